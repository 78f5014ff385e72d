"""Property test: ReduceMean over any one or more axes, axes as attribute (opset 17) or input
(opset 18), keepdims or not, alone or chained (torchvision's ``x.mean(3).mean(2)``) between a
Conv and a Gemm, quantized by torq (QDQ: the means stay float under one Q; QOperator: each gets
a Q/DQ island) -> avg_pool2d, `ort` rounding bit-exact with ONNX Runtime."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from qmodels import Reader, model
from qmodels import quantize as ort_quantize
from torq.quantize import quantize

from torq import compile

from .test_lowering_props import check, check_compiled

SETTINGS = settings(max_examples=15, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def reduce_means(shape, chain, opset):
    """x -> 1x1 Conv -> ReduceMean(axes_1, keepdims_1) -> ... -> [Flatten] -> Gemm -> y; axes as
    attribute (opset 17) or input (opset 18)."""
    rng = np.random.default_rng(shape[1])
    c = shape[1]
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (c, c) + (1,) * (len(shape) - 2)).astype(np.float32), "w")]
    nodes, x, out_shape = [helper.make_node("Conv", ["x", "w"], ["c"])], "c", list(shape)
    for i, (axes, keep) in enumerate(chain):
        if opset >= 18:
            inits.append(numpy_helper.from_array(np.array(axes, np.int64), f"axes{i}"))
            nodes.append(helper.make_node("ReduceMean", [x, f"axes{i}"], [f"m{i}"], keepdims=keep))
        else:
            nodes.append(helper.make_node("ReduceMean", [x], [f"m{i}"], axes=axes, keepdims=keep))
        axes = [a % len(out_shape) for a in axes]
        out_shape = [1 if d in axes else n for d, n in enumerate(out_shape) if keep or d not in axes]
        x = f"m{i}"
    if len(out_shape) != 2:
        nodes.append(helper.make_node("Flatten", [x], ["flat"], axis=1))
        x, out_shape = "flat", [out_shape[0], int(np.prod(out_shape[1:]))]
    inits.append(numpy_helper.from_array(rng.normal(0, 0.5, (4, out_shape[1])).astype(np.float32), "g"))
    nodes.append(helper.make_node("Gemm", [x, "g"], ["y"], transB=1))
    return model(nodes, [("x", shape)], ["y"], inits, opset=opset)


@st.composite
def chains(draw, shape):
    """One or two ReduceMeans whose axes exist at their point of the chain (negative axes too),
    each averaging at least two elements."""
    out, shape = [], list(shape)
    for _ in range(draw(st.integers(1, 2))):
        rank = len(shape)
        axes = sorted(draw(st.sets(st.integers(0, rank - 1), min_size=1, max_size=min(rank, 2))))
        if not rank or np.prod([shape[a] for a in axes]) < 2:
            break
        keep = draw(st.sampled_from([0, 1]))
        shape = [1 if d in axes else n for d, n in enumerate(shape) if keep or d not in axes]
        out.append(([a - rank for a in axes] if draw(st.booleans()) else axes, keep))
    return out


@SETTINGS
@given(st.data(), st.sampled_from(["qdq", "qoperator"]), st.sampled_from([17, 18]))
def test_reduce_mean(data, fmt, opset):
    shape = [1] + [data.draw(st.integers(2, 7)) for _ in range(data.draw(st.integers(2, 3)))]
    chain = data.draw(chains(shape))
    assume(chain)
    m = reduce_means(shape, chain, opset)
    seed = data.draw(st.integers(0, 999))
    q = quantize(m, quant_format=fmt, full_integer=True,
                 calibration_data_reader=Reader({"x": shape}, seed=seed, lo=-float(seed % 7 + 1) / 4, hi=1.5))
    check(q, "avg_pool2d")


def test_torchvision_mean3_mean2():
    """``x.mean(3).mean(2)`` on [1, 8, 7, 7] -> Gemm: ORT's QDQ quantizer leaves both means float
    under one Q (one average over H·W); torq's quantizer gives each its Q/DQ (two); bit-exact."""
    m = reduce_means([1, 8, 7, 7], [([3], 0), ([2], 0)], 17)
    c = check_compiled(compile(ort_quantize(m, {"x": [1, 8, 7, 7]}, "qdq")), "avg_pool2d")
    assert c.report.lowered["avg_pool2d"] == 1
    for fmt in ("qdq", "qoperator"):
        q = quantize(m, quant_format=fmt, full_integer=True, calibration_data_reader=Reader({"x": [1, 8, 7, 7]}))
        assert check_compiled(compile(q), "avg_pool2d").report.lowered["avg_pool2d"] == 2
