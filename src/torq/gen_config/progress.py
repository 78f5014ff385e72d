"""discover/run progress: a bar over layers or segments (``torq.progress``: rich on a terminal,
timestamped lines in logs and pipes)."""
from __future__ import annotations

from ..progress import bar, stage  # noqa: F401 (stage re-exported for gen_config)


def layer_progress(what: str, unit: str = "layers"):
    return bar(what, unit)
