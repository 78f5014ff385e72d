"""The NSS simulator: executes a `torq.program.Program` (torq_hl ops + data movement) with numpy.

It computes only from the program: weights, scale_bias, zero points and shifts are its
constants and attributes, every rounding is a `torq.numerics` call. It never calls ONNX Runtime,
IREE or MLIR: it is the independent implementation they are checked against, and a saved
program runs with numpy and numba alone. Every step's result is checked against the shape and
element type the IR declared for it.

Two rounding modes:
  native  what the NPU computes (fixed-point multiplier, round half toward +inf; bf16 fallbacks)
  ort     what ONNX Runtime's x86 CPU EP computes for the same quantized ops (float requant, RNE)
"""
from __future__ import annotations

import contextlib
import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..errors import TorqError, one_line
from ..isa import element_type_name
from ..program import Program, Step, np_dtype
from .kernels.blas import single_thread_run
from . import native
from .movement import DATA_MOVEMENT
from .float_ops import FLOAT_OPS, is_float_step
from .native import ops as native_ops
from .native import plan as native_plan
from .native import ENGINES
from .ops import OPS

ROUNDING_MODES = ("native", "ort")


@dataclass
class _Kernel:
    fn: object          # fn(args: list[np.ndarray], rounding: str) -> np.ndarray
    step: Step
    dtype: np.dtype     # numpy dtype of the declared result type
    check: object = None  # check(args, out, rounding) -> (size, differing, max LSB, causes, mismatches)


class Simulator:
    """A Program bound to kernels once (weight plans, tables cached); `run` executes it.

    ``engine``: "native" (the default, ``$TORQ_ENGINE`` overrides it) runs the int8 convolutions
    and fully connected layers as compiled native code (``runtime.native``) and every other op on
    the reference kernels; "reference" runs every op on the numpy reference kernels. Both give
    identical results. Without a C compiler the native engine is the reference one (``engine``
    then says "reference", ``native.why()`` why)."""

    def __init__(self, program: Program, engine: str | None = None):
        engine = engine or os.environ.get("TORQ_ENGINE") or "native"
        if engine not in ENGINES:
            raise TorqError(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")
        if engine == "native" and native.library() is None:
            engine = "reference"
        self.program = program
        self.engine = engine
        self.kernels = []
        for st in program.steps:
            with _from_file(program, st):
                self.kernels.append(self._bind(st, engine))
        self._pool: ThreadPoolExecutor | None = None
        self._plans: dict = {}          # recorded native runs (runtime.native.plan), per thread and input form

    @property
    def native_steps(self) -> int:
        """Steps bound to a native kernel (the rest run on the reference kernels)."""
        return sum(bool(getattr(k.fn, "native", False)) for k in self.kernels)

    def __getstate__(self):
        """Picklable / copyable: the thread pool of ``run_many`` is not carried along."""
        return {**self.__dict__, "_pool": None, "_plans": {}}

    @staticmethod
    def _bind(st: Step, engine: str = "reference") -> _Kernel:
        rtype = np_dtype(st.dtype)
        float_step = is_float_step(st)
        if float_step:
            make = FLOAT_OPS[st.op[8:]]
        elif st.op.startswith("torq_hl."):
            make = OPS.get(st.op[8:])
        else:
            make = DATA_MOVEMENT.get(st.op)
        if make is None:
            raise TorqError(f"not supported on NSS: {st.op} at {st.location}: no simulator kernel")
        fn = make(st, rtype)
        if engine == "native":
            fn = native_ops.make(st, rtype, fn) or fn
        return _Kernel(fn, st, rtype, getattr(fn, "check", None))

    def run(self, inputs: list[np.ndarray], rounding: str = "native", explain: bool = False,
            threads: int | None = None, ort_at: dict | None = None, force: dict | None = None,
            watch: dict | None = None):
        """Execute; with explain=True also return the per-op check of every rescaling op: the output
        it executed against the plain formula of the mode, and native vs ORT rounding on the very
        same inputs ([OpDiff]). Checks cost a second evaluation of each rescaling op.

        ``ort_at``: {slot: ONNX Runtime's own value of that slot}; a checked op writing such a slot
        is compared with it instead of the ``ort`` mode's formula (e.g. the graph outputs).
        ``force``: {slot: value} written over what the step computed there, before any later step
        reads it (``verify`` hands ORT's result of a bf16 island on to the int8 ops after it);
        ``watch``: a dict whose slots receive the values computed there."""
        if rounding not in ROUNDING_MODES:
            raise TorqError(f"--rounding must be one of {', '.join(ROUNDING_MODES)}, not {rounding!r}")
        p = self.program
        if len(inputs) != len(p.inputs):
            raise TorqError(f"the model takes {len(p.inputs)} inputs, got {len(inputs)}")
        env: list = [None] * p.n_slots
        for port, x in zip(p.inputs, inputs):
            env[port.slot] = x
        for s, v in p.constants.items():
            env[s] = v
        n = threads or usable_cores()
        native_ops.set_threads(n)
        key = None if explain or force or watch is not None or self.engine != "native" else native_plan.key(inputs, rounding)
        with single_thread_run():        # small GEMMs on one BLAS thread, switched once per run
            diffs = self._execute(env, rounding, n, key, explain, ort_at, (force or {}, watch))
        # copies: a native step's output buffer is reused by the next run (runtime.native.ops)
        outs = [np.array(env[o.slot], dtype=np_dtype(o.dtype), copy=True) for o in p.outputs]
        return (outs, diffs) if explain else outs

    def _execute(self, env: list, rounding: str, threads: int, key, explain: bool, ort_at, taps=({}, None)) -> list:
        """Every step on env: replayed from the plan recorded for ``key`` when there is one
        (``runtime.native.plan``), else step by step, recording that plan (key None: no plan).
        Returns the per-op checks of an explain run."""
        plan = self._plans.get(key) if key is not None else None
        if plan is not None:
            try:
                plan.run(env, threads, lambda i: self._step(i, env, rounding))
                return []
            except native_plan.Stale:
                del self._plans[key]
        diffs: list = []
        with native_plan.Recorder() if key is not None else contextlib.nullcontext() as rec:
            for i in range(len(self.kernels)):
                first = len(rec.calls) if rec is not None else 0
                args, out = self._step(i, env, rounding, explain, ort_at, diffs)
                force, watch, slot = *taps, self.kernels[i].step.out
                if watch is not None and slot in watch:
                    watch[slot] = np.array(out, copy=True)
                if slot in force:
                    env[slot] = np.asarray(force[slot], dtype=np.asarray(out).dtype).reshape(np.shape(out))
                if rec is not None:
                    rec.step(i, first, args, out, native_ops.persistent)
        if rec is not None:
            self._plans[key] = rec.plan(self.kernels)
        return diffs

    def _step(self, i: int, env: list, rounding: str, explain: bool = False, ort_at: dict | None = None,
              diffs: list | None = None):
        """Step i on env (its result stored there); with explain its per-op check into diffs."""
        k = self.kernels[i]
        st = k.step
        args = [env[a] for a in st.args]
        with _from_file(self.program, st):
            out = k.fn(args, rounding)
        _check_result(out, k)
        env[st.out] = out
        if explain and k.check is not None:
            ort = (ort_at or {}).get(st.out)
            given = {} if ort is None else {"ort": ort}
            diffs.append(OpDiff(st.op, st.location, rounding, *k.check(args, out, rounding, **given)))
        return args, out

    def run_many(self, calls: list[list[np.ndarray]], rounding: str = "native",
                 threads: int | None = None, explain: bool = False) -> list:
        """``[self.run(inputs, rounding, explain) for inputs in calls]``, the calls side by side
        on ``threads`` threads (default: every core this process may use).

        How one process uses several cores: the heavy parts of a run (BLAS GEMMs, compiled
        loops, large numpy passes) release the GIL, BLAS stays on one thread per call, and
        each call is independent, so the results are exactly the sequential ones."""
        requested = threads or usable_cores()
        threads = min(len(calls), requested)
        if threads <= 1:        # one call at a time: its native kernels get the cores
            return [self.run(inputs, rounding, explain, requested) for inputs in calls]
        if self._pool is None or self._pool._max_workers != threads:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
            cpus = sorted(_affinity())
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="torq-nss", initializer=_own_cpu,
                                            initargs=(cpus, itertools.count()) if len(cpus) >= threads else ([], None))
        with single_thread_run(pinned=True):      # no BLAS switch while calls run side by side
            futures = [self._pool.submit(self.run, inputs, rounding, explain, 1) for inputs in calls]
            return [f.result() for f in futures]


@contextlib.contextmanager
def _from_file(program: Program, st: Step):
    """A program read from a file that a kernel cannot run (attributes or weights that no
    compiler emits) is that file's one-line error; a compiled one's failure stays a bug."""
    try:
        yield
    except TorqError as e:
        if program.source is None or program.source in str(e):
            raise
        raise TorqError(f"{program.source}: {e}") from None
    except Exception as e:  # noqa: BLE001
        if program.source is None:
            raise
        raise TorqError(f"{program.source}: damaged torq program: {st.op} at {st.location} cannot run "
                        f"({type(e).__name__}: {one_line(e, 120)}); recompile the model") from None


def _affinity() -> set:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return set()


def _own_cpu(cpus: list, counter) -> None:
    """A ``run_many`` thread on a CPU of its own. Unpinned, a pool thread woken by the caller
    was placed on the caller's CPU whenever the other CPUs ran other processes' jobs, and the
    side-by-side calls then ran one after the other (evaluate, EfficientNet-Lite0, batches of
    16 at load 7: 88 ms per batch, wall = CPU; spread over both cores 46 ms)."""
    if cpus:
        try:
            os.sched_setaffinity(0, {cpus[next(counter) % len(cpus)]})
        except OSError:
            pass


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _check_result(out, k: _Kernel) -> None:
    """A step must produce exactly the type the IR declared (shape and element type)."""
    st = k.step
    shape = tuple(np.shape(out))
    dtype = getattr(out, "dtype", None)
    if shape != tuple(st.shape) or dtype != k.dtype:
        raise TorqError(f"NSS: {st.op} at {st.location} produced {_type(shape, dtype)}, the program declares "
                        f"{_type(st.shape, st.dtype)}")


def _type(shape, dtype) -> str:
    elem = dtype if isinstance(dtype, str) else element_type_name(dtype) if dtype else "?"
    return f"tensor<{'x'.join(map(str, shape))}{'x' if len(shape) else ''}{elem}>"


@dataclass
class OpDiff:
    """The per-op check of one rescaling op in one run: native-vs-ORT rounding on identical
    inputs (``differ``, ``max_lsb``, ``causes``) and how many executed outputs differ from the
    plain formula of the run's mode (``mismatches``: a fast path computing something else)."""
    op: str
    location: str
    mode: str
    size: int
    differ: int
    max_lsb: int
    causes: dict
    mismatches: int = 0

    @property
    def explained(self) -> bool:
        """The op executed its formula, and every native-vs-ort difference has a cause: ≤ 1 LSB
        at a (near-)tie, or, for int16 activations, within ORT's float32 error bound or at an
        int32 overflow of the ACT sum (numerics.int16: ``float`` / ``overflow``)."""
        bounded = "float" in self.causes
        return self.mismatches == 0 and (self.max_lsb <= 1 or bounded) and not self.causes.get("other")


