"""Q·Kᵀ and softmax·V: MatMul of two int8 activations -> torq_hl.matmul, against real ONNX Runtime.

`ort` rounding is bit-exact with ORT's QLinearMatMul (the fused kernel qdqisint8allowed selects);
`native` differs only by explained rounding ties / near-ties (verify's per-op check).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

from compiler.test_lowering_props import ACTS, FORMATS, SETTINGS, check, check_compiled
from qmodels import model, quantize
from torq import compile as torq_compile
from torq.verify import verify


def matmul_model(batch: tuple, m: int, k: int, n: int, transposed: bool):
    """a [*batch, m, k] @ b (b given as [*batch, n, k] and transposed, like attention's K)."""
    if transposed:
        nodes = [helper.make_node("Transpose", ["b"], ["bt"], perm=[*range(len(batch)), len(batch) + 1, len(batch)]),
                 helper.make_node("MatMul", ["a", "bt"], ["y"])]
        b_shape = [*batch, n, k]
    else:
        nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
        b_shape = [*batch, k, n]
    return model(nodes, [("a", [*batch, m, k]), ("b", b_shape)], ["y"]), {"a": [*batch, m, k], "b": b_shape}


@SETTINGS
@given(st.data(), FORMATS, ACTS)
def test_matmul_of_two_activations(data, fmt, act):
    batch = data.draw(st.sampled_from([(), (2,), (1, 3), (2, 2)]))
    m, k, n = (data.draw(st.integers(1, 9)) for _ in range(3))
    mdl, shapes = matmul_model(batch, m, k, n, data.draw(st.booleans()))
    lo, hi = -data.draw(st.floats(0.1, 3)), data.draw(st.floats(0.1, 3))
    q = quantize(mdl, shapes, fmt, False, act, seed=data.draw(st.integers(0, 999)), lo=lo, hi=hi)
    check(q, "matmul")


def test_attention_scores_at_vit_size_are_exact():
    """One ViT-B head group: [1, 12, 197, 64] @ [1, 12, 64, 197] (K = 64), QDQ int8, both roundings."""
    mdl, shapes = matmul_model((1, 12), 197, 64, 197, transposed=True)
    c = check_compiled(torq_compile(quantize(mdl, shapes, "qdq", False, "s8", lo=-3, hi=3)), "matmul", seeds=(0,))
    assert c.report.lowered["matmul"] == 1


@pytest.mark.parametrize("fault", ["zero point not taken off", "requant scale off by 2**-10"])
def test_an_injected_fault_is_caught(monkeypatch, fault):
    """A compiler that forgets a zero point, or a kernel with a slightly wrong ORT scale, must
    make verify fail against ORT."""
    from torq.compiler.patterns import matmul
    from torq.runtime import ops
    if fault.startswith("zero"):
        monkeypatch.setattr(matmul, "_minus_zp", lambda value, zp, loc, ip: value)
    else:
        real = ops.numerics.ort_requant_scale
        monkeypatch.setattr(ops.numerics, "ort_requant_scale", lambda dq, ys: real(dq, ys) * np.float32(1 + 2**-10))
    mdl, shapes = matmul_model((2,), 6, 8, 5, transposed=True)
    r = verify(torq_compile(quantize(mdl, shapes, "qdq", False, "s8", lo=-2, hi=3)), seed=0)
    assert not all(o.exact for o in r.outputs if o.mode == "ort")
    assert not r.ok


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_a_big_k_is_refused_with_a_reason(fmt):
    """K·255·255 beyond int32: the accumulator could wrap, so the rule declines, naming the bound."""
    mdl, shapes = matmul_model((), 1, 40000, 1, transposed=False)
    c = torq_compile(quantize(mdl, shapes, fmt, False, "s8", lo=0, hi=2))     # zero point -128
    assert any("exceeds int32" in u.reason for u in c.report.unsupported), [str(u) for u in c.report.unsupported]
