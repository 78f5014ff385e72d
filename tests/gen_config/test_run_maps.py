"""`run` over random executor maps: every map of the demo, a ResNet-style and an
EfficientNet-style CNN runs (QDQ, per-channel, QOperator), and with ``--rounding ort`` the whole
model is bit-exact with ONNX Runtime whichever layers sit on nss, css or host."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from torq.compiler.pipeline import import_graph
from torq.examples import build_example_cnn
from torq.gen_config import partition
from torq.gen_config.mapping import QDQ
from torq.gen_config.run import RunOptions, c_nodes, execute
from torq.quantize import quantize
from torq import reference
from torq.graph.inputs import random_inputs

from .netmodels import efficientnet_style, resnet_style

MODELS = {"demo": build_example_cnn, "resnet": resnet_style, "effnet": efficientnet_style}
FLAGS = {"qdq": dict(quant_format="qdq"), "qdq-pc": dict(quant_format="qdq", per_channel=True),
         "qop": dict(quant_format="qoperator")}
SETTINGS = settings(max_examples=2, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck))
_QUANTIZED: dict = {}


def quantized(model: str, flags: str):
    """(quantized model, canonical graph, compute-node indices), built once per session."""
    if (model, flags) not in _QUANTIZED:
        q = quantize(MODELS[model](), full_integer=True, **FLAGS[flags])
        c = import_graph(q)
        compute = [j for j, n in enumerate(c_nodes(c)) if n.op_type not in QDQ]
        _QUANTIZED[model, flags] = q, c, compute
    return _QUANTIZED[model, flags]


def run_map(model: str, flags: str, executor_of: dict, tmp_path) -> None:
    q, c, _ = quantized(model, flags)
    segs = partition.segments(c_nodes(c), executor_of)
    inputs = random_inputs(q, 0)
    tensors, timings = execute(c, segs, inputs, RunOptions(tmp_path / "m.onnx", rounding="ort"), model)
    assert [t["executor"] for t in timings] == [s.executor for s in segs]
    for name, want in reference.run(q, inputs).items():
        np.testing.assert_array_equal(tensors[name], want, err_msg=f"{model} {flags} {executor_of}")


def spans(n: int):
    """Maps with at most two off-NSS runs of consecutive compute nodes (few IREE compiles)."""
    run = st.tuples(st.integers(0, n - 1), st.integers(1, 3), st.sampled_from(["css", "host"]))
    return st.lists(run, min_size=1, max_size=2)


@pytest.mark.parametrize("flags", list(FLAGS))
@pytest.mark.parametrize("model", list(MODELS))
@SETTINGS
@given(data=st.data())
def test_every_map_runs_bit_exact(model, flags, data, tmp_path_factory):
    _, _, compute = quantized(model, flags)
    executor_of = {}
    for start, length, ex in data.draw(spans(len(compute)), label="off-NSS runs"):
        executor_of.update({j: ex for j in compute[start:start + length]})
    run_map(model, flags, executor_of, tmp_path_factory.mktemp("run"))


@pytest.mark.parametrize("ex", ["host", "css"])
def test_demo_conv2_conv3_off_nss(ex, tmp_path):
    """The map that crashed with KeyError 'relu2_QuantizeLinear_Output': the int8 tensor under
    a DequantizeLinear computed in two segments must be exported by the first."""
    _, c, _ = quantized("demo", "qdq")
    names = [n.name for n in c_nodes(c)]
    run_map("demo", "qdq", {names.index("conv2"): ex, names.index("conv3"): ex}, tmp_path)
