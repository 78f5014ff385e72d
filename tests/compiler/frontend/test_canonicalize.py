"""canonicalize(): ORT QOperator models -> standard QDQ, checked with real ORT and real torch-mlir.

Every float model is quantized with onnxruntime.quantization.quantize_static (QOperator, s8/s8,
per-tensor and per-channel). ORT runs both forms with `session.qdqisint8allowed=1`, so it fuses
the canonical DQ -> op -> Q groups back into the very same QLinear kernels (asserted from the
optimized graphs) and the int8 outputs must be bit-identical."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from torq.errors import TorqError
from torq.compiler.frontend.canonicalize import canonicalize

X_SHAPE = [1, 3, 8, 8]


def _w(name, shape, seed, scale=0.3):
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _model(nodes, inits, y_shape, opset=17):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, X_SHAPE)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _conv(out, inp="x", w="w1", b="b1", name="conv1"):
    return helper.make_node("Conv", [inp, w, b] if b else [inp, w], [out], pads=[1, 1, 1, 1], name=name)


_CONV_INITS = [_w("w1", (4, 3, 3, 3), 1), _w("b1", (4,), 2)]
N = helper.make_node

FLOAT_MODELS = {
    # Conv -> Relu -> Conv -> Add (residual) -> GlobalAveragePool -> Flatten -> Gemm
    "resnet": lambda: _model(
        [_conv("c1", w="w1", b="b1"), N("Relu", ["c1"], ["r1"], name="relu1"),
         _conv("c2", inp="r1", w="w2", b="b2", name="conv2"), N("Add", ["c2", "r1"], ["a"], name="add"),
         N("GlobalAveragePool", ["a"], ["g"], name="gap"), N("Flatten", ["g"], ["f"], name="flat"),
         N("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="fc")],
        [_w("w1", (8, 3, 3, 3), 1), _w("b1", (8,), 2), _w("w2", (8, 8, 3, 3), 3), _w("b2", (8,), 4),
         _w("wf", (5, 8), 5), _w("bf", (5,), 6)], [1, 5]),
    "avgpool": lambda: _model(
        [_conv("c"), N("AveragePool", ["c"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                       count_include_pad=0, name="pool")], _CONV_INITS, [1, 4, 4, 4]),
    "sigmoid": lambda: _model([_conv("c"), N("Sigmoid", ["c"], ["y"], name="sig")], _CONV_INITS, [1, 4, 8, 8]),
    "leakyrelu": lambda: _model([_conv("c"), N("LeakyRelu", ["c"], ["y"], alpha=0.1, name="lrelu")],
                                _CONV_INITS, [1, 4, 8, 8]),
    "softmax": lambda: _model([_conv("c"), N("Softmax", ["c"], ["y"], axis=1, name="smax")],
                              _CONV_INITS, [1, 4, 8, 8]),
    "concat": lambda: _model(
        [_conv("c"), N("Sigmoid", ["x"], ["s"], name="sig"), N("Concat", ["c", "s"], ["y"], axis=1, name="cat")],
        _CONV_INITS, [1, 7, 8, 8]),
    "mul": lambda: _model(
        [_conv("c"), _conv("d", w="w2", b=None, name="conv2"), N("Mul", ["c", "d"], ["y"], name="mul")],
        _CONV_INITS + [_w("w2", (4, 3, 3, 3), 3)], [1, 4, 8, 8]),
    "gemm_notrans": lambda: _model(
        [N("Flatten", ["x"], ["f"], name="flat"), N("Gemm", ["f", "wf", "bf"], ["y"], name="fc")],
        [_w("wf", (192, 5), 5), _w("bf", (5,), 6)], [1, 5]),
    "gemm_alpha": lambda: _model(
        [N("Flatten", ["x"], ["f"], name="flat"), N("Gemm", ["f", "wf", "bf"], ["y"], alpha=0.5, transB=1, name="fc")],
        [_w("wf", (5, 192), 5), _w("bf", (5,), 6)], [1, 5]),
    "conv_opset12": lambda: _model([_conv("c"), N("Relu", ["c"], ["y"], name="relu")], _CONV_INITS,
                                   [1, 4, 8, 8], opset=12),
}
# ORT does not fuse DQ -> Gemm(alpha != 1, with bias) -> Q back into QGemm; it runs an fp32 Gemm,
# whose result equals QGemm's integer recipe only up to near-ties (<= 1 LSB; 0 seen in 15k outputs).
FLOAT_PATH_IN_ORT = {"gemm_alpha"}


class _Calib(CalibrationDataReader):
    def __init__(self):
        self._it = iter([{"x": np.random.default_rng(100 + i).standard_normal(X_SHAPE).astype(np.float32)}
                         for i in range(4)])

    def get_next(self):
        return next(self._it, None)


CASES = [(name, pc) for name in FLOAT_MODELS for pc in (False, True)]


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    d, cache = tmp_path_factory.mktemp("canon"), {}

    def get(name, per_channel):
        if (name, per_channel) not in cache:
            src, dst = d / f"{name}.onnx", d / f"{name}_{int(per_channel)}.q.onnx"
            onnx.save(FLOAT_MODELS[name](), src)
            quantize_static(str(src), str(dst), _Calib(), quant_format=QuantFormat.QOperator,
                            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=per_channel,
                            extra_options={"ForceQuantizeNoInputCheck": True})
            q = onnx.load(dst)
            cache[name, per_channel] = (q, canonicalize(q))
        return cache[name, per_channel]
    return get


def _session(model, optimized_path=None):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    so.add_session_config_entry("session.qdqisint8allowed", "1")
    if optimized_path:
        so.optimized_model_filepath = str(optimized_path)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _with_outputs(model, names, value_info):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(value_info[n] for n in names if n not in have)
    return m


def _lower(model):
    """torch-mlir's own ONNX -> linalg pipelines on `model`, in a forked child (torq's isolation):
    an MLIR pass pipeline run in the test process would leave LLVM signal state behind that
    later forked compiles inherit (their crash diagnostics lose faulthandler's report)."""
    from torq.compiler.isolation import run_isolated
    return run_isolated(_lower_in_process, model)


def _lower_in_process(model):
    from torch_mlir.dialects import torch as torch_d
    from torch_mlir.extras import onnx_importer
    from torch_mlir.ir import Context
    from torch_mlir.passmanager import PassManager
    ctx = Context()
    torch_d.register_dialect(ctx)
    m = onnx.shape_inference.infer_shapes(model)
    mi = onnx_importer.ModelInfo(m)
    mod = mi.create_module(context=ctx).operation
    onnx_importer.NodeImporter.define_function(mi.main_graph, mod).import_all()
    with ctx:
        PassManager.parse("builtin.module(torch-onnx-to-torch-backend-pipeline,"
                          "torch-backend-to-linalg-on-tensors-backend-pipeline)").run(mod)
    return mod.get_asm()


def _ops(model):
    return [(n.domain or "", n.op_type) for n in model.graph.node]


def _per_channel_biased_conv(model):
    """QLinearConvs canonicalize must rewrite: per-channel weights (with or without bias)."""
    inits = {t.name: t for t in model.graph.initializer}
    return [n for n in model.graph.node if n.op_type == "QLinearConv"
            and (int(np.prod(inits[n.input[4]].dims)) > 1 or len(inits[n.input[3]].dims) == 3)]


@pytest.mark.parametrize("name,per_channel", CASES)
def test_structure_and_checker(quantized, name, per_channel):
    q, c = quantized(name, per_channel)
    assert not any(d == "com.microsoft" for d, _ in _ops(c))
    assert "com.microsoft" not in {o.domain for o in c.opset_import}
    onnx.checker.check_model(c, full_check=True)
    assert not _per_channel_biased_conv(c)
    # per-tensor QLinearConv with symmetric pads stay as they are: torch-mlir handles them
    n_conv = sum(op == "QLinearConv" for _, op in _ops(q)) - len(_per_channel_biased_conv(q))
    assert sum(op == "QLinearConv" for _, op in _ops(c)) == n_conv
    typed = {v.name for v in list(c.graph.value_info) + list(c.graph.input) + list(c.graph.output)}
    assert all(o in typed for n in c.graph.node for o in n.output)
    if name == "conv_opset12" and per_channel:   # per-axis DequantizeLinear forced opset 13
        assert [o.version for o in c.opset_import if o.domain == ""] == [13]


@pytest.mark.parametrize("name,per_channel", CASES)
def test_ort_outputs_identical(quantized, name, per_channel, tmp_path):
    q, c = quantized(name, per_channel)
    vi = {v.name: v for v in list(c.graph.value_info) + list(c.graph.output)}
    # compare every tensor a quantized node of the original produces, plus the graph outputs
    names = [n.output[0] for n in q.graph.node if n.op_type.startswith("Q")]
    sq = _session(_with_outputs(q, names, vi), tmp_path / "q.opt.onnx")
    sc = _session(_with_outputs(c, names, vi), tmp_path / "c.opt.onnx")
    if name not in FLOAT_PATH_IN_ORT:   # ORT fused the QDQ groups back into the same kernels
        assert _ops(onnx.load(tmp_path / "c.opt.onnx")) == _ops(onnx.load(tmp_path / "q.opt.onnx"))
    rng = np.random.default_rng(7)
    for _ in range(3):
        x = (rng.standard_normal(X_SHAPE) * 1.3).astype(np.float32)   # wider than calibration: saturates
        for meta, a, b in zip(sq.get_outputs(), sq.run(None, {"x": x}), sc.run(None, {"x": x})):
            assert a.dtype == b.dtype and a.shape == b.shape, meta.name
            if name in FLOAT_PATH_IN_ORT and a.dtype == np.int8:
                assert np.abs(a.astype(int) - b.astype(int)).max() <= 1, meta.name
            elif name not in FLOAT_PATH_IN_ORT:   # (float graph outputs are DQ of the int8 ones)
                np.testing.assert_array_equal(a, b, err_msg=meta.name)


@pytest.mark.parametrize("name,per_channel", CASES)
def test_torch_mlir_lowers_canonical_only(quantized, name, per_channel):
    q, c = quantized(name, per_channel)
    asm = _lower(c)
    assert "torch." not in asm and "onnx." not in asm   # fully lowered to linalg/arith
    if any(d == "com.microsoft" for d, _ in _ops(q)):
        # the contrib op (or its consumer) stays a torch.operator: torch-mlir's MLIRError in the child
        with pytest.raises(RuntimeError, match=r"^MLIRError: .*failed to legalize operation 'torch\.operator'"):
            _lower(q)


def test_per_channel_conv_bias_scale(quantized):
    q, c = quantized("resnet", True)
    inits = {t.name: numpy_helper.to_array(t) for t in c.graph.initializer}
    for conv in _per_channel_biased_conv(q):
        dq = next(n for n in c.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == conv.input[8])
        want = inits[conv.input[1]].astype(np.float32) * inits[conv.input[4]].astype(np.float32)
        assert inits[dq.input[1]].dtype == np.float32
        np.testing.assert_array_equal(inits[dq.input[1]], want)
        assert inits[dq.input[2]].dtype == np.int32 and not inits[dq.input[2]].any()
        assert helper.get_attribute_value(dq.attribute[0]) == 0


def _qgemm_float_out_model():
    """Hand-built QGemm without y_scale / y_zero_point: float output (quantize_static never emits it)."""
    rng = np.random.default_rng(3)
    init = [numpy_helper.from_array(v, k) for k, v in {
        "xs": np.array(0.02, np.float32), "xz": np.array(3, np.int8),
        "b": rng.integers(-127, 128, (4, 6)).astype(np.int8), "bs": np.array([0.01, 0.02, 0.03, 0.015], np.float32),
        "bz": np.zeros(4, np.int8), "c": rng.integers(-500, 500, 4).astype(np.int32)}.items()]
    g = helper.make_graph(
        [N("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q"),
         N("QGemm", ["xq", "xs", "xz", "b", "bs", "bz", "c"], ["y"], domain="com.microsoft", transB=1, name="qg")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


def test_qgemm_float_output(tmp_path):
    q = _qgemm_float_out_model()
    c = canonicalize(q)
    assert _ops(c) == [("", "QuantizeLinear")] + [("", "DequantizeLinear")] * 3 + [("", "Gemm")]
    sq, sc = _session(q), _session(c, tmp_path / "c.opt.onnx")
    assert ("com.microsoft", "QGemm") in _ops(onnx.load(tmp_path / "c.opt.onnx"))
    x = np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)
    np.testing.assert_array_equal(sq.run(None, {"x": x})[0], sc.run(None, {"x": x})[0])
    _lower(c)


def test_input_model_not_mutated(quantized):
    q, _ = quantized("resnet", True)
    before = q.SerializeToString()
    canonicalize(q)
    assert q.SerializeToString() == before


def test_unknown_contrib_op_names_node():
    m = _qgemm_float_out_model()
    m.graph.node[1].op_type = "QLinearReduceMean"
    m.graph.node[1].name = "mean_quant"
    with pytest.raises(TorqError, match=r"node 'mean_quant' \(com\.microsoft\.QLinearReduceMean\) is not supported"):
        canonicalize(m)


def test_channels_last_pool_rejected(quantized):
    q, _ = quantized("avgpool", False)
    m = onnx.ModelProto()
    m.CopyFrom(q)
    pool = next(n for n in m.graph.node if n.op_type == "QLinearAveragePool")
    keep = [a for a in pool.attribute if a.name != "channels_last"]
    del pool.attribute[:]
    pool.attribute.extend(keep + [helper.make_attribute("channels_last", 1)])
    with pytest.raises(TorqError, match=pool.name) as e:
        canonicalize(m)
    assert "channels_last" in str(e.value) and "\n" not in str(e.value)


def test_hand_built_conv_scalar_weight_zp(tmp_path):
    """Per-channel w_scale with a scalar w_zp and 1-element 1-D x qparams: the per-axis DQ gets
    a broadcast zero point, the 1-D [1] tensors become scalars; ORT result unchanged."""
    rng = np.random.default_rng(5)
    init = [numpy_helper.from_array(v, k) for k, v in {
        "xs": np.array([0.05], np.float32), "xz": np.array([-2], np.int8),
        "w": rng.integers(-127, 128, (3, 2, 3, 3)).astype(np.int8), "ws": np.array([0.01, 0.004, 0.02], np.float32),
        "wz": np.array(0, np.int8), "ys": np.array(0.1, np.float32), "yz": np.array(5, np.int8),
        "bias": rng.integers(-3000, 3000, 3).astype(np.int32)}.items()]
    g = helper.make_graph(
        [N("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q"),
         N("QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz", "bias"], ["y"], pads=[1, 1, 1, 1],
           name="qc")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, [1, 3, 5, 5])], init)
    q = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    q.ir_version = 8
    c = canonicalize(q)
    assert not _per_channel_biased_conv(c)
    inits = {t.name: numpy_helper.to_array(t) for t in c.graph.initializer}
    dq_w = next(n for n in c.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "w")
    np.testing.assert_array_equal(inits[dq_w.input[2]], np.zeros(3, np.int8))
    assert all(inits[n.input[1]].ndim == 0 for n in c.graph.node if n.input[0] in ("xq", "qc_conv"))
    x = (rng.standard_normal((1, 2, 5, 5)) * 3).astype(np.float32)
    np.testing.assert_array_equal(_session(q).run(None, {"x": x})[0], _session(c).run(None, {"x": x})[0])
    _lower(c)
