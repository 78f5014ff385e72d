"""The report on disk: read, merged and written under a lock, so no writer loses another's work.

* Every write is a transaction (``update``): lock the report's folder, re-read the report, apply
  the change to what is on disk *now*, write report + compiler JSON, unlock. An ``edit`` made
  while ``discover`` or ``run`` works is therefore merged, never overwritten. A writer waits
  up to ``LOCK_WAIT_S`` for the lock, then is refused in one line.
* ``discover`` and ``run`` also hold a session lock on the report (``session``): a second
  discover, or a run during a discover (which would judge a half-made map), is refused in one
  line. ``edit`` never takes it.
* Edits are data: ``edit`` records ``ops[id].edit`` (``executor``, ``tolerance``) beside the
  fields it sets; ``discover`` keeps them when it merges its results (``merge_discovered``).
* Whenever the executor map changes under a ``run`` result, that result is marked ``stale``.
* ``backup`` keeps a report (and its compiler JSON) that discover may not merge into.
"""
from __future__ import annotations

import contextlib
import copy
import fcntl
import glob
import hashlib
import json
import os
import time
from pathlib import Path

from ..errors import TorqError
from ..fileio import _new_file_mode, temp_prefix
from . import schema

LOCK_WAIT_S = 60
DISCOVER_FIELDS = ("executors", "_node_index", "_orig_index", "mlir_location", "skipped", "duplicate_of",
                   "mac_count", "precision")


def _try_lock(fd: int, how: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        except OSError:
            return True                  # a file system without locks: carry on unlocked


@contextlib.contextmanager
def write_lock(path: Path):
    """The report's folder, locked for one read-merge-write."""
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError as e:
        raise TorqError(f"{path.parent}: cannot open the report folder: {e.strerror}") from None
    try:
        if not _try_lock(fd, fcntl.LOCK_EX, LOCK_WAIT_S):
            raise TorqError(f"{path}: another torq-gen-config has held the lock on its folder for "
                            f"{LOCK_WAIT_S} s; try again when it is done")
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def session(path: Path, who: str, exclusive: bool):
    """discover (exclusive) and run (shared) on one report exclude each other. The lock file
    (``.<report>.lock``) is removed by the last holder."""
    lock = path.with_name(f".{path.name}.lock")
    fd = _open_lock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, path)
    try:
        note = f"a running {who} (pid {os.getpid()})".encode()
        if exclusive:
            os.ftruncate(fd, 0)
            _remove_stale_temps(path)
        with contextlib.suppress(OSError):      # (a full disk: the note is only informative)
            os.pwrite(fd, note.ljust(64), 0)
        yield
    finally:
        if _try_lock(fd, fcntl.LOCK_EX, 0):
            with contextlib.suppress(OSError):
                os.unlink(lock)
        os.close(fd)


def _remove_stale_temps(path: Path) -> None:
    """Temp files of report writes that a killed process left behind."""
    with write_lock(path):
        for name in (path.name, schema.compiler_path(path).name):
            for tmp in path.parent.glob(f"{glob.escape(temp_prefix(name))}*.tmp"):
                with contextlib.suppress(OSError):
                    tmp.unlink()


def _open_lock(lock: Path, how: int, path: Path) -> int:
    """An fd of ``lock`` holding ``how``; retried when the file was removed meanwhile."""
    for _ in range(20):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, _new_file_mode())
        except OSError as e:
            raise TorqError(f"{lock}: cannot create the report's lock file: {e.strerror}") from None
        if not _try_lock(fd, how, 0):
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another torq-gen-config"
            os.close(fd)
            raise TorqError(f"{path} is in use by {holder}; wait for it to finish (or use another "
                            "--output-dir)")
        try:
            if os.fstat(fd).st_ino == os.stat(lock).st_ino:
                return fd
        except OSError:
            pass
        os.close(fd)                     # its last holder removed it: take the new one
    raise TorqError(f"{lock}: cannot take the report's lock")


def map_digest(report: dict) -> str:
    """The executor map the compiler sees (LINE:COL -> executor), as one hash."""
    assign = schema.compiler_config(report)["op_assignments"]
    return hashlib.sha256(json.dumps(assign, sort_keys=True).encode()).hexdigest()


def _mark_stale(before: dict | None, after: dict) -> None:
    m = after.get("full_model_metrics")
    if not isinstance(m, dict) or m.get("stale"):
        return
    used = m.get("executor_map_sha256") or (map_digest(before) if before is not None else None)
    if used is not None and used != map_digest(after):
        m["stale"] = True


def read(path: Path) -> dict | None:
    """The report at ``path``, None when there is none; a damaged one is a TorqError."""
    if not path.exists():
        return None
    return schema.load(path)


def update(path: Path, change, keep_compiler_extras: bool = False) -> dict:
    """``change(report on disk or None) -> report`` under the lock; writes and returns it
    (``keep_compiler_extras``: see ``schema.save``). A change that leaves the report as it is on
    disk writes nothing (a command refused later leaves the files as they were)."""
    with write_lock(path):
        disk = read(path)
        before = copy.deepcopy(disk)
        report = change(disk)
        if before is not None and report == before and schema.compiler_path(path).exists():
            return report
        _mark_stale(before, report)
        try:
            schema.save(report, path, keep_compiler_extras=keep_compiler_extras)
        except OSError as e:
            raise TorqError(f"{path}: cannot write: {e.strerror or type(e).__name__}") from None
    return report


def backup(path: Path) -> Path:
    """Move the report and its compiler JSON aside as ``<name>.bak`` (``.bak.2``, ...)."""
    n, suffix = 1, ".bak"
    while path.with_name(path.name + suffix).exists():
        n += 1
        suffix = f".bak.{n}"
    kept = path.with_name(path.name + suffix)
    os.replace(path, kept)
    comp = schema.compiler_path(path)
    if comp.exists():
        os.replace(comp, comp.with_name(comp.name + suffix))
    return kept


def edited_executor(op: dict, computed):
    """An op's executor: its edit when it has one, else what discover computed."""
    edit = op.get("edit")
    if isinstance(edit, dict) and "executor" in edit:
        return edit["executor"]
    return computed


def merge_discovered(disk: dict | None, mine: dict, done: dict) -> dict:
    """``mine`` (discover's report) merged into ``disk``: for every layer in ``done`` (id ->
    the executor discover recommends) discover's fields replace the disk's; everything else on
    disk (edits, tolerances, run's metrics, layers not tested now) is kept."""
    if disk is None or disk.get("quantization") != mine.get("quantization"):
        out = copy.deepcopy(mine)
    else:
        out = copy.deepcopy(disk)
    ops = out["ops"]
    for lid, rec in done.items():
        src, op = mine["ops"][lid], ops.setdefault(lid, {"executors": {}})
        for f in DISCOVER_FIELDS:
            if f in src:
                op[f] = copy.deepcopy(src[f])
            else:
                op.pop(f, None)
        op["recommended_executor"] = edited_executor(op, rec)
    order = [lid for lid in mine["ops"] if lid in ops] + [lid for lid in ops if lid not in mine["ops"]]
    out["ops"] = {lid: ops[lid] for lid in order}
    schema.summarize(out)
    return out
