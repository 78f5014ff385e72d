"""Compiled per-element loops (numba) and the memory-layout plumbing they need.

Each loop is one element's formula of a numpy reference elsewhere in ``torq.numerics``
(``native.act_native``, ``ort.requant_ort``, ``native.add_native_mults``' int64 path), written as
a plain loop so the simulator makes one pass over memory instead of numpy's chain of
temporaries; the tests check each loop against its reference element for element. ``jit`` and
``pair`` are also used by the runtime's accumulation kernels.
"""
from __future__ import annotations

import functools
import math

import numpy as np


def jit(fn):
    """``fn`` compiled with numba on its first call (nopython, GIL released, cached on disk).

    The simulator's per-element loops (rescale, Winograd transforms) are written as plain
    loops over one element's formula, so each is one pass over memory instead of numpy's chain
    of temporaries. numba is imported on first use: importing the compiler never pays for it."""
    compiled = None

    @functools.wraps(fn)
    def call(*args):
        nonlocal compiled
        if compiled is None:
            import numba
            try:
                compiled = numba.njit(cache=True, nogil=True)(fn)
            except RuntimeError:            # no writable cache location: compile per process
                compiled = numba.njit(nogil=True)(fn)
        return compiled(*args)
    return call



def pair(v) -> tuple[int, int]:
    """A scalar or 2-sequence (kernel, stride, dilation) as an (h, w) pair of ints."""
    if np.ndim(v) == 0:
        return int(v), int(v)
    t = tuple(int(i) for i in v)
    if len(t) != 2:
        raise ValueError(f"expected 2 values, got {v!r}")
    return t



def bcast(v, ndim: int, axis: int, dtype) -> np.ndarray:
    """Broadcast a scalar, a 1-D per-channel vector (placed on ``axis``), or an array that
    already has ``ndim`` dims (numpy broadcasting), against an ndim-dimensional tensor."""
    a = np.asarray(v, dtype=dtype)
    if a.ndim == 0 or a.ndim == ndim:
        return a
    if a.ndim == 1:
        if ndim == 0:
            raise ValueError("per-channel parameter given for a scalar accumulator")
        shape = [1] * ndim
        shape[axis] = a.shape[0]
        return a.reshape(shape)
    raise ValueError(f"cannot broadcast parameter of shape {a.shape} against a {ndim}-D tensor")



def split_ok(a: np.ndarray, axis: int, out_dtype, lo: int, hi: int) -> bool:
    """Common preconditions of the fused ``*_parts`` fast paths."""
    if a.ndim == 0 or not -a.ndim <= axis < a.ndim or a.dtype.kind not in "iuf":
        return False
    od = np.dtype(out_dtype)
    if od.kind not in "iu":
        return False
    info = np.iinfo(od)
    return info.min <= lo <= hi <= info.max


def parts_int64(acc, extra, axis: int) -> np.ndarray:
    a = np.asarray(acc)
    if a.dtype.kind == "f":
        a = a.astype(np.int64)
    else:
        a = a.astype(np.int64, copy=True)
    e = bcast(np.asarray(extra, dtype=np.int64), a.ndim, axis, np.int64) if a.ndim else extra
    return a + e



def channel_params(v, a: np.ndarray, axis: int, dtype) -> np.ndarray | None:
    """A scalar or per-channel parameter as a 1-D vector over a's channel axis (None if it has
    another shape)."""
    arr = np.asarray(v, dtype=dtype)
    C = a.shape[axis]
    if arr.ndim == 0:
        return np.full(C, arr, dtype=dtype)
    if arr.ndim == 1 and arr.size == C:
        return np.ascontiguousarray(arr)
    return None


def as4d(a: np.ndarray, axis: int) -> np.ndarray:
    """a as [prod(dims before axis), C, prod(dims between), last dim] (a view when numpy can;
    a copy otherwise)."""
    axis %= a.ndim
    pre = math.prod(a.shape[:axis])
    post = a.shape[axis + 1:]
    if len(post) == 0:
        return a.reshape(pre, a.shape[axis], 1, 1)
    return a.reshape(pre, a.shape[axis], math.prod(post[:-1]), post[-1])


def contiguous_rows(a4: np.ndarray) -> np.ndarray:
    """A C-contiguous 4-D array whose ``[:, :, :M, :L]`` is ``a4`` [P, C, M, L]: ``a4`` itself, or
    the buffer it was sliced from when it is a row/column window of one (the GEMM's "wide"
    layout, an odd Winograd output) -- only the window is ever read -- else a copy.

    Compiled loops need it: numba vectorises loops over C-contiguous arrays only, and a strided
    view runs ~50x slower there."""
    if a4.flags.c_contiguous:
        return a4
    P, C, M, L = a4.shape
    it = a4.itemsize
    s0, s1, s2, s3 = a4.strides
    if s3 == it and s2 > 0 and s2 % it == 0 and s2 >= L * it and s1 % s2 == 0 and s1 >= M * s2 and (
            P == 1 or s0 == C * s1) and (C == 1 or s1 > 0):
        W, Mf = s2 // it, s1 // s2
        return np.lib.stride_tricks.as_strided(a4, (P, C, Mf, W), (C * s1, s1, s2, it), writeable=False)
    return np.ascontiguousarray(a4)



def flat_planes(acc: np.ndarray, out: np.ndarray):
    """(acc, out) 4-D [P, C, M, L], each channel plane as one row [P, C, 1, M*L] when both are
    C-contiguous and the same shape (small planes: 7x7 rows are too short for the compiled
    loops to vectorise, a 49-element row is not), else as they are."""
    if acc.shape == out.shape and acc.flags.c_contiguous and out.flags.c_contiguous and acc.ndim == 4:
        P, C, M, L = out.shape
        return acc.reshape(P, C, 1, M * L), out.reshape(P, C, 1, M * L)
    return acc, out


def act_loop(acc, extra, mult, shift, zp, lo, hi, out, ties_even: bool = False):
    """act_native on acc + extra[o] (exact integers, sum within int32), 4-D [pre, O, mid, last];
    ``acc`` may be larger than ``out`` (only ``acc[:, :, :M, :L]`` is read). ``ties_even``: the
    ACT's NTE mode (round half to even) instead of NTP."""
    acc, out4 = flat_planes(acc, out)
    _act_loop(acc, extra, mult, shift, zp, lo, hi, out4, bool(ties_even) and shift > 0)


def requant_ort_loop(acc, extra, scale, zp, lo, hi, out):
    """requant_ort on acc + extra[o] (exact integers, sum within int32), 4-D like act_loop."""
    acc, out4 = flat_planes(acc, out)
    _requant_ort_loop(acc, extra, scale, zp, lo, hi, out4)


@jit
def _act_loop(acc, extra, mult, shift, zp, lo, hi, out, even):
    """NTP: (t + half) >> s. NTE (``even``, shift > 0): the same after t += odd(t >> s) - 1,
    which moves exact ties of an even quotient below the half (``native.nte_shift``)."""
    r = (np.int64(1) << shift) >> 1
    P, O, M, L = out.shape
    for p in range(P):
        for o in range(O):
            e, m = extra[o], mult[o]
            for i in range(M):
                for j in range(L):
                    t = (np.int64(acc[p, o, i, j]) + e) * m
                    if even:
                        t += ((t >> shift) & 1) - 1
                    out[p, o, i, j] = min(max(((t + r) >> shift) + zp, lo), hi)


@jit
def _requant_ort_loop(acc, extra, scale, zp, lo, hi, out):
    flo, fhi = np.float32(lo - zp), np.float32(hi - zp)
    P, O, M, L = out.shape
    for p in range(P):
        for o in range(O):
            e, s = extra[o], scale[o]
            for i in range(M):
                for j in range(L):
                    f = np.float32(np.int64(acc[p, o, i, j]) + e) * s
                    f = min(max(f, flo), fhi)
                    out[p, o, i, j] = np.int64(np.rint(f)) + zp



@jit
def add_loop(a, b, za, zb, mA, mB, shift, zc, lo, hi, out, even=False):
    """``native.add_native_mults``: NTP, or NTE with the zero point added before rounding
    (``even``, shift > 0; the tie rule as in ``_act_loop``)."""
    r = (np.int64(1) << shift) >> 1
    z = np.int64(zc) << shift if even else np.int64(0)
    zo = 0 if even else zc
    for i in range(a.size):
        t = (np.int64(a[i]) - za) * mA + (np.int64(b[i]) - zb) * mB + z
        if even:
            t += ((t >> shift) & 1) - 1
        out[i] = min(max(((t + r) >> shift) + zo, lo), hi)

