"""BLAS thread count for the exact GEMMs.

OpenBLAS splits every matmul over all cores and busy-waits for its workers. On a shared or
small host (2 vCPUs, other processes running) that makes the small GEMMs of 1x1 / late-stage
convolutions 4-80x slower than one thread (measured: 112x672 @ 672x196 float32 0.34 ms on one
thread, 8-28 ms on two under load). The simulator therefore runs GEMMs below
``SMALL_GEMM_MACS`` multiply-accumulates on one BLAS thread; larger ones keep the process
setting. Results are identical either way (every GEMM is exact; see the package doc).

Switching costs ~30 us (threadpoolctl), which per GEMM adds up (a batch of 16 EfficientNet-Lite0
images runs ~500 of them), so a whole simulator run sits in ``single_thread_run``: one switch
to one thread for the run, and back to the process setting only around the large GEMMs.

Several runs may execute at once in different threads (``Simulator.run_many`` uses every core
that way). The BLAS setting is process-wide, so the first run to start switches it to one
thread and the last to end switches it back; a large GEMM gets every core only while its run
is the only one active, and no run starts or ends while it has them (one lock guards both).
``single_thread_run(pinned=True)`` keeps BLAS on one thread throughout, also for large GEMMs.

Measured with numpy's OpenBLAS 0.3.31: once the main thread has set the thread count, a set
from another thread does not take effect. So whoever runs calls side by side enters the pinned
context in its own (usually the main) thread first and leaves it last, as ``run_many`` does:
the switches then happen there. Results never depend on it (every GEMM is exact).
"""
from __future__ import annotations

import contextlib
import threading

SMALL_GEMM_MACS = 1 << 26

_controller = None
_lock = threading.RLock()
_state = {"active": {}, "saved": [], "threads": 1, "pinned": 0}   # active: thread id -> depth


def _blas():
    """The threadpoolctl controller of the loaded BLAS libraries (built on first use)."""
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController
        _controller = ThreadpoolController().select(user_api="blas")
    return _controller


@contextlib.contextmanager
def single_thread_run(pinned: bool = False):
    """Context for a whole simulator run (any thread, nested or concurrent runs): BLAS on one
    thread, except inside large GEMMs of a run that is alone (never when ``pinned``)."""
    me = threading.get_ident()
    with _lock:
        active = _state["active"]
        if not active:
            libs = _blas().lib_controllers
            _state["saved"] = [(lib, lib.get_num_threads()) for lib in libs]
            _state["threads"] = max([n for _, n in _state["saved"]] or [1])
            _set_threads(libs, 1)
        active[me] = active.get(me, 0) + 1
        _state["pinned"] += int(pinned)
    try:
        yield
    finally:
        with _lock:
            _state["pinned"] -= int(pinned)
            active[me] -= 1
            if not active[me]:
                del active[me]
            if not active:
                for lib, n in _state["saved"]:
                    lib.set_num_threads(n)
                _state["saved"] = []


@contextlib.contextmanager
def _all_cores():
    """Every BLAS thread for one large GEMM of the only active run (see the module doc)."""
    _lock.acquire()
    alone = (not _state["pinned"] and _state["threads"] > 1
             and list(_state["active"]) == [threading.get_ident()])
    if not alone:
        _lock.release()
        yield
        return
    try:
        _set_threads(_blas().lib_controllers, _state["threads"])
        yield
    finally:
        _set_threads(_blas().lib_controllers, 1)
        _lock.release()


def _set_threads(libs, n: int) -> None:
    """Set the thread count of each BLAS library (see the module doc on threads)."""
    for lib in libs:
        lib.set_num_threads(n)


def gemm_threads(macs: int):
    """Context for one GEMM of ``macs`` multiply-accumulates: one BLAS thread when it is small."""
    if _state["active"]:
        if macs < SMALL_GEMM_MACS:
            return contextlib.nullcontext()
        return _all_cores()
    if macs >= SMALL_GEMM_MACS:
        return contextlib.nullcontext()
    return _blas().limit(limits=1)


def all_threads():
    """Context for GEMMs that gain from every core (Winograd's batched ones): the process setting."""
    return gemm_threads(SMALL_GEMM_MACS)
