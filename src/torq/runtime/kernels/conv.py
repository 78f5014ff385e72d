"""Exact convolution accumulators: im2col by stride phases + exact GEMM, Winograd for 3x3,
a compiled per-plane loop for depthwise (see the package doc)."""
from __future__ import annotations

import numpy as np

from ...numerics.loops import jit, pair
from .depthwise import depthwise_acc
from .gemm import AccParts, _acc_dtype, _centre, _gemm, _pads, _range, _Weights, conv_out_size
from .winograd import _Winograd
from .workspace import Workspace, empty

_COLS_BUDGET = 1 << 22      # elements of the column buffer per block (16 MiB in float32)
_WIDE_MAX_WASTE = 0.05      # use "wide" columns when the junk columns are at most this fraction
_WINO_MIN_TILES = 32        # Winograd F(2x2, 3x3) when there are at least this many 2x2 tiles


def _phase(xn, a, b, sh, sw, pt, pl, rows, cols_, fill, c, dtype, out=None) -> np.ndarray:
    """Phase (a, b) of the padded image: out[ch, r, q] = xpad[ch, r*sh + a, q*sw + b] - c for
    r < rows, q < cols_ (positions outside the padded image hold ``fill``). xn [C, H, W]."""
    C, H, W = xn.shape
    buf = np.empty((C, rows, cols_), dtype=dtype) if out is None else out
    r0 = max(0, -((a - pt) // sh))
    r1 = min(rows, -((a - pt - H) // sh))
    q0 = max(0, -((b - pl) // sw))
    q1 = min(cols_, -((b - pl - W) // sw))
    if r1 <= r0 or q1 <= q0:
        buf.fill(fill)
        return buf
    if r0:
        buf[:, :r0] = fill
    if r1 < rows:
        buf[:, r1:] = fill
    if q0:
        buf[:, r0:r1, :q0] = fill
    if q1 < cols_:
        buf[:, r0:r1, q1:] = fill
    ys = r0 * sh + a - pt
    xs = q0 * sw + b - pl
    inner = buf[:, r0:r1, q0:q1]
    inner[...] = xn[:, ys:ys + (r1 - r0 - 1) * sh + 1:sh, xs:xs + (q1 - q0 - 1) * sw + 1:sw]
    if c:
        inner -= c
    return buf


class ConvPlan:
    """A convolution with fixed weights / bias / geometry, prepared once for repeated runs.

    ``w`` [O, C/groups, KH, KW] integer weights already ``w - w_zp``; ``bias`` [O] already
    ``bias - in_zp * Σw'`` (or None); padding is filled with ``pad_value`` (= in_zp).
    ``plan(x)`` is ``conv2d_acc(x, w, bias, ...)``; ``plan.parts(x)`` the same accumulator as
    ``AccParts`` (no int64 pass; for a fused requantisation).
    """

    def __init__(self, w, bias=None, pad_lrtb=(0, 0, 0, 0), pad_value: int = 0, stride=1,
                 dilation=1, groups: int = 1):
        w = np.asarray(w)
        if w.ndim != 4:
            raise ValueError("conv2d_acc expects x [N,C,H,W] and w [O,C/g,KH,KW]")
        O, Cg, KH, KW = w.shape
        g = int(groups)
        if g < 1 or O % g:
            raise ValueError(f"bad groups={g} for w shape {w.shape}")
        self.shape = w.shape
        self.groups = g
        self.pads = _pads(pad_lrtb)
        self.pad_value = int(pad_value)
        self.stride = pair(stride)
        self.dilation = pair(dilation)
        w64 = w.astype(np.int64)
        self.wsum = w64.reshape(O, -1).sum(axis=1)
        self.bias = (np.zeros(O, dtype=np.int64) if bias is None
                     else np.asarray(bias).astype(np.int64).reshape(O))
        self.bias_max = int(np.abs(self.bias).max()) if O else 0
        self.depthwise = Cg == 1
        self.row_abs_max = int(np.abs(w64).reshape(O, -1).sum(axis=1).max()) if w64.size else 0
        if self.depthwise:
            self.w64 = w64
            self.wmax = int(np.abs(w64).max()) if w64.size else 0
        self._w = w                          # the weights themselves (no copy), for lazy builds
        self._weights: _Weights | None = None
        self._wino_ok = (not self.depthwise and g == 1 and (KH, KW) == (3, 3)
                         and self.stride == (1, 1) and self.dilation == (1, 1))
        self._wino: _Winograd | None = None

    @property
    def weights(self) -> "_Weights":
        """The GEMM weights [g, O/g, KH*KW*Cg], K in (kh, kw, c) order (built on first use)."""
        if self._weights is None:
            O, Cg, KH, KW = self.shape
            wm = self._w.astype(np.int64).transpose(0, 2, 3, 1).reshape(
                self.groups, O // self.groups, KH * KW * Cg)
            self._weights = _Weights(wm, right=False)
        return self._weights

    # ---------------------------------------------------------------- geometry
    def out_size(self, H: int, W: int) -> tuple[int, int]:
        O, Cg, KH, KW = self.shape
        pl, pr, pt, pb = self.pads
        OH = conv_out_size(H, KH, self.stride[0], self.dilation[0], pt, pb)
        OW = conv_out_size(W, KW, self.stride[1], self.dilation[1], pl, pr)
        return OH, OW

    def __call__(self, x) -> np.ndarray:
        return self.parts(x).int64(axis=1)

    def parts(self, x, ws: Workspace | None = None) -> AccParts:
        """The accumulator; with a workspace ``ws`` its arrays live in ws (valid until ws is
        asked for them again: the caller consumes the accumulator first)."""
        x = np.asarray(x)
        if x.ndim != 4:
            raise ValueError("conv2d_acc expects x [N,C,H,W] and w [O,C/g,KH,KW]")
        N, C, H, W = x.shape
        O, Cg, KH, KW = self.shape
        g = self.groups
        if C != Cg * g:
            raise ValueError(f"bad groups={g} for x channels {C}, w shape {self.shape}")
        OH, OW = self.out_size(H, W)
        if OH <= 0 or OW <= 0:
            raise ValueError("convolution output would be empty")
        has_pad = any(self.pads)
        lo, hi = _range(x, self.pad_value if has_pad else None)
        c, mx, key = _centre(lo, hi)
        extra = self.bias + c * self.wsum if c else self.bias
        raw = max(-lo, hi, 0)
        bound = raw * self.row_abs_max + self.bias_max
        acc_bound = mx * self.row_abs_max
        if self.depthwise:
            acc = depthwise_acc(x, self.w64, self.pads, self.pad_value, c, mx, self.wmax,
                             self.stride, self.dilation, OH, OW, O // C, ws)
            return AccParts(acc, extra, acc_bound, bound)
        if self._wino_ok and ((OH + 1) // 2) * ((OW + 1) // 2) >= _WINO_MIN_TILES:
            if self._wino is None:
                self._wino = _Winograd(self._w.astype(np.int64))
            weng = self._wino.engine(key)
            if weng is not None:
                fill = self.pad_value - c if has_pad else 0
                acc = self._wino.run(x, weng, c, fill, self.pads, OH, OW)
                return AccParts(acc, extra, acc_bound, bound)
        return AccParts(self._dense(x, c, key, OH, OW, ws), extra, acc_bound, bound)

    def _dense(self, x, c, key, OH, OW, ws=None) -> np.ndarray:
        N, C, H, W = x.shape
        O, Cg, KH, KW = self.shape
        g = self.groups
        Og = O // g
        pl, pr, pt, pb = self.pads
        sh, sw = self.stride
        dh, dw = self.dilation
        eng = self.weights.engine(key)
        dtype = eng.dtype
        fill = self.pad_value - c if any(self.pads) else 0    # |fill| <= mx: junk stays small
        # taps: phase (a, b) and offset (ri, rj) inside it
        taps = []
        for i in range(KH):
            ri, a = divmod(i * dh, sh)
            for j in range(KW):
                rj, b = divmod(j * dw, sw)
                taps.append((a, b, ri, rj))
        T = len(taps)
        mri = max(t[2] for t in taps)
        mrj = max(t[3] for t in taps)
        Hq, Wq = OH + mri, OW + mrj
        wide = mrj == 0 or (T > 1 and mrj <= _WIDE_MAX_WASTE * OW)
        rows = Hq + (1 if (wide and mrj) else 0)           # slack row for the last junk columns
        width = Wq if wide else OW
        K = T * Cg
        rb = max(1, min(OH, _COLS_BUDGET // max(1, K * width)))   # output rows per block
        acc = empty(ws, "acc", (N, g, Og, OH, width), _acc_dtype(eng))
        phase_keys = sorted({(t[0], t[1]) for t in taps})
        direct = T == 1 and wide
        colbuf = None
        for n in range(N):
            ph = {k: _phase(x[n], k[0], k[1], sh, sw, pt, pl, rows, Wq, fill, c, dtype,
                            None if ws is None else ws.array(f"phase{k}", (C, rows, Wq), dtype))
                  for k in phase_keys}
            flat = {k: v.reshape(g, Cg, rows * Wq) for k, v in ph.items()}
            out_n = acc[n].reshape(g, Og, OH * width)
            for r0 in range(0, OH, rb):
                r1 = min(OH, r0 + rb)
                Lb = (r1 - r0) * width
                if direct:
                    a, b, ri, rj = taps[0]
                    s0 = (ri + r0) * Wq + rj
                    cols = flat[(a, b)][:, :, s0:s0 + Lb]
                else:
                    if colbuf is None or colbuf.shape[-1] != Lb:
                        colbuf = empty(ws, "cols", (g, T, Cg, Lb), dtype)
                    for t, (a, b, ri, rj) in enumerate(taps):
                        if wide:
                            s0 = (ri + r0) * Wq + rj
                            colbuf[:, t] = flat[(a, b)][:, :, s0:s0 + Lb]
                        else:
                            src = ph[(a, b)].reshape(g, Cg, rows, Wq)
                            colbuf[:, t].reshape(g, Cg, r1 - r0, OW)[...] = \
                                src[:, :, ri + r0:ri + r1, rj:rj + OW]
                    cols = colbuf.reshape(g, K, Lb)
                _gemm(eng, cols, out_n[:, :, r0 * width:r1 * width])
        acc = acc.reshape(N, O, OH, width)
        return acc[..., :OW] if width != OW else acc


def conv2d_acc(x, w, bias=None, pad_lrtb=(0, 0, 0, 0), pad_value: int = 0, stride=1,
               dilation=1, groups: int = 1) -> np.ndarray:
    """Exact integer convolution accumulator (NCHW), int64 [N, O, OH, OW].

    ``x`` raw integer activations [N, C, H, W] (NOT zero-point shifted); ``w`` [O, C/groups,
    KH, KW] integer weights already ``w - w_zp`` (int8 or int16 values); ``bias`` [O] already
    ``bias - in_zp * Σw'`` (or None); padding is filled with ``pad_value`` (= in_zp, so borders
    stay correct). acc[n, o] = Σ_taps xpad * w[o] + bias[o].
    For repeated runs with the same weights, build a ``ConvPlan`` once instead.
    """
    x = np.asarray(x)
    w = np.asarray(w)
    if x.ndim != 4 or w.ndim != 4:
        raise ValueError("conv2d_acc expects x [N,C,H,W] and w [O,C/g,KH,KW]")
    return ConvPlan(w, bias, pad_lrtb, pad_value, stride, dilation, groups)(x)
