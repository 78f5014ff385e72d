"""The TORQ compiler: quantized ONNX -> torch-mlir -> linalg -> torq_hl (see pipeline.py).
May import: torq.compiler.frontend, torq.graph, torq.program, torq.isa, torq.numerics, torq.errors, torq.fileio (never the runtime or the quantizer).
"""
from .pipeline import STAGES, CompiledModel, compile  # noqa: A004

__all__ = ["STAGES", "CompiledModel", "compile"]
