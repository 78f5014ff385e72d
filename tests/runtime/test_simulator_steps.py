"""NSS steps on hand-built Programs (no MLIR, no ONNX): expected values computed by hand."""
from __future__ import annotations

import ast
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import torq
from torq.compiler import torq_hl
from torq.errors import TorqError
from torq.program import Port, Program, Step
from torq.runtime import ops
from torq.runtime.nss import Simulator

I8 = np.int8


def prog(inputs, steps, consts=None, outputs=None):
    """inputs: [(shape, dtype)] in slots 0..; steps write the next slots; output: the last step."""
    ports = [Port(f"in{i}", i, dt, tuple(s)) for i, (s, dt) in enumerate(inputs)]
    consts = consts or {}
    n = len(inputs) + len(consts) + len(steps)
    last = steps[-1]
    outs = outputs or [Port("out", last.out, last.dtype, tuple(last.shape))]
    return Program(ports, outs, steps, consts, n)


def maxpool_step(shape=(1, 2, 2, 2), dtype="i8"):
    return Step("torq_hl.maxpool2d", [0], 1, {"kernel": np.array([2, 2]), "stride": np.array([2, 2]),
                                              "pad": np.array([0, 0, 0, 0]), "dilation": np.array([1, 1])},
                shape, dtype, "3:7", "MaxPool")


def test_maxpool_step():
    x = np.arange(32).reshape(1, 2, 4, 4).astype(I8) - 16
    (y,) = Simulator(prog([((1, 2, 4, 4), "i8")], [maxpool_step()])).run([x])
    assert y.dtype == I8
    assert y.tolist() == [[[[-11, -9], [-3, -1]], [[5, 7], [13, 15]]]]


def test_step_that_lies_about_its_shape_fails_with_its_location():
    sim = Simulator(prog([((1, 2, 4, 4), "i8")], [maxpool_step((1, 2, 4, 4))]))
    with pytest.raises(TorqError) as e:
        sim.run([np.zeros((1, 2, 4, 4), I8)])
    assert str(e.value) == ("NSS: torq_hl.maxpool2d at 3:7 produced tensor<1x2x2x2xi8>, the program declares "
                            "tensor<1x2x4x4xi8>")


def test_step_that_lies_about_its_element_type_fails_with_its_location():
    st = Step("tensor.collapse_shape", [0], 1, {}, (8,), "i16", "4:1")
    with pytest.raises(TorqError, match=r"^NSS: tensor.collapse_shape at 4:1 produced tensor<8xi8>, the program "
                                        r"declares tensor<8xi16>$"):
        Simulator(prog([((2, 4), "i8")], [st])).run([np.zeros((2, 4), I8)])


def _ntp(acc: int, m: int, s: int) -> int:
    """Round half toward +inf of acc*m/2**s, in exact rationals (independent of numerics)."""
    v = Fraction(acc * m, 2 ** s)
    return int((v + Fraction(1, 2)).__floor__())


def test_conv_1x1_step_native_and_ort():
    x = np.array([[[[10, -20]], [[3, 4]]]], I8)                 # [1, 2, 1, 2]
    w = np.array([[[[2]], [[-1]]], [[[1]], [[1]]]], I8)         # [2, 2, 1, 1]
    bias, mult, shift = [5, -7], [1 << 27, 3 << 26], 28         # rescale 0.5 and 0.75
    sb = np.array([bias[0], mult[0], bias[1], mult[1]], np.int32)
    attrs = dict(input_zp=0, weight_zp=0, output_zp=1, output_min=-128, output_max=127, shift_factor=shift,
                 groups=1, pad=np.zeros(4, np.int64), stride=np.array([1, 1]), dilation=np.array([1, 1]),
                 ort_dq_scale=np.array([0.5, 0.75], np.float32), ort_output_scale=np.array([1.0], np.float32))
    st = Step("torq_hl.conv2d", [1, 2, 0], 3, attrs, (1, 2, 1, 2), "i8", "5:3", "Conv")
    p = prog([((1, 2, 1, 2), "i8")], [st], {1: w, 2: sb})
    acc = np.einsum("nchw,ochw->nohw", x.astype(int), w[:, :, :1, :1].astype(int)) + np.array(bias).reshape(1, 2, 1, 1)
    want_native = [[[[_ntp(int(acc[0, o, 0, j]), mult[o], shift) + 1 for j in range(2)]] for o in range(2)]]
    half_even = lambda v: int(np.rint(float(v)))  # noqa: E731 - ORT: float requant, round half to even
    want_ort = [[[[half_even(acc[0, o, 0, j] * (0.5, 0.75)[o]) + 1 for j in range(2)]] for o in range(2)]]
    sim = Simulator(p)
    assert sim.run([x], "native")[0].tolist() == want_native
    assert sim.run([x], "ort")[0].tolist() == want_ort
    outs, (od,) = sim.run([x], "native", explain=True)
    assert od.op == "torq_hl.conv2d" and od.location == "5:3" and od.mismatches == 0


def test_add_step_native():
    a, b = np.array([[10, 11, -3]], I8), np.array([[0, 1, 5]], I8)
    attrs = dict(input_zp=0, output_zp=-2, output_min=-128, output_max=127, shift_factor=28,
                 weights=np.array([1 << 27, 1 << 26]), scale_bias=np.array([0, 0]), input_zps=np.array([1, 1]),
                 ort_input_scales=np.array([0.5, 0.25], np.float32), ort_output_scale=np.array([1.0], np.float32),
                 ort_zp_shift=0, ort_kernel="QLinearAdd")
    st = Step("torq_hl.add", [0, 1], 2, attrs, (1, 3), "i8", "2:2", "Add")
    (y,) = Simulator(prog([((1, 3), "i8"), ((1, 3), "i8")], [st])).run([a, b])
    exact = [Fraction(x - 1, 2) + Fraction(z - 1, 4) for x, z in zip(a[0].tolist(), b[0].tolist())]
    assert y.tolist() == [[int((v + Fraction(1, 2)).__floor__()) - 2 for v in exact]]


def test_table_and_data_movement_steps():
    table = np.arange(256) - 128
    table = np.clip(table * 2, -128, 127)
    steps = [Step("tensor.pad", [0], 1, {"low": [0, 1], "high": [0, 0], "value": 7}, (1, 4), "i8"),
             Step("linalg.transpose", [1], 2, {"permutation": [1, 0]}, (4, 1), "i8"),
             Step("torq_hl.table", [2], 3, {"table": table}, (4, 1), "i8"),
             Step("tensor.collapse_shape", [3], 4, {}, (4,), "i8")]
    (y,) = Simulator(prog([((1, 3), "i8")], steps)).run([np.array([[1, -2, 100]], I8)])
    assert y.tolist() == [14, 2, -4, 127]


def test_unknown_op_is_refused_with_its_location():
    st = Step("linalg.generic", [0], 1, {}, (1,), "i8", "9:1")
    with pytest.raises(TorqError, match=r"^not supported on NSS: linalg.generic at 9:1: no simulator kernel$"):
        Simulator(prog([((1,), "i8")], [st]))


def _string_literals(folder: Path) -> set[str]:
    out = set()
    for p in folder.rglob("*.py"):
        out |= {n.value for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Constant)
                and isinstance(n.value, str)}
    return out


def test_every_torq_hl_op_has_an_nss_kernel_and_a_rule_that_emits_it():
    from torq.runtime.float_ops import FLOAT_OPS
    assert set(ops.OPS) | set(FLOAT_OPS) == set(torq_hl.OPS)
    emitted = _string_literals(Path(torq.__file__).parent / "compiler" / "patterns")
    assert not [name for name in torq_hl.OPS if name not in emitted]
