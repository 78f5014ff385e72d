"""Run native compiler work in a forked child so a crash is a message, not a dead process.

`run_isolated(fn, model)` forks (cheap: the parent has already imported torch_mlir), caps the
child's address space (RLIMIT_AS), sends the child's stdout/stderr to a file we keep, and pickles
`fn(model)` back through a pipe. If the child dies by a signal or runs out of memory, each node
is retried alone (in its own child, within a time budget) to name the one that crashes:

    torq-compile: error: torch-mlir crashed (SIGSEGV) while lowering node 'conv1' (Conv): <diagnostic>

TORQ_ISOLATE=0 runs in process (debugging); TORQ_COMPILE_MEM_MB sets the child's extra address
space (default 4096 MiB); TORQ_COMPILE_CPU_S its CPU time (default 300 s: a lowering that loops
is stopped and reported, never waited for); TORQ_DEBUG=1 prints the child's full diagnostics.
"""
from __future__ import annotations

import faulthandler
import os
import pickle
import resource
import signal
import sys
import tempfile
import time
import traceback

import onnx
from onnx import helper

from ..errors import TorqError, one_line, quote

BISECT_BUDGET_S = 6.0
_DIAG_HINTS = ("LLVM ERROR", "Assertion", "error:", "terminate called", "what():")


IN_CHILD = False    # True inside the forked child: its stderr is already captured for diagnostics


class NativeCrash(TorqError):
    """torch-mlir died natively; `diagnostics` holds everything the child printed."""

    def __init__(self, message: str, diagnostics: str = ""):
        super().__init__(message)
        self.diagnostics = diagnostics


def enabled() -> bool:
    """Isolation needs fork (POSIX); TORQ_ISOLATE=0 turns it off."""
    return hasattr(os, "fork") and os.environ.get("TORQ_ISOLATE", "1") != "0"


def run_isolated(fn, model: onnx.ModelProto):
    """`fn(model)` in a memory-capped child; TorqError from the child is re-raised as is."""
    status, payload, diag = _fork_call(fn, model)
    if status == "ok":
        return payload
    if status == "error":
        raise TorqError(payload)
    if status == "bug":
        raise RuntimeError(payload)
    if status == "memory":
        raise NativeCrash(f"torch-mlir ran out of memory (address space capped at {payload >> 20} MiB; "
                          "TORQ_COMPILE_MEM_MB raises the budget)", diag)
    culprit = _find_culprit(fn, model)
    raise NativeCrash(_crash_message(payload, culprit, diag, _memory_cap() >> 20), diag)


def _budget_mb() -> int:
    return int(os.environ.get("TORQ_COMPILE_MEM_MB", "4096"))


def _memory_cap(extra_mb: int | None = None) -> int:
    """Current address space + the budget (numba/ORT reserve a lot of virtual memory up front)."""
    extra = (_budget_mb() if extra_mb is None else extra_mb) << 20
    try:
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        current = 0
    return current + extra


def _cpu_budget_s() -> int:
    return int(os.environ.get("TORQ_COMPILE_CPU_S", "300"))


def _fork_call(fn, model, extra_mb: int | None = None, cpu_s: int | None = None):
    """(status, payload, diagnostics): status 'ok' | 'error' | 'bug' | 'signal' | 'exit' | 'memory'.

    The result comes back through a temp file in RAM (/dev/shm): ~100 MB of MLIR text for
    ResNet-18 moves there faster than through a pipe."""
    cap = _memory_cap(extra_mb)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryFile() as diag, tempfile.TemporaryFile(dir=shm) as result:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(fn, model, result, diag.fileno(), cap, cpu_s or _cpu_budget_s())
        _, status = os.waitpid(pid, 0)
        diag.seek(0)
        text = diag.read().decode(errors="replace")
        result.seek(0)
        try:
            kind, payload = pickle.load(result)
            return kind, payload, text
        except Exception:  # noqa: BLE001 - nothing written, or a child killed mid-write
            pass
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGABRT and _out_of_memory(text):
            return "memory", cap, text
        return "signal", sig, text
    return "exit", os.WEXITSTATUS(status), text


def _child(fn, model, result, diag_fd: int, cap: int, cpu_s: int) -> None:
    global IN_CHILD
    IN_CHILD = True
    code = 0
    try:
        os.dup2(diag_fd, 1)
        os.dup2(diag_fd, 2)
        for sig in (signal.SIGSEGV, signal.SIGFPE, signal.SIGABRT, signal.SIGBUS, signal.SIGILL):
            signal.signal(sig, signal.SIG_DFL)   # handlers a library (e.g. Ray) left in the parent
        faulthandler.disable()
        faulthandler.enable(file=os.fdopen(os.dup(diag_fd), "w"), all_threads=False)
        try:
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            used = int(resource.getrusage(resource.RUSAGE_SELF).ru_utime + resource.getrusage(
                resource.RUSAGE_SELF).ru_stime)     # (inherited: the limit counts from there)
            resource.setrlimit(resource.RLIMIT_CPU, (used + cpu_s, used + cpu_s + 5))
        except (ValueError, OSError):
            pass
        try:
            out = ("ok", fn(model))
        except TorqError as e:
            out = ("error", str(e))
        except MemoryError:
            out = ("memory", cap)
        except ImportError as e:  # a native library that no longer fits under the cap
            out = ("memory", cap) if "failed to map" in str(e) else ("bug", f"ImportError: {one_line(e)}")
        except Exception as e:  # noqa: BLE001 - a bug in the child: say what and where
            tb = traceback.extract_tb(e.__traceback__)[-1:]
            where = f" at {tb[0].filename.rsplit('/', 1)[-1]}:{tb[0].lineno}" if tb else ""
            out = ("bug", f"{type(e).__name__}: {one_line(e)}{where}")
        pickle.dump(out, result, protocol=pickle.HIGHEST_PROTOCOL)
        result.flush()
    except BaseException:  # noqa: BLE001 - nothing may escape a forked child
        code = 70
    finally:
        os._exit(code)


def _out_of_memory(diag: str) -> bool:
    return any(s in diag for s in ("bad_alloc", "out of memory", "Cannot allocate memory"))


def _crash_message(payload, culprit: str | None, diag: str, cap_mb: int) -> str:
    where = f"while lowering node {culprit}" if culprit else \
        f"while lowering the model (no single node crashes alone with more memory: likely out of memory " \
        f"at its {cap_mb} MiB address-space cap; TORQ_COMPILE_MEM_MB raises it)"
    hint = _diagnostic_line(diag)
    if os.environ.get("TORQ_DEBUG") and diag:
        sys.stderr.write(diag)
    return f"torch-mlir {_what(payload)} {where}{': ' + hint if hint else ''}"


def _what(payload) -> str:
    if payload in (signal.SIGXCPU, signal.SIGKILL):
        return (f"did not finish within {_cpu_budget_s()} s of CPU (a runaway lowering; "
                "TORQ_COMPILE_CPU_S raises the budget)")
    if isinstance(payload, int) and payload > 0 and payload != 70:
        try:
            name = signal.Signals(payload).name
        except ValueError:
            name = f"signal {payload}"
        return f"crashed ({name})"
    return f"exited unexpectedly (status {payload})"


def _diagnostic_line(diag: str) -> str:
    """The most telling line of the child's output (hints in order of preference)."""
    lines = [ln.strip() for ln in diag.splitlines() if ln.strip()]
    for hint in _DIAG_HINTS:
        hits = [ln for ln in lines if hint in ln and not ln.startswith("Fatal Python error")]
        if hits:
            return one_line(hits[0], 200)
    return ""


def _find_culprit(fn, model: onnx.ModelProto) -> str | None:
    """The first node that crashes `fn` on its own (one child per node, within the budget)."""
    deadline = time.monotonic() + BISECT_BUDGET_S
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001
        inferred = model
    types = _value_types(inferred.graph)
    inits = {t.name: t for t in inferred.graph.initializer}
    for i, node in enumerate(inferred.graph.node):
        if time.monotonic() > deadline:
            return None
        single = _single_node_model(inferred, node, types, inits)
        if single is None:
            continue
        status, _, _ = _fork_call(fn, single, max(4 * _budget_mb(), 4096),   # memory is not the cause
                                  cpu_s=max(1, int(deadline - time.monotonic()) + 1))
        if status in ("signal", "exit", "memory"):
            return f"{quote(node.name or (node.output[0] if node.output else f'#{i}'))} ({node.op_type})"
    return None


def _value_types(g: onnx.GraphProto) -> dict:
    return {v.name: v for v in list(g.input) + list(g.value_info) + list(g.output)}


def _single_node_model(model, node, types: dict, inits: dict):
    """`node` alone: its initializers, typed graph inputs for the rest; None if a type is unknown."""
    ins, used = [], []
    for name in node.input:
        if not name:
            continue
        if name in inits:
            used.append(inits[name])
        elif name in types:
            ins.append(types[name])
        else:
            return None
    outs = [types[o] for o in node.output if o in types]
    if len(outs) != len([o for o in node.output if o]):
        return None
    g = helper.make_graph([node], "single", ins, outs, used)
    m = helper.make_model(g, opset_imports=list(model.opset_import))
    m.ir_version = model.ir_version
    return m
