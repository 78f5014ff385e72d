"""``torq-gen-config evaluate`` end to end on 20 real Fashion-MNIST test images, checked against
numbers computed here independently (ORT run directly), plus the one-line errors of bad specs."""
from __future__ import annotations

import json
import re

import numpy as np
import onnxruntime as ort
import pytest

from torq.data.datasets import load_dataset
from torq.evaluate.engines import NssEngine, with_batch
from torq.gen_config.cli import main

from .fmnist_probe import TEST, TRAIN


def _run(capsys, *argv):
    code = main(["evaluate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_evaluate_20_images(probe_model, tmp_path, capsys):
    out_dir = tmp_path / "out"
    code, out, err = _run(capsys, "--model", str(probe_model), "--dataset", str(TEST), "--limit", "20",
                          "--calibration-data", str(TRAIN), "--num-calib", "32", "--preprocess", "norm=unit",
                          "--batch", "8", "-o", str(out_dir))
    assert code == 0, err
    rep = json.loads((out_dir / "evaluation.json").read_text())
    assert rep["images"] == 20 and rep["settings"]["calibration_images"] == 32
    # FP32 top-1 recomputed here with ORT directly on the same 20 images
    test = load_dataset(TEST)
    x = np.stack([test.load(i) for i in range(20)])[:, None].astype(np.float32) / 255
    logits = ort.InferenceSession(str(probe_model), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    assert rep["per_image"]["fp32"] == np.argmax(logits, axis=1).tolist()
    assert rep["fp32"]["top1"] == pytest.approx(np.mean(np.argmax(logits, 1) == test.labels[:20]))
    assert rep["per_image"]["label"] == test.labels[:20].tolist()
    assert rep["fp32"]["top1"] >= 0.6                       # a real classifier, not chance (0.1)
    # default: exact scales, on which the NSS's native rounding is ORT's, logit for logit
    assert rep["settings"]["recipe"]["exact_scales"] is True
    assert rep["agreement_nss_vs_ort"] == 1.0 and rep["lsb_diff_nss_vs_ort"] == {"0": 20 * 10}
    assert len(rep["sqnr_db"]) >= 3 and all(float(s["sqnr_db"]) > 10 for s in rep["sqnr_db"])
    for name in ("evaluation.md", "sqnr.png", "lsb_hist.png"):
        assert (out_dir / name).stat().st_size > 0
    assert (out_dir / "sqnr.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "INT8 (NSS, native rounding)" in out and "| FP32 (ORT) |" in out


def test_batch_invariance(probe_model):
    """Batch 1 and batch 3 (last batch padded) give identical per-image NSS results."""
    from torq.quantize import quantize
    q = quantize(probe_model, per_channel=True, full_integer=True, num_calib=4)
    x = np.random.default_rng(1).integers(-128, 128, (5, 1, 28, 28)).astype(np.int8)
    one, three = NssEngine(q, 1)(x), NssEngine(q, 3)(x)
    assert one.shape == (5, 10) and np.array_equal(one, three)
    ref = ort.InferenceSession(with_batch(q, 5).SerializeToString(), providers=["CPUExecutionProvider"])
    assert np.abs(ref.run(None, {"input": x})[0].astype(int) - one.astype(int)).max() <= 2


def _one_line_error(code, err, *needles):
    err = "".join(ln for ln in err.splitlines(True) if not re.match(r"\[\d\d:\d\d:\d\d\] ", ln))  # progress
    assert code == 2 and err.count("\n") == 1 and err.startswith("torq-gen-config: error: "), err
    for n in needles:
        assert n in err, err


def test_bad_specs_are_one_line_errors(probe_model, tmp_path, capsys):
    base = ["--model", str(probe_model), "--preprocess", "norm=unit", "--calibration-data", str(TRAIN)]
    code, _, err = _run(capsys, *base, "--dataset", str(tmp_path))
    _one_line_error(code, err, "no labels.tsv")
    np.savez(tmp_path / "oor.npz", x=np.zeros((3, 28, 28), np.uint8), y=np.array([1, 10, 2]))
    code, _, err = _run(capsys, *base, "--dataset", str(tmp_path / "oor.npz"))
    _one_line_error(code, err, "class index 10 of sample 1 is out of range", "10 classes")
    img_dir = tmp_path / "imgs"
    img_dir.mkdir()
    (img_dir / "x.png").write_bytes(b"garbage")
    (img_dir / "labels.tsv").write_text("file\tclass_index\nx.png\t1\n")
    code, _, err = _run(capsys, *base, "--dataset", str(img_dir))
    _one_line_error(code, err, "x.png: unreadable image")
    np.savez(tmp_path / "big.npz", x=np.zeros((3, 32, 32), np.uint8), y=np.array([1, 2, 3]))
    code, _, err = _run(capsys, *base, "--dataset", str(tmp_path / "big.npz"))
    _one_line_error(code, err, "preprocessed image is 32×32×1 but model input 'input' expects 28×28×1")
    code, _, err = _run(capsys, "--model", str(probe_model), "--dataset", str(TEST))
    _one_line_error(code, err, "needs real calibration images")
    code, _, err = _run(capsys, "--model", str(probe_model), "--dataset", str(TEST),
                        "--calibration-data", str(TEST))
    _one_line_error(code, err, "calibration data shares")
    assert not (tmp_path / "torq_out").exists()


def test_jobs_match_single_process(probe_model):
    """--jobs 2 (spawned worker processes) gives the same per-image results as one process."""
    from torq.evaluate import evaluate
    kw = dict(preprocess="norm=unit", calibration=str(TRAIN), num_calib=8, limit=12, batch=4,
              sqnr_images=0, progress=False)
    one, two = evaluate(probe_model, TEST, **kw), evaluate(probe_model, TEST, jobs=2, **kw)
    for path in ("fp32", "int8_ort", "int8_nss"):
        assert np.array_equal(one.top[path], two.top[path]), path
    assert one.lsb == two.lsb


@pytest.mark.parametrize("jobs", [1, 2])
def test_ort_rounding_agrees_with_ort_everywhere(probe_model, tmp_path, capsys, jobs):
    """--rounding ort: the NSS reproduces ORT's int8 logits bit for bit (in process and in
    --jobs workers), so agreement is 100 % and every logit differs by 0 LSB."""
    out_dir = tmp_path / "out"
    code, out, err = _run(capsys, "--model", str(probe_model), "--dataset", str(TEST), "--limit", "24",
                          "--calibration-data", str(TRAIN), "--num-calib", "16", "--preprocess", "norm=unit",
                          "--batch", "8", "--sqnr-images", "0", "--rounding", "ort", "--jobs", str(jobs),
                          "-o", str(out_dir))
    assert code == 0, err
    rep = json.loads((out_dir / "evaluation.json").read_text())
    assert rep["settings"]["rounding"] == "ort"
    assert rep["agreement_nss_vs_ort"] == 1.0 and rep["lsb_diff_nss_vs_ort"] == {"0": 24 * 10}
    assert rep["per_image"]["int8_nss"] == rep["per_image"]["int8_ort"]
    assert "INT8 (NSS, ort rounding)" in out
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", "--model", str(probe_model), "--dataset", str(TEST), "--rounding", "exact"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--rounding" in err and err.count("\n") == 1


def test_a_fixed_batch_of_one_runs_one_image_per_call(probe_model, tmp_path, capsys):
    """A model exported with batch 1 (torch's default) is evaluated at the default --batch, one
    image per call, with the same per-image FP32 answers as ORT on that model directly."""
    import onnx
    fixed = tmp_path / "fixed.onnx"
    onnx.save(with_batch(onnx.load(str(probe_model)), 1), str(fixed))
    out_dir = tmp_path / "out"
    code, out, err = _run(capsys, "--model", str(fixed), "--dataset", str(TEST), "--limit", "6",
                          "--calibration-data", str(TRAIN), "--num-calib", "8", "--preprocess", "norm=unit",
                          "--sqnr-images", "0", "-o", str(out_dir))
    assert code == 0, err
    assert "fixed batch of 1: one image per call" in err
    rep = json.loads((out_dir / "evaluation.json").read_text())
    test = load_dataset(TEST)
    sess = ort.InferenceSession(str(fixed), providers=["CPUExecutionProvider"])
    want = [int(np.argmax(sess.run(None, {"input": test.load(i)[None, None].astype(np.float32) / 255})[0]))
            for i in range(6)]
    assert rep["per_image"]["fp32"] == want
    assert rep["agreement_nss_vs_ort"] == 1.0
