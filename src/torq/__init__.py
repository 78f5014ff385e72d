"""torq: quantize ONNX models with ONNX Runtime, lower them to integer-only TORQ NPU ops
(torq_hl), simulate those bit-for-bit, and compare every layer with ONNX Runtime.

Python API (one direction of data flow: quantize -> graph -> compiler -> runtime -> gen_config):

    import torq
    qmodel = torq.quantize("model.onnx", per_channel=True, full_integer=True)
    prog = torq.compile(qmodel)
    outputs = prog.run({"input": x_int8}, rounding="native")
"""
from .errors import TorqError

__version__ = "0.1.0"


def quantize(*args, **kwargs):
    from .quantize import quantize as _q
    return _q(*args, **kwargs)


def compile(*args, **kwargs):  # noqa: A001 - mirrors torch.compile-style naming
    from .compiler import compile as _c
    return _c(*args, **kwargs)


__all__ = ["TorqError", "quantize", "compile", "__version__"]
