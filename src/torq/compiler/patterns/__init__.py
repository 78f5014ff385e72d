"""The LinalgToTorqHL rules, one op family per module (conv, fully_connected, matmul, pooling,
elementwise, table, data movement, the bf16 float rules); `compiler/lowering.py` applies them.
May import: what ``torq.compiler`` may (its face)."""
