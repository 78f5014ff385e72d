"""Test helpers shared by every test folder (not a test file): small float ONNX models, ORT
quantization (real quantize_static), ORT sessions, the NPU's bf16 Q/DQ fallback steps and a
plain int64 depthwise convolution."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from torq import numerics
from torq.quantize import convert_to_full_integer

OPSET = [helper.make_opsetid("", 17)]


def vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, inits=(), opset=17, opsets=None, name=None, ir_version=None):
    """A float ONNX model. ``inputs``: ValueInfoProtos or (name, shape) float inputs; ``outputs``:
    ValueInfoProtos, or names (float, shapes inferred); ``inits``: TensorProtos or a dict of
    name -> array (stored as float32). IR version 9 when shapes are inferred, else 8."""
    ins = [i if isinstance(i, onnx.ValueInfoProto) else vi(*i) for i in inputs]
    infer = not all(isinstance(o, onnx.ValueInfoProto) for o in outputs)
    outs = [o if isinstance(o, onnx.ValueInfoProto) else vi(o, None) for o in outputs]
    if isinstance(inits, dict):
        inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()]
    m = helper.make_model(helper.make_graph(nodes, name or ("m" if infer else "g"), ins, outs, list(inits)),
                          opset_imports=list(opsets or [helper.make_opsetid("", opset)]))
    m.ir_version = ir_version or (9 if infer else 8)
    return onnx.shape_inference.infer_shapes(m) if infer else m


def weight(name, shape, seed=0, scale=0.3):
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def conv_relu_pool_model():
    """Conv -> Relu -> MaxPool -> Conv: every compute op has a compact QLinear form."""
    return model(
        [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c1"], ["r1"]),
         helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("Conv", ["p1", "w2"], ["y"], pads=[1, 1, 1, 1])],
        [vi("x", [1, 3, 8, 8])], [vi("y", [1, 4, 4, 4])],
        [weight("w1", (4, 3, 3, 3), 1), weight("w2", (4, 4, 3, 3), 2)])


def conv_reducemean_model():
    """Conv -> ReduceMean: ReduceMean has no QOperator form, so hybrid must choose QDQ."""
    return model(
        [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
         helper.make_node("ReduceMean", ["c1"], ["y"], axes=[2, 3], keepdims=1)],
        [vi("x", [1, 3, 8, 8])], [vi("y", [1, 4, 1, 1])],
        [weight("w1", (4, 3, 3, 3), 1)])


def zero_branch_model():
    """Conv output multiplied by a 0 constant: an all-zero activation (range 0) inside the graph."""
    return model(
        [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
         helper.make_node("Mul", ["c1", "zero"], ["z"]),
         helper.make_node("Add", ["c1", "z"], ["y"])],
        [vi("x", [1, 3, 8, 8])], [vi("y", [1, 4, 8, 8]), vi("z", [1, 4, 8, 8])],
        [weight("w1", (4, 3, 3, 3), 1), numpy_helper.from_array(np.zeros((1,), np.float32), "zero")])


def reshape_subgraph_model():
    """Conv -> Reshape whose shape comes from Shape/Gather/Concat (+ Constant nodes) -> MatMul."""
    c = lambda name, arr: helper.make_node(  # noqa: E731
        "Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr), name + "_v"))
    return model(
        [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
         helper.make_node("Shape", ["c1"], ["shp"]),
         c("idx0", np.array(0, np.int64)),
         helper.make_node("Gather", ["shp", "idx0"], ["batch"], axis=0),
         c("axes0", np.array([0], np.int64)),
         helper.make_node("Unsqueeze", ["batch", "axes0"], ["batch1"]),
         c("minus1", np.array([-1], np.int64)),
         helper.make_node("Concat", ["batch1", "minus1"], ["newshape"], axis=0),
         helper.make_node("Reshape", ["c1", "newshape"], ["flat"]),
         helper.make_node("MatMul", ["flat", "w2"], ["y"])],
        [vi("x", ["N", 3, 4, 4])], [vi("y", ["N", 5])],
        [weight("w1", (2, 3, 3, 3), 1), weight("w2", (32, 5), 2)])


def session(m, disable_opt=False):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if disable_opt:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    data = m.SerializeToString() if isinstance(m, onnx.ModelProto) else str(m)
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def run(m, feeds, disable_opt=False):
    s = session(m, disable_opt)
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


def all_intermediates(m, feeds):
    """Every tensor of the model: all node outputs exposed as graph outputs (ORT types them)."""
    full = onnx.ModelProto()
    full.CopyFrom(m)
    have = {o.name for o in full.graph.output}
    for n in full.graph.node:
        for o in n.output:
            if o and o not in have:
                full.graph.output.add().name = o
                have.add(o)
    return {**feeds, **run(full, feeds, disable_opt=True)}


def rand_input(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)


class Reader(CalibrationDataReader):
    def __init__(self, shapes: dict, n=4, seed=0, lo=-1.0, hi=1.0):
        rng = np.random.default_rng(seed)
        self.data = [{k: rng.uniform(lo, hi, s).astype(np.float32) for k, s in shapes.items()} for _ in range(n)]
        self.i = 0

    def get_next(self):
        if self.i >= len(self.data):
            return None
        self.i += 1
        return self.data[self.i - 1]

    def rewind(self):
        self.i = 0


def quantize(m: onnx.ModelProto, shapes: dict, fmt="qdq", per_channel=False, act="s8", seed=0,
             lo=-1.0, hi=1.0, full_integer=True, op_types=None, **extra) -> onnx.ModelProto:
    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "f.onnx", Path(d) / "q.onnx"
        onnx.save(m, src)
        quantize_static(str(src), str(dst), Reader(shapes, seed=seed, lo=lo, hi=hi),
                        quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
                        per_channel=per_channel, op_types_to_quantize=op_types,
                        activation_type={"u8": QuantType.QUInt8, "s16": QuantType.QInt16}.get(act, QuantType.QInt8),
                        weight_type=QuantType.QInt8,
                        extra_options={"ForceQuantizeNoInputCheck": True, **extra})
        q = onnx.load(dst)
    return convert_to_full_integer(q) if full_integer else q


def conv_model(rng, cin, cout, k, stride, dilation, pads, group, bias, relu, hw):
    w = rng.normal(0, 1.0 / np.sqrt(cin // group * k * k), (cout, cin // group, k, k))
    inits = {"w": w}
    ins = ["x", "w"]
    if bias:
        inits["b"] = rng.normal(0, 0.2, cout)
        ins.append("b")
    nodes = [helper.make_node("Conv", ins, ["c" if relu else "y"], kernel_shape=[k, k], strides=[stride] * 2,
                              dilations=[dilation] * 2, pads=pads, group=group)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    return model(nodes, [("x", [1, cin, hw[0], hw[1]])], ["y"], inits)



def depthwise_ref(x, w, pads, pv, s, d):
    """Plain int64 depthwise convolution (channel multiplier O // C; stride ``s`` and dilation ``d``
    as (h, w) pairs): pad with ``pv``, take each tap's strided slice, sum."""
    N, C, H, W = x.shape
    O, _, KH, KW = w.shape
    pl, pr, pt, pb = pads
    xp = np.full((N, C, H + pt + pb, W + pl + pr), pv, np.int64)
    xp[:, :, pt:pt + H, pl:pl + W] = x
    OH = (H + pt + pb - d[0] * (KH - 1) - 1) // s[0] + 1
    OW = (W + pl + pr - d[1] * (KW - 1) - 1) // s[1] + 1
    out = np.zeros((N, O, OH, OW), np.int64)
    for i in range(KH):
        for j in range(KW):
            sl = xp[:, :, i * d[0]:i * d[0] + s[0] * (OH - 1) + 1:s[0], j * d[1]:j * d[1] + s[1] * (OW - 1) + 1:s[1]]
            out += np.repeat(sl, O // C, axis=1) * w[:, 0, i, j][None, :, None, None]
    return out


#: Files that are no loadable ONNX model -> the words every loader's one-line error must contain.
BAD_MODEL_FILES = {"missing": "no such file", "directory": "is a directory", "empty": "empty file",
                   "random": "not an ONNX model", "truncated": "not an ONNX model",
                   "text": "not an ONNX model"}


def bad_model_file(folder: Path, kind: str) -> Path:
    """``folder/<kind>.onnx`` made into a bad model file of that kind (``BAD_MODEL_FILES``)."""
    from torq.examples import build_example_cnn
    p = Path(folder) / f"{kind}.onnx"
    if kind == "directory":
        p.mkdir()
    elif kind == "empty":
        p.write_bytes(b"")
    elif kind == "random":
        p.write_bytes(np.random.default_rng(0).bytes(5000))
    elif kind == "truncated":
        good = build_example_cnn().SerializeToString()
        p.write_bytes(good[: len(good) // 2])
    elif kind == "text":
        p.write_text("ir_version: 8\nthis is a text file, not a protobuf\n")
    else:
        assert kind == "missing", kind
    return p


def combine_shift_by_seven(h, low, out=None):
    """An injected A16W8 fault for ``runtime.kernels.byteplanes.combine_partials``: the ACT's
    ``act_lsh`` 7 instead of 8 when the high byte plane's partial sum joins the low one's."""
    h = np.asarray(h)
    if out is not None:
        np.multiply(h, 128, out=out)
        return np.add(out, low, out=out)
    return h * np.asarray(128, h.dtype) + np.asarray(low).astype(h.dtype)
