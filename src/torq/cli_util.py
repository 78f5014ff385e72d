"""Shared CLI plumbing: one-line errors, no tracebacks, distinct exit codes.

Every error path prints exactly one line on stderr: our own TorqError, a numpy warning that
escalated, an internal bug (unless TORQ_DEBUG=1), ^C, or a closed stdout pipe (`| head`).
May import: torq.errors.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import threading
import warnings
from typing import Callable

from .errors import TorqError, one_line


class OneLineParser(argparse.ArgumentParser):
    """argparse, but usage errors are one line too (like every other torq error)."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {one_line(message, None)} (see {self.prog} --help)\n")


def quiet_native_logs() -> None:
    """ONNX Runtime's C++ logger writes coloured lines to stderr (even for errors we report
    ourselves); only fatal ones are kept."""
    try:
        import onnxruntime as ort
    except ImportError:  # pragma: no cover - a dependency
        return
    ort.set_default_logger_severity(4)


TERMINATED = 143


class Terminated(BaseException):
    """SIGTERM, raised where the program is, so every ``with`` block cleans up (temp folders)."""


def _on_sigterm(signum, frame):
    raise Terminated


def run_main(prog: str, fn: Callable[[], int | None]) -> int:
    """Run a CLI body; TorqError -> 'prog: error: msg' on stderr, exit 2.

    Set TORQ_DEBUG=1 to see tracebacks of unexpected failures."""
    quiet_native_logs()
    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _on_sigterm) if main else None
    try:
        code = _run(prog, fn)
    finally:
        if main:
            signal.signal(signal.SIGTERM, before)
    if code == TERMINATED and main:          # cleaned up: now end as SIGTERM asked
        os.kill(os.getpid(), signal.SIGTERM)
    return code


def _run(prog: str, fn) -> int:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)    # numpy: overflow, invalid value, ...
            return fn() or 0
    except TorqError as e:
        _say(f"{prog}: error: {one_line(e, limit=None)}")
        return 2
    except (RuntimeWarning, FloatingPointError) as e:
        if os.environ.get("TORQ_DEBUG"):
            raise
        _say(f"{prog}: error: numeric problem: {one_line(e)} (the model or data produce "
             "overflowing or undefined values; set TORQ_DEBUG=1 for a traceback)")
        return 2
    except BrokenPipeError:
        _stdout_to_devnull()     # the reader (`| head`) has what it wanted: not an error
        return 0
    except KeyboardInterrupt:
        _say(f"{prog}: interrupted")
        return 130
    except Terminated:
        _say(f"{prog}: terminated")
        return TERMINATED
    except Exception as e:  # a bug: still one line unless debugging
        if os.environ.get("TORQ_DEBUG"):
            raise
        _say(f"{prog}: internal error: {type(e).__name__}: {one_line(e)} "
             "(set TORQ_DEBUG=1 for a traceback)")
        return 1


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (BrokenPipeError, OSError):
        pass


def _stdout_to_devnull() -> None:
    """After EPIPE, point stdout at /dev/null so the interpreter's final flush stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[()][A-Za-z0-9]|\r")


class _Tee:
    """A text stream that also appends what it is given (without terminal control codes) to a
    log. It is no terminal (``isatty`` False): progress then prints plain timestamped lines,
    which read well in the log and on the screen alike, instead of redrawing a bar."""

    def __init__(self, stream, log):
        self.terminal, self._log = stream, log

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        self._log.write(_ANSI.sub("", text))
        return self.terminal.write(text)

    def flush(self) -> None:
        self._log.flush()
        self.terminal.flush()

    def __getattr__(self, name):        # isatty, fileno, encoding, ... of the terminal
        return getattr(self.terminal, name)


@contextlib.contextmanager
def log_to(path: str | None, prog: str = "", flag: str = "--log-file"):
    """With a path: everything printed on stdout and stderr is also written to that file (and
    the one-line error, if the command fails with one)."""
    if not path:
        yield
        return
    try:
        log = open(path, "w", encoding="utf-8")
    except OSError as e:
        raise TorqError(f"{flag} {path}: cannot write: {e.strerror}") from None
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Tee(out, log), _Tee(err, log)
    try:
        yield
    except TorqError as e:
        log.write(f"{prog}: error: {one_line(e, limit=None)}\n")
        raise
    finally:
        sys.stdout, sys.stderr = out, err
        log.close()
