"""int16 activations on the NPU's byte datapath: one exact partial sum per byte plane.

The NPU's ALU multiplies bytes. An int16 convolution / fully connected layer therefore runs
twice over the same int8 weights: once on the signed high bytes of the activations and once
on their unsigned low bytes, each plane padded with the matching byte of the input zero point;
the ACT adds ``(P_h << 8) + P_l`` and the bias (``torq.numerics.int16``). The partial sums
reuse this package's int8 kernels (a high-byte plane is int8, a low-byte plane uint8), so they
are exact and as fast as an int8 layer each.

``abs_acc`` gives the magnitudes ``Σ|x − zx|·|w| + |bias|`` that bound ONNX Runtime's float32
error on the same layer (used only by the per-op checks).
"""
from __future__ import annotations

import numpy as np

from ...numerics.int16 import combine_partials, split_bytes
from .conv import ConvPlan
from .gemm import AccParts, FcPlan
from .workspace import empty, thread_workspace


def _combined(high: AccParts, low: AccParts, bias: np.ndarray, ws=None) -> AccParts:
    """The ACT's sum of two byte-plane accumulators and the bias, as one ``AccParts`` (a float32
    accumulator while every value is below 2**24, else float64: exact, |P_h·256 + P_l| < 2**53;
    the bounds add up the same way)."""
    acc_bound = (high.acc_bound << 8) + low.acc_bound
    exact_in = np.float32 if acc_bound < (1 << 24) else np.float64
    if high.acc.dtype.kind == "f" and low.acc.dtype.kind == "f" and high.acc.shape == low.acc.shape:
        out = high.acc if high.acc.dtype == exact_in else empty(ws, "combined", high.acc.shape, exact_in)
        acc = combine_partials(high.acc, low.acc, out=out)     # in high's buffer, or one of ours
    else:
        acc = combine_partials(high.acc, low.acc)
    extra = combine_partials(high.extra, low.extra) + bias
    bias_max = int(np.abs(bias).max()) if bias.size else 0
    return AccParts(acc, extra, acc_bound, (high.bound << 8) + low.bound + bias_max)


class ByteConv:
    """A convolution with int16 input as two byte-plane ``ConvPlan``s (same geometry)."""

    def __init__(self, w, bias, pad_lrtb, pad_value: int, stride, dilation, groups: int):
        high, low = (int(v) for v in split_bytes(int(pad_value)))
        geometry = dict(pad_lrtb=pad_lrtb, stride=stride, dilation=dilation, groups=groups)
        self.high = ConvPlan(w, None, pad_value=high, **geometry)
        self.low = ConvPlan(w, None, pad_value=low, **geometry)
        self.bias = np.asarray(bias, np.int64).reshape(-1)
        w64 = np.asarray(w, np.int64)
        original = self.bias + int(pad_value) * w64.reshape(len(self.bias), -1).sum(axis=1)   # b = b' + zx·Σw
        self._abs_plan = ConvPlan(np.abs(w64), np.abs(original), pad_value=0, **geometry)

    def parts(self, x, ws=None) -> AccParts:
        h, l = split_bytes(x)
        high = self.high.parts(h, None if ws is None else thread_workspace("high"))   # lives on
        return _combined(high, self.low.parts(l, ws), self.bias, None if ws is None else thread_workspace("high"))

    def abs_acc(self, x, in_zp: int) -> np.ndarray:
        """Σ|x − in_zp|·|w| + |b| per output, b the bias before the zero-point fold (padding
        contributes 0: x − in_zp is 0 there)."""
        return self._abs_plan(np.abs(np.asarray(x, np.int64) - int(in_zp)))


class ByteFc:
    """A fully connected layer with int16 input as two byte-plane ``FcPlan``s."""

    def __init__(self, w, bias, in_zp: int):
        self.high = FcPlan(w, None)
        self.low = FcPlan(w, None)
        self.bias = np.asarray(bias, np.int64).reshape(-1)
        w64 = np.asarray(w, np.int64)
        self._abs_plan = FcPlan(np.abs(w64), np.abs(self.bias + int(in_zp) * w64.sum(axis=1)))

    def parts(self, x, ws=None) -> AccParts:
        h, l = split_bytes(x)
        return _combined(self.high.parts(h), self.low.parts(l), self.bias)

    def abs_acc(self, x, in_zp: int) -> np.ndarray:
        """Σ|x − in_zp|·|w| + |b| per output (b before the zero-point fold)."""
        return self._abs_plan(np.abs(np.asarray(x, np.int64) - int(in_zp)))
