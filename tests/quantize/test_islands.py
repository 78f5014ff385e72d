"""QOperator float islands: ``torq.quantize(..., quant_format="qoperator")`` leaves nothing in float.

ORT's QOperator quantizer runs HardSwish → squeeze-excite pool (MobileNetV3) and BN → Relu →
pool head (DenseNet) in float; torq.quantize wraps them in Q/DQ, then the whole model must
compile with nothing unsupported and the NSS in `ort` rounding must equal ORT bit for bit."""
from __future__ import annotations

import collections
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

import torq
from torq.errors import TorqError
from torq.quantize import SyntheticDataReader, quantize
from torq.quantize.islands import island_nodes, unquantized_tensors
from torq.verify import verify

from .islands_model import island_at_output, island_cnn

ISLAND_OPS = {"HardSwish", "HardSigmoid", "GlobalAveragePool", "BatchNormalization", "Relu", "Flatten"}


def _ort_only(model: onnx.ModelProto) -> onnx.ModelProto:
    """What ORT's QOperator quantizer alone makes of ``model`` (the islands stay float)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "m.onnx", Path(tmp) / "q.onnx"
        onnx.save(model, str(src))
        quantize_static(str(src), str(dst), SyntheticDataReader(model, 4), quant_format=QuantFormat.QOperator,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
        return onnx.load(str(dst))


@pytest.fixture(scope="module", params=[False, True], ids=["float-io", "full-integer"])
def compiled(request):
    q = quantize(island_cnn(), quant_format="qoperator", num_calib=4, full_integer=request.param)
    return torq.compile(q)


def test_ort_alone_leaves_the_islands_in_float():
    raw = _ort_only(island_cnn())
    assert {n.op_type for n in island_nodes(raw)} == ISLAND_OPS
    assert set(unquantized_tensors(raw)) == {"h", "bn", "relu", "pool"}
    # the check this file relies on sees it: the float islands are "not supported on NSS"
    unsupported = torq.compile(raw).report.unsupported
    assert unsupported and any("HardSwish" in str(u) for u in unsupported)


def test_every_island_tensor_is_quantized_once():
    q = quantize(island_cnn(), quant_format="qoperator", num_calib=4)
    assert unquantized_tensors(q) == []
    assert {n.op_type for n in island_nodes(q)} == ISLAND_OPS   # still float ops, now between DQ and Q
    quants = collections.Counter(n.input[0] for n in q.graph.node if n.op_type == "QuantizeLinear")
    assert max(quants.values()) == 1    # ORT's own Q of h (for QLinearMul) is reused, not doubled
    by_out = {o: n for n in q.graph.node for o in n.output}
    q_of_h = next(n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "h")
    assert any(n.op_type == "QLinearMul" for n in q.graph.node if q_of_h.output[0] in n.input)
    for n in island_nodes(q):   # each island op reads only DQ outputs (or constants)
        assert all(by_out[i].op_type == "DequantizeLinear" for i in n.input if i in by_out), n.op_type
    onnx.checker.check_model(q, full_check=True)


def test_whole_model_lowers_and_is_bit_exact_with_ort(compiled):
    assert compiled.report.unsupported == []
    assert compiled.report.lowered["table"] >= 4 and compiled.report.lowered["avg_pool2d"] == 2
    res = verify(compiled, seed=3)
    assert res.ok
    assert all(o.exact for o in res.outputs if o.mode == "ort")


def test_injected_fault_in_an_island_table_fails_verify(compiled):
    bad = torq.compile(compiled.model)
    step = next(s for s in bad.program.steps if s.op == "torq_hl.table" and s.onnx_op == "HardSwish")
    step.attrs["table"] = np.clip(step.attrs["table"].astype(np.int16) + 1, -128, 127).astype(np.int8)
    res = verify(bad, seed=3)
    assert not res.ok
    assert any(not o.exact for o in res.outputs if o.mode == "ort")


@pytest.mark.parametrize("full_integer", [False, True])
def test_island_producing_the_graph_output(full_integer):
    q = quantize(island_at_output(), quant_format="qoperator", num_calib=4, full_integer=full_integer)
    assert [o.name for o in q.graph.output] == ["y"] and unquantized_tensors(q) == []
    elem = q.graph.output[0].type.tensor_type.elem_type
    assert elem == (onnx.TensorProto.INT8 if full_integer else onnx.TensorProto.FLOAT)
    c = torq.compile(q)
    assert c.report.unsupported == [] and verify(c, seed=1).ok


def test_qdq_models_are_left_alone():
    q = quantize(island_cnn(), quant_format="qdq", num_calib=4)
    assert not any("__torq_" in n.name for n in q.graph.node)


def test_a_reader_that_cannot_rewind_is_a_clear_error():
    m = island_cnn()

    class OnePass:   # an ORT CalibrationDataReader without rewind(): the island pass finds it empty
        def __init__(self):
            self.samples = iter([{"x": np.random.default_rng(0).uniform(-1, 1, (1, 4, 8, 8)).astype(np.float32)}])

        def get_next(self):
            return next(self.samples, None)

    with pytest.raises(TorqError, match="rewind"):
        quantize(m, quant_format="qoperator", calibration_data_reader=OnePass())


def test_the_quantize_summary_names_the_wrapped_ops():
    from torq.quantize.summary import summary_lines
    m = island_cnn()
    lines = summary_lines(m, quantize(m, quant_format="qoperator", num_calib=4))
    (line,) = [ln for ln in lines if ln.startswith("in Q/DQ:")]
    assert "HardSwish x1" in line and "BatchNormalization x1" in line and "GlobalAveragePool x2" in line
    assert not any(ln.startswith("in Q/DQ:") for ln in summary_lines(m, quantize(m, num_calib=4)))


def test_constant_operands_of_an_island_stay_constants():
    """GELU's x / √2 as the torch exporter writes it: Div by a Constant node's scalar. The Div
    is an island op; its Constant operand is no activation and gets no Q/DQ of its own."""
    from onnx import helper
    m = island_at_output()
    g = m.graph
    g.node[-1].output[0] = "h"
    g.node.extend([helper.make_node("Constant", [], ["sqrt2"], value_float=1.4142135),
                   helper.make_node("Div", ["h", "sqrt2"], ["y"])])
    q = quantize(m, quant_format="qoperator", num_calib=4)
    assert unquantized_tensors(q) == []
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] == "sqrt2" for n in q.graph.node)
    c = torq.compile(q)
    assert c.report.unsupported == [] and verify(c, seed=2).ok
