"""Float (bf16) contractions for the NSS simulator: float64 sums, their error bounds, and the
exact sums of single outputs on request -- what ``numerics.bf16_arith.exact_finish`` needs.

Every bf16 x bf16 product is exact in float64, so BLAS (float64, any blocking) gives sums within
``sum_bound(K, Σ|w·x|)`` of the exact ones; ``Σ|w·x| <= ||w||·||x||`` (Cauchy-Schwarz) bounds
that from row and column norms, one cheap pass each. Each function returns a ``Sums``:
``v`` [R, C] float64, ``bound`` broadcastable to it, and ``exact(rows, cols)`` -> fl32 of the
exact sums at those positions (numerics.bf16_arith.exact_sum_f32 of their products).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from ... import numerics
from .blas import gemm_threads

_B = numerics.bf16_arith


class Sums(NamedTuple):
    v: np.ndarray
    bound: np.ndarray
    exact: Callable


def _norms(a: np.ndarray, axis: int) -> np.ndarray:
    return np.sqrt(np.einsum("ij,ij->" + ("j" if axis == 0 else "i"), a, a))


class ConvPlan:
    """A float conv2d (NCHW, groups) with its weights prepared once: [g][O/g, K] float64."""

    def __init__(self, w, pad, stride, dilation, groups):
        w = np.asarray(w, np.float64)
        self.O, self.cg, self.kh, self.kw = w.shape
        self.g = int(groups)
        self.pad, self.stride, self.dil = [int(p) for p in pad], [int(s) for s in stride], [int(d) for d in dilation]
        self.w2 = [np.ascontiguousarray(w[i * (self.O // self.g):(i + 1) * (self.O // self.g)].reshape(self.O // self.g, -1))
                   for i in range(self.g)]
        self.wn = [_norms(m, 1) for m in self.w2]

    def out_hw(self, h, w):
        pl, pr, pt, pb = self.pad
        oh = (h + pt + pb - self.dil[0] * (self.kh - 1) - 1) // self.stride[0] + 1
        ow = (w + pl + pr - self.dil[1] * (self.kw - 1) - 1) // self.stride[1] + 1
        return oh, ow

    def columns(self, xp: np.ndarray, oh: int, ow: int) -> np.ndarray:
        """[C, H', W'] padded float64 image -> [C*KH*KW, OH*OW] (K in (c, kh, kw) order)."""
        c = xp.shape[0]
        sh, sw = self.stride
        dh, dw = self.dil
        if self.kh == self.kw == 1 and sh == sw == 1:
            return xp.reshape(c, -1)
        st = xp.strides
        view = np.lib.stride_tricks.as_strided(
            xp, (c, self.kh, self.kw, oh, ow), (st[0], st[1] * dh, st[2] * dw, st[1] * sh, st[2] * sw))
        return view.reshape(c * self.kh * self.kw, oh * ow)

    def sums(self, x: np.ndarray) -> list[Sums]:
        """Per image of the batch: Sums over [O, OH*OW]."""
        pl, pr, pt, pb = self.pad
        out = []
        for img in np.asarray(x, np.float64):
            xp = np.pad(img, ((0, 0), (pt, pb), (pl, pr))) if any(self.pad) else img
            oh, ow = self.out_hw(*img.shape[1:])
            vs, bs, cols = [], [], []
            for gi in range(self.g):
                col = self.columns(np.ascontiguousarray(xp[gi * self.cg:(gi + 1) * self.cg]), oh, ow)
                with gemm_threads(self.w2[gi].shape[0] * col.size):
                    vs.append(self.w2[gi] @ col)
                bs.append(_B.sum_bound(col.shape[0], self.wn[gi][:, None] * _norms(col, 0)[None, :]))
                cols.append(col)
            out.append(Sums(np.concatenate(vs), np.concatenate(bs), self._exact(cols)))
        return out

    def _exact(self, cols):
        per = self.O // self.g

        def exact(rows, cs):
            return [_B.exact_sum_f32(self.w2[r // per][r % per] * cols[r // per][:, c]) for r, c in zip(rows, cs)]
        return exact


def depthwise_sums(x, w, pad, stride, dilation) -> list[Sums]:
    """Depthwise conv (weights [C, 1, KH, KW]): per image, Sums over [C, OH*OW] by taps."""
    w = np.asarray(w, np.float64)
    C, _, kh, kw = w.shape
    pl, pr, pt, pb = (int(p) for p in pad)
    (sh, sw), (dh, dw) = stride, dilation
    out = []
    for img in np.asarray(x, np.float64):
        xp = np.pad(img, ((0, 0), (pt, pb), (pl, pr)))
        oh = (xp.shape[1] - dh * (kh - 1) - 1) // sh + 1
        ow = (xp.shape[2] - dw * (kw - 1) - 1) // sw + 1
        v = np.zeros((C, oh, ow))
        a = np.zeros((C, oh, ow))
        for i in range(kh):
            for j in range(kw):
                win = xp[:, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
                t = w[:, 0, i, j][:, None, None] * win
                v += t
                a += np.abs(t)

        def exact(rows, cs, xp=xp, ow=ow):
            res = []
            for c, p in zip(rows, cs):
                r0, c0 = (p // ow) * sh, (p % ow) * sw
                win = xp[c, r0:r0 + dh * (kh - 1) + 1:dh, c0:c0 + dw * (kw - 1) + 1:dw]
                res.append(_B.exact_sum_f32(w[c, 0] * win))
            return res
        out.append(Sums(v.reshape(C, -1), _B.sum_bound(kh * kw, a.reshape(C, -1)), exact))
    return out


def matmul_sums(x, y) -> Sums:
    """x [..., M, K] @ y [..., K, N] (batch dims broadcast): Sums over [B*M, N]."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    batch = np.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    xb = np.broadcast_to(x, batch + x.shape[-2:]).reshape(-1, *x.shape[-2:])
    yb = np.broadcast_to(y, batch + y.shape[-2:]).reshape(-1, *y.shape[-2:])
    m, k, n = xb.shape[1], xb.shape[2], yb.shape[2]
    with gemm_threads(xb.shape[0] * m * k * n):
        v = np.matmul(xb, yb).reshape(-1, n)
    xn = np.sqrt(np.einsum("bmk,bmk->bm", xb, xb)).reshape(-1)
    yn = np.sqrt(np.einsum("bkn,bkn->bn", yb, yb))
    bound = _B.sum_bound(k, xn[:, None] * np.repeat(yn, m, axis=0))

    def exact(rows, cols):
        return [_B.exact_sum_f32(xb[r // m, r % m] * yb[r // m, :, c]) for r, c in zip(rows, cols)]
    return Sums(v, bound, exact)


def window_sums(x, kernel, stride, pad) -> Sums:
    """Average-pool window sums (zero padding) of x [N, C, H, W]: Sums over [N*C, OH*OW]."""
    x = np.asarray(x, np.float64)
    n, c, h, w = x.shape
    (kh, kw), (sh, sw) = kernel, stride
    pl, pr, pt, pb = (int(p) for p in pad)
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    if kh == h + pt + pb and kw == w + pl + pr:
        v, a = xp.sum(axis=(2, 3)), np.abs(xp).sum(axis=(2, 3))
    else:
        v, a = np.zeros((n, c, oh, ow)), np.zeros((n, c, oh, ow))
        for i in range(kh):
            for j in range(kw):
                win = xp[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
                v += win
                a += np.abs(win)

    def exact(rows, cols):
        flat = xp.reshape(n * c, *xp.shape[2:])
        return [_B.exact_sum_f32(flat[r, (p // ow) * sh:(p // ow) * sh + kh, (p % ow) * sw:(p % ow) * sw + kw])
                for r, p in zip(rows, cols)]
    return Sums(v.reshape(n * c, -1), _B.sum_bound(kh * kw, a.reshape(n * c, -1)), exact)


def axis_sums(x, dims) -> Sums:
    """Sums of x over ``dims``: Sums over [1, outputs] (outputs in x's order without ``dims``)."""
    x = np.asarray(x, np.float64)
    keep = [d for d in range(x.ndim) if d not in dims]
    moved = np.transpose(x, keep + list(dims)).reshape(int(np.prod([x.shape[d] for d in keep])), -1)
    v, a = moved.sum(axis=1), np.abs(moved).sum(axis=1)

    def exact(rows, cols):
        return [_B.exact_sum_f32(moved[c]) for c in cols]
    return Sums(v.reshape(1, -1), _B.sum_bound(moved.shape[1], a.reshape(1, -1)), exact)
