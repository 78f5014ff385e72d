"""The seed's first example, ``discover --model m.onnx --skip-mode --quantize`` (float graph I/O):
the bf16 Q/DQ fallback at a layer's edges is the NPU's real arithmetic, explained by its bound,
so such a layer is a ``success`` on the NSS; anything beyond that bound is not."""
from __future__ import annotations

import json

import numpy as np
import pytest

from torq import numerics as nx
from torq.examples import build_example_cnn
from torq.gen_config import bf16_edges, layer_test
from torq.gen_config import executors as X
from torq.gen_config.options import QuantSettings
from torq.graph import extract_layers
from torq.graph.load import load_model

from .conftest import cli


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = tmp_path_factory.mktemp("bf16_edges")
    return build_example_cnn(d / "demo.onnx") and d / "demo.onnx"


def test_demo_without_full_integer_is_all_nss(demo):
    d = demo.parent
    # the recommended recipe is full-integer (int8 I/O); float graph I/O, the seed's, is --no-full-integer
    assert cli("discover", "--model", demo, "--output-dir", d, "--skip-mode", "--quantize", "--no-full-integer") == 0
    r = json.loads((d / "torq_gen_config_demo.json").read_text())
    assert [lid for lid, op in r["ops"].items() if op["recommended_executor"] != "nss"] == []
    explained = {lid for lid, op in r["ops"].items() if "explained" in op["executors"]["nss"]}
    assert {"Relu_relu1", "Relu_relu2"} <= explained          # the two the ±1 LSB rule used to send to CSS
    for lid in explained:
        nss = r["ops"][lid]["executors"]["nss"]
        assert nss["status"] == "success" and nss["max_diff"]["max_abs_diff"] > 0


def _layer(demo, lid):
    lay = next(lay for lay in extract_layers(load_model(demo)) if lay.id == lid)
    p = layer_test.prepare(lay.model, QuantSettings(quantize=True))
    return p, X.build("nss", p.compiled, rounding="native")


@pytest.mark.parametrize("lid", ["Relu_relu1", "Conv_conv1"])
def test_faults_beyond_the_bound_are_differences(demo, lid):
    p, nss = _layer(demo, lid)
    outs, _ = nss.run(p.inputs)
    assert bf16_edges.explain(p.model, p.inputs, outs) is not None
    (name, y), = outs.items()
    io = bf16_edges_io(p.model)["outputs"][name]
    scale, zp = io["scale"], io["zero_point"]
    q = np.rint(y.astype(np.float64) / scale).astype(np.int64) + zp         # ~ the int8 behind y
    i = int(np.argmax(np.abs(q - zp) < 100))                                # an element away from clamping
    two_lsb = y.copy()
    two_lsb.flat[i] = nx.dequantize_fallback(q.flat[i] + 2, scale, zp)     # the core off by 2 LSB
    assert bf16_edges.explain(p.model, p.inputs, {name: two_lsb}) is None
    off_grid = y.copy()
    off_grid.flat[i] = np.float32(y.flat[i] * (1 + 2.0 ** -6) + scale / 3)  # not a bf16 Dequantize value
    assert bf16_edges.explain(p.model, p.inputs, {name: off_grid}) is None
    x_name = next(iter(p.inputs))
    skewed, _ = nss.run({**p.inputs, x_name: (p.inputs[x_name] * np.float32(0.9)).astype(np.float32)})
    assert bf16_edges.explain(p.model, p.inputs, skewed) is None            # a Quantize 10 % off


def bf16_edges_io(model):
    from torq.graph.io_quant import io_quant_params
    from torq.quantize.full_integer import convert_to_full_integer
    return io_quant_params(convert_to_full_integer(model))


def test_full_integer_layers_need_no_explanation(demo):
    p, nss = _layer(demo, "Relu_relu1")
    from torq.quantize.full_integer import convert_to_full_integer
    core = convert_to_full_integer(p.model)
    assert bf16_edges.explain(core, {}, {}) is None                         # no float edge: nothing to explain


def test_resnet18_hybrid_without_full_integer(tmp_path):
    """A ResNet-18 (torq.zoo, 20 Conv, 17 Relu, 8 Add, MaxPool, GAP, Flatten, Gemm), the seed's
    hybrid example without --full-integer: at least 47 of 49 layers on the NSS (the seed's figure)."""
    from torq import zoo
    from torq.fileio import save_model
    model = save_model(zoo.resnet18(32), tmp_path / "resnet18.onnx")
    assert cli("discover", "--model", model, "--output-dir", tmp_path, "--skip-mode", "--quantize",
               "--no-full-integer", "--quant-format", "hybrid", "--dedup-layers") == 0
    r = json.loads((tmp_path / "torq_gen_config_resnet18.json").read_text())
    nss = sum(op["recommended_executor"] == "nss" for op in r["ops"].values())
    assert len(r["ops"]) == 49 and nss >= 47, r["final_report_text"]
