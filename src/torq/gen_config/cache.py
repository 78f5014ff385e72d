"""Per-layer results cached by content: the layer's ONNX bytes + every flag that changes a result.

A resumed or repeated ``discover`` finds each layer it has already tested here and neither
recompiles nor reruns it. Compiled IREE modules are cached next to it (``gen_config/executors/iree.py``)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .._version import __version__
from ..fileio import atomic_write_json

#: bump when the comparison or recommendation rules change (old cached verdicts become stale)
RULES_VERSION = 2


class ResultCache:
    def __init__(self, root: Path, recompute: bool = False):
        self.root = Path(root)
        self.recompute = recompute
        self.hits = 0

    def key(self, model_bytes: bytes, flags: dict) -> str:
        h = hashlib.sha256(f"torq {__version__}|rules {RULES_VERSION}|".encode() + json.dumps(flags, sort_keys=True).encode())
        h.update(model_bytes)
        return h.hexdigest()

    def _path(self, key: str, executor: str) -> Path:
        return self.root / "results" / key[:2] / f"{key}.{executor}.json"

    def get(self, key: str, executor: str) -> dict | None:
        if self.recompute:
            return None
        try:
            result = json.loads(self._path(key, executor).read_text())
        except (OSError, ValueError):
            return None
        self.hits += 1
        return result

    def put(self, key: str, executor: str, result: dict) -> None:
        try:
            atomic_write_json(self._path(key, executor), result)
        except OSError:
            pass  # a read-only cache only costs speed
