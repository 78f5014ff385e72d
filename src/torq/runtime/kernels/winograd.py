"""Integer Winograd F(2x2, 3x3): 3x3 / stride 1 / single-group convolutions with 16 instead of
36 multiplies per 2x2 output tile, exact (see the transform algebra below)."""
from __future__ import annotations

import numpy as np

from ...numerics.loops import jit
from .blas import all_threads
from .gemm import _F24, _greedy_chunks


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
        with all_threads():                               # 16 GEMMs of one conv: all cores pay off
            for n in range(N):
                _wino_input_tiles(x[n], int(c), np.float32(fill), pt, pl, Th, Tw, V)
                for i, (c0, c1, u) in enumerate(chunks):
                    np.matmul(u, V[:, c0:c1], out=M)
                    if Msum is not None:                  # chunk sums: exact in float64
                        if i == 0:
                            np.copyto(Msum, M)
                        else:
                            Msum += M
                _wino_output(M if Msum is None else Msum, Th, Tw, acc[n])
        return acc[:, :, :OH, :OW]
