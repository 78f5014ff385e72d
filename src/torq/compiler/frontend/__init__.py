"""The compiler's ONNX front end: ONNX -> ONNX passes that make a quantized model importable by
torch-mlir (one canonical form per op, int8 everywhere, static shapes, floor-mode pools).
May import: ``torq.graph``, ``torq.numerics``, ``torq.errors`` (never MLIR, never the quantizer)."""
