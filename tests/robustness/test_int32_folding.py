"""Conv/FC constants at the int32 limits: a bias zero point that takes `bias − bias_zp` out of int32
is refused with location and value (ORT computes it in int32 and wraps; a wider fold would compile
to other numbers); a folded bias or accumulator beyond int32 wraps exactly as ORT's does."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from robustness.mutants import qconv
from torq.compiler import compile as compile_model


def with_bias(zp: int | None = None, values=None) -> onnx.ModelProto:
    m = qconv(per_channel=True)
    for t in m.graph.initializer:
        if t.name == "b_quantized_zero_point" and zp is not None:
            t.CopyFrom(numpy_helper.from_array(np.full(numpy_helper.to_array(t).shape, zp, np.int32), t.name))
        if t.name == "b_quantized" and values is not None:
            t.CopyFrom(numpy_helper.from_array(np.asarray(values, np.int32), t.name))
    return m


def conv_refusal(compiled) -> str:
    assert "conv2d" not in compiled.report.lowered
    (u,) = [u for u in compiled.report.unsupported if "conv" in str(u)]
    return str(u)


@pytest.mark.parametrize("zp, value", [(2**31 - 1, -2147486814), (-2**31, 2147486319)])
def test_bias_minus_zero_point_outside_int32_is_refused(zp, value):
    msg = conv_refusal(compile_model(with_bias(zp)))
    assert msg.startswith("not supported on NSS: linalg.conv_2d_nchw_fchw at 17:11: ")
    assert f"bias − bias zero point {value} (output channel" in msg and msg.endswith("exceeds int32")


def test_bias_at_the_int32_limits_wraps_like_ort(tmp_path):
    """A bias at the int32 limits (a BatchNorm "dust" channel after ORT's weight-scale widening):
    b' = b − in_zp·Σw′ and acc + b' wrap modulo 2**32 as ORT's int32 accumulator does, so the
    conv lowers and stays bit-exact with ORT."""
    m = with_bias(values=[2**31 - 1, -2**31, 5, 7])
    assert compile_model(m).report.lowered.get("conv2d") == 1
    onnx.save(m, tmp_path / "limits.onnx")
    r = subprocess.run([sys.executable, "-m", "torq.compile_cli", str(tmp_path / "limits.onnx"),
                        "--verify-against-ort", "--rounding", "ort"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr


def test_bias_zero_point_inside_int32_lowers_exactly(tmp_path):
    """A nonzero bias zero point that fits is folded exactly: bit-exact with ORT."""
    m = with_bias(1000)
    assert compile_model(m).report.lowered.get("conv2d") == 1
    onnx.save(m, tmp_path / "zp.onnx")
    r = subprocess.run([sys.executable, "-m", "torq.compile_cli", str(tmp_path / "zp.onnx"),
                        "--verify-against-ort", "--rounding", "ort"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr


def test_a_bias_zero_point_that_lets_the_accumulator_wrap_is_refused():
    """A nonzero bias zero point keeps ORT's Conv in float (no int32 kernel, nothing wraps): when
    the int32 accumulator could leave int32 the conv is refused, naming the channel and its range
    (fuzz: the zero point at 2**31 - 1 compiled, then differed from ORT by 122 LSB)."""
    m = with_bias(values=[5, 7, 9, 11])
    for t in m.graph.initializer:
        if t.name == "b_quantized_zero_point":
            zp = numpy_helper.to_array(t).copy()
            zp[1] = 2**31 - 100
            t.CopyFrom(numpy_helper.from_array(zp, t.name))
    msg = conv_refusal(compile_model(m))
    assert "nonzero bias zero point" in msg and "output channel 1 spans [" in msg and "would wrap" in msg, msg
