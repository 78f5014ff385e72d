"""Binary byte ops through a table of their 65536 results (see ``runtime.ops._pair_table``)."""
from __future__ import annotations

import numpy as np

from ...numerics.loops import jit

BYTE_TYPES = (np.dtype(np.int8), np.dtype(np.uint8))


def byte_grid(dtype) -> np.ndarray:
    """All 256 values of a one-byte integer dtype, in increasing order."""
    info = np.iinfo(dtype)
    return np.arange(info.min, info.max + 1).astype(dtype)


def pair_lookup(x: np.ndarray, y: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``table[(x - min) * 256 + (y - min)]`` for same-shaped one-byte arrays x, y (min of each
    dtype): a binary byte op evaluated through the table of its 65536 results."""
    out = np.empty(x.shape, dtype=table.dtype)
    _pair_lookup(np.ascontiguousarray(x).reshape(-1), np.ascontiguousarray(y).reshape(-1),
                 int(np.iinfo(x.dtype).min), int(np.iinfo(y.dtype).min), table, out.reshape(-1))
    return out


@jit
def _pair_lookup(x, y, xmin, ymin, table, out):
    for i in range(x.size):
        out[i] = table[(np.int64(x[i]) - xmin) * 256 + (np.int64(y[i]) - ymin)]
