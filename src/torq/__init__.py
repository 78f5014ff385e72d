"""torq: quantize ONNX models with ONNX Runtime, lower them to integer-only TORQ NPU ops
(torq_hl), simulate those bit-for-bit, and compare every layer with ONNX Runtime.

Python API. Data flows quantize -> compile -> Program -> simulate; imports form a DAG (each
package face says what it may import, ``tests/test_imports.py`` holds it): graph and numerics
at the bottom, quantize and compiler on graph, the Program between compiler and runtime,
verify / evaluate / gen_config on top.

    import torq
    qmodel = torq.quantize("model.onnx", per_channel=True, full_integer=True)
    prog = torq.compile(qmodel)
    outputs = prog.run({"input": x_int8}, rounding="native")
    prog.program.save("model.torq")          # torq.program.Program.load("model.torq") runs anywhere
May import: torq._version, torq.errors, torq.compiled and torq.quantize (the last two lazily).
"""
from .errors import TorqError

from ._version import __version__


def quantize(*args, **kwargs):
    from .quantize import quantize as _q
    return _q(*args, **kwargs)


def __getattr__(name: str):
    """``torq.compile`` is ``torq.compiled.compile`` itself (its real signature in ``help``),
    imported on first use: ``import torq`` stays cheap (no ONNX, no MLIR)."""
    if name == "compile":
        from .compiled import compile as fn
        globals()["compile"] = fn
        return fn
    raise AttributeError(f"module 'torq' has no attribute {name!r}")


__all__ = ["TorqError", "quantize", "compile", "__version__"]
