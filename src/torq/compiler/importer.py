"""ONNX -> torch-mlir -> linalg-on-tensors (no torch needed), isolated in a child process.

The imported module is printed to text and re-parsed from that text, so every op's location is
the LINE:COL of its `torch.operator` in that text: the key of the compiler JSON. The weights
(dialect resources, printed as hex after every op) stay out of that round trip: the parsed ops
take their attributes from the imported module (`fresh_module`). Lowering passes
keep those locations, so each linalg op (and each torq_hl op built from it) names its ONNX node.

torch-mlir trusts its input: a value we failed to validate can crash it natively (SIGSEGV,
abort, runaway memory). So import + pipelines run in a forked child with a memory cap
(`isolation.py`); the child hands back only what compiling needs -- the operator locations and
the linalg module as bytecode (locations included) -- and a crash becomes a one-line TorqError
naming the node. The stages' texts (~100 MB with weights for ResNet-18) are printed only when
`.ir(stage)`, `--emit` or `--debug-ir` asks for them (`StageTexts`).
"""
from __future__ import annotations

import contextlib
import io
from collections.abc import MutableMapping
import os
import re
import tempfile
from dataclasses import dataclass, field

import onnx

from ..errors import TorqError, one_line

TORCH_PIPELINE = "builtin.module(torch-onnx-to-torch-backend-pipeline)"
# The same pipeline without its two shape-refinement rounds (torch-shape-refinement-pipeline:
# reify a shape function per op, inline them all, simplify, drop), which are ~95 % of its time
# (DenseNet-121: ~4 s of ~4.3 s) and refine nothing when ONNX shape inference already typed every
# tensor statically. `cse` stands in for the inliner's canonicalisation that deduplicated
# constants, so the torch stage and the linalg module come out as the full pipeline's.
STATIC_TORCH_PIPELINE = ("builtin.module(func.func(convert-torch-onnx-to-torch{allow-non-finites=true},"
                         "torch-decompose-complex-ops,canonicalize,cse,torch-scalarize-shapes,cse),"
                         "torch-refine-public-return,func.func(canonicalize,torch-decompose-complex-ops,canonicalize))")
LINALG_PIPELINE = "builtin.module(torch-backend-to-linalg-on-tensors-backend-pipeline)"
CLEANUP_PIPELINE = "builtin.module(func.func(canonicalize,cse))"

_OPERATOR_RE = re.compile(r'torch\.operator\s+"onnx\.([A-Za-z0-9_]+)"')
_NOT_STATIC_RE = re.compile(r"!torch\.v?tensor(?!<\[[0-9,]*\],)")   # a tensor type without static shape + dtype


def new_context():
    """A torch-mlir context with the torch dialect and our torq_hl dialect registered."""
    from torch_mlir import ir
    from torch_mlir.dialects import torch as torch_d

    from .torq_hl import register_dialect

    ctx = ir.Context()
    torch_d.register_dialect(ctx)
    register_dialect(ctx)
    return ctx


@contextlib.contextmanager
def _quiet_stderr():
    """torch-mlir's QLinearConv lowering prints debug lines straight to fd 2; keep them from users
    (in the isolated child fd 2 is already the diagnostics file the parent keeps)."""
    from . import isolation
    if isolation.IN_CHILD:
        yield
        return
    try:
        fd = os.dup(2)
    except OSError:  # no real stderr (embedded use)
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(fd, 2)
            os.close(fd)


@dataclass
class ImportedModel:
    """torch-onnx MLIR text (its ops; the weights stay in `module`) plus the LINE:COL of every
    non-Constant torch.operator, in order.

    From the isolated child, `text` is None (printed on request, see `StageTexts`) and `bytecode`
    holds the linalg module; `source` is the ONNX model that re-derives the texts."""
    text: str | None
    operator_locations: list[tuple[str, str]] = field(default_factory=list)  # (onnx op type, "L:C")
    bytecode: bytes | None = field(default=None, repr=False)
    source: onnx.ModelProto | None = field(default=None, repr=False)
    module: object = field(default=None, repr=False)   # in process: the importer's module (the weights)


class StageTexts(MutableMapping):
    """stage -> MLIR text, where a value may be a zero-argument callable printed on first read:
    most compiles never look at the texts, and printing them (weights included) is costly."""

    def __init__(self):
        self._texts: dict = {}

    def __getitem__(self, stage: str) -> str:
        value = self._texts[stage]
        if callable(value):
            value = self._texts[stage] = value()
        return value

    def __setitem__(self, stage: str, value) -> None:
        self._texts[stage] = value

    def __delitem__(self, stage: str) -> None:
        del self._texts[stage]

    def __iter__(self):
        return iter(self._texts)

    def __len__(self) -> int:
        return len(self._texts)


def operator_locations(text: str) -> list[tuple[str, str]]:
    """(op_type, 'LINE:COL') of each non-Constant torch.operator, in text order (1-based)."""
    locs = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = _OPERATOR_RE.search(line)
        if m and m.group(1) != "Constant":
            locs.append((m.group(1), f"{lineno}:{line.find('torch.operator') + 1}"))
    return locs


def import_onnx(model: onnx.ModelProto) -> ImportedModel:
    """Import the model and lower it to linalg in an isolated child (see `isolation.py`)."""
    from . import isolation
    if not isolation.enabled():
        return import_in_process(model)      # lower_to_linalg then runs the pipelines here
    import torch_mlir.dialects.torch  # noqa: F401 - loaded before the fork: the child
    import torch_mlir.extras.onnx_importer  # noqa: F401 - starts warm and within its memory cap
    import torch_mlir.passmanager  # noqa: F401

    from . import torq_hl  # noqa: F401
    imported = isolation.run_isolated(import_and_lower, model)
    imported.source = model
    return imported


def import_and_lower(model: onnx.ModelProto) -> ImportedModel:
    """Import + every pipeline, in this process; what the parent needs: locations and bytecode."""
    imported = import_in_process(model)
    module = _lower(imported, None)
    buf = io.BytesIO()
    module.operation.write_bytecode(buf)
    return ImportedModel(None, imported.operator_locations, buf.getvalue())


def _import_and_print(model: onnx.ModelProto) -> dict[str, str]:
    """Import + pipelines printing the torch_onnx and torch stages (run isolated, on request)."""
    texts = {}
    _lower(import_in_process(model), lambda stage, m: texts.__setitem__(stage, m.operation.get_asm()))
    return {stage: texts[stage] for stage in ("torch_onnx", "torch")}


def import_in_process(model: onnx.ModelProto) -> ImportedModel:
    """Run torch-mlir's ONNX importer: the module, the text of its ops, their LINE:COL."""
    from torch_mlir.extras import onnx_importer

    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as e:  # noqa: BLE001 - onnx raises many types
        raise TorqError(f"ONNX shape inference failed: {one_line(e)}") from None
    ctx = new_context()
    try:
        info = onnx_importer.ModelInfo(model)
        module = info.create_module(context=ctx)
        onnx_importer.NodeImporter.define_function(info.main_graph, module.operation).import_all()
    except Exception as e:  # noqa: BLE001
        raise TorqError(f"torch-mlir cannot import the model: {one_line(e)}") from None
    text = _ops_text(module)
    return ImportedModel(text, operator_locations(text), module=module)


def _ops_text(module) -> str:
    """The module's text up to its dialect resources: the weights, which the full text prints as
    hex after every op (~90 % of it, and of its parse); lines and columns are the full text's."""
    text = module.operation.get_asm(large_elements_limit=None, large_resource_limit=0)
    end = text.find("\n{-#")
    return text if end < 0 else text[:end + 1]


def fresh_module(imported: ImportedModel):
    """`imported.text` parsed (each op at its LINE:COL), with the imported module's attributes
    (the weights among them) set on the parsed ops, in the imported module's context."""
    module = parse(imported.text, imported.module.context)
    ours, theirs = _all_ops(module), _all_ops(imported.module)
    if [op.name for op in ours] != [op.name for op in theirs]:
        raise RuntimeError("the parsed torch-onnx text does not mirror the imported module")
    for op, source in zip(ours, theirs):
        for name in source.attributes:
            op.attributes[name] = source.attributes[name]
    return module


def _all_ops(module) -> list:
    from torch_mlir import ir
    ops = []

    def visit(op):
        ops.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return ops


def parse(text: str, ctx=None, filename: str = "model.torch_onnx.mlir"):
    """Parse MLIR text; op locations become 'filename':LINE:COL."""
    from torch_mlir import ir

    ctx = ctx or new_context()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, filename)
        with open(path, "w") as f:
            f.write(text)
        with ctx:
            try:
                return ir.Module.parseFile(path)
            except Exception as e:  # noqa: BLE001
                raise TorqError(f"cannot parse MLIR: {_first_error(e)}") from None


def _first_error(e: Exception) -> str:
    """The first 'error:' diagnostic of an MLIR exception, without the temp-file path."""
    lines = str(e).splitlines()
    line = next((ln for ln in lines if "error:" in ln), lines[0] if lines else "?")
    return re.sub(r'^\s*error:\s*"[^"]*":', "line ", line.strip())


def run_pipeline(module, pipeline: str, what: str, verify_each: bool = True) -> None:
    """Run `pipeline` on `module`; verify_each=False verifies the result once instead of after
    every pass (the linalg pipeline's ~20 verifications were ~45 % of its time)."""
    from torch_mlir.passmanager import PassManager

    with module.context, _quiet_stderr():
        try:
            pm = PassManager.parse(pipeline)
            pm.enable_verifier(verify_each)
            pm.run(module.operation)
            if not verify_each:
                module.operation.verify()
        except Exception as e:  # noqa: BLE001
            raise TorqError(f"{what} failed: {_first_error(e)}") from None


def lower_to_linalg(imported: ImportedModel, ctx=None, dump=None):
    """torch-onnx text -> torch backend -> linalg-on-tensors module.

    `dump(stage, text)` is called for each stage (used by --debug-ir). Uses the isolated child's
    result (parsed in `ctx`) when `imported` came from `import_onnx`, else lowers the imported
    module in process. From the child, `text` is a callable printing that stage on request."""
    if imported.bytecode is None:
        return _lower(imported, dump and (lambda stage, m: dump(stage, m.operation.get_asm())))
    from torch_mlir import ir
    if dump:
        reprint = _Reprint(imported.source)
        dump("torch_onnx", lambda: reprint("torch_onnx"))
        dump("torch", lambda: reprint("torch"))
        dump("linalg", lambda: ir.Module.parse(imported.bytecode, context=new_context()).operation.get_asm())
    return ir.Module.parse(imported.bytecode, context=ctx or new_context())


class _Reprint:
    """The torch_onnx and torch texts, re-derived in one isolated child on the first request."""

    def __init__(self, model: onnx.ModelProto):
        self.model, self.texts = model, None

    def __call__(self, stage: str) -> str:
        if self.texts is None:
            from . import isolation
            self.texts = isolation.run_isolated(_import_and_print, self.model)
        return self.texts[stage]


def _lower(imported: ImportedModel, dump):
    """The pipelines on a fresh copy of the torch-onnx module; `dump(stage, module)` after each."""
    module = fresh_module(imported)
    if dump:
        dump("torch_onnx", module)
    module = _to_torch(module, imported)
    if dump:
        dump("torch", module)
    # its input is verified torch backend IR (malformed models fail before); checked again at the end
    run_pipeline(module, LINALG_PIPELINE, "torch-to-linalg lowering", verify_each=False)
    run_pipeline(module, CLEANUP_PIPELINE, "canonicalization", verify_each=False)
    if dump:
        dump("linalg", module)
    return module


def _to_torch(module, imported: ImportedModel):
    """torch-onnx -> torch backend: STATIC_TORCH_PIPELINE when every tensor type of the imported
    module (and of its result) is static, else the full pipeline on a fresh copy of the import."""
    if not _NOT_STATIC_RE.search(imported.text):
        try:
            run_pipeline(module, STATIC_TORCH_PIPELINE, "torch-onnx-to-torch lowering")
            if not _reads_unrefined(module):
                return module
        except TorqError:
            pass           # the full pipeline says why, or refines what the short one could not
        module = fresh_module(imported)
    run_pipeline(module, TORCH_PIPELINE, "torch-onnx-to-torch lowering")
    return module


def _reads_unrefined(module) -> bool:
    """Whether some op reads a tensor whose type is not static (decompositions create a few
    unused ones, e.g. BatchNorm's `aten.empty.memory_format`; the linalg lowering drops those)."""
    from torch_mlir import ir
    found = []

    def visit(op):
        for r in op.results:
            if _NOT_STATIC_RE.match(str(r.type)) and next(iter(r.uses), None) is not None:
                found.append(op)
                return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return bool(found)
