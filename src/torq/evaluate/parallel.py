"""Where the NSS runs the evaluation batches: in process, in N worker processes, or on Ray.

Every backend takes an iterator of (start, int8 batch) and yields (start, int8 logits) for every
batch exactly once; a batch's result depends only on its images (the model is compiled for a
fixed batch and padded), so the backends agree image for image. Workers compile the model once
(per process / per Ray actor-less task process via a cache keyed by the model bytes).

In process, one batch runs as sub-batches side by side on every core (threads,
``NssEngine``). ``--jobs N`` (N worker processes, one thread and one BLAS thread each) is the
other way to use several cores: N processes run N batches side by side. The workers compile
the model before the first batch is handed out (not part of images/s), and batches go out in
rounds of N: the caller's preprocessing of the next round never overlaps the NSS, so "NSS
seconds = wall time - preprocessing time" stays true.
"""
from __future__ import annotations

import hashlib

import numpy as np

from ..errors import TorqError
from ..workers import WorkerPool, cap_jobs

_ENGINES: dict = {}
_WORKER: dict = {}              # in a --jobs worker: its engine


def _engine(model_bytes: bytes, batch: int, threads: int | None = None, rounding: str = "native"):
    """The NssEngine for (model, batch, threads, rounding), compiled on first use in this process."""
    key = (hashlib.sha256(model_bytes).hexdigest(), batch, threads, rounding)
    if key not in _ENGINES:
        import onnx

        from .engines import NssEngine
        _ENGINES[key] = NssEngine(onnx.load_from_string(model_bytes), batch, rounding=rounding, threads=threads)
    return _ENGINES[key]


def run_batch(model_bytes: bytes, batch: int, start: int, x: np.ndarray, rounding: str = "native"):
    """One task (a Ray worker, one core): (start, NSS int8 logits of x). Pure: re-running it
    gives the same answer."""
    return start, _engine(model_bytes, batch, threads=1, rounding=rounding)(x)


def nss_outputs(qmodel, opts, inputs, images: int = 0):
    """An iterator of (start, logits) per input batch from the backend chosen by ``opts``.

    In process and with --jobs, the model is compiled here, before the first batch (not part
    of images/s). ``images``: how many there are, when known (no more --jobs workers than batches)."""
    data = qmodel.SerializeToString()
    if opts.ray:
        from .ray_backend import ray_outputs
        return ray_outputs(data, opts, inputs)
    if opts.jobs < 1:
        raise TorqError(f"--jobs {opts.jobs} must be at least 1")
    if opts.threads < 0:
        raise TorqError(f"--threads {opts.threads} must be at least 0 (0 = every core)")
    jobs = cap_jobs(opts.jobs, -(-images // opts.batch) if images else opts.jobs)
    if jobs > 1:
        return _pool_outputs(_start_pool(data, opts.batch, jobs, opts.rounding), jobs, inputs)
    engine = _engine(data, opts.batch, opts.threads or None, opts.rounding)
    return ((start, engine(x)) for start, x in inputs)


def _start_pool(data: bytes, batch: int, jobs: int, rounding: str = "native"):
    """``jobs`` spawned workers, each with the model compiled and one BLAS thread; returns once
    all of them are ready (or raises the first worker's compile error)."""
    pool = WorkerPool(jobs, init=_worker_init, initargs=(data, batch, rounding), what="evaluate --jobs")
    try:
        pool.wait_ready()
    except BaseException:
        pool.close()
        raise
    return pool


def _worker_init(data: bytes, batch: int, rounding: str = "native") -> None:
    from threadpoolctl import threadpool_limits
    _WORKER["blas"] = threadpool_limits(1)   # N processes on N cores: one BLAS thread each
    _WORKER["engine"] = _engine(data, batch, threads=1, rounding=rounding)


def _pool_outputs(pool, jobs: int, inputs):
    """Rounds of ``jobs`` batches: read them (the caller's preprocessing), run them side by side.
    A worker that dies is noticed: its batch is retried once, then named in a one-line error."""
    with pool:
        while True:
            items = [item for _, item in zip(range(jobs), inputs)]
            if not items:
                return
            yield from pool.map(_pool_task, items, label=_batch_label)


def _batch_label(item) -> str:
    start, x = item
    return f"running images {start}..{start + len(x) - 1}"


def _pool_task(item):
    start, x = item
    return start, _WORKER["engine"](x)
