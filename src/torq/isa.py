"""What the NSS executes, as data: the one list the compiler's lowering report, the Program
emitter and the simulator all read (a test holds the three to it).

A Program step is a ``torq_hl.*`` op (schema: ``compiler/torq_hl.py``) or one of the
data-movement ops below, with the attributes listed beside it. ``STRUCTURAL`` ops become no step:
``arith.constant`` is a Program constant, ``tensor.empty`` an uninitialised init, ``func.return``
the outputs. Element types are named as MLIR spells them.
May import: nothing from torq; numpy and the standard library (the contract layer, beside ``program.py``).
"""
from __future__ import annotations

import numpy as np

#: Pure data movement the NSS runs besides torq_hl ops -> the attributes its step carries.
DATA_MOVEMENT = {
    "tensor.pad": ("low", "high", "value"),
    "tensor.collapse_shape": (),
    "tensor.expand_shape": (),
    "tensor.reshape": (),
    "tensor.cast": (),
    "linalg.transpose": ("permutation",),
    "linalg.broadcast": ("dimensions",),
    "linalg.fill": (),
    "tensor.extract_slice": ("offsets", "sizes", "strides"),
    "tensor.insert_slice": ("offsets", "sizes", "strides"),
    "tensor.concat": ("dim",),
}

#: IR ops that need no NSS kernel and become no step.
STRUCTURAL = frozenset({"arith.constant", "tensor.empty", "func.return"})

#: Element types as MLIR spells them -> the numpy type that holds them (bf16 lives in float32).
ELEMENT_TYPES = {"i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
                 "ui8": np.uint8, "f16": np.float16, "f32": np.float32, "f64": np.float64,
                 "bf16": np.float32}

_NAMES = {np.dtype(t): name for name, t in ELEMENT_TYPES.items() if name != "bf16"}


def runs_on_nss(op: str) -> bool:
    """Whether an IR op is something a Program may hold (a step, or structural)."""
    return op.startswith("torq_hl.") or op in DATA_MOVEMENT or op in STRUCTURAL


def element_type_name(dtype) -> str:
    """The MLIR name of a numpy dtype (float32 -> "f32"); the dtype's own name if it has none."""
    return _NAMES.get(np.dtype(dtype), str(dtype))
