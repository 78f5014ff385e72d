"""Rich progress bars on stderr: layer i/N, what is running, elapsed, ETA."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def layer_progress(what: str):
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)
    console = Console(stderr=True)
    with Progress(TextColumn(f"{what}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
                  transient=True, disable=not console.is_terminal) as prog:   # (logs: no stray lines)
        task = prog.add_task("", total=None)

        def update(i: int, n: int, label: str):
            prog.update(task, completed=i, total=n, description=escape(label[:48]))
        yield update
