"""Where the NSS runs the evaluation batches: in process, in N worker processes, or on Ray.

Every backend takes an iterator of (start, int8 batch) and yields (start, int8 logits) for every
batch exactly once; a batch's result depends only on its images (the model is compiled for a
fixed batch and padded), so the backends agree image for image. Workers compile the model once
(per process / per Ray actor-less task process via a cache keyed by the model bytes).
"""
from __future__ import annotations

import hashlib

import numpy as np

from ..errors import TorqError

_ENGINES: dict = {}


def _engine(model_bytes: bytes, batch: int):
    """The NssEngine for (model, batch), compiled on first use in this process."""
    key = (hashlib.sha256(model_bytes).hexdigest(), batch)
    if key not in _ENGINES:
        import onnx

        from .engines import NssEngine
        _ENGINES[key] = NssEngine(onnx.load_from_string(model_bytes), batch)
    return _ENGINES[key]


def run_batch(model_bytes: bytes, batch: int, start: int, x: np.ndarray):
    """One task: (start, NSS int8 logits of x). Pure: re-running it gives the same answer."""
    return start, _engine(model_bytes, batch)(x)


def nss_outputs(qmodel, opts, inputs):
    """An iterator of (start, logits) per input batch from the backend chosen by ``opts``.

    In process, the model is compiled here, before the first batch (not part of images/s)."""
    data = qmodel.SerializeToString()
    if opts.ray:
        from .ray_backend import ray_outputs
        return ray_outputs(data, opts, inputs)
    if opts.jobs > 1:
        return _pool_outputs(data, opts, inputs)
    engine = _engine(data, opts.batch)
    return ((start, engine(x)) for start, x in inputs)


def _pool_outputs(data: bytes, opts, inputs):
    import multiprocessing as mp
    from functools import partial
    if opts.jobs < 1:
        raise TorqError(f"--jobs {opts.jobs} must be at least 1")
    ctx = mp.get_context("spawn")            # fresh interpreters: no forked BLAS/numba threads
    with ctx.Pool(opts.jobs) as pool:
        task = partial(_pool_task, data, opts.batch)
        yield from pool.imap(task, inputs)


def _pool_task(data, batch, item):
    start, x = item
    return run_batch(data, batch, start, x)
