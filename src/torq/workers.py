"""Worker processes that may die (the OOM killer, a native crash): noticed, retried, reported.
May import: torq.errors.

``WorkerPool(jobs, init, initargs)`` starts ``jobs`` spawned processes (fresh interpreters: MLIR
contexts and numba/BLAS threads do not survive fork), each running ``init(*initargs)`` once.
``pool.map(fn, tasks, label)`` runs ``fn(task)`` for every task and yields the results in task
order. The parent hands each worker one task at a time and watches both its pipe and its process
sentinel, so it always knows which task a dead worker held: that task is retried once on a fresh
worker; a second death is a one-line ``HostProblem`` naming the task (``label(task)``). No wait
is unbounded: a worker either answers or its death is seen. A worker's exception is re-raised in
the parent (a ``TorqError`` as itself, anything else as one line).

Workers ignore SIGINT (the parent owns ^C and stops them) and exit when the parent's end of
their pipe closes, so a killed parent leaves no orphans.
"""
from __future__ import annotations

import os
import pickle
import signal
import time
from multiprocessing.connection import wait

from .errors import HostProblem, TorqError, one_line

START_TIMEOUT_S = 900        # a worker that neither starts nor dies (init hung) within this
TASK_TIMEOUT_S = float(os.environ.get("TORQ_TASK_TIMEOUT_S", 3600))   # a task that neither ends nor
                                                                       # dies in this is killed


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cap_jobs(jobs: int, work: int) -> int:
    """``--jobs`` bounded by the cores this process may use and by the number of tasks."""
    return max(1, min(int(jobs), usable_cores(), max(1, int(work))))


def _signal_name(code) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _worker_main(conn, init, initargs) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        if init is not None:
            init(*initargs)
        conn.send(("ready", None))
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        conn.send(("error", _portable(e)))
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return                       # the parent is gone
        if msg is None:
            return
        index, fn, task = msg
        try:
            reply = ("ok", index, fn(task))
        except BaseException as e:  # noqa: BLE001
            reply = ("raise", index, _portable(e))
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            conn.send(("raise", index, RuntimeError(f"unpicklable result: {e}")))


def _portable(e: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(e).__name__}: {e}")


class _Worker:
    def __init__(self, ctx, init, initargs):
        parent, child = ctx.Pipe()
        self.conn = parent
        self.proc = ctx.Process(target=_worker_main, args=(child, init, initargs), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.task = None                 # index of the task it holds
        self.started = 0.0               # when it got that task
        self.hung = False


class WorkerPool:
    def __init__(self, jobs: int, init=None, initargs=(), what: str = "worker"):
        import multiprocessing
        self.ctx = multiprocessing.get_context("spawn")
        self.init, self.initargs, self.what = init, initargs, what
        self.workers = [_Worker(self.ctx, init, initargs) for _ in range(max(1, jobs))]

    # -- lifetime
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        for w in self.workers:
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                pass
        for w in self.workers:
            w.proc.join(timeout=2)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(timeout=2)
            w.conn.close()
        self.workers = []

    def wait_ready(self) -> None:
        """Return once every worker has run ``init`` (raises the first init error)."""
        while not all(w.ready for w in self.workers):
            self._step(None, {}, {}, lambda t: "starting", timeout=START_TIMEOUT_S)

    # -- work
    def map(self, fn, tasks, label=str):
        """``fn(task)`` for every task, results yielded in task order."""
        tasks = list(tasks)
        pending, results, tries = list(range(len(tasks))), {}, {}
        nxt = 0
        while nxt < len(tasks):
            for w in list(self.workers):
                if w.ready and w.task is None and pending:
                    w.task, w.started = pending.pop(0), time.monotonic()
                    try:
                        w.conn.send((w.task, fn, tasks[w.task]))
                    except OSError:      # it died after its last answer
                        self._died(w, tasks, tries, label, pending)
            self._step(tasks, results, tries, label, pending=pending, timeout=self._next_deadline())
            while nxt in results:
                yield results.pop(nxt)
                nxt += 1

    def _next_deadline(self) -> float | None:
        """Seconds until the longest-running task reaches TASK_TIMEOUT_S (None: nothing runs)."""
        started = [w.started for w in self.workers if w.task is not None]
        return max(0.0, min(started) + TASK_TIMEOUT_S - time.monotonic()) if started else None

    def _step(self, tasks, results, tries, label, pending=None, timeout=None) -> None:
        busy = [w for w in self.workers if w.task is not None or not w.ready]
        if not busy:
            return
        ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout)
        if not ready and pending is None:
            raise HostProblem(f"{self.what}: a worker process did not start within {timeout} s")
        for w in busy:                   # a task past its time: its worker is killed (a death)
            if w.task is not None and time.monotonic() - w.started >= TASK_TIMEOUT_S:
                w.hung = True
                w.proc.kill()
        for w in busy:
            if w.conn in ready or w.proc.sentinel in ready:
                self._receive(w, tasks, results, tries, label, pending)

    def _receive(self, w: _Worker, tasks, results, tries, label, pending) -> None:
        try:
            if not w.conn.poll():
                raise EOFError
            msg = w.conn.recv()
        except (EOFError, OSError):
            self._died(w, tasks, tries, label, pending)
            return
        if msg[0] == "ready":
            w.ready = True
        elif msg[0] == "error":          # init: what the workers were given cannot be set up
            e = msg[1]
            raise e if isinstance(e, TorqError) else TorqError(
                f"{self.what}: a worker could not start: {type(e).__name__}: {one_line(e)}")
        elif msg[0] == "ok":
            results[msg[1]] = msg[2]
            w.task = None
        else:
            raise _reraise(msg[2], f"{self.what}: {label(tasks[msg[1]])}")

    def _died(self, w: _Worker, tasks, tries, label, pending) -> None:
        w.proc.join(timeout=5)
        why = _signal_name(w.proc.exitcode)
        if w.task is None:
            raise HostProblem(f"{self.what}: a worker process died while starting ({why}); "
                              "free memory or use fewer --jobs")
        task = w.task
        tries[task] = tries.get(task, 0) + 1
        if tries[task] > 1:
            what = (f"took longer than {TASK_TIMEOUT_S:.0f} s (TORQ_TASK_TIMEOUT_S) twice" if w.hung else
                    f"died twice ({why}, e.g. the OOM killer)")
            raise HostProblem(f"{self.what}: a worker process {what} while {label(tasks[task])}; "
                              "free memory or use fewer --jobs")
        pending.insert(0, task)          # retried once, first, on a fresh worker
        self.workers[self.workers.index(w)] = _Worker(self.ctx, self.init, self.initargs)
        w.conn.close()


def _reraise(e: BaseException, where: str) -> BaseException:
    if isinstance(e, (TorqError, KeyboardInterrupt)):
        return e
    return RuntimeError(f"{where}: {type(e).__name__}: {one_line(e)}")
