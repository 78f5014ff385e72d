"""Native kernels of the bf16 / f32 contractions (``float_conv.c``): conv2d, depthwise_conv2d,
fully_connected and matmul with bias, clamp and the bf16 rounding fused; and of the float max
pool, the elementwise add and the one-input bf16 bodies (``float_eltwise.c``).

The arithmetic is ``numerics.bf16_arith``'s, the accumulation order included (one SIMD lane per
output walking k in the model's order), so the results are the reference kernels' bits
(runtime/kernels/float_gemm.py), which stay the oracle. Weights are packed once per program
(``_cached_plan``); a call whose operands the kernel does not take (not 4-D, shapes that do not
match the weights) runs on the reference kernel.
"""
from __future__ import annotations

import ctypes
import os
import weakref

import numpy as np

from ... import numerics
from ..kernels.float_gemm import conv_out_hw
from ..kernels.gemm import _pads
from ..ops import _cached_plan
from .build import TorqFgeom
from .plan import kernels
from .ops import _Outputs, _address
from .ops import _threads as _run_threads

_F32 = np.float32
RO_MAX = 6                              # output channels per weight block (float_conv.c: FRO)
BINARY_OPS = {"add": 0, "sub": 1, "mul": 2}   # float_eltwise.c: torq_binary_f32's op
SLACK = 128                             # floats a plane's last tile may read past its end (float_conv.c)


def _c(x) -> np.ndarray:
    return x if x.dtype == _F32 and x.flags.c_contiguous else np.ascontiguousarray(x, _F32)


_SLACKED: dict = {}                      # id -> weakref of the outputs made by _out (SLACK follows each)


def _out(outputs: _Outputs, shape) -> tuple[np.ndarray, int]:
    """This thread's float output array of a step (SLACK zeroed floats follow it)."""
    out, addr = outputs.get(shape, _F32, SLACK)
    if id(out) not in _SLACKED:
        if len(_SLACKED) > 4096:
            _SLACKED.clear()
        _SLACKED[id(out)] = weakref.ref(out)
    return out, addr


def _threads() -> int:
    return load_aware(_run_threads())


def load_aware(n: int) -> int:
    """``n`` threads, or 1 on an oversubscribed host (1-min load >= cores + 2: other
    work holds the cores, a helper thread is often not running, and every step then waits for
    the chunk it claimed -- measured at load 5-9 on 2 vCPUs: MobileNetV2 b1 28.6 ms wall on 2
    threads vs 16.1 ms CPU on one; ResNet-18 94 vs 48 ms). A run of its own on a quiet host
    (load <= ~2) keeps every thread. Results are the same bits either way."""
    if n > 1 and os.getloadavg()[0] >= (os.cpu_count() or 1) + 2:
        return 1
    return n


def _slack_follows(x: np.ndarray) -> bool:
    """Whether SLACK readable floats follow x in memory (x is then its own plane: no copy)."""
    known = _SLACKED.get(id(x))
    if known is not None and known() is x:
        return True
    root = x
    while isinstance(root.base, np.ndarray):
        root = root.base
    start, root_start = x.__array_interface__["data"][0], root.__array_interface__["data"][0]
    return x.dtype == _F32 and x.flags.c_contiguous and root_start + root.nbytes - (start + x.nbytes) >= 4 * SLACK


def _clamp(attrs):
    return (float(numerics.bf16_arith.clamp_bits(attrs["output_min"])),
            float(numerics.bf16_arith.clamp_bits(attrs["output_max"])))


class FloatConv:
    """A conv2d / depthwise_conv2d: weights packed [G][blocks][Cg][T][RO], geometry per input shape."""

    def __init__(self, w, bias, attrs, depthwise: bool, bf16: bool):
        w = np.asarray(w, _F32)
        self.O, self.cg, self.kh, self.kw = w.shape
        self.w, self.depthwise, self.bf16 = w, depthwise, bf16
        self.groups = None if depthwise else int(attrs["groups"])
        self.bias = np.ascontiguousarray(np.asarray(bias, _F32).reshape(-1))
        self.pad = [int(p) for p in attrs["pad"]]
        self.stride = [int(s) for s in attrs["stride"]]
        self.dil = [int(d) for d in attrs["dilation"]]
        self.lo, self.hi = _clamp(attrs)
        self.packs: dict = {}
        self.geoms: dict = {}
        self.outputs = _Outputs()
        self.lib = kernels()

    def _pack(self, groups: int) -> tuple:
        if groups not in self.packs:
            og = self.O // groups
            ro = 1 if og == 1 else min(RO_MAX, og)
            nob = -(-og // ro)
            w = np.zeros((groups, nob * ro, self.cg, self.kh * self.kw), _F32)
            w[:, :og] = self.w.reshape(groups, og, self.cg, -1)
            packed = np.ascontiguousarray(w.reshape(groups, nob, ro, self.cg, -1).transpose(0, 1, 3, 4, 2))
            self.packs[groups] = (packed, ro)
        return self.packs[groups]

    def geometry(self, shape, direct_ok: bool):
        """(TorqFgeom and the arrays it points to, output shape), or None when not supported."""
        key = (shape, direct_ok)
        if key not in self.geoms:
            self.geoms[key] = self._geometry(shape, direct_ok)
        return self.geoms[key]

    def _geometry(self, shape, direct_ok):
        """Depthwise layers of stride 2 (kernels up to 5x5) and 3x3 ones of stride 1 read their
        input rows in place (float_depthwise.c, ``dwrows``): measured 1.2-2x faster there than
        building the padded phase planes (1 thread; MobileNetV2's and 5x5 layers); larger
        stride-1 kernels stay on the planes (7x7 on a 7x7 map: 1.7x faster there)."""
        if len(shape) != 4:
            return None
        n, c, h, w = shape
        groups = c // self.cg if self.depthwise else self.groups
        if groups < 1 or c != groups * self.cg or self.O % groups or self.bias.size != self.O:
            return None
        (sh, sw), (dh, dw), (pl, pr, pt, pb) = self.stride, self.dil, self.pad
        oh, ow = conv_out_hw(h, w, (self.kh, self.kw), self.pad, self.stride, self.dil)
        if oh < 1 or ow < 1 or min(self.pad) < 0:
            return None
        taps = [(i * dh, j * dw) for i in range(self.kh) for j in range(self.kw)]
        phases = sorted({(r % sh, q % sw) for r, q in taps})
        rows = oh + max(r // sh for r, _ in taps)
        wq = ow + max(q // sw for _, q in taps)
        direct = direct_ok and not any(self.pad) and sh == sw == 1
        plane = h * w if direct else -(-rows * wq // 16) * 16
        phstride = (self.cg if groups > 1 and not direct else c) * plane     # float_conv.c: local planes
        tap_off = np.array([phases.index((r % sh, q % sw)) * phstride + (r // sh) * wq + q // sw
                            for r, q in taps], np.int64)
        ph_ab = np.array(phases, np.int32).reshape(-1)
        packed, ro = self._pack(groups)
        small = max(self.kh, self.kw) <= 5
        dwrows = groups == c == self.O and self.cg == 1 and (dh, dw) == (1, 1) and (
            sh == sw == 2 and small or sh == sw == 1 and self.kh == self.kw == 3)
        g = TorqFgeom(n, c, h, w, groups, self.cg, self.O // groups, oh, ow, len(taps), len(phases), rows, wq,
                      sh, sw, pt, pl, (oh - 1) * wq + ow, ro, 8 if ro == 1 else 4, int(direct), int(self.bf16),
                      int(ro == 1 and 14 <= ow <= 128),
                      self.lo, self.hi, plane, phstride, ph_ab.ctypes.data, tap_off.ctypes.data, self.kh, self.kw,
                      int(dwrows))
        return (g, ctypes.pointer(g), ph_ab, tap_off, packed, packed.ctypes.data), (n, self.O, oh, ow)

    def __call__(self, x):
        x = _c(x)
        geo = self.geometry(tuple(x.shape), _slack_follows(x))
        if geo is None:
            return None
        (_, gref, _, _, _, wptr), oshape = geo
        out, addr = _out(self.outputs, oshape)
        self.lib.torq_conv_f32(_address(x), addr, wptr, self.bias.ctypes.data, gref, _threads())
        return out


def pack_panels(wt: np.ndarray) -> np.ndarray:
    """A weight [K, N] in the 64-column panels float_conv.c streams: [ceil(N / 64)][K][64]."""
    k, n = wt.shape
    nb = -(-n // 64)
    buf = np.zeros((k, nb * 64), _F32)
    buf[:, :n] = wt
    return np.ascontiguousarray(buf.reshape(k, nb, 64).transpose(1, 0, 2))


def _matmul(lib, outputs, x, y, bias, lo, hi, bf16, panels=None):
    """finish(x [..., M, K] @ y [..., K, N] + bias) on the native kernel (batch dims broadcast);
    ``panels``: y packed by ``pack_panels`` (a weight)."""
    batch = np.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    nb = int(np.prod(batch))
    (m, k), n = x.shape[-2:], y.shape[-1]
    if panels is not None:
        xa = _c(x)
        out, addr = _out(outputs, batch + (m, n))
        lib.torq_matmul_f32(_address(xa), panels.ctypes.data, addr, 0 if bias is None else bias.ctypes.data, nb, m, k,
                            n, m * k, 0, m * n, lo, hi, int(bf16), 1, _threads())
        return out

    def operand(a):
        if int(np.prod(a.shape[:-2])) == nb:
            return _c(a), a.shape[-2] * a.shape[-1]
        if int(np.prod(a.shape[:-2])) == 1:
            return _c(a), 0
        return np.ascontiguousarray(np.broadcast_to(a, batch + a.shape[-2:]), _F32), a.shape[-2] * a.shape[-1]
    (xa, sx), (ya, sy) = operand(x), operand(y)
    out, addr = _out(outputs, batch + (m, n))
    lib.torq_matmul_f32(_address(xa), _address(ya), addr, 0 if bias is None else bias.ctypes.data, nb, m, k, n,
                        sx, sy, m * n, lo, hi, int(bf16), 0, _threads())
    return out


def _shaped(out: np.ndarray, shape) -> np.ndarray:
    """out as ``shape``: the buffer itself when it has that shape (a recorded run replays only
    steps whose result is their buffer or a view of it; a view's base is the memory's owner)."""
    return out if out.shape == tuple(shape) else out.reshape(shape)


def _conv_step(st, reference):
    a, depthwise = st.attrs, st.op.endswith("depthwise_conv2d")
    plan = _cached_plan(lambda w, b: FloatConv(w, b, a, depthwise, st.dtype == "bf16"))
    shape = tuple(int(d) for d in st.shape)

    def fn(args, rounding):
        w, bias, x = args
        out = plan(w, bias)(x) if x.dtype.kind == "f" else None
        if out is None:
            return reference(args, rounding)
        return _shaped(out, shape)
    return fn


def _fc_step(st, reference):
    lo, hi = _clamp(st.attrs)
    plan = _cached_plan(lambda w, b: (np.shape(w)[::-1], np.ascontiguousarray(np.asarray(b, _F32).reshape(-1)),
                                      pack_panels(np.asarray(w, _F32).T)))
    lib, outputs = kernels(), _Outputs()

    def fn(args, rounding):
        w, bias, x = args
        (k, n), b, panels = plan(w, bias)
        if x.dtype.kind != "f" or x.shape[-1] != k or b.size != n:
            return reference(args, rounding)
        out = _matmul(lib, outputs, x.reshape(-1, k), np.empty((k, n), _F32), b, lo, hi, st.dtype == "bf16", panels)
        return _shaped(out, st.shape)
    return fn


def _matmul_step(st, reference):
    lo, hi = _clamp(st.attrs)
    lib, outputs = kernels(), _Outputs()

    def fn(args, rounding):
        x, y = args
        if x.dtype.kind != "f" or y.dtype.kind != "f" or x.ndim < 2 or y.ndim < 2 or x.shape[-1] != y.shape[-2]:
            return reference(args, rounding)
        return _shaped(_matmul(lib, outputs, x, y, None, lo, hi, st.dtype == "bf16"), st.shape)
    return fn


def _flat(spec, shape) -> bool:
    """Whether an operand laid by ``spec`` has the output's elements in the output's flat order
    (its axes in order; the output's axes it lacks are of size 1): a (1000,) bias on (1, 1000)."""
    dims = [d for d in spec if d >= 0]
    return dims == sorted(set(dims)) and all(shape[d] == 1 for d in range(len(shape)) if d not in dims)


def _elementwise_step(st, reference):
    """An add / sub / mul of two operands holding the output's elements in its order, or a
    one-input bf16 body the reference runs as its 65536-entry table; other bodies stay on the
    reference kernel (None)."""
    from ..float_ops import bf16_table, elementwise_parts
    types, nodes, _, specs = elementwise_parts(st)
    shape, ident = tuple(int(d) for d in st.shape), list(range(len(st.shape)))
    lib, outputs = kernels(), _Outputs()
    size = int(np.prod(shape))
    if len(nodes) == 1 and nodes[0][0] in BINARY_OPS and nodes[0][2] == ["a0", "a1"] and len(specs) == 2 \
            and all(_flat(sp, shape) for sp in specs) and nodes[0][1] in ("bf16", "f32"):
        bf16, op = int(nodes[0][1] == "bf16"), BINARY_OPS[nodes[0][0]]
        ndims = [len(sp) for sp in specs]

        def add(args, rounding):
            a, b = args
            if [a.ndim, b.ndim] != ndims or a.size != size or b.size != size or a.dtype != _F32 or b.dtype != _F32:
                return reference(args, rounding)
            a, b = _c(a), _c(b)
            out, addr = _out(outputs, shape)
            lib.torq_binary_f32(_address(a), _address(b), addr, size, op, bf16, _threads())
            return out
        return add
    table = bf16_table(st, np.float32) if int(np.prod(shape)) >= 4096 and specs == [ident] else None
    if table is None:
        return None
    table = np.ascontiguousarray(table)

    def lookup(args, rounding):
        (x,) = args
        if x.shape != shape or x.dtype != _F32:
            return reference(args, rounding)
        x = _c(x)
        out, addr = _out(outputs, shape)
        lib.torq_lut16_f32(_address(x), table.ctypes.data, addr, x.size, _threads())
        return out
    return lookup


def _maxpool_step(st, reference):
    a = st.attrs
    (kh, kw), (sh, sw), (dh, dw) = (np.broadcast_to(np.asarray(a[k], int), (2,)) for k in ("kernel", "stride", "dilation"))
    pl, pr, pt, pb = _pads(list(a["pad"]))
    lib, outputs, geos = kernels(), _Outputs(), {}

    def fn(args, rounding):
        (x,) = args
        if x.ndim != 4 or x.dtype != _F32:
            return reference(args, rounding)
        n, c, h, w = x.shape
        oh, ow = conv_out_hw(h, w, (kh, kw), (pl, pr, pt, pb), (sh, sw), (dh, dw))
        if (n, c, oh, ow) != tuple(st.shape) or min(pl, pr, pt, pb) < 0:
            return reference(args, rounding)
        x = _c(x)
        geo = geos.get((oh, ow))        # kept: a recorded run (plan.py) replays its address
        if geo is None:
            geo = geos[oh, ow] = np.array([kh, kw, sh, sw, dh, dw, pt, pl, oh, ow], np.int32)
        out, addr = _out(outputs, (n, c, oh, ow))
        lib.torq_maxpool_f32(_address(x), addr, n * c, h, w, geo.ctypes.data, _threads())
        return out
    return fn


def _avgpool_step(st, reference):
    """A global average pool (the window is the whole unpadded plane): float_eltwise.c's
    torq_gap_f32, the reference's row-major fp32 window sum, fp32 division and one rounding.
    Other pools: None."""
    a = st.attrs
    if any(int(p) for p in a["pad"]) or st.dtype not in ("bf16", "f32"):
        return None
    kernel = [int(v) for v in a["kernel"]]
    lib, outputs = kernels(), _Outputs()

    def fn(args, rounding):
        (x,) = args
        if x.ndim != 4 or x.dtype != _F32 or list(x.shape[2:]) != kernel:
            return reference(args, rounding)
        n, c, h, w = x.shape
        x = _c(x)
        out, addr = _out(outputs, (n, c, 1, 1))
        lib.torq_gap_f32(_address(x), addr, n * c, h * w, int(st.dtype == "bf16"), _threads())
        return _shaped(out, st.shape)
    return fn


def _reduce_step(st, reference):
    """A sum / mean reduction as ones[1, R] @ X (X: the reduced elements of each output as a
    column, in the input's row-major order): one lane per output adding its R values in that
    order, as the reference's loop does; then its fp32 division and one rounding. Max: None."""
    a = st.attrs
    if a["mode"] not in ("sum", "mean"):
        return None
    dims = sorted(int(d) for d in a["dims"])
    lib, outputs = kernels(), _Outputs()

    def fn(args, rounding):
        (x,) = args
        if x.dtype != _F32 or not dims or max(dims) >= x.ndim:
            return reference(args, rounding)
        keep = [d for d in range(x.ndim) if d not in dims]
        r = int(np.prod([x.shape[d] for d in dims]))
        cols = np.ascontiguousarray(np.transpose(x, keep + dims).reshape(-1, r).T)       # [R, outputs]
        acc = _matmul(lib, outputs, np.ones((1, r), _F32), cols, None, -np.inf, np.inf, False).reshape(-1)
        if a["mode"] == "mean":
            with np.errstate(all="ignore"):
                acc = acc / _F32(r)
        return numerics.bf16_arith.round_to(acc, st.dtype).reshape(st.shape)
    return fn


FLOAT_MAKERS = {"reduce": _reduce_step, "avg_pool2d": _avgpool_step, "conv2d": _conv_step, "depthwise_conv2d": _conv_step, "fully_connected": _fc_step,
                "matmul": _matmul_step, "elementwise": _elementwise_step, "maxpool2d": _maxpool_step}
