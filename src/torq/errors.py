"""One exception type for problems the user can fix (bad file, bad flag, unsupported node).

CLIs print it as a single line and exit non-zero; anything else is a bug in torq.
May import: nothing from torq.
"""
from __future__ import annotations


class TorqError(Exception):
    """A user-facing error; its message must name the file, flag or node at fault."""


def one_line(e: BaseException | str, limit: int | None = 300) -> str:
    """Error text on one line: whitespace runs (newlines included) become one space.

    Never empty (falls back to the exception's type name); cut at `limit` characters."""
    text = " ".join(str(e).split())
    if not text:
        text = type(e).__name__ if isinstance(e, BaseException) else "?"
    if limit is not None and len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def quote(name: object) -> str:
    """A user-supplied name (node, tensor, file) as it goes into a message: repr-style, one line."""
    return repr(str(name))


class HostProblem(TorqError):
    """The machine, not the model: a full disk, a folder we may not write, a worker that was
    killed. Never recorded or cached as a verdict about a layer."""
