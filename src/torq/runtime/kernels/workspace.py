"""Scratch memory reused from one simulator step to the next.

A fresh multi-megabyte numpy array is fresh pages from the kernel (glibc maps allocations above
32 MiB, and releases freed heap tops): the first write of every page faults and zero-fills it.
An EfficientNet-Lite0 batch of 8 allocates ~40 MB of float accumulators per early layer, and
those faults cost as much as the layer's GEMM (measured: 96x16 @ 16x12544 into a fresh array
1.5-2.5x slower than into a reused one). A ``Workspace`` hands out views of buffers it keeps, by
name: an array obtained under a name is valid until the same name is asked for again. The
simulator keeps one workspace per thread and passes it to the accumulation kernels, whose
accumulator it consumes within the same step; without a workspace the kernels allocate.
"""
from __future__ import annotations

import math
import threading

import numpy as np


class Workspace:
    """Named reusable buffers; ``array(name, shape, dtype)`` is ``np.empty`` without the faults."""

    def __init__(self):
        self._buffers: dict[str, np.ndarray] = {}

    def array(self, name: str, shape, dtype) -> np.ndarray:
        """An uninitialised array; its memory is reused by the next request for ``name``."""
        dtype = np.dtype(dtype)
        size = math.prod(shape) * dtype.itemsize
        buf = self._buffers.get(name)
        if buf is None or buf.size < size:
            buf = self._buffers[name] = np.empty(max(size, 64), dtype=np.uint8)
        return buf[:size].view(dtype).reshape(shape)

    @property
    def nbytes(self) -> int:
        return sum(b.size for b in self._buffers.values())


def empty(ws: Workspace | None, name: str, shape, dtype) -> np.ndarray:
    """``ws.array(name, shape, dtype)``, or a fresh ``np.empty`` without a workspace."""
    return np.empty(shape, dtype=dtype) if ws is None else ws.array(name, shape, dtype)


_local = threading.local()


def thread_workspace(which: str = "ws") -> Workspace:
    """This thread's workspace (simulator runs in several threads each use their own); a second
    name gives a second one (the high byte plane's accumulator lives while the low one runs)."""
    ws = getattr(_local, which, None)
    if ws is None:
        ws = Workspace()
        setattr(_local, which, ws)
    return ws
