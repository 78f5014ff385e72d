"""CLE where users meet it: ``quantize(equalize=True)``, ``torq-gen-config quantize/evaluate --equalize``."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from torq.examples import build_example_cnn
from torq.quantize import io_quant_params, quantize

from .test_equalize import chain, spread_weights


def cli(*args):
    env = dict(os.environ)
    env.pop("TORQ_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "torq.gen_config.cli", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=300)


def _depthwise_block():
    """expand 1×1 → Relu → depthwise 3×3 → Relu → project 1×1, balanced weights then skewed the
    way BatchNorm folding skews them: depthwise channel c times d_c (d spans 1000×), the project
    conv's input channel c times 1/d_c. Same function, but per-tensor int8 of the depthwise
    weights and of its output activation now rounds the small channels away (MobileNet's case)."""
    rng = np.random.default_rng(11)
    ws = [rng.normal(0, 1, shape).astype(np.float32) for shape in ((16, 4, 1, 1), (16, 1, 3, 3), (6, 16, 1, 1))]
    d = np.geomspace(1e-3, 1, 16)[rng.permutation(16)].astype(np.float32)
    ws[1] *= d.reshape(-1, 1, 1, 1)
    ws[2] /= d.reshape(1, -1, 1, 1)
    m = chain(ws, ["relu", "relu"], [1, 16, 1], 4, size=12)
    b = next(t for t in m.graph.initializer if t.name == "c1_b")
    b.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(b) * d, b.name))
    return m


def _sqnr(model, q, xs):
    f = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    i = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = np.concatenate([f.run(None, {"x": x})[0] for x in xs])
    got = np.concatenate([i.run(None, {"x": x})[0] for x in xs])
    return 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - got) ** 2))


def test_equalization_lifts_int8_accuracy(tmp_path):
    m = _depthwise_block()
    rng = np.random.default_rng(12)
    calib, held_out = rng.normal(0, 1, (16, 1, 4, 12, 12)), rng.normal(0, 1, (8, 1, 4, 12, 12))
    np.savez(tmp_path / "c.npz", x=calib.astype(np.float32))
    xs = list(held_out.astype(np.float32))
    for per_channel in (False, True):      # per channel too: the activation's one scale loses them
        plain = quantize(m, calibration_data=tmp_path / "c.npz", num_calib=16, per_channel=per_channel)
        equal = quantize(m, calibration_data=tmp_path / "c.npz", num_calib=16, per_channel=per_channel,
                         equalize=True)
        before, after = _sqnr(m, plain, xs), _sqnr(m, equal, xs)
        assert before < 10 and after > 25, (per_channel, before, after)   # measured −0.2 / 1.6 → 34.2 / 34.5 dB


def test_cli_quantize_equalize(tmp_path):
    build_example_cnn(tmp_path / "net.onnx")
    np.savez(tmp_path / "c.npz", input=np.random.default_rng(0).uniform(-1, 1, (4, 3, 32, 32)).astype(np.float32))
    r = cli("quantize", "--model", tmp_path / "net.onnx", "--equalize", "--full-integer",
            "--calibration-data", tmp_path / "c.npz", "--num-calib", "4", "-o", tmp_path / "eq.onnx")
    assert r.returncode == 0, r.stderr
    assert "equalize=bounded" in r.stdout
    r = cli("quantize", "--model", tmp_path / "net.onnx", "--full-integer", "--equalize", "off",
            "--calibration-data", tmp_path / "c.npz", "--num-calib", "4", "-o", tmp_path / "plain.onnx")
    assert r.returncode == 0, r.stderr
    eq, plain = (onnx.load(tmp_path / f) for f in ("eq.onnx", "plain.onnx"))
    assert io_quant_params(eq)["inputs"]["input"] == io_quant_params(plain)["inputs"]["input"]

    def conv1_weight(q):          # the int8 weight of conv1 (rescaled by CLE, so it must differ)
        inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
        return next(v for k, v in inits.items() if k.startswith("conv1") and v.dtype == np.int8 and v.ndim == 4)
    assert not np.array_equal(conv1_weight(eq), conv1_weight(plain))
    assert "--equalize" in cli("quantize", "--help").stdout


def test_cli_quantize_equalize_bad_model_is_one_line(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    r = cli("quantize", "--model", tmp_path / "bad.onnx", "--equalize")
    assert r.returncode == 2 and r.stderr.startswith("torq-gen-config: error:") and len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "bad.int8.onnx").exists()
