"""Exact integer GEMM through BLAS: bounds, input centring, K chunks (see the package doc).

Also the two-part accumulator ``AccParts`` every accumulation kernel returns, and the fully
connected layer (``FcPlan``, ``fc_acc``).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .blas import gemm_threads

_F24 = (1 << 24) - 1
_F53 = 1 << 53
_MIN_F32_CHUNK = 64


def _pads(p) -> tuple[int, int, int, int]:
    if p is None:
        return 0, 0, 0, 0
    t = tuple(int(i) for i in p)
    if len(t) != 4 or min(t) < 0:
        raise ValueError(f"pad_lrtb must be 4 non-negative ints, got {p!r}")
    return t


def conv_out_size(size: int, k: int, stride: int, dilation: int, p0: int, p1: int) -> int:
    """Output extent of a convolution / pooling window (ceil_mode = 0)."""
    return (size + p0 + p1 - dilation * (k - 1) - 1) // stride + 1


class AccParts(NamedTuple):
    """An exact integer accumulator in two parts: ``acc + extra`` (extra broadcast along the
    channel axis) is the true accumulator, bias included.

    acc        integer-valued array (float32, float64, int32 or int64; possibly a strided view)
    extra      int64 [O]
    acc_bound  Python int >= max |acc|
    bound      Python int >= max |acc + extra|
    """
    acc: np.ndarray
    extra: np.ndarray
    acc_bound: int
    bound: int

    def int64(self, axis: int = 1) -> np.ndarray:
        """acc + extra as a fresh int64 array."""
        out = self.acc.astype(np.int64)
        shape = [1] * out.ndim
        if out.ndim:
            shape[axis] = -1
            out += self.extra.reshape(shape)
        return out


def _pow2_at_least(v: int) -> int:
    return 1 << max(0, int(v) - 1).bit_length()


def _range(x: np.ndarray, extra: int | None) -> tuple[int, int]:
    if x.size:
        lo, hi = int(x.min()), int(x.max())
    else:
        lo = hi = 0
    if extra is not None:
        lo, hi = min(lo, int(extra)), max(hi, int(extra))
    return lo, hi


def _centre(lo: int, hi: int) -> tuple[int, int, int]:
    """(c, mx, key): subtract c from the input so that |x - c| <= mx; key = plan key >= mx.

    Centring costs a pass, so it is used only when it lowers the power-of-two plan key."""
    raw = max(-lo, hi, 0)
    c = (lo + hi) // 2
    mc = max(hi - c, c - lo)
    if _pow2_at_least(mc) < _pow2_at_least(raw):
        return c, mc, _pow2_at_least(mc)
    return 0, raw, _pow2_at_least(raw)


class _Engine(NamedTuple):
    dtype: type
    chunks: list            # [(k0, k1, weight matrix in dtype)]


def _greedy_chunks(wm2: np.ndarray, key: int, wmax: int, total: int):
    """Contiguous K chunks [(k0, k1)] of the rows of wm2 [R, K] such that
    ``key * Σ_{k in chunk} |wm2[r, k]| <= 2**24 - 1`` for every row r, or None when float32 would
    need chunks shorter than ``_MIN_F32_CHUNK`` on average (``total`` = key * max_r Σ_k |w|)."""
    K = wm2.shape[1]
    limit = _F24 // key
    if wmax > limit:
        return None
    max_chunks = max(1, K // _MIN_F32_CHUNK)
    if total > (max_chunks + 1) * _F24:     # cannot fit in max_chunks: skip the search
        return None
    absw = np.abs(wm2.astype(np.int64))
    cs = np.zeros((absw.shape[0], K + 1), dtype=np.int64)
    np.cumsum(absw, axis=1, out=cs[:, 1:])
    bounds = []
    k0 = 0
    while k0 < K:
        if len(bounds) >= max_chunks:
            return None
        reach = (cs[:, k0 + 1:] - cs[:, k0:k0 + 1]).max(axis=0)   # non-decreasing
        k1 = k0 + int(np.searchsorted(reach, limit, side="right"))
        bounds.append((k0, k1))
        k0 = k1
    return bounds


class _Weights:
    """A weight matrix wm [g, Og, K] with its exact-GEMM plans, one per input bound key."""

    def __init__(self, wm: np.ndarray, right: bool):
        g, Og, K = wm.shape
        self.K = K
        self.right = right                              # store chunks transposed [g, kc, Og]
        small = wm.size == 0 or (int(wm.min()) >= -(1 << 15) and int(wm.max()) < (1 << 15))
        self.wm = np.ascontiguousarray(wm, dtype=np.int16 if small else np.int64)
        absw = np.abs(wm.reshape(g * Og, K).astype(np.int64))
        self.row_abs = absw.sum(axis=1)                 # Σ_k |w[o, k]|
        self.S = int(self.row_abs.max()) if absw.size else 0
        self.wmax = int(absw.max()) if absw.size else 0
        self._plans: dict[int, _Engine] = {}

    def engine(self, key: int) -> _Engine:
        eng = self._plans.get(key)
        if eng is None:
            eng = self._plans[key] = self._make(key)
        return eng

    def _chunk_bounds(self, key: int):
        total = key * self.S
        if total <= _F24:
            return [(0, self.K)]
        return _greedy_chunks(self.wm.reshape(-1, self.K), key, self.wmax, total)

    def _make(self, key: int) -> _Engine:
        bounds = self._chunk_bounds(key)
        if bounds is not None:
            dtype = np.float32
        elif key * self.S < _F53:
            dtype, bounds = np.float64, [(0, self.K)]
        else:
            dtype, bounds = np.int64, [(0, self.K)]
        chunks = []
        for k0, k1 in bounds:
            m = self.wm[:, :, k0:k1]
            if self.right:
                m = m.transpose(0, 2, 1)
            chunks.append((k0, k1, np.ascontiguousarray(m, dtype=dtype)))
        return _Engine(dtype, chunks)


def _gemm(eng: _Engine, cols: np.ndarray, out: np.ndarray):
    """out[g, Og, L] = Σ_chunks W_chunk @ cols[g, k0:k1, L], exact. ``out`` has the dtype
    ``_acc_dtype(eng)`` (float32 for one float32 chunk, float64 for several)."""
    g, K, L = cols.shape
    with gemm_threads(g * out.shape[1] * K * L):
        _gemm_chunks(eng, cols, out)


def _gemm_chunks(eng: _Engine, cols: np.ndarray, out: np.ndarray):
    chunks = eng.chunks
    g = cols.shape[0]
    if len(chunks) == 1:
        wmat = chunks[0][2]
        if g == 1:
            np.matmul(wmat[0], cols[0], out=out[0])
        else:
            np.matmul(wmat, cols, out=out)
        return
    tmp = np.empty(out.shape, dtype=eng.dtype)
    for i, (k0, k1, wmat) in enumerate(chunks):
        dst = out if (eng.dtype == out.dtype and i == 0) else tmp
        if g == 1:
            np.matmul(wmat[0], cols[0, k0:k1], out=dst[0])
        else:
            np.matmul(wmat, cols[:, k0:k1], out=dst)
        if dst is not out:
            if i == 0:
                np.copyto(out, dst)
            else:
                np.add(out, dst, out=out)


def _acc_dtype(eng: _Engine):
    if eng.dtype is np.float32 and len(eng.chunks) > 1:
        return np.float64
    return eng.dtype


class FcPlan:
    """A fully-connected layer with fixed weights / bias, prepared once (see ``fc_acc``)."""

    def __init__(self, w, bias=None):
        w = np.asarray(w)
        if w.ndim != 2:
            raise ValueError(f"fc_acc: w must be [O, K], got {w.shape}")
        O, K = w.shape
        self.shape = w.shape
        w64 = w.astype(np.int64)
        self.wsum = w64.sum(axis=1)
        self.bias = (np.zeros(O, dtype=np.int64) if bias is None
                     else np.asarray(bias).astype(np.int64).reshape(O))
        self.bias_max = int(np.abs(self.bias).max()) if O else 0
        self.weights = _Weights(w64.reshape(1, O, K), right=True)

    def __call__(self, x) -> np.ndarray:
        return self.parts(x).int64(axis=-1)

    def parts(self, x) -> AccParts:
        x = np.asarray(x)
        O, K = self.shape
        if x.ndim < 1 or x.shape[-1] != K:
            raise ValueError(f"fc_acc: x {x.shape} and w {self.shape} do not match")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, K)
        lo, hi = _range(x2, None)
        c, mx, key = _centre(lo, hi)
        eng = self.weights.engine(key)
        xc = x2.astype(eng.dtype)
        if c:
            xc -= c
        chunks = eng.chunks
        with gemm_threads(x2.shape[0] * O * K):
            if len(chunks) == 1:
                acc = np.matmul(xc, chunks[0][2][0])
            else:
                acc = np.zeros((x2.shape[0], O), dtype=np.float64)
                for k0, k1, wt in chunks:
                    acc += np.matmul(xc[:, k0:k1], wt[0])
        extra = self.bias + c * self.wsum if c else self.bias
        S = self.weights.S
        return AccParts(acc.reshape(*lead, O), extra, mx * S, max(-lo, hi, 0) * S + self.bias_max)


def fc_acc(x, w, bias=None) -> np.ndarray:
    """Exact integer fully-connected accumulator: int64 [..., O] = x @ w.T + bias.

    ``x`` raw integer activations [..., K]; ``w`` [O, K] already ``w - w_zp``; ``bias`` [O]
    already ``bias - in_zp * Σ_k w'[o, k]`` (or None). Same exactness rules as ``conv2d_acc``.
    """
    x = np.asarray(x)
    w = np.asarray(w)
    if w.ndim != 2 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"fc_acc: x {x.shape} and w {w.shape} do not match")
    return FcPlan(w, bias)(x)
