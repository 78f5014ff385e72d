"""Small fp32 models and ORT helpers shared by the quantize/load/extract/CLI tests (not a test file)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]


def vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, inits=(), opsets=OPSET, name="g"):
    m = helper.make_model(helper.make_graph(nodes, name, inputs, outputs, list(inits)),
                          opset_imports=list(opsets))
    m.ir_version = 8
    return m


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
