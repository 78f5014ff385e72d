"""Compare NSS outputs with ONNX Runtime: |Δ| in LSB per output, and why native rounding differs."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class OutputDiff:
    name: str
    mode: str
    size: int
    differ: int
    max_lsb: float          # integer outputs: LSB; float outputs: absolute difference
    unit: str = "LSB"

    @property
    def exact(self) -> bool:
        return self.differ == 0


def output_diff(name: str, mode: str, ours: np.ndarray, ref: np.ndarray) -> OutputDiff:
    if ours.shape != ref.shape:
        raise ValueError(f"output {name}: shape {ours.shape} != reference {ref.shape}")
    if np.issubdtype(ref.dtype, np.integer):
        d = np.abs(ours.astype(np.int64) - ref.astype(np.int64))
        return OutputDiff(name, mode, int(d.size), int((d > 0).sum()), float(d.max(initial=0)))
    # float outputs (models without full-integer I/O): bitwise equality, and the largest |Δ|
    ours32, ref32 = ours.astype(np.float32), ref.astype(np.float32)
    differ = int((ours32.view(np.int32) != ref32.view(np.int32)).sum())
    return OutputDiff(name, mode, int(ref.size), differ, float(np.abs(ours32 - ref32).max(initial=0)), "abs")


def sum_causes(op_diffs) -> dict:
    total = {"tie": 0, "near-tie": 0, "float": 0, "overflow": 0, "other": 0}
    for od in op_diffs:
        for k, v in od.causes.items():
            total[k] = total.get(k, 0) + v
    return total
