"""Inputs are never outputs; outputs respect the umask (audit 3: B4, B28, B35 -o folder).

Each typo of the audit must be a one-line error (exit 2) that leaves the input byte for byte
as it was; a file torq writes gets 0666 minus the umask, and a replaced file keeps its mode.
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from robustness.mutants import qconv
from torq.examples import build_example_cnn
from torq.fileio import atomic_write_text, refuse_overwrite, save_model
from torq.errors import TorqError


def run(module, *args, cwd=None):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          timeout=600, cwd=cwd)


def one_line_refusal(r, *needles):
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0], r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("outputs")
    save_model(qconv(), d / "q.onnx")
    build_example_cnn(d / "m.onnx")
    np.savez(d / "calib.npz", input=np.zeros((2, 1, 1, 16, 16), np.float32))
    (d / "report.json").write_text('{"ops": {}}')
    os.symlink(d / "q.onnx", d / "link.onnx")
    return d


def unchanged(path, before: bytes):
    assert path.read_bytes() == before


def test_compile_refuses_its_input(files):
    before = (files / "q.onnx").read_bytes()
    for out in ("q.onnx", "link.onnx", "./q.onnx", f"../{files.name}/q.onnx"):
        one_line_refusal(run("torq.compile_cli", "q.onnx", "--emit", "linalg", "-o", out, cwd=files), "q.onnx")
        unchanged(files / "q.onnx", before)
    one_line_refusal(run("torq.compile_cli", "q.onnx", "--emit", "linalg", "-o", files, cwd=files), "is a folder")


def test_view_html_refuses_the_report_and_the_model(files):
    before = {n: (files / n).read_bytes() for n in ("report.json", "m.onnx")}
    for out in ("report.json", "m.onnx"):
        one_line_refusal(run("torq.gen_config.cli", "view", "report.json", "--model", "m.onnx", "--html", out,
                             cwd=files), out)
    for n, b in before.items():
        unchanged(files / n, b)


def test_quantize_refuses_its_calibration_data_and_a_folder(files):
    before = (files / "calib.npz").read_bytes()
    one_line_refusal(run("torq.gen_config.cli", "quantize", "--model", "m.onnx", "--calibration-data", "calib.npz",
                         "-o", "calib.npz", cwd=files), "calib.npz")
    unchanged(files / "calib.npz", before)
    one_line_refusal(run("torq.gen_config.cli", "quantize", "--model", "m.onnx", "-o", ".", cwd=files), "is a folder")


def test_refuse_overwrite_folder_inputs(tmp_path):
    (tmp_path / "calib").mkdir()
    np.save(tmp_path / "calib" / "x.npy", np.zeros(3))
    with pytest.raises(TorqError, match="is the input"):
        refuse_overwrite(tmp_path / "calib" / "x.npy", "-o", {"--calibration-data": tmp_path / "calib"})
    refuse_overwrite(tmp_path / "calib" / "new.onnx", "-o", {"--calibration-data": tmp_path / "calib"})


def test_new_files_follow_the_umask_and_replaced_files_keep_their_mode(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o644
        os.umask(0o077)
        atomic_write_text(tmp_path / "b.txt", "x")
        assert stat.S_IMODE((tmp_path / "b.txt").stat().st_mode) == 0o600
        (tmp_path / "a.txt").chmod(0o640)
        atomic_write_text(tmp_path / "a.txt", "y")
        assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o640
    finally:
        os.umask(old)


def test_a_symlink_at_the_destination_is_replaced_not_followed(tmp_path):
    (tmp_path / "victim").write_text("precious")
    os.symlink(tmp_path / "victim", tmp_path / "out.json")
    atomic_write_text(tmp_path / "out.json", "{}")
    assert (tmp_path / "victim").read_text() == "precious" and not (tmp_path / "out.json").is_symlink()
