"""view / edit / bad input: one-line errors, exit 2, no traceback, no half-written files."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from torq.examples import build_example_cnn

from .conftest import cli, conv_chain

QFLAGS = ["--quantize", "--full-integer"]


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    model = build_example_cnn(d / "example.onnx") and d / "example.onnx"
    assert cli("discover", "--model", model, "--output-dir", d, *QFLAGS, "--skip-mode") == 0
    return model, d


def _one_line_error(capsys, code, *needles):
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.count("\n") == 0 and err.startswith("torq-gen-config: error:") and "Traceback" not in err, err
    for n in needles:
        assert n in err, err


def test_view_table_and_layer(done, capsys):
    model, d = done
    assert cli("view", "--model", model, "--output-dir", d) == 0
    out = capsys.readouterr().out
    assert "Conv_conv1" in out and "recommended" in out and "STATUS COUNTS:" in out
    assert cli("view", "--model", model, "--output-dir", d, "--layer", "dwconv") == 0
    out = capsys.readouterr().out
    assert "LAYER: Conv_dwconv" in out and "Recommended Executor: nss" in out
    _one_line_error(capsys, cli("view", "--model", model, "--output-dir", d, "--layer", "nope"), "no layer matches")


def test_edit_executor_glob_and_tolerance(done, tmp_path, capsys):
    model, d = done
    for f in d.glob("torq_gen_config_example*.json"):
        shutil.copy(f, tmp_path / f.name)
    assert cli("edit", "--model", model, "--output-dir", tmp_path, "--layer", "Conv_conv*", "--executor", "host") == 0
    comp = json.loads((tmp_path / "torq_gen_config_example_compiler.json").read_text())
    assert sum(v["executor"] == "host" for v in comp["op_assignments"].values()) == 3
    assert cli("edit", "--model", model, "--output-dir", tmp_path, "--layer", "gemm", "--executor", "null") == 0
    r = json.loads((tmp_path / "torq_gen_config_example.json").read_text())
    assert r["ops"]["Gemm_logits"]["recommended_executor"] is None
    lines = r["final_report_text"].splitlines()
    assert "  none: 1" in lines and [ln for ln in lines if "Gemm_logits" in ln][0].endswith(" -")
    assert cli("edit", "--model", model, "--output-dir", tmp_path, "--layer", "ALL", "--tolerance-max", "0.05") == 0
    r = json.loads((tmp_path / "torq_gen_config_example.json").read_text())
    assert all(op["tolerance_used"]["fp_max_tol"] == 0.05 for op in r["ops"].values())
    capsys.readouterr()
    assert cli("edit", "--model", model, "--output-dir", tmp_path, "--list", "relu") == 0
    assert capsys.readouterr().out.count("Relu_") == 2
    _one_line_error(capsys, cli("edit", "--model", model, "--output-dir", tmp_path, "--layer", "zzz",
                                "--executor", "nss"), "--layer 'zzz'")
    _one_line_error(capsys, cli("edit", "--model", model, "--output-dir", tmp_path, "--layer", "ALL",
                                "--executor", "gpu"), "--executor 'gpu'")


def test_bad_reports(done, tmp_path, capsys):
    model, d = done
    rp = tmp_path / "torq_gen_config_example.json"
    rp.write_text("{ not json")
    _one_line_error(capsys, cli("view", rp), "not valid JSON")
    _one_line_error(capsys, cli("run", "--model", model, "--output-dir", tmp_path, *QFLAGS), "not valid JSON")
    r = json.loads((d / "torq_gen_config_example.json").read_text())
    r["ops"]["Conv_conv1"]["recommended_executor"] = "gpu"
    rp.write_text(json.dumps(r))
    _one_line_error(capsys, cli("view", rp), "recommended_executor is 'gpu'")
    rp.write_text(json.dumps({"op_assignments": {}}))
    _one_line_error(capsys, cli("edit", rp, "--layer", "ALL", "--executor", "nss"), "compiler JSON")
    _one_line_error(capsys, cli("run", "--model", model, "--output-dir", tmp_path / "none", *QFLAGS), "no such report")


def test_model_json_mismatch(done, tmp_path, capsys):
    _, d = done
    other = conv_chain(tmp_path / "example.onnx")          # same stem, different model
    shutil.copy(d / "torq_gen_config_example.json", tmp_path)
    _one_line_error(capsys, cli("run", "--model", other, "--output-dir", tmp_path, *QFLAGS), "model file changed")
    r = json.loads((tmp_path / "torq_gen_config_example.json").read_text())
    del r["quantization"]
    (tmp_path / "torq_gen_config_example.json").write_text(json.dumps(r))
    _one_line_error(capsys, cli("run", "--model", other, "--output-dir", tmp_path, *QFLAGS), "another model")


def test_bad_flags(done, tmp_path, capsys):
    model, _ = done
    _one_line_error(capsys, cli("discover", "--model", model, "--skip-executors", "nss,gpu"), "unknown executor 'gpu'")
    _one_line_error(capsys, cli("discover", "--model", tmp_path / "missing.onnx"), "no such file")
    _one_line_error(capsys, cli("discover", "--model", model, "--full-integer"), "need --quantize")
    _one_line_error(capsys, cli("discover", "--model", model, "--quantize", "--quant-format", "int4"), "--quant-format")
    _one_line_error(capsys, cli("discover", "--model", model, "--quantize", "--subgraph-from", "nope"),
                    "--subgraph-from")


def test_output_dir_that_cannot_be_created(done, tmp_path, capsys):
    model, _ = done
    (tmp_path / "file").write_text("x")
    _one_line_error(capsys, cli("discover", "--model", model, "--output-dir", tmp_path / "file" / "out", *QFLAGS),
                    "cannot create")


NOBODY = 65534
_AS_NOBODY = """import contextlib, io, os, sys
from torq.gen_config.cli import main
argv = sys.argv[1:]
with contextlib.redirect_stderr(io.StringIO()):   # warm-up as root: the same path up to the check,
    main(argv[:-1] + [os.devnull + "/out"])       # loading what it imports (stdlib is root-only)
os.setgroups([]); os.setgid({id}); os.setuid({id})
sys.exit(main(argv))
"""


def _nobody_can_run_python(env) -> bool:
    try:
        r = subprocess.run([sys.executable, "-c", "import torq.gen_config.cli"], env=env, user=NOBODY,
                           group=NOBODY, extra_groups=[], capture_output=True, timeout=120)
    except OSError:      # e.g. the interpreter lives under root's home (mode 700)
        return False
    return r.returncode == 0


def _cli_as_nobody(argv, base: Path) -> subprocess.CompletedProcess:
    """The CLI in a child process running as nobody (root ignores directory permissions);
    argv ends with the --output-dir value.

    With `user=` when nobody can run this interpreter; else the child starts as root and drops
    to nobody before main() runs (only the interpreter's own files are then out of nobody's reach)."""
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": str(src), "HOME": str(base / "home"),
           "TORQ_GEN_CONFIG_CACHE_DIR": str(base / "home" / "cache")}
    if _nobody_can_run_python(env):
        cmd, as_user = [sys.executable, "-m", "torq.gen_config.cli"], {"user": NOBODY, "group": NOBODY, "extra_groups": []}
    else:
        cmd, as_user = [sys.executable, "-c", _AS_NOBODY.format(id=NOBODY)], {}
    return subprocess.run(cmd + [str(a) for a in argv], env=env, cwd=base, capture_output=True, text=True,
                          timeout=300, **as_user)


def _readable_by_nobody(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o005 == 0o005 for p in [path, *path.parents])


@pytest.mark.skipif(not hasattr(os, "setuid"), reason="needs POSIX users")
def test_read_only_output_dir(done, tmp_path, capsys):
    model, _ = done
    if os.geteuid() != 0:        # an ordinary user: permissions apply in process
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            _one_line_error(capsys, cli("discover", "--model", model, "--output-dir", ro, *QFLAGS), "not writable")
            assert list(ro.iterdir()) == []
        finally:
            ro.chmod(0o700)
        return
    src = Path(__file__).resolve().parents[2] / "src"
    if not _readable_by_nobody(src / "torq" / "gen_config"):
        pytest.skip(f"{src} is not readable by uid {NOBODY} (chmod -R o+rX the checkout)")
    base = Path(tempfile.mkdtemp(prefix="torq-ro-"))
    try:
        base.chmod(0o755)
        (base / "home").mkdir(mode=0o777)
        (base / "home").chmod(0o777)
        shutil.copy(model, base / "model.onnx")
        (base / "model.onnx").chmod(0o644)
        ro = base / "ro"
        ro.mkdir(mode=0o555)
        r = _cli_as_nobody(["discover", "--model", base / "model.onnx", *QFLAGS, "--output-dir", ro], base)
        err = r.stderr.strip()
        assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, err)
        assert err.count("\n") == 0 and "Traceback" not in err, err
        assert err == f"torq-gen-config: error: --output-dir {ro}: not writable", err
        assert list(ro.iterdir()) == []
    finally:
        shutil.rmtree(base)


def test_skip_executors_and_dedup(tmp_path):
    model = conv_chain(tmp_path / "twin.onnx", middle=None)
    assert cli("discover", "--model", model, "--output-dir", tmp_path, *QFLAGS, "--dedup-layers",
               "--skip-executors", "css,host") == 0
    r = json.loads((tmp_path / "torq_gen_config_twin.json").read_text())
    first, second = r["ops"]["Conv_conv0"], r["ops"]["Conv_y"]
    assert second["duplicate_of"] == "Conv_conv0" and second["executors"] == first["executors"]
    assert set(first["executors"]) == {"nss"}
    assert r["discovery_report"]["summary"]["computed"] + r["discovery_report"]["summary"]["from_cache"] == 1


def test_jobs_gives_the_same_report(tmp_path):
    model = conv_chain(tmp_path / "chain2.onnx", middle="Relu")
    reports = []
    for jobs, sub in ((1, "serial"), (2, "parallel")):
        assert cli("discover", "--model", model, "--output-dir", tmp_path / sub, *QFLAGS, "--skip-mode",
                   "--recompute-cache", "--jobs", jobs) == 0
        reports.append(json.loads((tmp_path / sub / "torq_gen_config_chain2.json").read_text()))
    assert reports[0]["ops"] == reports[1]["ops"] and len(reports[0]["ops"]) == 3
    assert reports[1]["discovery_report"]["summary"]["computed"] == 3


def test_html_in_headless_chromium(done, tmp_path):
    model, d = done
    page = tmp_path / "map.html"
    assert cli("view", "--model", model, "--output-dir", d, "--html", page) == 0
    text = page.read_text()
    assert "<script" not in text and "http" not in text.split("<body>")[1]   # self-contained
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (make test installs it where apt-get may: apt-get install -y chromium)")
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    assert dom.count("<tr>") >= 12 and "Conv_dwconv" in dom and "background:#c8f7c5" in dom


def test_quantization_flags_reach_layers_and_fingerprint(tmp_path):
    import numpy as np
    model = conv_chain(tmp_path / "q.onnx", middle=None)
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).uniform(-2, 2, (4, 1, 4, 8, 8)).astype(np.float32))
    args = ["--model", model, "--output-dir", tmp_path, "--quantize", "--per-channel", "--quant-format", "QDQ",
            "--quant-dtype", "a8w8", "--calibrate-method", "Entropy", "--num-calib", "4",
            "--calibration-data", tmp_path / "calib.npz"]
    assert cli("discover", *args, "--skip-executors", "css", "--recommend-by-timing", "--timing-runs", "1") == 0
    r = json.loads((tmp_path / "torq_gen_config_q.json").read_text())
    fp = r["quantization"]
    assert (fp["per_channel"], fp["calibrate_method"], fp["num_calib"], fp["quant_dtype"]) == (True, "entropy", 4, "A8W8")
    assert fp["calibration_data"] == "calib.npz" and len(fp["calibration_sha256"]) == 64
    for op in r["ops"].values():
        assert set(op["executors"]) == {"nss", "host"} and all("timing" in e for e in op["executors"].values())
        fastest = min(op["executors"], key=lambda e: op["executors"][e]["timing"]["runtime_ms"])
        assert op["recommended_executor"] == fastest
    assert cli("run", *args) == 0
    np.savez(tmp_path / "calib.npz", x=np.zeros((4, 1, 4, 8, 8), np.float32))   # other calibration data
    assert cli("run", *args) == 2


def test_discover_carries_each_layers_precision_and_view_shows_it(tmp_path, capsys):
    """--precision NODE=int16: the layer is quantized and tested with int16 activations (the NSS
    int16 path against ORT), its report entry says so, view shows a precision column."""
    model = build_example_cnn(tmp_path / "example.onnx") and tmp_path / "example.onnx"
    assert cli("discover", "--model", model, "--output-dir", tmp_path, *QFLAGS, "--per-channel",
               "--precision", "conv2=int16,add1=int16", "--skip-executors", "css,host") == 0
    r = json.loads((tmp_path / "torq_gen_config_example.json").read_text())
    prec = {lid: op["precision"] for lid, op in r["ops"].items()}
    assert prec["Conv_conv2"] == prec["Add_add1"] == "int16" and prec["Conv_conv1"] == "int8"
    assert r["ops"]["Conv_conv2"]["executors"]["nss"]["status"] == "success"
    assert ["conv2", "int16"] in r["quantization"]["precision"]
    capsys.readouterr()
    assert cli("view", "--model", model, "--output-dir", tmp_path) == 0
    out = capsys.readouterr().out
    assert "precision" in out and "int16" in out
    assert cli("view", "--model", model, "--output-dir", tmp_path, "--layer", "Conv_conv2") == 0
    assert "Precision: int16" in capsys.readouterr().out


def test_run_refuses_a_layer_no_executor_can_run(tmp_path, capsys):
    """discover saw every executor it tested fail on a layer (LpNormalization: no NSS pattern; css and
    host not tested): run names that layer and the edit that gets it going, instead of putting it on
    the NSS by default and failing there; after that edit the run passes."""
    model = conv_chain(tmp_path / "lp.onnx")
    assert cli("discover", "--model", model, "--output-dir", tmp_path, *QFLAGS, "--skip-executors", "css,host") == 1
    report = json.loads((tmp_path / "torq_gen_config_lp.json").read_text())
    assert report["has_critical_failures"]
    op = report["ops"]["LpNormalization_mid"]
    assert op["recommended_executor"] is None and [e["status"] for e in op["executors"].values()] == ["error"]
    capsys.readouterr()
    _one_line_error(capsys, cli("run", "--model", model, "--output-dir", tmp_path, *QFLAGS),
                    "layer 'LpNormalization_mid' (LpNormalization) has no executor", "nss: ", "--executor host",
                    "css/host")
    assert not list(tmp_path.glob("*.tmp*"))
    assert cli("edit", "--model", model, "--output-dir", tmp_path, "--layer", "LpNormalization_mid",
               "--executor", "host") == 0
    assert cli("run", "--model", model, "--output-dir", tmp_path, *QFLAGS) == 0
