"""Float (bf16) contractions for the NSS simulator: float64 sums, their error bounds, and the
exact sums of single outputs on request -- what ``numerics.bf16_arith.exact_finish`` needs.

Every bf16 x bf16 product is exact in float64, so BLAS (float64, any blocking, any order of the
partial GEMMs) gives sums within ``sum_bound(K, Σ|w·x|)`` of the exact ones, and
``Σ|w·x| <= ||w||·||x||`` (Cauchy-Schwarz) bounds that from row and column norms. Each function
returns a ``Sums``: ``v`` [R, C] float64, the bound (``bound`` broadcastable to it, or ``norms``
= (row norms, column norms, K)), and ``exact(rows, cols)`` -> fl32 of the exact sums there.

Convolutions with unit stride run as one GEMM per kernel tap on the flattened padded image
("wide" columns: each tap reads a contiguous slice, the GEMM also computes the padding
columns of every output row, which are dropped), so no column buffer is built; other strides
build the [K, OH*OW] column buffer once. Depthwise convolutions are one compiled pass.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from ... import numerics
from ...numerics.loops import jit
from .blas import gemm_threads

_B = numerics.bf16_arith


class Sums(NamedTuple):
    v: np.ndarray
    bound: object            # array broadcastable to v, or None (then ``norms``)
    exact: Callable
    norms: tuple | None = None


def _row_norms(a: np.ndarray) -> np.ndarray:
    return np.sqrt(np.einsum("ij,ij->i", a, a))


class ConvPlan:
    """A float conv2d (NCHW, groups) with its weights prepared once."""

    def __init__(self, w, pad, stride, dilation, groups):
        w = np.asarray(w, np.float64)
        self.O, self.cg, self.kh, self.kw = w.shape
        self.g = int(groups)
        self.pad, self.stride, self.dil = [int(p) for p in pad], [int(s) for s in stride], [int(d) for d in dilation]
        per = self.O // self.g
        self.w2 = [np.ascontiguousarray(w[i * per:(i + 1) * per].reshape(per, -1)) for i in range(self.g)]
        # per tap (i, j): [O/g, C/g] weights, for the unit-stride wide path
        self.taps = [[np.ascontiguousarray(w[gi * per:(gi + 1) * per, :, i, j]) for i in range(self.kh)
                      for j in range(self.kw)] for gi in range(self.g)]
        self.wn = np.concatenate([_row_norms(m) for m in self.w2])
        self.wide = self.stride == [1, 1] and self.kh * self.kw > 1 and self.g == 1
        self.winograd = Winograd(w) if (self.wide and self.kh == self.kw == 3 and self.dil == [1, 1]
                                        and self.cg >= 4) else None

    def out_hw(self, h, w):
        pl, pr, pt, pb = self.pad
        oh = (h + pt + pb - self.dil[0] * (self.kh - 1) - 1) // self.stride[0] + 1
        ow = (w + pl + pr - self.dil[1] * (self.kw - 1) - 1) // self.stride[1] + 1
        return oh, ow

    def sums(self, x: np.ndarray) -> list[Sums]:
        """Per image of the batch: Sums over [O, OH*OW]."""
        pl, pr, pt, pb = self.pad
        out = []
        for img in np.asarray(x):
            xp = _padded(img, self.pad)
            oh, ow = self.out_hw(*img.shape[1:])
            if self.winograd is not None and oh * ow >= 16:
                v, bound = self.winograd.sums(xp, oh, ow)
                out.append(Sums(v, bound, self._exact_direct(xp, ow)))
            else:
                out.append(self._wide(xp, oh, ow) if self.wide else self._columns(xp, oh, ow))
        return out

    def _exact_direct(self, xp, ow):
        """fl32 of exact sums from the padded image (unit stride, one group): any output."""
        def exact(rows, cs):
            return [_B.exact_sum_f32(self.w2[0][r] * xp[:, (p // ow):(p // ow) + self.kh,
                                                        (p % ow):(p % ow) + self.kw].ravel())
                    for r, p in zip(rows, cs)]
        return exact

    def _columns(self, xp, oh, ow) -> Sums:
        vs, cols = [], []
        for gi in range(self.g):
            col = _im2col(xp[gi * self.cg:(gi + 1) * self.cg], self.kh, self.kw, self.stride, self.dil, oh, ow)
            with gemm_threads(self.w2[gi].shape[0] * col.size):
                vs.append(self.w2[gi] @ col)
            cols.append(col)
        cn = np.sqrt(sum(np.einsum("kp,kp->p", c, c) for c in cols)) if self.g == 1 else None
        if cn is None:      # groups: the bound per group's rows
            bound = np.concatenate([_B.sum_bound(c.shape[0], self.wn[gi * (self.O // self.g):(gi + 1) * (self.O // self.g), None]
                                                 * np.sqrt(np.einsum("kp,kp->p", c, c))[None, :])
                                    for gi, c in enumerate(cols)])
            return Sums(np.concatenate(vs), bound, self._exact_cols(cols))
        return Sums(vs[0], None, self._exact_cols(cols), (self.wn, cn, cols[0].shape[0]))

    def _exact_cols(self, cols):
        per = self.O // self.g

        def exact(rows, cs):
            return [_B.exact_sum_f32(self.w2[r // per][r % per] * cols[r // per][:, c]) for r, c in zip(rows, cs)]
        return exact

    def _wide(self, xp, oh, ow) -> Sums:
        c, hp, wp = xp.shape
        flat = xp.reshape(c, hp * wp)
        length = (oh - 1) * wp + ow
        dh, dw = self.dil
        offs = [i * dh * wp + j * dw for i in range(self.kh) for j in range(self.kw)]
        vs = []
        for gi in range(self.g):
            part = flat[gi * self.cg:(gi + 1) * self.cg]
            acc = np.zeros((self.O // self.g, oh * wp))
            with gemm_threads(acc.shape[0] * part.shape[0] * length * len(offs)):
                for t, off in enumerate(offs):
                    acc[:, :length] += self.taps[gi][t] @ part[:, off:off + length]
            vs.append(acc.reshape(-1, oh, wp)[:, :, :ow].reshape(acc.shape[0], -1))
        sq = np.einsum("chw,chw->hw", xp, xp).reshape(-1)
        box = np.zeros(oh * wp)
        for off in offs:
            box[:length] += sq[off:off + length]
        cn = np.sqrt(box.reshape(oh, wp)[:, :ow].reshape(-1))

        def exact(rows, cs):
            res = []
            for r, p in zip(rows, cs):
                base = (p // ow) * wp + p % ow
                res.append(_B.exact_sum_f32(np.concatenate([self.taps[0][t][r] * flat[:, base + off]
                                                             for t, off in enumerate(offs)])))
            return res
        return Sums(vs[0], None, exact, (self.wn, cn, self.cg * len(offs)))


class Winograd:
    """Float64 Winograd F(2x2, 3x3) for 3x3 / stride 1 / one-group convolutions, with a rigorous
    bound on its distance to the exact sums.

    Y = A^T [(G g G^T) ⊙ (B^T d B)] A is the exact correlation for exact U = G g G^T and
    V = B^T d B (every entry of B, G, A is a dyadic rational, so float64 computes them with at
    most a few roundings): 16 GEMMs over the channels instead of 36 multiplies per 2x2 outputs.
    Rounding of U (<= 9 terms), V (<= 4), the channel GEMM (C) and the output transform (<= 6)
    stays within (C + 19) u (1 + 2^-30) * sum over Winograd positions of Û·V̂ (Û = |G||g||G^T|,
    V̂ = |B^T||d||B|, both >= the magnitudes they bound), and Σ_c Û_c V̂_c <= ||Û|| ||V̂||."""

    BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
    G = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], np.float64)

    def __init__(self, w: np.ndarray):
        o, c = w.shape[:2]
        self.u = np.ascontiguousarray(np.einsum("ai,ocij,bj->aboc", self.G, w, self.G).reshape(16, o, c))
        uabs = np.einsum("ai,ocij,bj->aboc", np.abs(self.G), np.abs(w), np.abs(self.G)).reshape(16, o, c)
        self.nu = np.sqrt(np.einsum("poc,poc->po", uabs, uabs))        # [16, O]
        self.gamma = (c + 19) * 2.0 ** -53 * (1 + 2.0 ** -30)

    def sums(self, xp: np.ndarray, oh: int, ow: int):
        """(v [O, OH*OW], bound [O, OH*OW]) for a padded image xp [C, H', W']."""
        c = xp.shape[0]
        th, tw = -(-oh // 2), -(-ow // 2)
        need_h, need_w = 2 * th + 2, 2 * tw + 2
        if xp.shape[1] < need_h or xp.shape[2] < need_w:
            ext = np.zeros((c, max(need_h, xp.shape[1]), max(need_w, xp.shape[2])))
            ext[:, :xp.shape[1], :xp.shape[2]] = xp
            xp = ext
        v, nv2 = _winograd_in(xp, th, tw)                                   # [16, C, T], [16, T]
        with gemm_threads(16 * self.u.shape[1] * c * th * tw):
            m = np.matmul(self.u, v)                                        # [16, O, T]
        o = m.shape[1]
        out = _winograd_out(m, th, tw, oh, ow)
        nv = np.sqrt(nv2)
        bound = self.gamma * (self.nu.T @ nv)                               # [O, T], each tile's 4 outputs
        bound = np.repeat(np.repeat(bound.reshape(o, th, tw), 2, axis=1), 2, axis=2)[:, :oh, :ow]
        return out.reshape(o, -1), np.ascontiguousarray(bound).reshape(o, -1)


@jit
def _winograd_in(xp, th, tw):
    """V = B^T d B of every 4x4 tile (stride 2) of every channel, and per tile and position the
    sum over channels of V̂² (V̂ = |B^T||d||B|): one pass."""
    c_n = xp.shape[0]
    v = np.empty((16, c_n, th * tw))
    nv2 = np.zeros((16, th * tw))
    d = np.empty((4, 4))
    e = np.empty((4, 4))
    r = np.empty((4, 4))
    ra = np.empty((4, 4))
    for c in range(c_n):
        for ti in range(th):
            for tj in range(tw):
                for i in range(4):
                    for j in range(4):
                        d[i, j] = xp[c, 2 * ti + i, 2 * tj + j]
                        e[i, j] = abs(d[i, j])
                for j in range(4):
                    r[0, j], ra[0, j] = d[0, j] - d[2, j], e[0, j] + e[2, j]
                    r[1, j], ra[1, j] = d[1, j] + d[2, j], e[1, j] + e[2, j]
                    r[2, j], ra[2, j] = d[2, j] - d[1, j], e[2, j] + e[1, j]
                    r[3, j], ra[3, j] = d[1, j] - d[3, j], e[1, j] + e[3, j]
                t = ti * tw + tj
                for i in range(4):
                    vals = (r[i, 0] - r[i, 2], r[i, 1] + r[i, 2], r[i, 2] - r[i, 1], r[i, 1] - r[i, 3])
                    absv = (ra[i, 0] + ra[i, 2], ra[i, 1] + ra[i, 2], ra[i, 2] + ra[i, 1], ra[i, 1] + ra[i, 3])
                    for j in range(4):
                        v[4 * i + j, c, t] = vals[j]
                        nv2[4 * i + j, t] += absv[j] * absv[j]
    return v, nv2


@jit
def _winograd_out(m, th, tw, oh, ow):
    """Y = A^T M A per tile (M [16, O, T]) into [O, OH, OW] (the last row / column cropped)."""
    o_n = m.shape[1]
    out = np.empty((o_n, oh, ow))
    for o in range(o_n):
        for ti in range(th):
            for tj in range(tw):
                t = ti * tw + tj
                a0 = m[0, o, t] + m[4, o, t] + m[8, o, t]
                a1 = m[1, o, t] + m[5, o, t] + m[9, o, t]
                a2 = m[2, o, t] + m[6, o, t] + m[10, o, t]
                a3 = m[3, o, t] + m[7, o, t] + m[11, o, t]
                b0 = m[4, o, t] - m[8, o, t] - m[12, o, t]
                b1 = m[5, o, t] - m[9, o, t] - m[13, o, t]
                b2 = m[6, o, t] - m[10, o, t] - m[14, o, t]
                b3 = m[7, o, t] - m[11, o, t] - m[15, o, t]
                r, q = 2 * ti, 2 * tj
                out[o, r, q] = a0 + a1 + a2
                if q + 1 < ow:
                    out[o, r, q + 1] = a1 - a2 - a3
                if r + 1 < oh:
                    out[o, r + 1, q] = b0 + b1 + b2
                    if q + 1 < ow:
                        out[o, r + 1, q + 1] = b1 - b2 - b3
    return out


def _im2col(xp, kh, kw, stride, dil, oh, ow) -> np.ndarray:
    """[C, H', W'] padded image -> [C*KH*KW, OH*OW] (K in (c, kh, kw) order)."""
    c = xp.shape[0]
    (sh, sw), (dh, dw) = stride, dil
    if kh == kw == 1 and sh == sw == 1:
        return xp.reshape(c, -1)
    st = xp.strides
    view = np.lib.stride_tricks.as_strided(xp, (c, kh, kw, oh, ow), (st[0], st[1] * dh, st[2] * dw, st[1] * sh, st[2] * sw))
    return view.reshape(c * kh * kw, oh * ow)


@jit
def _dw_loop(xp, w, sh, sw, dh, dw, oh, ow):
    """Depthwise taps in one pass per output row (the column loop vectorises): float64 sums
    and sums of |w x| per output."""
    c_n, kh, kw = w.shape[0], w.shape[2], w.shape[3]
    v = np.zeros((c_n, oh, ow))
    a = np.zeros((c_n, oh, ow))
    for c in range(c_n):
        for r in range(oh):
            vr = v[c, r]
            ar = a[c, r]
            for i in range(kh):
                row = xp[c, r * sh + i * dh]
                for j in range(kw):
                    t = w[c, 0, i, j]
                    ta = abs(t)
                    for q in range(ow):
                        x = row[q * sw + j * dw]
                        vr[q] += t * x
                        ar[q] += ta * abs(x)
    return v, a


def _padded(img, pad) -> np.ndarray:
    """[C, H, W] -> float64 [C, H+t+b, W+l+r], zero padding (pad = l, r, t, b): one pass."""
    pl, pr, pt, pb = (int(p) for p in pad)
    c, h, w = img.shape
    if not (pl or pr or pt or pb):
        return np.ascontiguousarray(img, np.float64)
    xp = np.zeros((c, h + pt + pb, w + pl + pr))
    xp[:, pt:pt + h, pl:pl + w] = img
    return xp


def depthwise_sums(x, w, pad, stride, dilation) -> list[Sums]:
    """Depthwise conv (weights [C, 1, KH, KW]): per image, Sums over [C, OH*OW]."""
    w = np.ascontiguousarray(w, np.float64)
    C, _, kh, kw = w.shape
    pl, pr, pt, pb = (int(p) for p in pad)
    (sh, sw), (dh, dw) = [int(s) for s in stride], [int(d) for d in dilation]
    out = []
    for img in np.asarray(x):
        xp = _padded(img, (pl, pr, pt, pb))
        oh = (xp.shape[1] - dh * (kh - 1) - 1) // sh + 1
        ow = (xp.shape[2] - dw * (kw - 1) - 1) // sw + 1
        v, a = _dw_loop(xp, w, sh, sw, dh, dw, oh, ow)

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

    def exact(rows, cols):
        return [_B.exact_sum_f32(xb[r // m, r % m] * yb[r // m, :, c]) for r, c in zip(rows, cols)]
    if xb.shape[0] == 1:
        return Sums(v, None, exact, (xn, yn[0], k))
    return Sums(v, _B.sum_bound(k, xn[:, None] * np.repeat(yn, m, axis=0)), exact)


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
