"""ONNX (int8) -> torch-onnx -> torch -> linalg -> torq_hl, keeping the IR of every stage.

`compile(model)` is the Python API under `torq-compile`: it returns a `CompiledModel` with
`.ir(stage)` and `.run(inputs, rounding=...)` (the NSS simulator).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from ..errors import TorqError
from ..fileio import atomic_write_text
from ..graph import signedness
from . import importer, lowering

STAGES = ("torch_onnx", "torch", "linalg", "torq_hl")


@dataclass
class CompiledModel:
    model: onnx.ModelProto                 # the quantized ONNX as given (what ORT runs as reference)
    input_names: list[str]
    output_names: list[str]
    stages: dict[str, str]                 # stage -> MLIR text
    report: lowering.LoweringReport
    operator_locations: list               # [(onnx op type, "LINE:COL")] of the torch_onnx text
    timings: dict[str, float] = field(default_factory=dict)
    uint8_inputs: list = field(default_factory=list)   # shifted to int8 at the boundary
    uint8_outputs: list = field(default_factory=list)
    _program: object = None
    _module: object = None                 # the live torq_hl module (keeps the torch.operator locations)

    def ir(self, stage: str = "torq_hl") -> str:
        if stage not in self.stages:
            raise TorqError(f"unknown IR stage {stage!r}; choose one of {', '.join(STAGES)}")
        return self.stages[stage]

    @property
    def program(self):
        """The NSS program (built on first use; refuses modules with unsupported ops)."""
        if self._program is None:
            from ..runtime.nss import NssProgram
            module = self._module or importer.parse(self.stages["torq_hl"], filename="model.torq_hl.mlir")
            self._program = NssProgram(module, self.report.unsupported)
        return self._program

    def run(self, inputs: dict[str, np.ndarray], rounding: str = "native") -> dict[str, np.ndarray]:
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise TorqError(f"missing input(s): {', '.join(missing)}")
        outs = self.program.run(self.feed(inputs), rounding)
        return self.fetch(outs)

    def feed(self, inputs: dict) -> list:
        """Inputs in function order; uint8 activations shifted to the int8 the module computes with."""
        return [signedness.shift_in(inputs[n]) if n in self.uint8_inputs else np.asarray(inputs[n])
                for n in self.input_names]

    def fetch(self, outs: list) -> dict:
        return {n: signedness.shift_out(o) if n in self.uint8_outputs else o
                for n, o in zip(self.output_names, outs)}


def _graph_io(model):
    inits = {i.name for i in model.graph.initializer}
    return ([i.name for i in model.graph.input if i.name not in inits], [o.name for o in model.graph.output])


def compile(model, debug_ir: str | os.PathLike | None = None, name: str | None = None) -> CompiledModel:  # noqa: A001
    """Compile a quantized ONNX model (path or ModelProto) to torq_hl.

    debug_ir: a folder that receives <name>.<stage>.mlir for every stage."""
    from ..graph.load import load_model
    from ..graph.specialise import specialise_dynamic_dims
    from ..graph.validate import validate
    t0 = time.perf_counter()
    if name is None:
        name = Path(model).stem if isinstance(model, (str, os.PathLike)) else (model.graph.name or "model")
    where, model = (str(model) if isinstance(model, (str, os.PathLike)) else "model"), load_model(model)
    validate(model, where)             # attribute values torch-mlir would trust blindly
    original = model
    model = specialise_dynamic_dims(model)     # compiled for batch 1 (graph/specialise.py)
    try:
        from ..graph.canonicalize import canonicalize
    except ImportError:  # pragma: no cover - canonicalisation lands separately
        canonicalize = None
    if canonicalize is not None:
        model = canonicalize(model)
    model, u8_in, u8_out, shifted = signedness.to_int8(model)
    stages: dict[str, str] = {}
    imported = importer.import_onnx(model)
    t1 = time.perf_counter()

    def dump(stage, text):
        stages[stage] = text

    module = importer.lower_to_linalg(imported, dump=dump)
    t2 = time.perf_counter()
    report = lowering.lower(module, ort_zp_shift=signedness.UINT8_SHIFT if shifted else 0,
                            onnx_ops={loc: op for op, loc in imported.operator_locations})
    try:
        module.operation.verify()      # the torq_hl dialect is IRDL-registered: attributes are checked
    except Exception as e:  # noqa: BLE001 - an invalid module is a compiler bug, say where
        raise RuntimeError(f"lowering produced an invalid module: {str(e).splitlines()[1:2]}") from None
    stages["torq_hl"] = module.operation.get_asm()
    t3 = time.perf_counter()
    ins, outs = _graph_io(model)
    compiled = CompiledModel(original, ins, outs, stages, report, imported.operator_locations,
                             {"import_s": t1 - t0, "linalg_s": t2 - t1, "torq_hl_s": t3 - t2}, u8_in, u8_out,
                             _module=module)
    if debug_ir is not None:
        for stage, text in stages.items():
            atomic_write_text(Path(debug_ir) / f"{name}.{stage}.mlir", text)
    return compiled
