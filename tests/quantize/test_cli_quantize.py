"""`torq-gen-config quantize` end to end in a subprocess: summary on success, one-line errors."""
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

from qmodels import BAD_MODEL_FILES, bad_model_file, model, run, vi
from torq.examples import build_example_cnn


def cli(*args, cwd=None):
    env = dict(os.environ)
    env.pop("TORQ_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "torq.gen_config.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_quantize_default_output_and_summary(tmp_path):
    build_example_cnn(tmp_path / "net.onnx")
    r = cli("quantize", "--model", tmp_path / "net.onnx", "--full-integer", "--per-channel")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert "recipe gptq [" in r.stdout and "calibration=synthetic" in r.stdout
    # mixed measures its int16 layers on real inputs: without data it is gptq, and says so
    r = cli("quantize", "--model", tmp_path / "net.onnx", "--recipe", "mixed", "-o", tmp_path / "m.onnx")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "recipe gptq [" in r.stdout and "no --calibration-data" in r.stdout
    r = cli("quantize", "--model", tmp_path / "net.onnx", "--full-integer", "--per-channel")
    out = tmp_path / "net.int8.onnx"
    q = onnx.load(out)
    assert q.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT8
    assert "ops fp32: Conv x4" in r.stdout
    assert "QuantizeLinear x" in r.stdout and "DequantizeLinear x" in r.stdout
    assert "input: int8[1,3,32,32]" in r.stdout and "logits: int8[1,10]" in r.stdout
    assert "KiB" in r.stdout and str(out) in r.stdout
    x = np.zeros((1, 3, 32, 32), np.int8)
    assert run(q, {"input": x})["logits"].shape == (1, 10)


def test_quantize_qoperator_with_dataset_and_output(tmp_path):
    """The default recipe (mixed) in QOperator is gptq without a word (mixed precision has no QOperator
    form); an explicit `--recipe mixed` with --quant-format qoperator is gptq with one note (every
    layer int8); an explicit --precision auto there is refused."""
    build_example_cnn(tmp_path / "net.onnx")
    np.savez(tmp_path / "c.npz", input=np.random.default_rng(0).uniform(-1, 1, (4, 3, 32, 32)))
    args = ("-m", tmp_path / "net.onnx", "-o", tmp_path / "o" / "q.onnx", "--quant-format", "QOperator",
            "--calibrate-method", "entropy", "--num-calib", "4", "--calibration-data", tmp_path / "c.npz")
    r = cli("quantize", *args)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = cli("quantize", *args, "--recipe", "mixed")
    assert r.returncode == 0, r.stderr
    assert len(r.stderr.splitlines()) == 1 and "] note: --quant-format qoperator:" in r.stderr, r.stderr
    assert "QLinearConv x4" in r.stdout and "format:   qoperator" in r.stdout
    assert (tmp_path / "o" / "q.onnx").is_file()
    assert not any(t.data_type == onnx.TensorProto.INT16 for t in onnx.load(tmp_path / "o" / "q.onnx").graph.initializer)
    r = cli("quantize", *args, "--precision", "auto")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "need --quant-format qdq" in r.stderr, r.stderr


def test_quantize_mixed_int16_logits_and_a_pin_to_int8(tmp_path):
    """With calibration data the mixed recipe promotes the layers int8 hurts most to int16 within
    its MAC cap; the classifier writing the graph output costs no int16 MACs and is one of them
    (the output is then int16, the input stays int8). ``--precision auto,logits=int8`` keeps it int8,
    and the report says it was given, not chosen."""
    import json
    build_example_cnn(tmp_path / "net.onnx")
    np.savez(tmp_path / "c.npz", input=np.random.default_rng(0).uniform(-1, 1, (9, 3, 32, 32)))
    r = cli("quantize", "-m", tmp_path / "net.onnx", "--calibration-data", tmp_path / "c.npz", "--recipe", "mixed",
            cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "logits: int16[1,10]" in r.stdout and "input: int8[1,3,32,32]" in r.stdout
    q = onnx.load(tmp_path / "net.int8.onnx")
    assert q.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.INT16
    report = json.loads((tmp_path / "net.int8.precision.json").read_text())
    assert "logits" in report["int16_layers"] and report["int8_mac_share"] >= 0.90
    r = cli("quantize", "-m", tmp_path / "net.onnx", "--calibration-data", tmp_path / "c.npz", "--recipe", "mixed",
            "--precision", "auto,logits=int8", "-o", tmp_path / "pinned.onnx", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "logits: int8[1,10]" in r.stdout
    q = onnx.load(tmp_path / "pinned.onnx")
    assert q.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.INT8
    report = json.loads((tmp_path / "pinned.precision.json").read_text())
    assert report["int16_layers"] and "logits" not in report["int16_layers"]
    why = {c["name"]: c["why"] for c in report["layers"]}
    assert why["logits"].startswith("int8: given as --precision logits=int8")
    assert any(t.data_type == onnx.TensorProto.INT16 for t in q.graph.initializer)


def test_help_on_every_subcommand():
    for args in (["--help"], ["quantize", "--help"]):
        r = cli(*args)
        assert r.returncode == 0 and "usage:" in r.stdout
    assert "discover" in cli("--help").stdout
    q = cli("quantize", "--help").stdout
    for flag in ("--per-channel", "--full-integer", "--quant-format", "--quant-dtype",
                 "--calibrate-method", "--num-calib", "--calibration-data", "--output"):
        assert flag in q


def _external(tmp_path, loc):
    m = build_example_cnn()
    p = tmp_path / "ext.onnx"
    onnx.save_model(m, p, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="w.bin", size_threshold=0)
    m = onnx.load(p, load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = loc
    onnx.save(m, p)
    return p


def _make(kind, tmp_path):
    p = tmp_path / f"{kind}.onnx"
    if kind in BAD_MODEL_FILES:
        p = bad_model_file(tmp_path, kind)
    elif kind == "custom_op":
        m = model([helper.make_node("Warp", ["x"], ["y"], name="warp_1", domain="vendor.x")],
                  [vi("x", [1, 4])], [vi("y", [1, 4])],
                  opsets=[helper.make_opsetid("", 17), helper.make_opsetid("vendor.x", 1)])
        onnx.save(m, p)
    elif kind == "external_escape":
        p = _external(tmp_path, "../../etc/passwd")
    elif kind == "quantized":
        build_example_cnn(tmp_path / "fp.onnx")
        assert cli("quantize", "--model", tmp_path / "fp.onnx", "-o", p).returncode == 0
    return p


@pytest.mark.parametrize("kind, expect", [
    *BAD_MODEL_FILES.items(),
    ("custom_op", "node 'warp_1' (Warp) uses unknown custom op domain 'vendor.x'"),
    ("external_escape", "external data location '../../etc/passwd' points outside"),
    ("quantized", "already quantized"),
])
def test_bad_models_give_one_line_errors(tmp_path, kind, expect):
    p = _make(kind, tmp_path)
    before = set(tmp_path.rglob("*"))
    r = cli("quantize", "--model", p)
    assert r.returncode != 0
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("torq-gen-config: error: ") and str(p) in lines[0]
    assert expect in lines[0]
    assert "Traceback" not in r.stderr + r.stdout
    assert set(tmp_path.rglob("*")) == before  # no output file, no temp file


@pytest.mark.parametrize("args, expect", [
    (["--quant-format", "int4"], "supported values are qdq, qoperator, hybrid"),
    (["--quant-dtype", "A16W16"], "supported values are A8W8, A16W8"),
    (["--calibrate-method", "mse"], "supported values are minmax, entropy, percentile"),
    (["--num-calib", "zero"], "argument --num-calib: invalid int value"),
    (["--calibration-data", "nope.npz"], "calibration data not found"),
])
def test_bad_flags_give_one_line_errors(tmp_path, args, expect):
    build_example_cnn(tmp_path / "net.onnx")
    r = cli("quantize", "--model", tmp_path / "net.onnx", *args, cwd=tmp_path)
    assert r.returncode == 2
    assert len(r.stderr.splitlines()) == 1 and expect in r.stderr, r.stderr
    assert not (tmp_path / "net.int8.onnx").exists()


def test_refuses_to_overwrite_input(tmp_path):
    build_example_cnn(tmp_path / "net.onnx")
    r = cli("quantize", "--model", tmp_path / "net.onnx", "-o", tmp_path / "net.onnx")
    assert r.returncode == 2 and "refusing to overwrite it" in r.stderr


def test_quantize_precision_auto_writes_its_choice(tmp_path):
    """--precision auto: the choice per layer next to the model, the summary line, a model whose
    int16 layers are the ones the report names; without calibration data a one-line error."""
    import json
    build_example_cnn(tmp_path / "net.onnx")
    np.savez(tmp_path / "c.npz", input=np.random.default_rng(0).uniform(-1, 1, (9, 3, 32, 32)))
    r = cli("quantize", "-m", tmp_path / "net.onnx", "--precision", "auto", "--accuracy-budget", "0.001",
            "--calibration-data", tmp_path / "c.npz", "--num-calib", "9", "--per-channel", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "--precision auto:" in r.stdout and "held-apart samples" in r.stdout
    report = json.loads((tmp_path / "net.int8.precision.json").read_text())
    assert report["holdout_images"] == 3 and len(report["layers"]) == 7
    q = onnx.load(tmp_path / "net.int8.onnx")
    wide = {t.name for t in q.graph.initializer if t.data_type == onnx.TensorProto.INT16}
    assert bool(wide) == bool(report["int16_layers"])
    r = cli("quantize", "-m", tmp_path / "net.onnx", "--precision", "auto", "--accuracy-budget", "0.5", cwd=tmp_path)
    assert r.returncode != 0 and "needs real calibration data" in r.stderr and "Traceback" not in r.stderr
    r = cli("quantize", "-m", tmp_path / "net.onnx", "--precision", "auto", "--accuracy-budget", "0",
            "--int16-macs", "30", "--per-channel", "-o", tmp_path / "cap.onnx", cwd=tmp_path)
    assert r.returncode == 0, r.stderr                  # budget 0 judges nothing: synthetic data will do
    assert "within --int16-macs 30 %" in r.stdout
    report = json.loads((tmp_path / "cap.precision.json").read_text())
    assert report["expected_top1_loss_points"] is None and report["int8_mac_share"] >= 0.7
    r = cli("quantize", "-m", tmp_path / "net.onnx", "--precision", "conv9=int16", cwd=tmp_path)
    assert r.returncode != 0 and "no node 'conv9'" in r.stderr
