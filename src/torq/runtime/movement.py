"""NSS kernels of the data-movement ops a lowered program keeps (pad, reshapes, transpose, ...):
one per op of ``torq.isa.DATA_MOVEMENT``."""
from __future__ import annotations

import numpy as np


def _pad(st, rtype):
    widths, value = list(zip(st.attrs["low"], st.attrs["high"])), st.attrs["value"]
    return lambda a, r: np.pad(a[0], widths, constant_values=value)


def _reshape(st, rtype):
    shape = tuple(st.shape)
    return lambda a, r: a[0].reshape(shape)


def _transpose(st, rtype):
    perm = list(st.attrs["permutation"])
    return lambda a, r: np.ascontiguousarray(np.transpose(a[0], perm))


def _broadcast(st, rtype):
    dims, shape = tuple(st.attrs["dimensions"]), tuple(st.shape)
    return lambda a, r: np.broadcast_to(np.expand_dims(a[0], dims), shape).copy()


def _fill(st, rtype):
    shape = tuple(st.shape)
    return lambda a, r: np.full(shape, a[0], dtype=rtype)


def _extract_slice(st, rtype):
    off, size, stride = (st.attrs[k] for k in ("offsets", "sizes", "strides"))
    sl, shape = tuple(slice(o, o + s * k, k) for o, s, k in zip(off, size, stride)), tuple(st.shape)
    return lambda a, r: a[0][sl].reshape(shape)


def _insert_slice(st, rtype):
    off, size, stride = (st.attrs[k] for k in ("offsets", "sizes", "strides"))
    sl, shape = tuple(slice(o, o + s * k, k) for o, s, k in zip(off, size, stride)), tuple(st.shape)

    def run(a, r):
        out = np.zeros(shape, rtype) if a[1] is None else a[1].copy()    # dest of tensor.empty: no value
        out[sl] = a[0].reshape(size)
        return out
    return run


def _concat(st, rtype):
    dim = int(st.attrs["dim"])
    return lambda a, r: np.concatenate(a, axis=dim)


DATA_MOVEMENT = {"tensor.pad": _pad, "tensor.collapse_shape": _reshape, "tensor.expand_shape": _reshape,
                  "tensor.reshape": _reshape, "tensor.cast": _reshape, "linalg.transpose": _transpose,
                  "linalg.broadcast": _broadcast, "linalg.fill": _fill, "tensor.extract_slice": _extract_slice,
                  "tensor.insert_slice": _insert_slice, "tensor.concat": _concat}
