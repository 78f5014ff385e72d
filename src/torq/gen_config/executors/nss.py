"""NSS: the torq_hl program on the bit-exact simulator (native NPU rounding by default)."""
from __future__ import annotations

import time

from . import ExecutorError, Runnable, one_line

NAME = "nss"


def build(compiled, *, cache_dir=None, rounding: str = "native") -> Runnable:
    try:
        compiled.program  # noqa: B018 - builds the program; refuses ops without a torq_hl rule
    except Exception as e:  # noqa: BLE001 - "not supported on NSS: <op> at L:C: <reason>"
        raise ExecutorError("no_pattern", one_line(e)) from None

    def run(inputs):
        t0 = time.perf_counter()
        out = compiled.run(inputs, rounding=rounding)
        return out, (time.perf_counter() - t0) * 1e3
    return Runnable(NAME, run)
