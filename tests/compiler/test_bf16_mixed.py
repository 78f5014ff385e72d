"""Mixed int8 + bf16 models: the float ops ORT leaves between a DequantizeLinear and a
QuantizeLinear compute in bf16 on the NSS (graph.bf16.bf16_float_ops), joined to the int8 convs
by the seed's bf16 Quantize / Dequantize fallback; and the bf16 front-end rule (the fp32 twin)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import torq
from torq import reference
from torq.graph.bf16 import bf16_float_ops, convert_to_bf16, is_bf16, to_fp32


def fp32_model(path):
    rng = np.random.default_rng(0)
    inits = {"w0": rng.normal(0, .3, (8, 4, 3, 3)), "b0": rng.normal(0, .1, 8), "w1": rng.normal(0, .3, (8, 8, 1, 1)),
             "b1": rng.normal(0, .1, 8), "s": np.ones(8), "t": np.zeros(8)}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1] * 4), helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Transpose", ["r0"], ["tr"], perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["tr", "s", "t"], ["ln"], axis=-1),
             helper.make_node("Transpose", ["ln"], ["tb"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["tb", "w1", "b1"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
                          [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    m.ir_version = 9
    onnx.save(m, str(path))
    return path


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    d = tmp_path_factory.mktemp("mixed")
    rng = np.random.default_rng(1)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.left = 8

        def get_next(self):
            self.left -= 1
            return {"x": rng.normal(0, 1, (1, 4, 8, 8)).astype(np.float32)} if self.left >= 0 else None
    quantize_static(str(fp32_model(d / "m.onnx")), str(d / "q.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=["Conv"], activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    return bf16_float_ops(onnx.load(str(d / "q.onnx")))


def test_float_ops_become_bf16_between_casts(mixed):
    types = {t.name: t.data_type for t in mixed.graph.initializer}
    assert types["s"] == types["t"] == TensorProto.BFLOAT16          # LayerNorm's parameters
    assert types["w0_quantized"] == TensorProto.INT8 and types["w0_scale"] == TensorProto.FLOAT  # int8 convs
    casts = [n for n in mixed.graph.node if n.op_type == "Cast"]
    assert sorted(a.i for n in casts for a in n.attribute) == [TensorProto.FLOAT, TensorProto.BFLOAT16]
    assert is_bf16(mixed) and mixed.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT


def test_mixed_model_runs_whole_on_the_nss(mixed):
    compiled = torq.compile(mixed)
    assert not compiled.report.unsupported, compiled.report.unsupported
    steps = compiled.program.steps
    kinds = {(s.op.split(".")[-1], s.dtype) for s in steps if s.op.startswith("torq_hl.")}
    assert ("conv2d", "i8") in kinds                                    # int8 convs
    assert ("reduce", "f32") in kinds and ("elementwise", "bf16") in kinds   # LayerNorm in the bf16 region
    assert {"fma", "act", "mul"} <= {k for k, _ in kinds}               # the bf16 Q/DQ fallback joins
    x = {"x": np.random.default_rng(2).normal(0, 1, (1, 4, 8, 8)).astype(np.float32)}
    out = compiled.run(x)["y"]
    ref = reference.run(to_fp32(mixed), x)["y"]
    assert np.abs(out - ref).max() <= 0.05 * np.abs(ref).max()


def test_a_bf16_model_goes_through_the_front_end_as_its_fp32_twin():
    """The ONNX checker rejects bf16 Conv at opset 17; compile takes the model anyway, and the
    twin holds exactly the bf16 values."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.normal(0, 1, (2, 3, 1, 1)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 2, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 2])], [w])
    b = convert_to_bf16(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises((onnx.checker.ValidationError, onnx.shape_inference.InferenceError)):
        onnx.checker.check_model(b, full_check=True)
    compiled = torq.compile(b)
    assert compiled.report.lowered == {"conv2d": 1} and compiled.program.steps[-1].dtype == "bf16"
    twin = numpy_helper.to_array(to_fp32(b).graph.initializer[0])
    assert np.array_equal(twin, torq.numerics.to_bf16(numpy_helper.to_array(w)))
    assert convert_to_bf16(to_fp32(b)).SerializeToString() == b.SerializeToString()
