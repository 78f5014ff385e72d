"""What `torq.compile` returns: the compiler's result, runnable on the NSS simulator.

The compiler stops at a `Program` (it never imports the runtime); this subclass, above both,
adds `run`. One `Simulator` is kept per compiled model, so weight plans and lookup tables are
built once and reused across runs.
May import: torq.compiler, torq.runtime.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .compiler.pipeline import CompiledModel
from .compiler.pipeline import compile as _compile_ir


@dataclass
class Compiled(CompiledModel):
    _simulator: object = None

    @property
    def simulator(self):
        """The NSS simulator bound to this model's program (built on first use)."""
        if self._simulator is None:
            from .runtime.nss import Simulator
            self._simulator = Simulator(self.program)
        return self._simulator

    def run(self, inputs: dict[str, np.ndarray], rounding: str = "native") -> dict[str, np.ndarray]:
        """Outputs of the NSS simulator for `inputs` (name -> array, the ONNX model's dtypes)."""
        return self.program.fetch(self.simulator.run(self.program.feed(inputs), rounding))


def compile(model, debug_ir=None, name: str | None = None, bf16_islands: bool = True) -> Compiled:  # noqa: A001
    """Compile a quantized ONNX model for the NSS: ONNX -> torch-mlir -> linalg -> torq_hl -> Program.

    model: a path or an ``onnx.ModelProto`` (QDQ or QOperator int8, e.g. from ``torq.quantize``);
    debug_ir: a folder that receives ``<name>.<stage>.mlir`` for every stage; name: the model
    name used there (default: the file stem). Returns a ``Compiled``: ``.run({name: array},
    rounding="native"|"ort")`` simulates it, ``.ir(stage)`` prints a stage, ``.program`` is the
    saveable Program, ``.report`` says what was lowered and why not. ``bf16_islands``: ops with
    no integer form (Softmax, LayerNorm) run in bf16 between the Q/DQ fallbacks (``.islands``);
    False refuses them. Bad input raises ``TorqError`` with a one-line message."""
    c = _compile_ir(model, debug_ir=debug_ir, name=name, bf16_islands=bf16_islands)
    return Compiled(**{f.name: getattr(c, f.name) for f in fields(c)})
