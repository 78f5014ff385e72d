"""NSS batches as Ray tasks (``torq.cluster``): the same per-image results as in process, on
any number of machines.

Each batch is one pure task keyed by its first image index: a batch whose worker died is run
again, none is lost nor counted twice, and the caller's progress bar advances as tasks finish,
in whatever order they finish.
"""
from __future__ import annotations

from .. import cluster


def ray_outputs(model_bytes: bytes, opts, inputs):
    """Yield (start, logits) as Ray tasks finish."""
    cluster.connect(opts.ray)
    import ray
    from .parallel import run_batch
    model_ref = ray.put(model_bytes)
    items = ((start, (model_ref, opts.batch, start, x, opts.rounding)) for start, x in inputs)
    for _, (start, out) in cluster.unordered(run_batch, items, opts.ray):
        yield start, out
