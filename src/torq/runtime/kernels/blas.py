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
"""
from __future__ import annotations

import contextlib

SMALL_GEMM_MACS = 1 << 26

_controller = None
_run = {"depth": 0, "threads": 0}       # inside single_thread_run: the process setting it saved


def _blas():
    """The threadpoolctl controller of the loaded BLAS libraries (built on first use)."""
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController
        _controller = ThreadpoolController().select(user_api="blas")
    return _controller


@contextlib.contextmanager
def single_thread_run():
    """Context for a whole simulator run: BLAS on one thread, except inside large GEMMs."""
    if _run["depth"]:
        _run["depth"] += 1
        try:
            yield
        finally:
            _run["depth"] -= 1
        return
    ctl = _blas()
    _run["threads"] = max([lib["num_threads"] for lib in ctl.info()] or [1])
    with ctl.limit(limits=1):
        _run["depth"] = 1
        try:
            yield
        finally:
            _run["depth"] = 0


def gemm_threads(macs: int):
    """Context for one GEMM of ``macs`` multiply-accumulates: one BLAS thread when it is small."""
    if _run["depth"]:
        if macs < SMALL_GEMM_MACS or _run["threads"] <= 1:
            return contextlib.nullcontext()
        return _blas().limit(limits=_run["threads"])
    if macs >= SMALL_GEMM_MACS:
        return contextlib.nullcontext()
    return _blas().limit(limits=1)


def all_threads():
    """Context for GEMMs that gain from every core (Winograd's batched ones): the process setting."""
    return gemm_threads(SMALL_GEMM_MACS)
