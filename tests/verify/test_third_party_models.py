"""A third-party model file: the ResNet-50 architecture shipped in the onnx wheel's test data
(opset 3-era graph: Sum for residuals, count_include_pad=0 AveragePool, BN folded; weights are
ConstantOfShape fills, so only the structure is real). Quantized, compiled, proven against ORT."""
from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from torq import compile
from torq.verify import verify
from torq.quantize import quantize

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def modernise(path: Path, tmp: Path) -> onnx.ModelProto:
    """Fold the ConstantOfShape weights (ORT basic optimisation), then lift the IR-3 graph to opset 13."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(tmp / "folded.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    m = onnx.load(tmp / "folded.onnx")
    g = m.graph
    names = {i.name for i in g.input}
    g.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                   for t in g.initializer if t.name not in names)   # IR 3: initializers are inputs
    m = onnx.version_converter.convert_version(m, 13)
    m.ir_version = 8
    inits = {t.name for t in m.graph.initializer}
    used = {x for n in m.graph.node for x in n.input}
    keep = [i for i in m.graph.input if i.name not in inits and i.name in used]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    if m.graph.node[-1].op_type == "Softmax":          # not an NPU op: end at the logits
        m.graph.output[0].name = m.graph.node[-1].input[0]
        del m.graph.node[-1]
    return m


@pytest.mark.skipif(not (LIGHT / "light_resnet50.onnx").exists(), reason="onnx wheel without test data")
def test_legacy_resnet50_lowers_fully_and_is_bit_exact(tmp_path):
    m = modernise(LIGHT / "light_resnet50.onnx", tmp_path)
    assert {n.op_type for n in m.graph.node} >= {"Sum", "AveragePool", "Conv", "Gemm", "MaxPool", "Relu"}
    c = compile(quantize(m, full_integer=True, num_calib=4))
    assert c.report.unsupported == []
    assert c.report.lowered["conv2d"] == 53 and c.report.lowered["add"] == 16
    r = verify(c, seed=0)
    assert r.ok and all(o.exact for o in r.outputs if o.mode == "ort"), r.outputs
