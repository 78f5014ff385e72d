"""ONNX (int8) -> torch-onnx -> torch -> linalg -> torq_hl -> Program, keeping every stage's IR.

`compile(model)` returns a `CompiledModel`: `.ir(stage)`, `.report`, `.timings` and `.program`
(the `torq.program.Program` the runtime executes). `torq.compile` wraps it with `.run`.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from .. import numerics
from ..errors import TorqError, one_line
from ..fileio import atomic_write_text
from ..graph.io_quant import io_quant_params
from ..graph.load import load_model
from ..graph.validate import validate
from .frontend.wide_weights import per_axis_int16_weights
from ..program import Program
from ..graph.bf16 import convert_to_bf16, is_bf16, to_fp32
from . import importer, lowering, torq_hl
from .frontend import signedness
from .frontend.canonicalize import canonicalize
from .frontend.fold_shapes import fold_shape_arithmetic, slice_constant_gathers
from .frontend.specialise import specialise_dynamic_dims
from .emit import emit_program

STAGES = ("torch_onnx", "torch", "linalg", "torq_hl")


@dataclass
class CompiledModel:
    model: onnx.ModelProto                 # the quantized ONNX as given (what ORT runs as reference)
    input_names: list[str]
    output_names: list[str]
    stages: importer.StageTexts            # stage -> MLIR text (printed on first read)
    report: lowering.LoweringReport
    operator_locations: list               # [(onnx op type, "LINE:COL")] of the torch_onnx text
    timings: dict[str, float] = field(default_factory=dict)
    uint8_inputs: list = field(default_factory=list)   # shifted to int8 at the boundary
    uint8_outputs: list = field(default_factory=list)
    _program: Program | None = None
    _program_error: str | None = None      # why there is no program (first unsupported op)

    def ir(self, stage: str = "torq_hl") -> str:
        if stage not in self.stages:
            raise TorqError(f"unknown IR stage {stage!r}; choose one of {', '.join(STAGES)}")
        return self.stages[stage]

    @property
    def program(self) -> Program:
        """The Program the runtime executes; a TorqError naming the first op without a torq_hl
        lowering when the model has one ("not supported on NSS: <op> at LINE:COL: <reason>")."""
        if self._program is None:
            raise TorqError(self._program_error or "no program was emitted")
        return self._program

    def feed(self, inputs: dict) -> list:
        """Inputs in function order for the linalg module (IREE): uint8 activations shifted to the
        int8 the module computes with, bf16 inputs rounded and typed ``ml_dtypes.bfloat16``."""
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise TorqError(f"missing input(s): {', '.join(missing)}")
        bf16 = _bf16_inputs(self.model)
        return [numerics.uint8_to_int8(inputs[n]) if n in self.uint8_inputs else
                _as_bfloat16(inputs[n]) if n in bf16 else np.asarray(inputs[n]) for n in self.input_names]

    def fetch(self, outs: list) -> dict:
        """Outputs by name: uint8 shifted back, bf16 (``ml_dtypes.bfloat16``) as float32 values."""
        return {n: numerics.int8_to_uint8(o) if n in self.uint8_outputs else
                np.asarray(o, np.float32) if np.asarray(o).dtype.name == "bfloat16" else o
                for n, o in zip(self.output_names, outs)}


def _bf16_inputs(model) -> set:
    return {v.name for v in model.graph.input if v.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16}


def _as_bfloat16(x):
    import ml_dtypes
    return numerics.to_bf16(np.asarray(x, np.float32)).astype(ml_dtypes.bfloat16)


def _graph_io(model):
    inits = {i.name for i in model.graph.initializer}
    return ([i.name for i in model.graph.input if i.name not in inits], [o.name for o in model.graph.output])


def import_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """The ONNX graph whose k-th non-Constant node is the k-th imported torch.operator: batch 1
    (compiler/frontend/specialise.py), contrib ops in standard form, shape arithmetic folded and constant-index
    Gathers as slices (compiler/frontend/fold_shapes.py). `gen_config run` partitions this same graph.

    A bf16 model goes through as its exact fp32 twin (the ONNX checker rejects bf16 Conv at the
    opsets models use; see graph/bf16.py) and is retyped bf16 at the end."""
    if is_bf16(model):
        return convert_to_bf16(import_graph(to_fp32(model)))
    model = per_axis_int16_weights(canonicalize(specialise_dynamic_dims(model)))
    return slice_constant_gathers(fold_shape_arithmetic(model))


def front_end(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str], list[str], bool]:
    """The ONNX model exactly as the importer receives it (`import_graph`, then uint8 made
    int8), with the uint8 input / output names and whether activations were shifted."""
    return signedness.to_int8(import_graph(model))


def compile(model, debug_ir: str | os.PathLike | None = None, name: str | None = None) -> CompiledModel:  # noqa: A001
    """Compile a quantized ONNX model (path or ModelProto) to torq_hl.

    debug_ir: a folder that receives <name>.<stage>.mlir for every stage."""
    t0 = time.perf_counter()
    if name is None:
        name = Path(model).stem if isinstance(model, (str, os.PathLike)) else (model.graph.name or "model")
    where, model = (str(model) if isinstance(model, (str, os.PathLike)) else "model"), load_model(model)
    validate(model, where)             # attribute values torch-mlir would trust blindly
    original = model
    model, u8_in, u8_out, shifted = front_end(model)
    stages = importer.StageTexts()     # texts printed only when read (.ir, --emit, --debug-ir)
    imported = importer.import_onnx(model)
    t1 = time.perf_counter()

    def dump(stage, text):
        stages[stage] = text

    module = importer.lower_to_linalg(imported, dump=dump)
    t2 = time.perf_counter()
    onnx_ops = {loc: op for op, loc in imported.operator_locations}
    with torq_hl.recording() as recorded:
        report = lowering.lower(module, ort_zp_shift=numerics.UINT8_SHIFT if shifted else 0, onnx_ops=onnx_ops,
                                float_ops=is_bf16(model))
    try:
        module.operation.verify()      # the torq_hl dialect is IRDL-registered: attributes are checked
    except Exception as e:  # noqa: BLE001 - an invalid module is a compiler bug, say where
        raise RuntimeError(f"lowering produced an invalid module: {one_line(e)}") from None
    stages["torq_hl"] = module.operation.get_asm    # printed on first read (weights included)
    t3 = time.perf_counter()
    ins, outs = _graph_io(model)
    program, why = None, None
    try:
        program = emit_program(module, report.unsupported, onnx_ops, ins, outs, u8_in, u8_out,
                               io_quant_params(original), recorded)
    except TorqError as e:
        why = str(e)
    t4 = time.perf_counter()
    compiled = CompiledModel(original, ins, outs, stages, report, imported.operator_locations,
                             {"import_s": t1 - t0, "linalg_s": t2 - t1, "torq_hl_s": t3 - t2, "program_s": t4 - t3},
                             u8_in, u8_out, program, why)
    if debug_ir is not None:
        for stage, text in stages.items():
            atomic_write_text(Path(debug_ir) / f"{name}.{stage}.mlir", text)
    return compiled
