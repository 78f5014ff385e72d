"""Native kernels of the torq_hl ops the engine compiles: int8 conv2d / depthwise_conv2d /
fully_connected with their rescale fused (``conv.c``, ``depthwise.c``); add / global average
pool / max pool come from ``eltwise.py``.

``make(step, rtype, reference)`` returns the step function ``fn(args, rounding)`` of the native
engine, or None when the op is not one it compiles; ``fn`` itself hands a call to the reference
kernel whenever its preconditions fail at run time (an operand that is not int8, weights outside
int8, a multiplier outside int32, an accumulator bound the depthwise float path cannot hold), so
every program runs, with native speed where the preconditions hold and the reference results
everywhere. The reference kernel's per-op check (``fn.check``) is kept: ``verify`` then judges
the native output against the plain numpy formula.
"""
from __future__ import annotations

import ctypes
import itertools
import threading
import weakref

import numpy as np

from ... import numerics
from ..kernels import conv_out_size
from ..kernels.gemm import _pads
from ..ops import _cached_plan
from .build import TorqDwq, TorqGeom, TorqRq, amx, int_depthwise, library
from .plan import kernels

R = 8                                   # output channels per register block (the C kernels)
AMX_MIN_CHANNELS = 32                   # input channels per group from which a conv runs on AMX tiles
_F24 = (1 << 24) - 1
_local = threading.local()
_GEOMETRY_IDS = itertools.count(1)       # torq_geom.id: never reused in a process


def set_threads(n: int) -> None:
    """Threads the kernels of the calling thread's runs use (``Simulator.run`` sets it)."""
    _local.threads = max(1, int(n))


def _threads() -> int:
    return getattr(_local, "threads", 1)


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


class _Outputs:
    """A step's output arrays, one per thread, reused from run to run (``Simulator.run`` copies
    the program's outputs, so no caller ever holds one), with their addresses: computing an
    address through ctypes costs microseconds, and a run has ~60 steps. Owned by the step's
    plan, so they go when the program goes."""

    def __init__(self):
        self._bufs: dict = {}

    def get(self, shape, dtype=np.int8, slack: int = 0) -> tuple[np.ndarray, int]:
        """This thread's output array of ``shape`` (``slack`` zeroed elements follow it in memory)."""
        tid = threading.get_ident()
        b = self._bufs.get(tid)
        if b is None or b[0].shape != shape or b[0].dtype != dtype:
            size = int(np.prod(shape))
            arr = np.zeros(size + slack, dtype=dtype)[:size].reshape(shape)
            b = self._bufs[tid] = (arr, arr.ctypes.data)
            known = _local.__dict__.setdefault("addrs", {})
            if len(known) > 4096:
                known.clear()
            known[id(arr)] = (weakref.ref(arr), b[1])
        return b


def persistent(a: np.ndarray) -> bool:
    """Whether a is one of this thread's step output buffers (or a view of one)."""
    known = _local.__dict__.get("addrs", {})
    for b in (a, a.base):
        entry = known.get(id(b)) if b is not None else None
        if entry is not None and entry[0]() is b:
            return True
    return False


def _address(x: np.ndarray) -> int:
    """The address of x: looked up when x is a step output made in this thread."""
    b = _local.__dict__.get("addrs", {}).get(id(x))
    return b[1] if b is not None and b[0]() is x else x.ctypes.data


def _wrap32(v) -> np.ndarray:
    """int64 values as the int32 they are modulo 2**32 (the accumulator register wraps)."""
    v = np.asarray(v, dtype=np.int64)
    return (((v + (1 << 31)) % (1 << 32)) - (1 << 31)).astype(np.int32)


class Requant:
    """One op's requantisation constants for the C kernels (``torq_rq``), both roundings."""

    def __init__(self, attrs: dict, sb: np.ndarray, adj: np.ndarray, O: int):
        sb = np.asarray(sb).astype(np.int64)
        mult = sb[1::2]
        shift = int(attrs["shift_factor"])
        lo, hi = int(attrs["output_min"]), int(attrs["output_max"])
        self.ok = (mult.size == O and 0 <= shift <= 62 and -128 <= lo <= hi <= 127
                   and int(mult.min(initial=0)) >= numerics.INT32_MIN and int(mult.max(initial=0)) <= numerics.INT32_MAX)
        self.adj = _wrap32(adj)
        self.mult = mult.astype(np.int32) if self.ok else np.zeros(O, np.int32)
        ys = float(attrs["ort_output_scale"][0])
        self.scale = np.ascontiguousarray(np.broadcast_to(
            numerics.ort_requant_scale(attrs["ort_dq_scale"], ys).reshape(-1), (O,)), dtype=np.float32)
        even = int(bool(attrs.get("round_ties_even", 0)) and shift > 0)
        self.structs = {r: TorqRq(_ptr(self.adj), _ptr(self.mult), _ptr(self.scale), shift, even,
                                  int(attrs["output_zp"]), lo, hi, int(r == "ort")) for r in ("native", "ort")}
        self.refs = {r: ctypes.pointer(v) for r, v in self.structs.items()}


class _Geometry:
    """Stride phases, taps and buffer sizes of a convolution on one input shape (``torq_geom``)."""

    def __init__(self, shape, wshape, groups, pads, stride, dilation, pad_value):
        N, C, H, W = shape
        O, Cg, KH, KW = wshape
        pl, pr, pt, pb = pads
        (sh, sw), (dh, dw) = stride, dilation
        OH = conv_out_size(H, KH, sh, dh, pt, pb)
        OW = conv_out_size(W, KW, sw, dw, pl, pr)
        taps = [(*divmod(i * dh, sh), *divmod(j * dw, sw)) for i in range(KH) for j in range(KW)]
        phases = sorted({(a, b) for _, a, _, b in taps})
        mri, mrj = max(t[0] for t in taps), max(t[2] for t in taps)
        Wq = OW + mrj
        offs = [ri * Wq + rj for ri, _, rj, _ in taps]
        L = OH * Wq
        Lpad = -(-L // 16) * 16
        self.ok = OH > 0 and OW > 0
        self.out_shape = (N, O, OH, OW)
        self.ph_ab = np.array(phases, dtype=np.int32).reshape(-1)
        self.tap_ph = np.array([phases.index((a, b)) for _, a, _, b in taps], dtype=np.int32)
        self.tap_off = np.array(offs, dtype=np.int32)
        self.Lph = Lpad + -(-max(offs) // 16) * 16 + 64      # a 64-byte load at any tap of any vector
        self.taps = [(ph, off) for ph, off in zip(self.tap_ph.tolist(), offs)]
        self.Wq = Wq
        self.struct = TorqGeom(N, C, H, W, groups, Cg, O // groups, OH, OW, len(taps), len(phases), OH + mri, Wq,
                               sh, sw, pt, pl, int(pad_value), L, Lpad, self.Lph,
                               _ptr(self.ph_ab), _ptr(self.tap_ph), _ptr(self.tap_off), next(_GEOMETRY_IDS))
        self.ref = ctypes.pointer(self.struct)


def _dw_quads(taps: list, Wq: int) -> tuple[list, list]:
    """Depthwise taps ``[(phase, offset)]`` packed four to a quad for the integer kernel
    (``torq_dwq``): ``(windows, slots)`` per quad, windows ``[(phase, base)]`` (at most two, each
    read as 64 bytes from base + p0), slots ``[(tap, window, offset - base)]`` (at most four).

    The taps of one phase row (same phase, same offset // Wq) form segments of <= 4 taps within
    48 bytes (16 lanes + the span fit a 64-byte window); segments are packed first-fit
    decreasing, two per quad at most (two source registers of vpermt2b)."""
    rows: dict = {}
    for t, (ph, off) in enumerate(taps):
        rows.setdefault((ph, off // Wq), []).append((off, t))
    segments = []
    for key in sorted(rows):
        seg: list = []
        for off, t in sorted(rows[key]):
            if seg and (len(seg) == 4 or off - seg[0][0] > 48):
                segments.append((key[0], seg))
                seg = []
            seg.append((off, t))
        segments.append((key[0], seg))
    quads: list = []
    for ph, seg in sorted(segments, key=lambda s: -len(s[1])):
        q = next((q for q in quads if len(q) < 2 and sum(len(s) for _, s in q) + len(seg) <= 4), None)
        if q is None:
            quads.append(q := [])
        q.append((ph, seg))
    return ([[(ph, seg[0][0]) for ph, seg in q] for q in quads],
            [[(t, w, off - seg[0][0]) for w, (_, seg) in enumerate(q) for off, t in seg] for q in quads])


class _DwQuads:
    """The integer depthwise kernel's view of one geometry: quads, byte indices, packed weights."""

    def __init__(self, geo: "_Geometry", w64: np.ndarray):
        windows, slots = _dw_quads(geo.taps, geo.Wq)
        nq, C = len(windows), w64.shape[0]
        self.win = np.full((nq, 4), -1, dtype=np.int32)
        self.idx = np.zeros((nq, 16, 4), dtype=np.uint8)
        wq = np.zeros((C, nq, 4), dtype=np.int8)
        wt = w64.reshape(C, -1)
        lane = np.arange(16)
        for i, (wins, sl) in enumerate(zip(windows, slots)):
            self.win[i, :2 * len(wins)] = np.array(wins, dtype=np.int32).reshape(-1)
            for s, (t, w, rel) in enumerate(sl):
                self.idx[i, :, s] = 64 * w + rel + lane
                wq[:, i, s] = wt[:, t]
        self.wq = np.ascontiguousarray(wq).view(np.int32).reshape(C, nq)
        self.struct = TorqDwq(nq, _ptr(self.win), _ptr(self.idx), _ptr(self.wq))
        self.ref = ctypes.pointer(self.struct)


def _pair(v) -> tuple[int, int]:
    t = tuple(int(i) for i in np.atleast_1d(v))
    return (t[0], t[0]) if len(t) == 1 else t


class ConvNative:
    """An int8 convolution prepared for the C kernels: packed weights, requant constants, and a
    geometry per input shape. ``ok`` is False when the op is outside what the kernels compute."""

    def __init__(self, w, sb, attrs):
        w = np.asarray(w)
        O, Cg, KH, KW = w.shape
        self.groups = G = int(attrs["groups"])
        self.depthwise = Cg == 1 and G > 1 and G == O
        self.wshape = w.shape
        self.pads = _pads(list(attrs["pad"]))
        self.stride, self.dilation = _pair(attrs["stride"]), _pair(attrs["dilation"])
        self.pad_value = int(attrs["input_zp"])
        w64 = w.astype(np.int64)
        bias = np.asarray(sb).astype(np.int64)[0::2]
        self.ok = (w.dtype.kind in "iu" and O % G == 0 and -128 <= self.pad_value <= 127 and bias.size == O
                   and (w64.size == 0 or (int(w64.min()) >= -128 and int(w64.max()) <= 127)))
        if not self.ok:
            return
        self.int_dw, self.amx = self.depthwise and int_depthwise(), False
        if self.depthwise and not self.int_dw:      # float32 path: exact while partial sums < 2**24
            T = KH * KW
            self.ok = int(np.abs(w64).reshape(O, T).sum(axis=1).max(initial=0)) * 128 <= _F24
            self.wpack = np.ascontiguousarray(w64.reshape(O, T), dtype=np.float32)
            adj = bias
        elif self.depthwise:                        # u8 phases and quads per geometry (_DwQuads)
            self.w64, self.wpack = w64, np.zeros(1, np.float32)
            adj = bias - 128 * w64.reshape(O, -1).sum(axis=1)
        else:
            self.amx = Cg >= AMX_MIN_CHANNELS and amx()
            self.wpack = _pack_amx(w64, G) if self.amx else _pack_conv(w64, G)
            adj = bias - 128 * w64.reshape(O, -1).sum(axis=1)
        self.wptr, self.lib, self.outputs = _ptr(self.wpack), kernels(), _Outputs()
        self.rq = Requant(attrs, sb, adj, O)
        self.ok = self.ok and self.rq.ok
        self._geoms: dict = {}

    def geometry(self, shape) -> _Geometry:
        g = self._geoms.get(shape)
        if g is None:
            g = _Geometry(shape, self.wshape, self.groups, self.pads, self.stride, self.dilation, self.pad_value)
            g.dwq = _DwQuads(g, self.w64) if self.int_dw and g.ok else None     # owns the arrays
            g.quads = g.dwq.ref if g.dwq is not None else None
            self._geoms[shape] = g
        return g

    def __call__(self, x: np.ndarray, rounding: str) -> np.ndarray:
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        geo = self._geoms.get(x.shape) or self.geometry(x.shape)
        out, addr = self.outputs.get(geo.out_shape)
        if self.depthwise:
            self.lib.torq_dw_i8(_address(x), addr, self.wptr, geo.quads, geo.ref, self.rq.refs[rounding], _threads())
        elif self.amx:
            self.lib.torq_conv_amx_i8(_address(x), addr, self.wptr, geo.ref, self.rq.refs[rounding], _threads())
        else:
            self.lib.torq_conv_i8(_address(x), addr, self.wptr, geo.ref, self.rq.refs[rounding], _threads())
        return out


def _pack_conv(w64: np.ndarray, G: int) -> np.ndarray:
    """[O, Cg, KH, KW] -> [G][OB][T][CQ][R][4] int8 (zero-padded channels)."""
    O, Cg, KH, KW = w64.shape
    Og, T = O // G, KH * KW
    OB, CQ = -(-Og // R), -(-Cg // 4)
    buf = np.zeros((G, OB * R, T, CQ * 4), dtype=np.int8)
    buf[:, :Og, :, :Cg] = w64.reshape(G, Og, Cg, T).transpose(0, 1, 3, 2)
    return np.ascontiguousarray(buf.reshape(G, OB, R, T, CQ, 4).transpose(0, 1, 3, 4, 2, 5))


def _pack_amx(w64: np.ndarray, G: int) -> np.ndarray:
    """[O, Cg, KH, KW] -> [G][OB/2][T][CQ/16][2][16][64] int8: AMX A tiles of 16 output channels
    x 64 input channels, output channel blocks in pairs (zero-padded)."""
    O, Cg, KH, KW = w64.shape
    Og, T = O // G, KH * KW
    OP, KB = -(-Og // 32), -(-Cg // 64)
    buf = np.zeros((G, OP * 32, T, KB * 64), dtype=np.int8)
    buf[:, :Og, :, :Cg] = w64.reshape(G, Og, Cg, T).transpose(0, 1, 3, 2)
    return np.ascontiguousarray(buf.reshape(G, OP, 2, 16, T, KB, 64).transpose(0, 1, 4, 5, 2, 3, 6))


class FcNative:
    """An int8 fully connected layer prepared for the C kernels (lanes = 16 output channels)."""

    def __init__(self, w, sb, attrs):
        w = np.asarray(w)
        w64 = w.astype(np.int64)
        O, K = w.shape
        bias = np.asarray(sb).astype(np.int64)[0::2]
        self.O, self.K = O, K
        self.ok = (w.dtype.kind in "iu" and bias.size == O
                   and (w64.size == 0 or (int(w64.min()) >= -128 and int(w64.max()) <= 127)))
        if not self.ok:
            return
        OB, KQ = -(-O // 16), -(-K // 4)
        buf = np.zeros((OB * 16, KQ * 4), dtype=np.int8)
        buf[:O, :K] = w64
        self.wpack = np.ascontiguousarray(buf.reshape(OB, 16, KQ, 4).transpose(0, 2, 1, 3))
        self.wptr, self.lib, self.outputs = _ptr(self.wpack), kernels(), _Outputs()
        self.rq = Requant(attrs, sb, bias - 128 * w64.sum(axis=1), O)
        self.ok = self.rq.ok

    def __call__(self, x: np.ndarray, rounding: str) -> np.ndarray:
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        out, addr = self.outputs.get(x.shape[:-1] + (self.O,))
        self.lib.torq_fc_i8(_address(x), addr, self.wptr, x.size // self.K, self.K, self.O, self.rq.refs[rounding])
        return out


def _native_step(plan_cls, st, rtype, reference):
    a = st.attrs
    plan = _cached_plan(lambda w, sb: plan_cls(w, sb, a))
    if np.dtype(rtype) != np.int8:
        return None

    def fn(args, rounding):
        w, sb, x = args
        p = plan(w, sb)
        if not p.ok or x.dtype != np.int8:
            return reference(args, rounding)
        if isinstance(p, ConvNative) and x.ndim == 3:       # Conv1D runs as 2-D with H = 1
            return p(x[:, :, None, :], rounding)[:, :, 0, :]
        if isinstance(p, ConvNative) and (x.ndim != 4 or not p.geometry(x.shape).ok):
            return reference(args, rounding)
        return p(x, rounding)
    return fn


def make(st, rtype, reference):
    """The native step function of ``st``, or None (the op runs on ``reference``)."""
    if library() is None:
        return None
    op = st.op[len("torq_hl."):] if st.op.startswith("torq_hl.") else None
    from .eltwise import MAKERS         # (it builds on this module's buffers)
    from .float_ops import FLOAT_MAKERS
    if st.dtype in ("bf16", "f32"):                     # bf16 models: float_conv.c
        fn = FLOAT_MAKERS[op](st, reference) if op in FLOAT_MAKERS else None
    elif op in ("conv2d", "depthwise_conv2d"):
        fn = _native_step(ConvNative, st, rtype, reference)
    elif op == "fully_connected":
        fn = _native_step(FcNative, st, rtype, reference)
    elif op in MAKERS:
        fn = MAKERS[op](st, rtype, reference)
    else:
        return None
    if fn is not None:
        fn.native = True                                  # Simulator.native_steps counts these
        if getattr(reference, "check", None) is not None:
            fn.check = reference.check
    return fn
