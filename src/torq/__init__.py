"""torq: quantize ONNX models with ONNX Runtime, lower them to integer-only TORQ NPU ops
(torq_hl), simulate those bit-for-bit, and compare every layer with ONNX Runtime.

Python API (data and imports flow one way: quantize -> graph -> compiler -> program -> runtime
-> verify / gen_config; torq.numerics is the leaf every stage uses):

    import torq
    qmodel = torq.quantize("model.onnx", per_channel=True, full_integer=True)
    prog = torq.compile(qmodel)
    outputs = prog.run({"input": x_int8}, rounding="native")
    prog.program.save("model.torq")          # torq.program.Program.load("model.torq") runs anywhere
"""
from .errors import TorqError

from ._version import __version__


def quantize(*args, **kwargs):
    from .quantize import quantize as _q
    return _q(*args, **kwargs)


def compile(*args, **kwargs):  # noqa: A001 - mirrors torch.compile-style naming
    from .compiled import compile as _c
    return _c(*args, **kwargs)


__all__ = ["TorqError", "quantize", "compile", "__version__"]
