"""Shared CLI plumbing: one-line errors, no tracebacks, distinct exit codes."""
from __future__ import annotations

import os
import sys
from typing import Callable

from .errors import TorqError


def run_main(prog: str, fn: Callable[[], int | None]) -> int:
    """Run a CLI body; TorqError -> 'prog: error: msg' on stderr, exit 2.

    Set TORQ_DEBUG=1 to see tracebacks of unexpected failures."""
    try:
        return fn() or 0
    except TorqError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug: still one line unless debugging
        if os.environ.get("TORQ_DEBUG"):
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"{prog}: internal error: {type(e).__name__}: {msg} (set TORQ_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 1
