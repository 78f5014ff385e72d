"""Exact integer accumulation kernels for the NSS simulator (NCHW; numpy + BLAS, and a few
numba-compiled loops where numpy would need a chain of temporaries).

These are the simulator's hot path. Every function returns the *exact* integer result; no
rounding decision is made here (that is ``torq.numerics``' job).

How exactness is kept while still using BLAS
--------------------------------------------
numpy's integer matmul does not use BLAS and is ~30x slower than float GEMM, so the GEMMs run
in floating point and are made exact by bounding magnitudes:

* The input may be *centred*: ``x' = x - c`` (c the midpoint of the values present, including
  the pad value) when that lowers ``max|x'|`` enough to matter (uint8 / int16 activations;
  int8 activations are used as they are). The shift is undone exactly with the integer term
  ``c * Σ_k w[o, k]`` (every kernel tap reads a real or padded input, so the correction is the
  same for every output position).
* float32: K is split into contiguous chunks such that, for every output channel o,
  ``mx * Σ_{k in chunk} |w[o, k]| <= 2**24 - 1`` (mx bounds |x'|). Every partial sum of a
  chunk's products (in any order, any blocking, with or without FMA) is a sum over a subset
  of the chunk's products, so it is an integer of magnitude < 2**24 and float32 holds it
  exactly. Chunk results are added in float64 (exact below 2**53). Using Σ|w| instead of
  K * max|w| makes chunks longer (usually one chunk per layer).
* When float32 chunks would be short (< 64 on average, e.g. int16 weights) the GEMM runs in
  float64 (exact while mx * Σ|w| < 2**53); beyond that, int64 matmul.

Convolutions (``ConvPlan``): the weights are reordered once to [g, O/g, KH*KW*Cg] (K in
(kh, kw, c) order) and split into chunks; per run, the padded input is converted once to the
GEMM dtype as "phase" images (one per (row, col) residue of the stride, so every tap is a
unit-stride window of a phase), and the column buffer [K, L] is filled with one block copy per
tap. For taps of unit stride the copy is a contiguous slice of the *flattened* phase ("wide"
columns: the GEMM then also computes ``Wq - OW`` junk columns per output row, which are never
read). 1x1 convolutions with one phase need no column buffer at all. The GEMM output [O, L] is
already NCHW. 3x3 / stride 1 / single-group convolutions with enough output (>= 32 2x2 tiles)
use an exact integer Winograd F(2x2, 3x3) instead (16 instead of 36 multiplies per 2x2 output
tile, see ``_Winograd``; its input and output transforms are compiled loops, the 16 GEMMs
BLAS); if its bounds do not hold (wide inputs / weights) the GEMM path runs.

Compiled loops stay single-threaded on purpose: BLAS already uses every core for the GEMMs,
and its worker threads spin for a while after each call, so a second thread pool fights them
(measured: a 2-thread numba Winograd transform made ResNet-18 7x slower on 2 vCPUs).

Depthwise convolutions are computed by summing KH*KW shifted slices (vectorised over channels),
in float32 when KH*KW*max|x'|*max|w| < 2**24, else float64/int64.

Layout: activations [N, C, H, W]; conv weights [O, C/groups, KH, KW]; fc weights [O, K].
``pad_lrtb`` is (left, right, top, bottom) as in ``torq_hl`` ops (ONNX ``pads`` is
[top, left, bottom, right]). Pooling assumes ceil_mode = 0.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..numerics.loops import jit, pair

__all__ = ["conv_out_size", "conv2d_acc", "fc_acc", "pool_sum", "maxpool", "ConvPlan", "FcPlan",
           "AccParts", "BYTE_TYPES", "byte_grid", "pair_lookup"]

_F24 = (1 << 24) - 1
_F53 = 1 << 53
_MIN_F32_CHUNK = 64
_COLS_BUDGET = 1 << 22      # elements of the column buffer per block (16 MiB in float32)
_WIDE_MAX_WASTE = 0.05      # use "wide" columns when the junk columns are at most this fraction
_WINO_MIN_TILES = 32        # Winograd F(2x2, 3x3) when there are at least this many 2x2 tiles


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


# Winograd F(2x2, 3x3) with integer transforms (interpolation points 0, 1, -1, inf):
#   V = B^T d B,  B^T = [[1,0,-1,0], [0,1,1,0], [0,-1,1,0], [0,1,0,-1]]      (|V| <= 4 max|d|)
#   U = G g G^T,  G = [[2,0,0], [1,1,1], [1,-1,1], [0,0,2]]   (twice the textbook G: integer U)
#   4 * y = A^T (U ⊙ V) A,  A^T = [[1,1,1,0], [0,1,-1,-1]]
# so a 4x4 input tile gives a 2x2 output tile with 16 instead of 36 multiplies. Each of the 16
# (xi, nu) positions is a GEMM over the input channels, made exact by the float32 chunk rule
# with |V| <= 4*key; the input and output transforms are compiled loops (one pass each). The
# guard 4*key * max_o Σ_{xi,nu,c} |U| < 2**31 bounds every product sum, so the output
# transform is exact in int32; the final division by 4 is an exact shift.
_WG = np.array([[2, 0, 0], [1, 1, 1], [1, -1, 1], [0, 0, 2]], dtype=np.int64)


@jit
def _wino_input_tiles(x, c, fill, pt, pl, Th, Tw, V):
    """V[4a + b, ch, ty*Tw + tx] = (B^T d B)[a, b] of the 4x4 tile d of the padded, centred input
    (x - c inside, ``fill`` outside) at rows 2ty - pt.., columns 2tx - pl..; x [C, H, W].

    Each padded row is split into its even and odd columns first, so every later loop is
    unit-stride (and vectorises)."""
    C, H, W = x.shape
    Hp = 2 * Th + 2
    E = np.empty((Hp, Tw + 1), dtype=np.float32)      # even / odd columns of the padded rows
    D = np.empty((Hp, Tw + 1), dtype=np.float32)
    RE = np.empty((4, Tw + 1), dtype=np.float32)      # B^T d (rows), even / odd columns
    RO = np.empty((4, Tw + 1), dtype=np.float32)
    n = Tw + 1
    for ch in range(C):
        for i in range(Hp):
            y = i - pt
            for ph in range(2):                    # dst[k] = x[ch, y, 2k + off] - c, or fill
                dst = E[i] if ph == 0 else D[i]
                off = ph - pl
                k0 = min(n, max(0, (1 - off) // 2)) if 0 <= y < H else n   # first 2k + off >= 0
                k1 = min(n, max(k0, (W - off + 1) // 2))                   # first 2k + off >= W
                for k in range(k0):
                    dst[k] = fill
                for k in range(k0, k1):
                    dst[k] = np.float32(x[ch, y, 2 * k + off] - c)
                for k in range(k1, n):
                    dst[k] = fill
        for ty in range(Th):
            i = 2 * ty
            for k in range(Tw + 1):
                RE[0, k] = E[i, k] - E[i + 2, k]
                RE[1, k] = E[i + 1, k] + E[i + 2, k]
                RE[2, k] = E[i + 2, k] - E[i + 1, k]
                RE[3, k] = E[i + 1, k] - E[i + 3, k]
                RO[0, k] = D[i, k] - D[i + 2, k]
                RO[1, k] = D[i + 1, k] + D[i + 2, k]
                RO[2, k] = D[i + 2, k] - D[i + 1, k]
                RO[3, k] = D[i + 1, k] - D[i + 3, k]
            t0 = ty * Tw
            for a in range(4):                             # ... times B
                for tx in range(Tw):
                    V[4 * a, ch, t0 + tx] = RE[a, tx] - RE[a, tx + 1]
                    V[4 * a + 1, ch, t0 + tx] = RO[a, tx] + RE[a, tx + 1]
                    V[4 * a + 2, ch, t0 + tx] = RE[a, tx + 1] - RO[a, tx]
                    V[4 * a + 3, ch, t0 + tx] = RO[a, tx] - RO[a, tx + 1]


@jit
def _wino_output(M, Th, Tw, out):
    """out[o, 2ty + u, 2tx + v] = (A^T m A)[u, v] / 4 of the tile products m = M[:, o, ty*Tw + tx]
    (exact integers below 2**31 in magnitude, as are all partial sums: int32 arithmetic);
    out [O, 2Th, 2Tw]. A tile row is computed into four contiguous buffers (vectorises), then
    interleaved."""
    O = out.shape[0]
    y00 = np.empty(Tw, dtype=np.int32)
    y01 = np.empty(Tw, dtype=np.int32)
    y10 = np.empty(Tw, dtype=np.int32)
    y11 = np.empty(Tw, dtype=np.int32)
    for o in range(O):
        for ty in range(Th):
            t0 = ty * Tw
            for tx in range(Tw):
                t = t0 + tx
                a0 = np.int32(M[0, o, t]) + np.int32(M[4, o, t]) + np.int32(M[8, o, t])
                a1 = np.int32(M[1, o, t]) + np.int32(M[5, o, t]) + np.int32(M[9, o, t])
                a2 = np.int32(M[2, o, t]) + np.int32(M[6, o, t]) + np.int32(M[10, o, t])
                a3 = np.int32(M[3, o, t]) + np.int32(M[7, o, t]) + np.int32(M[11, o, t])
                b0 = np.int32(M[4, o, t]) - np.int32(M[8, o, t]) - np.int32(M[12, o, t])
                b1 = np.int32(M[5, o, t]) - np.int32(M[9, o, t]) - np.int32(M[13, o, t])
                b2 = np.int32(M[6, o, t]) - np.int32(M[10, o, t]) - np.int32(M[14, o, t])
                b3 = np.int32(M[7, o, t]) - np.int32(M[11, o, t]) - np.int32(M[15, o, t])
                y00[tx] = (a0 + a1 + a2) >> 2
                y01[tx] = (a1 - a2 - a3) >> 2
                y10[tx] = (b0 + b1 + b2) >> 2
                y11[tx] = (b1 - b2 - b3) >> 2
            for tx in range(Tw):
                out[o, 2 * ty, 2 * tx] = y00[tx]
                out[o, 2 * ty, 2 * tx + 1] = y01[tx]
                out[o, 2 * ty + 1, 2 * tx] = y10[tx]
                out[o, 2 * ty + 1, 2 * tx + 1] = y11[tx]


class _Winograd:
    """A 3x3 / stride 1 / dilation 1 / single-group convolution in the Winograd domain."""

    def __init__(self, w64: np.ndarray):
        O, C = w64.shape[:2]
        U = np.einsum("ai,ocij,bj->aboc", _WG, w64, _WG).reshape(16, O, C)
        absu = np.abs(U)
        self.O, self.C = O, C
        self.S = int(absu.sum(axis=2).max()) if U.size else 0           # max Σ_c |U|
        self.tot = int(absu.sum(axis=(0, 2)).max()) if U.size else 0    # max_o Σ_{xi,nu,c} |U|
        self.umax = int(absu.max()) if U.size else 0
        self.U = U.astype(np.int16 if self.umax < (1 << 15) else np.int64)
        self._plans: dict[int, list | None] = {}

    def engine(self, key: int) -> "list | None":
        """Chunks [(c0, c1, U chunk float32 [16, O, c1 - c0])] for inputs |x'| <= key, or None if
        the bounds do not hold."""
        if key not in self._plans:
            vkey = 4 * key
            eng = None
            if vkey * self.tot < (1 << 31):
                total = vkey * self.S
                bounds = [(0, self.C)] if total <= _F24 else _greedy_chunks(
                    self.U.reshape(-1, self.C), vkey, self.umax, total)
                if bounds is not None:
                    eng = [(c0, c1, np.ascontiguousarray(self.U[:, :, c0:c1], dtype=np.float32))
                           for c0, c1 in bounds]
            self._plans[key] = eng
        return self._plans[key]

    def run(self, x, chunks: list, c, fill, pads, OH, OW) -> np.ndarray:
        """Accumulator without bias, int32 [N, O, OH, OW] (a window of [N, O, 2Th, 2Tw])."""
        N, C, H, W = x.shape
        pl, pr, pt, pb = pads
        Th, Tw = (OH + 1) // 2, (OW + 1) // 2
        V = np.empty((16, C, Th * Tw), dtype=np.float32)
        M = np.empty((16, self.O, Th * Tw), dtype=np.float32)
        Msum = np.empty(M.shape, dtype=np.float64) if len(chunks) > 1 else None
        acc = np.empty((N, self.O, 2 * Th, 2 * Tw), dtype=np.int32)
        for n in range(N):
            _wino_input_tiles(x[n], int(c), np.float32(fill), pt, pl, Th, Tw, V)
            for i, (c0, c1, u) in enumerate(chunks):
                np.matmul(u, V[:, c0:c1], out=M)
                if Msum is not None:                      # chunk sums: exact in float64
                    if i == 0:
                        np.copyto(Msum, M)
                    else:
                        Msum += M
            _wino_output(M if Msum is None else Msum, Th, Tw, acc[n])
        return acc[:, :, :OH, :OW]


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

    def parts(self, x) -> AccParts:
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
            acc = _depthwise(x, self.w64, self.pads, self.pad_value, c, mx, self.wmax,
                             self.stride, self.dilation, OH, OW, O // C)
            return AccParts(acc, extra, acc_bound, bound)
        if self._wino_ok and ((OH + 1) // 2) * ((OW + 1) // 2) >= _WINO_MIN_TILES:
            if self._wino is None:
                self._wino = _Winograd(self._w.astype(np.int64))
            weng = self._wino.engine(key)
            if weng is not None:
                fill = self.pad_value - c if has_pad else 0
                acc = self._wino.run(x, weng, c, fill, self.pads, OH, OW)
                return AccParts(acc, extra, acc_bound, bound)
        return AccParts(self._dense(x, c, key, OH, OW), extra, acc_bound, bound)

    def _dense(self, x, c, key, OH, OW) -> np.ndarray:
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
        acc = np.empty((N, g, Og, OH, width), dtype=_acc_dtype(eng))
        phase_keys = sorted({(t[0], t[1]) for t in taps})
        direct = T == 1 and wide
        colbuf = None
        for n in range(N):
            ph = {k: _phase(x[n], k[0], k[1], sh, sw, pt, pl, rows, Wq, fill, c, dtype)
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
                        colbuf = np.empty((g, T, Cg, Lb), dtype=dtype)
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


def _depthwise(x, w64, pads, pad_value, c, mx, mw, stride, dilation, OH, OW, mult):
    """Depthwise accumulator without bias, int64 [N, O, OH, OW], of (x - c) (pad: value - c)."""
    N, C, H, W = x.shape
    O, _, KH, KW = w64.shape
    sh, sw = stride
    dh, dw = dilation
    bound = KH * KW * mx * mw
    dtype = np.float32 if bound <= _F24 else (np.float64 if bound < _F53 else np.int64)
    wt = np.ascontiguousarray(w64.reshape(O, KH * KW).T.astype(dtype))   # [taps, O]
    out = np.empty((N, O, OH, OW), dtype=np.int64)
    # Work on blocks of input channels so the padded input, the accumulator and the temporary
    # stay cache-resident (fresh full-size temporaries cost more than the arithmetic).
    per_c = N * mult * max(OH * OW, x.shape[2] * x.shape[3])
    cb = max(1, min(C, (1 << 16) // max(1, per_c)))
    for c0 in range(0, C, cb):
        c1 = min(C, c0 + cb)
        xp = _padded(x[:, c0:c1], pads, pad_value, c, dtype)
        if mult > 1:
            xp = np.repeat(xp, mult, axis=1)      # output channel o reads input channel o // mult
        o0, o1 = c0 * mult, c1 * mult
        acc = np.zeros((N, o1 - o0, OH, OW), dtype=dtype)
        tmp = np.empty_like(acc)
        for i in range(KH):
            for j in range(KW):
                h0, w0 = i * dh, j * dw
                sl = xp[:, :, h0:h0 + sh * (OH - 1) + 1:sh, w0:w0 + sw * (OW - 1) + 1:sw]
                np.multiply(sl, wt[i * KW + j, o0:o1].reshape(1, -1, 1, 1), out=tmp)
                acc += tmp
        out[:, o0:o1] = acc
    return out


def _padded(x: np.ndarray, pads, value: int, c: int, dtype) -> np.ndarray:
    """x - c, padded with value - c, in dtype."""
    N, C, H, W = x.shape
    pl, pr, pt, pb = pads
    xp = np.empty((N, C, H + pt + pb, W + pl + pr), dtype=dtype)
    if pt or pb or pl or pr:
        xp.fill(value - c)
    inner = xp[:, :, pt:pt + H, pl:pl + W]
    inner[...] = x
    if c:
        inner -= c
    return xp


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


BYTE_TYPES = (np.dtype(np.int8), np.dtype(np.uint8))


def byte_grid(dtype) -> np.ndarray:
    """All 256 values of a one-byte integer dtype, in increasing order."""
    info = np.iinfo(dtype)
    return np.arange(info.min, info.max + 1).astype(dtype)


def pair_lookup(x: np.ndarray, y: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``table[(x - min) * 256 + (y - min)]`` for same-shaped one-byte arrays x, y (min of each
    dtype): a binary byte op evaluated through the table of its 65536 results."""
    out = np.empty(x.shape, dtype=table.dtype)
    _pair_lookup(np.ascontiguousarray(x).reshape(-1), np.ascontiguousarray(y).reshape(-1),
                 int(np.iinfo(x.dtype).min), int(np.iinfo(y.dtype).min), table, out.reshape(-1))
    return out


@jit
def _pair_lookup(x, y, xmin, ymin, table, out):
    for i in range(x.size):
        out[i] = table[(np.int64(x[i]) - xmin) * 256 + (np.int64(y[i]) - ymin)]


def _window_view(xp, kernel, stride, dilation, OH, OW):
    kh, kw = kernel
    sh, sw = stride
    dh, dw = dilation
    sN, sC, sH, sW = xp.strides
    N, C = xp.shape[:2]
    return as_strided(xp, shape=(N, C, OH, OW, kh, kw),
                      strides=(sN, sC, sH * sh, sW * sw, sH * dh, sW * dw), writeable=False)


def pool_sum(x, kernel, stride, pad_lrtb=(0, 0, 0, 0), count_include_pad: bool = False,
             zp: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Average-pool window sums of (x - zp), and the divisor of every output position.

    Returns ``(sums int64 [N, C, OH, OW], counts int64 [OH, OW])``. Padded positions contribute
    0 (they hold zp); ``counts`` is kh*kw when ``count_include_pad`` else the number of valid
    (non-padded) positions of each window.
    """
    x = np.asarray(x)
    N, C, H, W = x.shape
    kh, kw = pair(kernel)
    sh, sw = pair(stride)
    pl, pr, pt, pb = _pads(pad_lrtb)
    OH = conv_out_size(H, kh, sh, 1, pt, pb)
    OW = conv_out_size(W, kw, sw, 1, pl, pr)
    d = np.zeros((N, C, H + pt + pb, W + pl + pr), dtype=np.int32)
    inner = d[:, :, pt:pt + H, pl:pl + W]
    inner[...] = x
    inner -= int(zp)
    if kh * kw <= 25:
        s = np.zeros((N, C, OH, OW), dtype=np.int32)
        for i in range(kh):
            for j in range(kw):
                s += d[:, :, i:i + sh * (OH - 1) + 1:sh, j:j + sw * (OW - 1) + 1:sw]
        sums = s.astype(np.int64)
    else:
        sums = _window_view(d, (kh, kw), (sh, sw), (1, 1), OH, OW).sum(axis=(4, 5),
                                                                       dtype=np.int64)
    if count_include_pad:
        counts = np.full((OH, OW), kh * kw, dtype=np.int64)
    else:
        hs = np.arange(OH) * sh - pt
        ws = np.arange(OW) * sw - pl
        rows = np.minimum(hs + kh, H) - np.maximum(hs, 0)
        cols = np.minimum(ws + kw, W) - np.maximum(ws, 0)
        counts = (rows[:, None] * cols[None, :]).astype(np.int64)
    return sums, counts


def maxpool(x, kernel, stride, pad_lrtb=(0, 0, 0, 0), dilation=1) -> np.ndarray:
    """Max pool (NCHW, ceil_mode 0); padded positions are ignored (filled with the dtype's
    minimum, i.e. -inf for the max). Result has x's dtype."""
    x = np.asarray(x)
    N, C, H, W = x.shape
    kh, kw = pair(kernel)
    sh, sw = pair(stride)
    dh, dw = pair(dilation)
    pl, pr, pt, pb = _pads(pad_lrtb)
    OH = conv_out_size(H, kh, sh, dh, pt, pb)
    OW = conv_out_size(W, kw, sw, dw, pl, pr)
    low = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf
    xp = np.full((N, C, H + pt + pb, W + pl + pr), low, dtype=x.dtype)
    xp[:, :, pt:pt + H, pl:pl + W] = x
    if kh * kw <= 25:
        # separable: max over the kernel columns (every padded row used), then over its rows
        rows = xp[:, :, :sh * (OH - 1) + dh * (kh - 1) + 1]
        r = None
        for j in range(kw):
            sl = rows[:, :, :, j * dw:j * dw + sw * (OW - 1) + 1:sw]
            r = sl.copy() if r is None else np.maximum(r, sl, out=r)
        out = None
        for i in range(kh):
            sl = r[:, :, i * dh:i * dh + sh * (OH - 1) + 1:sh]
            out = sl.copy() if out is None else np.maximum(out, sl, out=out)
        return out
    return _window_view(xp, (kh, kw), (sh, sw), (dh, dw), OH, OW).max(axis=(4, 5))
