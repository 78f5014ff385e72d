"""Per-layer results cached by content: the layer's ONNX bytes + every flag that changes a result.

A resumed or repeated ``discover`` finds each layer it has already tested here and neither
recompiles nor reruns it. Compiled IREE modules are cached next to it (``gen_config/executors/iree.py``).

The cache holds results, not accidents: only completed verdicts are stored (an error caused by
the machine -- a full disk, a folder we may not write, a name too long for the file system -- is
not), and every entry is sealed (format, version, its key, a sha256 of its content). An entry
that is damaged, of another version or not a valid result is a miss: recomputed and rewritten,
never trusted, never a crash. ``hits`` counts only the entries really used.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .._version import __version__
from ..fileio import atomic_write_json
from .report_check import result_problem

#: bump when the comparison or recommendation rules, or how a layer is quantized, change (old cached
#: verdicts become stale; 3: --input-shape no longer fails every per-layer quantization; 4: exact scales
#: reach QOperator's QLinearConv and QGemm; 5: exact scales move the activation scales around each Add)
RULES_VERSION = 5
FORMAT_VERSION = 3

#: error texts that come from the machine, not the layer (never cached)
_HOST_MARKERS = ("[Errno", "No space left", "Permission denied", "Read-only file system",
                 "File name too long", "Too many open files", "Cannot allocate memory",
                 "failed to generate temporary file", "Disk quota", "MemoryError")


def seal(kind: str, key: str, body) -> dict:
    """A versioned, checksummed cache entry around ``body``."""
    return {"format": kind, "version": FORMAT_VERSION, "key": key, "body": body,
            "sha256": _digest(kind, key, body)}


def unseal(entry, kind: str, key: str):
    """``body`` of a sealed entry for ``key``, or None when it is anything else."""
    if not isinstance(entry, dict) or entry.get("format") != kind or entry.get("version") != FORMAT_VERSION \
            or entry.get("key") != key or "body" not in entry:
        return None
    return entry["body"] if entry.get("sha256") == _digest(kind, key, entry["body"]) else None


def _digest(kind: str, key: str, body) -> str:
    text = json.dumps([kind, FORMAT_VERSION, key, body], sort_keys=True, allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def read_sealed(path: Path, kind: str, key: str):
    """The body stored at ``path`` for ``key``, or None (missing, unreadable, damaged)."""
    try:
        return unseal(json.loads(path.read_text()), kind, key)
    except (OSError, ValueError, RecursionError, UnicodeDecodeError):
        return None


def write_sealed(path: Path, kind: str, key: str, body) -> None:
    try:
        atomic_write_json(path, seal(kind, key, body))
    except OSError:
        pass  # a read-only or full cache only costs speed


def cacheable(result: dict) -> bool:
    """A completed verdict about the layer: success, difference, or an error of the layer itself
    (not one the machine caused)."""
    if result.get("status") != "error":
        return True
    summary = str(result.get("failure_report", {}).get("summary", ""))
    return not any(m in summary for m in _HOST_MARKERS)


class ResultCache:
    def __init__(self, root: Path, recompute: bool = False):
        self.root = Path(root)
        self.recompute = recompute
        self.hits = 0

    def key(self, model_bytes: bytes, flags: dict) -> str:
        h = hashlib.sha256(f"torq {__version__}|rules {RULES_VERSION}|".encode() + json.dumps(flags, sort_keys=True).encode())
        h.update(model_bytes)
        return h.hexdigest()

    def path(self, key: str, executor: str) -> Path:
        return self.root / "results" / key[:2] / f"{key}.{executor}.json"

    def get(self, key: str, executor: str, tol: dict | None = None) -> dict | None:
        """The cached result, if there is a valid one (made with ``tol`` when given)."""
        if self.recompute:
            return None
        result = read_sealed(self.path(key, executor), "torq-result", f"{key}.{executor}")
        if result is None or result_problem(result, strict=True) or not cacheable(result):
            return None
        used = result.get("tolerance_used") or {}
        if tol is not None and {k: used.get(k) for k in tol} != tol:
            return None     # made with other tolerances (keys a test adds, e.g. an island's LSB, are its own)
        self.hits += 1
        return result

    def put(self, key: str, executor: str, result: dict) -> None:
        if cacheable(result) and result_problem(result, strict=True) is None:
            write_sealed(self.path(key, executor), "torq-result", f"{key}.{executor}", result)
