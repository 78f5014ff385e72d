"""Layers of the fp32 model <-> compute ops of the (quantized) full model's MLIR.

The importer emits one ``torch.operator`` per ONNX node, in order, so the full model's
``operator_locations`` give every node its ``LINE:COL``. In quantized mode Q/DQ are dropped,
QLinear names normalised (``QLinearConv`` -> ``Conv``) and the layers' op types aligned to the
remaining ops by a longest common subsequence, so a Relu that ORT fused into its Conv has no
partner: it keeps its report entry with ``mlir_location`` = its op type (no compiler entry).
"""
from __future__ import annotations

QDQ = ("QuantizeLinear", "DequantizeLinear")
_QOPERATOR = {"QGemm": "Gemm", "QAttention": "Attention"}


def normalize(op_type: str) -> str:
    if op_type in _QOPERATOR:
        return _QOPERATOR[op_type]
    return op_type.removeprefix("QLinear") if op_type.startswith("QLinear") and op_type != "QLinear" else op_type


def lcs_align(a: list[str], b: list[str]) -> dict[int, int]:
    """index in ``a`` -> index in ``b`` for a longest common subsequence of equal items."""
    n, m = len(a), len(b)
    dp = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        row, nxt = dp[i], dp[i + 1]
        for j in range(m - 1, -1, -1):
            row[j] = nxt[j + 1] + 1 if a[i] == b[j] else max(nxt[j], row[j + 1])
    out, i, j = {}, 0, 0
    while i < n and j < m:
        if a[i] == b[j]:
            out[i] = j
            i, j = i + 1, j + 1
        elif dp[i + 1][j] >= dp[i][j + 1]:
            i += 1
        else:
            j += 1
    return out


def compute_ops(operator_locations) -> list[tuple[str, str]]:
    """(normalised op type, LINE:COL) of the non-Q/DQ, non-Constant operators, in order."""
    return [(normalize(op), loc) for op, loc in operator_locations if op not in QDQ and op != "Constant"]


def map_layers(layer_ops: list[str], operator_locations) -> list[tuple[int | None, str | None]]:
    """For each layer op type: (index among the compute ops, LINE:COL), or (None, None) if fused."""
    ops = compute_ops(operator_locations)
    align = lcs_align(layer_ops, [op for op, _ in ops])
    return [(align[i], ops[align[i]][1]) if i in align else (None, None) for i in range(len(layer_ops))]
