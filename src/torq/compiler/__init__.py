"""The TORQ compiler: quantized ONNX -> torch-mlir -> linalg -> torq_hl (see pipeline.py)."""
from .pipeline import STAGES, CompiledModel, compile  # noqa: A004

__all__ = ["STAGES", "CompiledModel", "compile"]
