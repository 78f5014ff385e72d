"""Rich progress bars on stderr: layer i/N, what is running, elapsed, ETA."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def layer_progress(what: str):
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)
    import sys

    from ..cli_util import terminal
    console = Console(file=terminal(sys.stderr))      # never into a --log-file
    with Progress(TextColumn(f"{what}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
                  transient=True) as prog:
        task = prog.add_task("", total=None)

        def update(i: int, n: int, label: str):
            prog.update(task, completed=i, total=n, description=label[:48])
        yield update
