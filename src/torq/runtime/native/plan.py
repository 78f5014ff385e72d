"""A run's native kernel calls recorded once and replayed in one C call (``plan.c``).

The first run of a program in a thread (per rounding and input signature) executes step by
step and records every native kernel call. A step whose calls read only its own operands and
write its own output buffer (one of the per-thread buffers of ``ops._Outputs``, reused from run
to run) can be replayed; consecutive such steps form a segment, run later as one
``torq_run_calls``. Steps outside a segment (reference kernels, data movement, a kernel that
copied a non-contiguous operand) run in Python as before. A segment's operand that is a fresh
array at each run (the program's input, the result of a Python step) gets its new address
patched into the recorded calls. Same kernels, same arguments, same order: the results are
those of the step-by-step run.
"""
from __future__ import annotations

import ctypes
import struct
import threading

import numpy as np

from .build import library

# C entry point: (kind in plan.c, positions of the data operands, position of the output)
SPECS = {"torq_conv_i8": (1, (0,), 1), "torq_conv_amx_i8": (2, (0,), 1), "torq_dw_i8": (3, (0,), 1),
         "torq_fc_i8": (4, (0,), 1), "torq_add_i8": (5, (0, 1), 2), "torq_gap_i8": (6, (0,), 1),
         "torq_maxpool_i8": (7, (0,), 1), "torq_conv_f32": (8, (0,), 1), "torq_matmul_f32": (9, (0, 1), 2),
         "torq_binary_f32": (10, (0, 1), 2), "torq_lut16_f32": (11, (0,), 2), "torq_maxpool_f32": (12, (0,), 1),
         "torq_gap_f32": (13, (0,), 1), "torq_fc_f32": (14, (0,), 2)}
PACKED_B = 14                            # torq_matmul_f32's argument: B is a packed weight (recorded as torq_fc_f32)
FLOAT_CONV = 8
WORDS = 17                               # int64 words per call: the kind, then 16 arguments
_local = threading.local()


class Kernels:
    """The library's kernel entry points; each call is also recorded while this thread records."""

    def __init__(self, lib):
        for name in SPECS:
            if name != "torq_fc_f32":
                setattr(self, name, _recorded(name, getattr(lib, name)))


def _recorded(name, cfn):
    def call(*args):
        rec = getattr(_local, "recorder", None)
        if rec is not None:      # a matmul on a packed weight reads one data operand only
            rec.calls.append(("torq_fc_f32" if name == "torq_matmul_f32" and args[PACKED_B] else name, args))
        return cfn(*args)
    return call


def _word(a) -> int:
    if isinstance(a, ctypes._Pointer):
        return ctypes.addressof(a.contents)
    if isinstance(a, float):
        return struct.unpack("<I", struct.pack("<f", a))[0]
    return int(a or 0)


def _data(a) -> int:
    return a.__array_interface__["data"][0]


class Recorder:
    """Collects the calls of one step-by-step run and which steps may be replayed."""

    def __init__(self):
        self.calls: list = []
        self.steps: list = []            # per step: (kernel index, its calls or None, args, out)

    def __enter__(self):
        _local.recorder = self
        return self

    def __exit__(self, *exc):
        _local.recorder = None

    def step(self, index: int, first_call: int, args: list, out, persistent) -> None:
        """Step ``index`` ran (its calls from ``first_call`` on, its operands, its result): it may
        be replayed when its calls read only its operands and wrote its persistent result."""
        calls = self.calls[first_call:]
        operands = {_data(a) for a in args if isinstance(a, np.ndarray)}
        ok = bool(calls) and isinstance(out, np.ndarray) and persistent(out)
        for name, cargs in calls if ok else ():
            _, ins, o = SPECS[name]
            ok = ok and int(cargs[o]) == _data(out) and all(int(cargs[i]) in operands for i in ins)
        self.steps.append((index, calls if ok else None, args, out))

    def plan(self, kernels) -> "Plan":
        segments, run = [], []
        for entry in self.steps + [(None, None, None, None)]:
            if entry[1] is not None:
                run.append(entry)
                continue
            if run:
                seg = _Segment(run, kernels)
                segments.extend([e[0] for e in run] if seg.aliased else [seg])
                run = []
            if entry[0] is not None:
                segments.append(entry[0])
        return Plan(segments)


class _Segment:
    """Consecutive replayable steps: their calls as rows of int64 words, the operands read from
    outside (patched when their address changes) and the outputs written."""

    def __init__(self, run: list, kernels):
        rows = [[SPECS[name][0], *map(_word, cargs)] for _, calls, _, _ in run for name, cargs in calls]
        self.rows = np.zeros((len(rows), WORDS), dtype=np.int64)
        for r, row in enumerate(rows):
            self.rows[r, :len(row)] = row
        self.ptr, self.n = self.rows.ctypes.data, len(rows)
        produced, self.outputs, self.inputs = set(), [], []
        for index, _, args, out in run:
            st = kernels[index].step
            for slot, a in zip(st.args, args):
                if slot not in produced and isinstance(a, np.ndarray) and all(slot != s for s, *_ in self.inputs):
                    self.inputs.append((slot, a, _data(a)))
            produced.add(st.out)
            self.outputs.append((st.out, out))
        # two operands from outside at one address could part later: such steps stay in Python
        self.aliased = len({addr for _, _, addr in self.inputs}) < len(self.inputs)
        # a float conv reading its input in place (no padding, stride 1) reads SLACK floats past it
        direct = {int(c[0]) for _, calls, _, _ in run for name, c in calls
                  if name == "torq_conv_f32" and c[4].contents.direct}
        self.inputs = [(slot, a, addr, self._where(addr), addr in direct) for slot, a, addr in self.inputs]

    def _where(self, addr: int):
        """(rows, words) of the data operands of the calls that hold address addr."""
        rows, words = [], []
        for r in range(self.n):
            _, ins, _ = SPECS_BY_KIND[int(self.rows[r, 0])]
            for i in ins:
                if self.rows[r, 1 + i] == addr:
                    rows.append(r)
                    words.append(1 + i)
        return np.array(rows, dtype=np.intp), np.array(words, dtype=np.intp)

    def run(self, env: list, threads: int, fthreads: int, lib, ns: np.ndarray | None = None) -> bool:
        """Replay into env (int8 kernels on ``threads``, float ones on ``fthreads``); False (nothing
        run) when an operand is not what was recorded. ``ns``: int64 [n] receives each call's wall
        time in ns (profiling)."""
        from .float_ops import _slack_follows
        for k, (slot, last, addr, where, slack) in enumerate(self.inputs):
            a = env[slot]
            if a is last:               # (held here: its memory cannot have moved)
                continue
            if not (isinstance(a, np.ndarray) and a.shape == last.shape and a.dtype == last.dtype
                    and a.flags.c_contiguous == last.flags.c_contiguous) or (slack and not _slack_follows(a)):
                return False
            new = _data(a)
            if new != addr:
                self.rows[where] = new
            self.inputs[k] = (slot, a, new, where, slack)
        lib.torq_run_calls(self.ptr, self.n, threads, fthreads, None if ns is None else ns.ctypes.data)
        for slot, out in self.outputs:
            env[slot] = out
        return True


SPECS_BY_KIND = {kind: (kind, ins, o) for kind, ins, o in SPECS.values()}


class Plan:
    """A program's run in one thread: segments (replayed) and kernel indices (run in Python)."""

    def __init__(self, segments: list):
        self.segments = segments
        self.lib = library()

    @property
    def replayed(self) -> int:
        """Steps inside replayed segments."""
        return sum(len(s.outputs) for s in self.segments if isinstance(s, _Segment))

    def run(self, env: list, threads: int, run_step) -> None:
        """Every step in order: segments in C, the rest (and a segment whose operand changed
        form) through ``run_step(kernel index)``."""
        from .float_ops import load_aware
        fthreads = load_aware(threads)
        for s in self.segments:
            if isinstance(s, _Segment):
                if not s.run(env, threads, fthreads, self.lib):
                    raise Stale
            else:
                run_step(s)


class Stale(Exception):
    """A recorded segment met an operand of another shape, type or layout: record anew."""


_KERNELS: dict = {}


def kernels() -> Kernels | None:
    """The recording view of ``library()`` (None without one)."""
    lib = library()
    if lib is None:
        return None
    k = _KERNELS.get(id(lib))
    if k is None:
        k = _KERNELS[id(lib)] = Kernels(lib)
    return k


def key(inputs: list, rounding: str) -> tuple:
    """What a plan depends on besides the program: thread, rounding, the inputs' form."""
    return (threading.get_ident(), rounding,
            tuple((np.shape(x), getattr(x, "dtype", None), getattr(getattr(x, "flags", None), "c_contiguous", None))
                  for x in inputs))
