"""ONNX (int8) -> torch-onnx -> torch -> linalg -> torq_hl -> Program, keeping every stage's IR.

`compile(model)` returns a `CompiledModel`: `.ir(stage)`, `.report`, `.timings` and `.program`
(the `torq.program.Program` the runtime executes). `torq.compile` wraps it with `.run`.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from .. import numerics
from ..errors import HostProblem, TorqError, one_line
from ..fileio import atomic_write_text, inside, safe_name
from ..graph.io_quant import io_quant_params
from ..graph.load import load_model
from ..graph.input_shape import specialise, static_shapes
from ..graph.validate import validate
from .frontend.wide_weights import per_axis_int16_weights
from ..program import Program
from ..graph.bf16 import bf16_seeds, is_bf16, retype_from, to_fp32
from . import importer, lowering, torq_hl
from .frontend import signedness
from .frontend.canonicalize import canonicalize
from .frontend.fold_shapes import fold_shape_arithmetic, slice_constant_gathers
from .emit import emit_program
from .islands import bracketed, find_islands

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
    islands: list = field(default_factory=list)        # [islands.Island]: ops run in bf16 (no integer form)
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


def _node_names(model, operator_locations) -> dict:
    """LINE:COL -> ONNX node name (its first output when unnamed): the k-th torch.operator is
    the k-th non-Constant node."""
    nodes = [n for n in model.graph.node if n.op_type != "Constant"]
    if len(nodes) != len(operator_locations):
        return {}
    return {loc: n.name or (n.output[0] if n.output else "") for n, (_, loc) in zip(nodes, operator_locations)}


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
    (graph/input_shape.py), contrib ops in standard form, shape arithmetic folded and constant-index
    Gathers as slices (compiler/frontend/fold_shapes.py). `gen_config run` partitions this same graph.

    A bf16 model goes through as its exact fp32 twin (the ONNX checker rejects bf16 Conv at the
    opsets models use; see graph/bf16.py) and is retyped bf16 at the end."""
    if is_bf16(model):
        return retype_from(import_graph(to_fp32(model)), bf16_seeds(model))
    model = per_axis_int16_weights(canonicalize(specialise(model)))
    return slice_constant_gathers(fold_shape_arithmetic(model))


def front_end(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str], list[str], bool]:
    """The ONNX model exactly as the importer receives it (`import_graph`, then uint8 made
    int8), with the uint8 input / output names and whether activations were shifted."""
    return signedness.to_int8(import_graph(model))


def compile(model, debug_ir: str | os.PathLike | None = None, name: str | None = None,  # noqa: A001
            bf16_islands: bool = True) -> CompiledModel:
    """Compile a quantized ONNX model (path or ModelProto) to torq_hl.

    debug_ir: a folder that receives <name>.<stage>.mlir for every stage (``name`` sanitised:
    a model's names never choose where files go); bf16_islands: ops without an integer form
    (Softmax, LayerNorm) run on the NSS in bf16 between the Q/DQ fallbacks (False: refused)."""
    t0 = time.perf_counter()
    if name is None:
        name = Path(model).stem if isinstance(model, (str, os.PathLike)) else (model.graph.name or "model")
    name = safe_name(name)
    where, model = (str(model) if isinstance(model, (str, os.PathLike)) else "model"), load_model(model)
    validate(model, where)             # attribute values torch-mlir would trust blindly
    static_shapes(model, where)        # every input size known but the batch's (graph/input_shape.py)
    io_quant = io_quant_params(model)  # (malformed metadata: a one-line error now, not later)
    original = model
    model, u8_in, u8_out, shifted = front_end(model)
    model.graph.name = func_name(model.graph.name)
    stages = importer.StageTexts()     # texts printed only when read (.ir, --emit, --debug-ir)
    imported = importer.import_onnx(model)
    t1 = time.perf_counter()

    def dump(stage, text):
        stages[stage] = text

    module = importer.lower_to_linalg(imported, dump=dump)
    t2 = time.perf_counter()
    onnx_ops = {loc: op for op, loc in imported.operator_locations}
    can_be = bracketed(model, imported.operator_locations, lowering.NO_INTEGER_FORM) if bf16_islands else False
    with torq_hl.recording() as recorded:
        report = lowering.lower(module, ort_zp_shift=numerics.UINT8_SHIFT if shifted else 0, onnx_ops=onnx_ops,
                                float_ops=is_bf16(model), onnx_names=_node_names(model, imported.operator_locations),
                                islands=can_be)
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
                               io_quant, recorded)
    except TorqError as e:
        why = str(e)
    t4 = time.perf_counter()
    found = find_islands(program, model, imported.operator_locations, report.islands) if program else []
    compiled = CompiledModel(original, ins, outs, stages, report, imported.operator_locations,
                             {"import_s": t1 - t0, "linalg_s": t2 - t1, "torq_hl_s": t3 - t2, "program_s": t4 - t3},
                             found, u8_in, u8_out, program, why)
    if debug_ir is not None:
        write_stages(stages, debug_ir, name)
    return compiled


def write_stages(stages, folder, name: str) -> None:
    """Every stage as ``folder/<name>.<stage>.mlir``; a folder we cannot write is a TorqError."""
    for stage, text in stages.items():
        try:
            atomic_write_text(inside(folder, f"{name}.{stage}.mlir"), text)
        except HostProblem:
            raise
        except (OSError, TorqError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise HostProblem(f"--debug-ir {folder}: cannot write {name}.{stage}.mlir: {why}") from None


def func_name(graph_name: str) -> str:
    """The MLIR function a graph imports as: ASCII word characters only (MLIR quotes and escapes
    any other name, and IREE exports it escaped), at most 48 characters."""
    clean = re.sub(r"[^A-Za-z0-9_]", "_", graph_name or "")[:48].strip("_")
    if not clean:
        return "main"
    return clean if not clean[0].isdigit() else f"g_{clean}"
