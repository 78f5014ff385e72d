"""Small transformer graphs with the shape of what torch's exporter writes for torchvision's
ViT (opset 17): the helpers of tests/vit (not a test file).

`encoder_block` is one ViT encoder layer at toy size, node for node the exported pattern:
multi-head attention that reads its own shape (Shape → Slice → Concat → Reshape, `Mod` on the
axis), picks q/k/v out of one stacked projection with Gather, scales by
`Sqrt(1/Sqrt(Cast(Shape[-1])))` on both q and k, Softmax, and the MLP with exact GELU.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from qmodels import model


class _G:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], {}, 0

    def const(self, value, dtype=np.int64) -> str:
        """A Constant node (the exporter writes shape constants as nodes, not initializers)."""
        self.n += 1
        name = f"c{self.n}"
        self.nodes.append(helper.make_node("Constant", [], [name],
                                           value=numpy_helper.from_array(np.asarray(value, dtype), name + "_v")))
        return name

    def op(self, op_type, inputs, **attrs) -> str:
        self.n += 1
        out = f"{op_type.lower()}{self.n}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def weight(self, name, shape, scale) -> str:
        self.inits[name] = self.rng.normal(0, scale, shape)
        return name


def _attention(g: _G, x: str, seq: int, dim: int, heads: int, softmax: bool) -> str:
    """torch.nn.MultiheadAttention (batch 1, sequence-first inside) as exported."""
    xt = g.op("Transpose", [x], perm=[1, 0, 2])                                     # [S, 1, D]
    qkv = g.op("Add", [g.weight("in_bias", (3 * dim,), 0.1),
                       g.op("MatMul", [xt, g.weight("in_w", (dim, 3 * dim), dim ** -0.5)])])
    mod = g.op("Mod", [g.const([2]), g.const([3])])
    shape = g.op("Shape", [qkv])
    head = g.op("Slice", [shape, g.const([0]), g.op("Reshape", [mod, g.const([1])])])
    tail = g.op("Slice", [shape, g.op("Reshape", [g.op("Add", [mod, g.const([1])]), g.const([1])]),
                          g.const([2**63 - 1])])
    target = g.op("Concat", [head, g.const([3, dim]), tail], axis=0)
    stacked = g.op("Squeeze", [g.op("Transpose", [g.op("Unsqueeze", [g.op("Reshape", [qkv, target]), g.const([0])])],
                                    perm=[3, 1, 2, 0, 4]), g.const([3])])            # [3, S, 1, D]
    qkv_heads = []
    for i in range(3):
        t = g.op("Gather", [stacked, g.const(i)], axis=0)                            # [S, 1, D]
        t = g.op("Transpose", [g.op("Reshape", [t, g.const([seq, heads, dim // heads])])], perm=[1, 0, 2])
        qkv_heads.append(g.op("Reshape", [t, g.const([1, heads, seq, dim // heads])]))
    q, k, v = qkv_heads
    last = g.op("Slice", [g.op("Shape", [q]), g.const([-1]), g.const([2**63 - 1])])
    scale = g.op("Cast", [g.op("Div", [g.const([1.0], np.float32), g.op("Sqrt", [g.op("Cast", [last], to=1)])])], to=1)
    qs = g.op("Mul", [q, g.op("Sqrt", [scale])])
    ks = g.op("Mul", [g.op("Transpose", [k], perm=[0, 1, 3, 2]), g.op("Sqrt", [scale])])
    scores = g.op("MatMul", [qs, ks])
    probs = g.op("Softmax", [scores], axis=-1) if softmax else scores
    ctx = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[2, 0, 1, 3])         # [S, 1, H, dh]
    out = g.op("Gemm", [g.op("Reshape", [ctx, g.const([seq, dim])]), g.weight("out_w", (dim, dim), dim ** -0.5),
                        g.weight("out_b", (dim,), 0.1)], transB=1)
    return g.op("Transpose", [g.op("Reshape", [out, g.const([seq, 1, dim])])], perm=[1, 0, 2])


def encoder_block(seq: int = 5, dim: int = 8, heads: int = 2, seed: int = 0, layer_norm: bool = True,
                  softmax: bool = True):
    """x [1, seq, dim] -> [LN] -> attention -> + x -> [LN] -> MLP (GELU) -> + : one ViT encoder layer.
    Without LayerNorm and Softmax (no exact integer form) every op of it lowers to the NSS."""
    g = _G(seed)
    ln = (lambda t, i: g.op("LayerNormalization", [t, g.weight(f"ln{i}_g", (dim,), 1.0), g.weight(f"ln{i}_b", (dim,), 0.1)],
                            axis=-1, epsilon=1e-6)) if layer_norm else (lambda t, i: t)
    h = g.op("Add", [_attention(g, ln("x", 1), seq, dim, heads, softmax), "x"])
    up = g.op("Add", [g.weight("fc1_b", (2 * dim,), 0.1), g.op("MatMul", [ln(h, 2), g.weight("fc1_w", (dim, 2 * dim), dim ** -0.5)])])
    erf = g.op("Erf", [g.op("Div", [up, g.const(np.sqrt(2.0), np.float32)])])
    gelu = g.op("Mul", [g.op("Mul", [up, g.op("Add", [erf, g.const(1.0, np.float32)])]), g.const(0.5, np.float32)])
    down = g.op("Add", [g.weight("fc2_b", (dim,), 0.1), g.op("MatMul", [gelu, g.weight("fc2_w", (2 * dim, dim), (2 * dim) ** -0.5)])])
    g.nodes.append(helper.make_node("Add", [h, down], ["y"]))
    return model(g.nodes, [("x", [1, seq, dim])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, dim])],
                 g.inits)
