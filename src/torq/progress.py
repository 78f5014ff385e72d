"""Progress on stderr for anything slow — never silence.

On a terminal: rich bars and spinners (transient), and a line for every stage that took over
``STAGE_S`` seconds. Anywhere else (a pipe, a log file, CI): plain timestamped lines — a stage
announced once it has run ``STAGE_S`` seconds, then every ``HEARTBEAT_S`` seconds and when it
ends; a bar every 5 % of its items or ``HEARTBEAT_S`` seconds. ``TORQ_PROGRESS=plain|rich|off``
overrides the choice.

May import: nothing of torq (a leaf: stdlib, rich).

    with stage("quantize: calibration"):
        ...
    with bar("discover", "layers") as update:
        update(i, n, label)
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

STAGE_S = 2.0
HEARTBEAT_S = 10.0
_live = threading.local()      # a rich live display is up: stages inside it print plain lines


def mode() -> str:
    forced = os.environ.get("TORQ_PROGRESS", "").lower()
    if forced in ("plain", "rich", "off"):
        return forced
    return "rich" if sys.stderr.isatty() and os.environ.get("TERM") != "dumb" else "plain"


def say(text: str) -> None:
    """One timestamped progress line on stderr."""
    if mode() != "off":
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _clock(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


@contextlib.contextmanager
def stage(what: str):
    """A step that may be slow: a spinner on a terminal; a line once it passes STAGE_S, a
    heartbeat every HEARTBEAT_S and its duration at the end, in plain mode."""
    m = mode()
    t0 = time.perf_counter()
    if m == "off":
        yield
        return
    if m == "rich" and not getattr(_live, "on", False):
        from rich.console import Console
        console = Console(stderr=True)
        _live.on = True
        try:
            with console.status(what):
                yield
        finally:
            _live.on = False
        took = time.perf_counter() - t0
        if took >= STAGE_S:
            console.print(f"[dim]{what}: {took:.1f} s[/]", highlight=False)
        return
    done = threading.Event()
    announced = []

    def beat():
        wait = STAGE_S
        while not done.wait(wait):
            announced.append(1)
            say(f"{what} ... ({_clock(time.perf_counter() - t0)})")
            wait = HEARTBEAT_S
    ticker = threading.Thread(target=beat, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        if announced:
            say(f"{what}: done in {time.perf_counter() - t0:.1f} s")


@contextlib.contextmanager
def bar(what: str, unit: str = "items"):
    """``update(i, n, label)`` advances a bar: rich on a terminal, else a line every 5 % or
    HEARTBEAT_S seconds (and at the end)."""
    m = mode()
    if m == "rich":
        with _rich_bar(what) as update:
            yield update
        return
    t0 = time.perf_counter()
    state = {"last_t": t0, "last_pct": -5, "i": 0, "n": 0, "label": ""}
    lock, done = threading.Lock(), threading.Event()

    def line(now):
        i, n = state["i"], state["n"]
        pct = 100 * i // n if n else 0
        eta = (now - t0) / i * (n - i) if i and n else 0.0
        say(f"{what}: {i}/{n or '?'} {unit}" + (f" ({pct} %)" if n else "")
            + (f" {state['label']}" if state["label"] and i < n else "")
            + f", {_clock(now - t0)} elapsed" + (f", ETA {_clock(eta)}" if i and i < n else ""))
        state["last_t"], state["last_pct"] = now, pct - pct % 5

    def update(i: int, n: int, label: str = ""):
        with lock:
            state.update(i=i, n=n, label=label)
            now = time.perf_counter()
            if m != "off" and n and (100 * i // n >= state["last_pct"] + 5 or now - state["last_t"] >= HEARTBEAT_S
                                     or i == n):
                line(now)

    def beat():                    # a slow item (a compile, a big layer) is no reason for silence
        while not done.wait(HEARTBEAT_S / 2):
            with lock:
                now = time.perf_counter()
                if m != "off" and now - state["last_t"] >= HEARTBEAT_S:
                    line(now)
    ticker = threading.Thread(target=beat, daemon=True)
    ticker.start()
    try:
        yield update
    finally:
        done.set()
        ticker.join()


@contextlib.contextmanager
def _rich_bar(what: str):
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)
    console = Console(stderr=True)
    _live.on = True
    try:
        with Progress(TextColumn(escape(what)), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                      TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
                      transient=True) as prog:
            task = prog.add_task("", total=None)

            def update(i: int, n: int, label: str = ""):
                prog.update(task, completed=i, total=n, description=escape(label[:48]))
            yield update
    finally:
        _live.on = False
