"""Shared by CSS and HOST: the layer's linalg IR compiled by IREE for one backend."""
from __future__ import annotations

from . import ExecutorError, Runnable, one_line


def build(name: str, compiled, cache_dir=None) -> Runnable:
    from ...runtime import iree
    try:
        module = iree.compile_module(compiled.ir("linalg"), iree.BACKENDS[name], cache_dir)
    except Exception as e:  # noqa: BLE001
        raise ExecutorError("iree_compile_failed", one_line(e)) from None

    def run(inputs):
        outs, ms = module.run(compiled.feed(inputs))
        return compiled.fetch(outs), ms
    return Runnable(name, run)
