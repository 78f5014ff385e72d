"""The NSS simulator: executes a ``torq.program.Program`` with numpy (``nss.Simulator``).
May import: torq.program, torq.isa, torq.numerics, torq.errors, torq.fileio (never the compiler, MLIR or ONNX Runtime).
"""
