"""Whole-model tests: ResNet-18 and MobileNetV2 stand-ins (torq.zoo), quantized A8W8 full-integer,
compiled to torq_hl, simulated by the NSS and compared with ONNX Runtime.

For every case:
  * every Conv / Add / pool / Gemm is lowered to torq_hl (nothing unsupported, no linalg op left);
  * `ort` rounding is bit-exact with ORT (`session.qdqisint8allowed=1`) on 2 random int8 inputs;
  * `native` rounding: every per-op difference to ORT is explained (tie / near-tie, <= 1 LSB),
    and the whole-model |Δ| stays small (printed; run with -s to see it).

Sizes are kept small (ResNet-18 at 64x64, MobileNetV2 at 96x96, 4 calibration samples) so the
file runs in well under a minute on 2 cores; each model is quantized and compiled once per case.
"""
from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import onnx
import pytest

import torq
from torq import zoo
from torq.verify import verify
from torq import reference
from torq.graph.inputs import random_inputs

pytestmark = pytest.mark.slow

SIZES = {"resnet18": 64, "mobilenet_v2": 96}
NUM_CALIB = 4
SEEDS = (0, 1)
# Largest whole-model native-vs-ORT |Δ| (LSB of the int8 logits) observed over 8 seeds was 5
# (MobileNetV2 per-channel): a single ±1 LSB tie early in the net fans out through GAP + Gemm.
NATIVE_MAX_LSB = 8

CASES = [pytest.param(name, pc, id=f"{name}-{'pc' if pc else 'pt'}")
         for name in ("resnet18", "mobilenet_v2") for pc in (False, True)]


@functools.lru_cache(maxsize=None)
def _fp32(name: str) -> onnx.ModelProto:
    return getattr(zoo, name)(SIZES[name])


@functools.lru_cache(maxsize=None)
def _compiled(name: str, per_channel: bool, quant_format: str = "qdq"):
    q = torq.quantize(_fp32(name), full_integer=True, per_channel=per_channel,
                      quant_format=quant_format, num_calib=NUM_CALIB)
    return q, torq.compile(q)


def _expected_lowering(model: onnx.ModelProto) -> dict:
    ops = Counter(n.op_type for n in model.graph.node)
    depthwise = sum(1 for n in model.graph.node if n.op_type == "Conv"
                    and any(a.name == "group" and a.i > 1 for a in n.attribute))
    exp = {"conv2d": ops["Conv"] - depthwise, "depthwise_conv2d": depthwise, "add": ops["Add"],
           "fully_connected": ops["Gemm"], "avg_pool2d": ops["GlobalAveragePool"],
           "maxpool2d": ops["MaxPool"]}
    return {k: v for k, v in exp.items() if v}


def _check_lowering(name: str, compiled) -> None:
    rep = compiled.report
    assert rep.unsupported == [], "\n".join(map(str, rep.unsupported))
    # Exactly the compute ops of the fp32 graph, one torq_hl op each (no bf16 Q/DQ fallbacks).
    assert rep.lowered == _expected_lowering(_fp32(name))
    leftover = [ln.strip() for ln in compiled.ir("torq_hl").splitlines() if "linalg." in ln]
    assert leftover == [], leftover[:5]


def _check_bit_exact(compiled, q) -> list[int]:
    """`ort` rounding bit-exact with ORT on SEEDS inputs; returns native max |Δ| per seed."""
    sess = reference.session(q)
    native = []
    for seed in SEEDS:
        x = random_inputs(q, seed)
        ref = reference.run(q, x, sess)
        ours = compiled.run(x, rounding="ort")
        nat = compiled.run(x, rounding="native")
        assert set(ours) == set(ref)
        for k, r in ref.items():
            assert ours[k].dtype == r.dtype == np.int8 and ours[k].shape == r.shape
            differ = int((ours[k] != r).sum())
            assert differ == 0, f"seed {seed} output {k}: {differ}/{r.size} differ from ORT in ort rounding"
            native.append(int(np.abs(nat[k].astype(np.int64) - r.astype(np.int64)).max()))
    return native


# ---------------------------------------------------------------- the builders themselves

@pytest.mark.parametrize("build,hw,convs,adds", [(zoo.resnet18, 224, 20, 8), (zoo.mobilenet_v2, 224, 52, 10)])
def test_zoo_models_valid_deterministic_and_live(build, hw, convs, adds):
    m = build(hw)
    assert m.SerializeToString() == build(hw).SerializeToString()
    assert m.SerializeToString() != build(hw, seed=1).SerializeToString()
    onnx.checker.check_model(m, full_check=True)
    assert m.opset_import[0].version == 17
    ops = Counter(n.op_type for n in m.graph.node)
    assert ops["Conv"] == convs and ops["Add"] == adds and ops["Gemm"] == 1
    assert "BatchNormalization" not in ops
    assert [i.name for i in m.graph.input] == ["input"] and [o.name for o in m.graph.output] == ["logits"]
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, hw, hw)).astype(np.float32)
    logits = reference.run(m, {"input": x})["logits"]
    assert logits.shape == (1, 1000) and np.isfinite(logits).all()
    assert 0.3 < float(logits.std()) < 30  # activations stayed O(1) through the depth


def test_mobilenet_v2_structure():
    m = zoo.mobilenet_v2(96)
    nodes = list(m.graph.node)
    dw = [n for n in nodes if n.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in n.attribute)]
    assert len(dw) == 17
    assert sum(n.op_type == "Clip" for n in nodes) == 35
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    for n in dw:  # depthwise: group == channels, one input channel per filter
        group = next(a.i for a in n.attribute if a.name == "group")
        assert inits[n.input[1]].shape[:2] == (group, 1)
    last = [n for n in nodes if n.op_type == "Conv"][-1]
    assert inits[last.input[1]].shape[0] == 1280
    half = zoo.mobilenet_v2(96, width=0.5)
    assert onnx.numpy_helper.to_array(half.graph.initializer[0]).shape[0] == 16  # stem 32 * 0.5
    assert reference.run(half, {"input": np.zeros((1, 3, 96, 96), np.float32)})["logits"].shape == (1, 1000)


def test_resnet18_structure():
    m = zoo.resnet18(64)
    first = m.graph.node[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in first.attribute}
    assert first.op_type == "Conv" and attrs["kernel_shape"] == [7, 7] and attrs["strides"] == [2, 2]
    mp = next(n for n in m.graph.node if n.op_type == "MaxPool")
    assert {a.name: onnx.helper.get_attribute_value(a) for a in mp.attribute}["pads"] == [1, 1, 1, 1]
    down = [n for n in m.graph.node if n.name.endswith("downsample")]
    assert len(down) == 3


@pytest.mark.parametrize("hw", [16, 0])
def test_zoo_rejects_tiny_inputs(hw):
    with pytest.raises(ValueError, match="hw"):
        zoo.resnet18(hw)


# ---------------------------------------------------------------- quantized, compiled, simulated

@pytest.mark.parametrize("name,per_channel", CASES)
def test_every_op_lowered_to_torq_hl(name, per_channel):
    _, compiled = _compiled(name, per_channel)
    _check_lowering(name, compiled)


@pytest.mark.parametrize("name,per_channel", CASES)
def test_ort_rounding_bit_exact_whole_model(name, per_channel):
    q, compiled = _compiled(name, per_channel)
    native = _check_bit_exact(compiled, q)
    print(f"\n{name} {'per-channel' if per_channel else 'per-tensor'}: native vs ORT max |Δ| per seed = {native} LSB")
    assert max(native) <= NATIVE_MAX_LSB


@pytest.mark.parametrize("name,per_channel", CASES)
def test_native_differences_explained_per_op(name, per_channel):
    _, compiled = _compiled(name, per_channel)
    res = verify(compiled, seed=0)
    assert res.op_diffs, "verify produced no per-op comparison"
    bad = [(od.op, od.location, od.max_lsb, od.causes) for od in res.op_diffs if not od.explained]
    assert bad == []
    assert all(o.exact for o in res.outputs if o.mode == "ort")
    assert res.ok


def test_resnet18_qoperator_per_tensor():
    q, compiled = _compiled("resnet18", False, "qoperator")
    assert Counter(n.op_type for n in q.graph.node)["QLinearConv"] == 20
    _check_lowering("resnet18", compiled)
    native = _check_bit_exact(compiled, q)
    assert max(native) <= NATIVE_MAX_LSB
    assert verify(compiled, seed=0).ok


def test_resnet18_gap_over_1x1_lowered():
    q = torq.quantize(zoo.resnet18(32), full_integer=True, num_calib=2)
    compiled = torq.compile(q)
    assert compiled.report.unsupported == [], "\n".join(map(str, compiled.report.unsupported))
    assert compiled.report.lowered == _expected_lowering(_fp32("resnet18"))
