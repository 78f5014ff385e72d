"""Native kernels of the byte-cheap torq_hl ops (``eltwise.c``): int8 add in the native
rounding, global average pool in both roundings, max pool. Each ``make_*(step, rtype,
reference)`` returns the step function, which hands any call outside its preconditions to the
reference kernel (same results); the reference's per-op check is kept."""
from __future__ import annotations

import numpy as np

from ... import numerics
from ..kernels.gemm import _pads, conv_out_size
from .plan import kernels
from .ops import _Outputs, _threads

_I32 = (numerics.INT32_MIN, numerics.INT32_MAX)


def _int8(*arrays) -> bool:
    return all(getattr(a, "dtype", None) == np.int8 for a in arrays)


def _c(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def make_add(st, rtype, reference):
    a = st.attrs
    za, zb = (int(v) for v in a["input_zps"])
    ma, mb = (int(v) for v in a["weights"])
    shift, zc, lo, hi = int(a["shift_factor"]), int(a["output_zp"]), int(a["output_min"]), int(a["output_max"])
    even = int(bool(a.get("round_ties_even", 0)))
    if not (np.dtype(rtype) == np.int8 and 0 <= shift <= 62 and -128 <= lo <= hi <= 127
            and all(_I32[0] <= m <= _I32[1] for m in (ma, mb)) and abs(za) < 1 << 16 and abs(zb) < 1 << 16
            and abs(zc) < 1 << 16) or (even and not 0 < shift <= 46):      # NTE: zc << shift in int64
        return None
    lib, outputs = kernels(), _Outputs()

    def fn(args, rounding):
        x, y = args
        if rounding != "native" or not _int8(x, y) or x.shape != y.shape:
            return reference(args, rounding)
        x, y = _c(x), _c(y)
        out, addr = outputs.get(x.shape)
        lib.torq_add_i8(x.ctypes.data, y.ctypes.data, addr, x.size, za, zb, ma, mb, shift, zc, lo, hi, even)
        return out
    return fn


def make_global_avgpool(st, rtype, reference):
    a = st.attrs
    kernel, pad = [int(v) for v in a["kernel"]], [int(v) for v in a["pad"]]
    xs, ys = np.float32(a["ort_input_scale"][0]), np.float32(a["ort_output_scale"][0])
    zx, zy, lo, hi = int(a["input_zp"]), int(a["output_zp"]), int(a["output_min"]), int(a["output_max"])
    rshape, n = tuple(st.shape), kernel[0] * kernel[1] if len(kernel) == 2 else 0
    size = int(np.prod(rshape))          # the declared result: one value per (image, channel)
    if not (np.dtype(rtype) == np.int8 and len(kernel) == 2 and not any(pad) and 0 < n < 1 << 23
            and -128 <= lo <= hi <= 127 and -128 <= zx <= 127):
        return None
    m, s, nte = numerics.global_avgpool_act(xs, ys, n, zy, bool(a.get("round_ties_even", 0)))
    scale = float(numerics.global_avgpool_scale(n, xs, ys))
    native_ok = _I32[0] <= m <= _I32[1] and 0 <= s <= 62
    lib, outputs = kernels(), _Outputs()

    def fn(args, rounding):
        (x,) = args
        if (not _int8(x) or x.ndim != 4 or list(x.shape[2:]) != kernel or x.shape[0] * x.shape[1] != size
                or (rounding == "native" and not native_ok)):
            return reference(args, rounding)
        x = _c(x)
        out, addr = outputs.get(rshape)
        lib.torq_gap_i8(x.ctypes.data, addr, x.shape[0] * x.shape[1], n, zx, m, s, int(nte), zy, lo, hi,
                        int(rounding == "ort"), scale)
        return out
    return fn


def make_maxpool(st, rtype, reference):
    a = st.attrs
    kh, kw = (int(v) for v in np.broadcast_to(np.asarray(a["kernel"]), (2,)))
    sh, sw = (int(v) for v in np.broadcast_to(np.asarray(a["stride"]), (2,)))
    dh, dw = (int(v) for v in np.broadcast_to(np.asarray(a["dilation"]), (2,)))
    pl, pr, pt, pb = _pads(list(a["pad"]))
    if not (np.dtype(rtype) == np.int8 and 0 < kh <= 64 and kw > 0 and min(sh, sw, dh, dw) > 0):
        return None
    lib, outputs, geos = kernels(), _Outputs(), {}

    def fn(args, rounding):
        (x,) = args
        if not _int8(x) or x.ndim != 4:
            return reference(args, rounding)
        x = _c(x)
        N, C, H, W = x.shape
        OH, OW = conv_out_size(H, kh, sh, dh, pt, pb), conv_out_size(W, kw, sw, dw, pl, pr)
        if OH <= 0 or OW <= 0:
            return reference(args, rounding)
        geo = geos.get((H, W))         # kept: a recorded call (plan.py) holds its address
        if geo is None:
            geo = geos[(H, W)] = np.array([H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW], dtype=np.int32)
        out, addr = outputs.get((N, C, OH, OW))
        lib.torq_maxpool_i8(x.ctypes.data, addr, N * C, geo.ctypes.data, _threads())
        return out
    return fn


MAKERS = {"add": make_add, "avg_pool2d": make_global_avgpool, "maxpool2d": make_maxpool}
