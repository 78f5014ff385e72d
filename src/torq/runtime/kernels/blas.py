"""BLAS thread count for the exact GEMMs.

OpenBLAS splits every matmul over all cores and busy-waits for its workers. On a shared or
small host (2 vCPUs, other processes running) that makes the small GEMMs of 1x1 / late-stage
convolutions 4-80x slower than one thread (measured: 112x672 @ 672x196 float32 0.34 ms on one
thread, 8-28 ms on two under load). The simulator therefore runs GEMMs below
``SMALL_GEMM_MACS`` multiply-accumulates on one BLAS thread; larger ones keep the process
setting. Results are identical either way (every GEMM is exact; see the package doc).
"""
from __future__ import annotations

import contextlib

SMALL_GEMM_MACS = 1 << 26

_controller = None


def _blas():
    """The threadpoolctl controller of the loaded BLAS libraries (built on first use)."""
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController
        _controller = ThreadpoolController().select(user_api="blas")
    return _controller


def gemm_threads(macs: int):
    """Context for one GEMM of ``macs`` multiply-accumulates: one BLAS thread when it is small."""
    if macs >= SMALL_GEMM_MACS:
        return contextlib.nullcontext()
    return _blas().limit(limits=1)
