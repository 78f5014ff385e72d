"""linalg_view recognisers on small MLIR snippets (torch-mlir's own spellings), FileCheck-style:
parse text, look at one generic, assert what the recogniser reads from it."""
from __future__ import annotations

import numpy as np
import pytest

from torq.compiler import importer
from torq.compiler import linalg_view as L
from torq.compiler import recognise as R
from torq.compiler.lowering import func_ops

HEAD = "#map = affine_map<(d0, d1) -> (d0, d1)>\n"
GENERIC = """  %{res} = linalg.generic {{indexing_maps = [{maps}], iterator_types = ["parallel", "parallel"]}} ins({ins}) outs(%{init} : tensor<1x4x{oty}>) {{
  ^bb0({bargs}, %out: {oty}):
{body}
  }} -> tensor<1x4x{oty}>"""


def generic(body: str, ity="i8", oty="f32"):
    """The one linalg.generic of a function whose body is `body` (block args %in, %out)."""
    ins, bargs, maps = f"%arg0 : tensor<1x4x{ity}>", f"%in: {ity}", "#map, #map"
    text = HEAD + f"""module {{
  func.func @f(%arg0: tensor<1x4x{ity}>) -> tensor<1x4x{oty}> {{
  %e = tensor.empty() : tensor<1x4x{oty}>
""" + GENERIC.format(res="r", maps=maps, ins=ins, init="e", oty=oty, bargs=bargs, body=body) + f"""
  return %r : tensor<1x4x{oty}>
  }}
}}"""
    module = importer.parse(text)
    ctx = module.context
    ctx.__enter__()
    try:
        op = next(o for o in func_ops(module) if o.name == "linalg.generic")
        return L.Generic(op, L.Folder()), module
    finally:
        ctx.__exit__(None, None, None)


DQ_BODY = """    %c8 = arith.constant 8 : i64
    %s = arith.constant 0.00731242308 : f32
    %5 = arith.extsi %in : i8 to i64
    %6 = arith.subi %5, %c8 : i64
    %7 = arith.sitofp %6 : i64 to f32
    %8 = arith.mulf %7, %s : f32
    linalg.yield %8 : f32"""

Q_BODY = """    %s = arith.constant 0.00276382663 : f32
    %zp = arith.constant -1.280000e+02 : f32
    %hi = arith.constant 1.270000e+02 : f32
    %5 = arith.divf %in, %s : f32
    %6 = math.roundeven %5 : f32
    %7 = arith.addf %6, %zp : f32
    %8 = arith.maximumf %7, %zp : f32
    %9 = arith.minimumf %8, %hi : f32
    %10 = arith.fptosi %9 : f32 to i8
    linalg.yield %10 : i8"""


def test_as_dequant_reads_scale_and_zero_point():
    g, m = generic(DQ_BODY)
    with m.context:
        d = R.as_dequant(g)
        assert R.as_quant(g) is None
    assert d.source_index == 0 and d.zp == 8 and d.scale == np.float32(0.00731242308)


def test_as_dequant_without_zero_point():
    body = DQ_BODY.replace("%6 = arith.subi %5, %c8 : i64\n", "").replace("arith.sitofp %6", "arith.sitofp %5")
    g, m = generic(body)
    with m.context:
        d = R.as_dequant(g)
    assert d.zp == 0 and d.scale == np.float32(0.00731242308)


def test_as_quant_reads_scale_zero_point_and_bounds():
    g, m = generic(Q_BODY, ity="f32", oty="i8")
    with m.context:
        q = R.as_quant(g)
        assert R.as_dequant(g) is None
    assert (q.source_index, q.zp, q.lo, q.hi, q.out_dtype) == (0, -128, -128, 127, np.int8)
    assert q.scale == np.float32(0.00276382663)


def test_as_quant_clamp_tightens_bounds():
    body = Q_BODY.replace("%8 = arith.maximumf %7, %zp : f32", "%lo = arith.constant -1.000000e+02 : f32\n"
                          "    %8 = arith.maximumf %7, %lo : f32")
    g, m = generic(body, ity="f32", oty="i8")
    with m.context:
        q = R.as_quant(g)
    assert (q.lo, q.hi) == (-100, 127)


@pytest.mark.parametrize("op", ["math.floor", "math.round"])
def test_as_quant_refuses_other_rounding(op):
    g, m = generic(Q_BODY.replace("math.roundeven", op), ity="f32", oty="i8")
    with m.context:
        assert R.as_quant(g) is None


CLAMP_MAXMIN = """    %lo = arith.constant 0.000000e+00 : f32
    %hi = arith.constant 6.000000e+00 : f32
    %5 = arith.maximumf %in, %lo : f32
    %6 = arith.minimumf %5, %hi : f32
    linalg.yield %6 : f32"""

CLAMP_SELECT = """    %lo = arith.constant 0.000000e+00 : f32
    %5 = arith.cmpf ugt, %in, %lo : f32
    %6 = arith.select %5, %in, %lo : f32
    linalg.yield %6 : f32"""


@pytest.mark.parametrize("body,want", [(CLAMP_MAXMIN, (0.0, 6.0)), (CLAMP_SELECT, (0.0, np.inf))])
def test_as_clamp_in_both_spellings(body, want):
    g, m = generic(body, ity="f32", oty="f32")
    with m.context:
        assert R.as_clamp(g) == want


def test_as_clamp_refuses_a_non_clamp():
    g, m = generic(CLAMP_MAXMIN.replace("arith.minimumf", "arith.addf"), ity="f32", oty="f32")
    with m.context:
        assert R.as_clamp(g) is None


def test_as_scalar_op_reads_the_constant():
    body = """    %c = arith.constant 9.000000e+00 : f32
    %5 = arith.divf %in, %c : f32
    linalg.yield %5 : f32"""
    g, m = generic(body, ity="f32", oty="f32")
    with m.context:
        idx, c = R.as_scalar_op(g, "arith.divf")
        assert R.as_scalar_op(g, "arith.mulf") is None
    assert idx == 0 and float(np.asarray(c)) == 9.0
