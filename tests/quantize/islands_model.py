"""Small fp32 models with the float islands ORT's QOperator quantizer leaves (built with onnx.helper)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _w(rng, name, *shape, scale=0.3):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def island_cnn(seed: int = 0) -> onnx.ModelProto:
    """x[1,4,8,8] → Conv → HardSwish h → [squeeze-excite: GAP → Conv1x1 → HardSigmoid g] → Mul(h, g)
    → Conv1x1 → Concat(·, h) → BatchNormalization → Relu → GAP → Flatten → Gemm → logits[1,5].

    The MobileNetV3 island (HardSwish → GAP) and the DenseNet one (Concat → BN → Relu → GAP →
    Flatten): in QOperator form ORT runs HardSwish, HardSigmoid, BN, Relu, both pools and the
    Flatten in float."""
    rng = np.random.default_rng(seed)
    inits = [_w(rng, "c1.w", 8, 4, 3, 3), _w(rng, "c1.b", 8, scale=0.1),
             _w(rng, "se.w", 8, 8, 1, 1), _w(rng, "se.b", 8, scale=0.1),
             _w(rng, "c2.w", 8, 8, 1, 1), _w(rng, "c2.b", 8, scale=0.1),
             numpy_helper.from_array(rng.uniform(0.5, 2, 16).astype(np.float32), "bn.gamma"),
             _w(rng, "bn.beta", 16, scale=0.2), _w(rng, "bn.mean", 16, scale=0.2),
             numpy_helper.from_array(rng.uniform(0.5, 2, 16).astype(np.float32), "bn.var"),
             _w(rng, "fc.w", 5, 16), _w(rng, "fc.b", 5, scale=0.1)]
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "c1.w", "c1.b"], ["c1"], pads=[1, 1, 1, 1]),
        n("HardSwish", ["c1"], ["h"]),
        n("GlobalAveragePool", ["h"], ["se_pool"]),
        n("Conv", ["se_pool", "se.w", "se.b"], ["se_fc"]),
        n("HardSigmoid", ["se_fc"], ["gate"], alpha=1 / 6, beta=0.5),
        n("Mul", ["h", "gate"], ["scaled"]),
        n("Conv", ["scaled", "c2.w", "c2.b"], ["c2"]),
        n("Concat", ["c2", "h"], ["cat"], axis=1),
        n("BatchNormalization", ["cat", "bn.gamma", "bn.beta", "bn.mean", "bn.var"], ["bn"]),
        n("Relu", ["bn"], ["relu"]),
        n("GlobalAveragePool", ["relu"], ["pool"]),
        n("Flatten", ["pool"], ["flat"]),
        n("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], transB=1),
    ]
    g = helper.make_graph(nodes, "island_cnn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 5])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def island_at_output(seed: int = 0) -> onnx.ModelProto:
    """x[1,3,6,6] → Conv → HardSwish → y: the island's float tensor is the graph output."""
    rng = np.random.default_rng(seed)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("HardSwish", ["c"], ["y"])], "island_at_output",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        [_w(rng, "w", 4, 3, 3, 3), _w(rng, "b", 4, scale=0.1)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m
