"""Pure tasks on a Ray cluster: ``evaluate --ray``, ``discover --ray``, ``run --ray``.

``--ray`` alone starts a new local Ray instance (or uses the one this process already has; never
a cluster it happens to find running);
``--ray ADDRESS`` joins a running cluster (``ray start --head`` on one machine, ``ray start
--address=HEAD:6379`` on the others, then ``--ray HEAD:6379`` or ``--ray auto`` on the head).
Every worker needs torq installed (the same version): Ray ships the task, not the packages.

A task here is pure: its result depends only on its arguments. When a worker dies, Ray runs the
task again (``MAX_RETRIES``) and gets the same result; results are collected by key, so no task
is lost and none counted twice. Callers that cache by content (discover's layer results, run's
compiled segments) write what comes back into their own cache, so a multi-node cluster needs no
shared file system.

Fault injection for tests: if ``TORQ_RAY_DIE_ONCE`` names a file that does not exist yet, the
first task to see it creates the file and kills its own worker process (``os._exit``).

May import: torq.errors.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from .errors import TorqError, one_line

MAX_RETRIES = 3
IN_FLIGHT_PER_CPU = 2


def connect(address) -> None:
    """Start or join Ray (``address`` True: local; else a cluster address); one-line errors."""
    try:
        import ray
    except ImportError:
        raise TorqError("--ray needs Ray: pip install 'torq[ray]'") from None
    if ray.is_initialized():
        return
    try:
        if address is True:              # a new local instance, never a cluster found running
            ray.init(address="local", include_dashboard=False, log_to_driver=False, configure_logging=False)
        else:
            ray.init(address=str(address), log_to_driver=False, configure_logging=False)
    except Exception as e:  # noqa: BLE001 - connection errors come in many types
        raise TorqError(f"--ray {address if address is not True else ''}: cannot start or join Ray: "
                        f"{one_line(e, 200)}") from None


def _call(fn, *args):
    marker = os.environ.get("TORQ_RAY_DIE_ONCE")
    if marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.close(fd)
            os._exit(1)                    # a worker dying mid-run, for the retry tests
    return fn(*args)


def unordered(fn, items: Iterable, address=True) -> Iterator[tuple]:
    """Yield ``(key, fn(*args))`` for ``(key, args)`` in ``items`` as the Ray tasks finish, at
    most a few tasks in flight per CPU of the cluster. ``fn`` is a module-level function."""
    connect(address)
    import ray
    remote = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=False)(_call)
    fn_ref = ray.put(fn)
    window = max(2, IN_FLIGHT_PER_CPU * int(ray.cluster_resources().get("CPU", 1)))
    pending: dict = {}
    done: set = set()
    items = iter(items)
    exhausted = False
    while pending or not exhausted:
        while not exhausted and len(pending) < window:
            item = next(items, None)
            if item is None:
                exhausted = True
                break
            key, args = item
            pending[remote.remote(fn_ref, *args)] = key   # top-level ObjectRefs arrive resolved
        if not pending:
            break
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            key = pending.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayTaskError as e:     # the task raised: its own error
                cause = getattr(e, "cause", None)
                raise cause if isinstance(cause, TorqError) else RuntimeError(
                    f"--ray task failed: {one_line(cause or e)}") from None
            except ray.exceptions.RayError as e:
                raise TorqError(f"--ray: task {key} failed {MAX_RETRIES + 1} times ({type(e).__name__}: "
                                "its workers died, e.g. out of memory); free memory or use fewer jobs") from None
            if key in done:                # cannot happen with pure tasks; guard the count anyway
                continue
            done.add(key)
            yield key, result


def ordered(fn, args_list: list, address=True, on_done=None) -> Iterator:
    """``fn(*args)`` for each of ``args_list``, yielded in order, computed as Ray tasks;
    ``on_done(n_finished)`` is called as tasks finish (in any order)."""
    buffer: dict = {}
    nxt = 0
    for n, (i, result) in enumerate(unordered(fn, enumerate(args_list), address), 1):
        buffer[i] = result
        if on_done:
            on_done(n)
        while nxt in buffer:
            yield buffer.pop(nxt)
            nxt += 1
