"""NSS batches as Ray tasks: the same per-image results as in process, on any number of machines.

``--ray`` alone starts (or joins, if this process already has one) a local Ray instance;
``--ray ADDRESS`` joins a running cluster (``ray start --head`` on one machine, ``ray start
--address=HEAD:6379`` on the others, then ``--ray HEAD:6379`` or ``--ray auto`` on the head).
Every worker needs torq installed (the same version) -- Ray ships only the task, not packages.

Each batch is one task, keyed by its first image index. A task is pure (its result depends only
on its images), so when a worker dies Ray re-runs it (``max_retries``) and the result is the
same; results are collected by key, so a batch is never lost nor counted twice. The caller's
progress bar advances as tasks finish, in whatever order they finish.

Fault injection for tests: if ``TORQ_RAY_DIE_ONCE`` names a file that does not exist yet, the
first task to see that creates it and kills its own worker process (``os._exit``).
"""
from __future__ import annotations

import os

from ..errors import TorqError, one_line

MAX_RETRIES = 3
IN_FLIGHT_PER_CPU = 2


def _connect(address) -> None:
    try:
        import ray
    except ImportError:
        raise TorqError("--ray needs Ray: pip install 'torq[ray]'") from None
    if ray.is_initialized():
        return
    try:
        if address is True:
            ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
        else:
            ray.init(address=str(address), log_to_driver=False, configure_logging=False)
    except Exception as e:  # noqa: BLE001 - connection errors come in many types
        raise TorqError(f"--ray {address if address is not True else ''}: cannot start or join Ray: "
                        f"{one_line(e, 200)}") from None


def _task(model_ref, batch: int, start: int, x, rounding: str = "native"):
    marker = os.environ.get("TORQ_RAY_DIE_ONCE")
    if marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.close(fd)
            os._exit(1)                    # a worker dying mid-run, for the retry test
    from .parallel import run_batch
    return run_batch(model_ref, batch, start, x, rounding)


def ray_outputs(model_bytes: bytes, opts, inputs):
    """Yield (start, logits) as Ray tasks finish; at most a few tasks in flight per CPU."""
    _connect(opts.ray)
    import ray
    remote = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=False)(_task)
    model_ref = ray.put(model_bytes)
    window = max(2, IN_FLIGHT_PER_CPU * int(ray.cluster_resources().get("CPU", 1)))
    pending: dict = {}
    done: set[int] = set()
    inputs = iter(inputs)
    exhausted = False
    while pending or not exhausted:
        while not exhausted and len(pending) < window:
            item = next(inputs, None)
            if item is None:
                exhausted = True
                break
            start, x = item
            pending[remote.remote(model_ref, opts.batch, start, x, opts.rounding)] = start
        if not pending:
            break
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            pending.pop(ref)
            start, out = ray.get(ref)
            if start in done:              # cannot happen with pure tasks; guard the count anyway
                continue
            done.add(start)
            yield start, out
