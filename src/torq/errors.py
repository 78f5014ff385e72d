"""One exception type for problems the user can fix (bad file, bad flag, unsupported node).

CLIs print it as a single line and exit non-zero; anything else is a bug in torq."""


class TorqError(Exception):
    """A user-facing error; its message must name the file, flag or node at fault."""
