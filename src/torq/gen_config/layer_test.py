"""Test one layer on the executors: quantize it alone, run ORT as reference, run each executor,
compare, and turn every failure into a ``failure_report`` with its ``reason_code``."""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import HostProblem
from ..fileio import atomic_write_bytes, atomic_write_text, inside, safe_name, save_model
from . import bf16_edges
from . import executors as X
from ..graph.inputs import random_inputs
from .compare import BF16_ABS_TOL_FRAC, INT_TOL, compare, dq_output_scales

SEED = 1234
LAYER_INPUT_RANGE = 40.0   # float layer inputs uniform in [-40, 40), as the reference tool feeds them


@dataclass
class Prepared:
    model: object = None                    # the (quantized) layer ONNX
    inputs: dict = field(default_factory=dict)
    reference: dict = field(default_factory=dict)
    compiled: object = None
    error: X.ExecutorError | None = None    # a failure before any executor ran
    bf16: bool = False                      # --auto-convert-bf16: floats compared with the abs gate


def prepare(fp32_layer, quant, debug_ir=None, name="layer", calib=None) -> Prepared:
    """Quantize (with lone-op wrapping), make inputs, run ORT, compile once for all executors.

    ``calib``: the layer's input activations from the full model's calibration data (else the
    quantizer's synthetic data, as the reference tool does per layer)."""
    from .. import reference
    p = Prepared()
    if getattr(quant, "auto_convert_bf16", False):
        return _prepare_bf16(p, fp32_layer, debug_ir, name)
    try:
        if quant.quantize:
            from ..quantize.per_layer import layer_recipe, reader_for
            from ..quantize.recipe import apply
            reader = reader_for(fp32_layer, calib) if calib is not None else None
            recipe = layer_recipe(quant.recipe, fp32_layer)
            p.model = fp32_layer if recipe is None else \
                apply(recipe, fp32_layer, reader, wrap_lone_ops=True, cache=False).model   # (verdicts are cached)
        else:
            p.model = fp32_layer
    except HostProblem:
        raise
    except Exception as e:  # noqa: BLE001
        p.error = X.ExecutorError("quantize_failed", f"per-layer quantization failed: {X.one_line(e)}")
        return p
    p.inputs = random_inputs(p.model, SEED, float_range=LAYER_INPUT_RANGE)
    try:
        p.reference = reference.run(p.model, p.inputs)
    except Exception as e:  # noqa: BLE001
        p.error = X.ExecutorError("reference_failed", f"ONNX Runtime failed: {X.one_line(e)}")
        return p
    try:
        p.compiled = X.frontend(p.model, debug_ir=debug_ir, name=name)
    except X.ExecutorError as e:
        p.error = e
    return p


def _prepare_bf16(p: Prepared, fp32_layer, debug_ir, name) -> Prepared:
    """The layer converted to bf16; its random inputs rounded to bf16; the reference is ONNX
    Runtime fp32 on the exact fp32 twin (the very values the bf16 layer holds)."""
    from .. import numerics, reference
    from ..graph.bf16 import convert_to_bf16, to_fp32
    p.model = convert_to_bf16(fp32_layer)
    p.bf16 = True
    p.inputs = {k: numerics.to_bf16(v) if np.asarray(v).dtype == np.float32 else v
                for k, v in random_inputs(fp32_layer, SEED, float_range=LAYER_INPUT_RANGE).items()}
    try:
        p.reference = reference.run(to_fp32(p.model), p.inputs)
    except Exception as e:  # noqa: BLE001
        p.error = X.ExecutorError("reference_failed", f"ONNX Runtime failed: {X.one_line(e)}")
        return p
    try:
        p.compiled = X.frontend(p.model, debug_ir=debug_ir, name=name)
    except X.ExecutorError as e:
        p.error = e
    return p


def run_executor(p: Prepared, executor: str, tol: dict, cache_dir, rounding="native",
                 timing_runs: int = 0) -> dict:
    """One executor's result entry (the reference's fields + our failure_report.reason_code)."""
    entry = {"status": "error", "tolerance_used": dict(tol)}
    if p.bf16:
        entry["tolerance_used"].update(use_abs_tol_gate=True, fp_abs_tol_frac=BF16_ABS_TOL_FRAC)
    try:
        if p.error is not None:
            raise p.error
        runnable = X.build(executor, p.compiled, cache_dir=cache_dir, rounding=rounding)
        outs, ms = runnable.run(p.inputs)
        gate = BF16_ABS_TOL_FRAC if p.bf16 else None
        int_tol = island_tol(p, executor, rounding)
        ok, diff = compare(outs, p.reference, tol["fp_max_tol"], dq_output_scales(p.model), gate, int_tol,
                           island=int_tol != INT_TOL)
    except X.ExecutorError as e:
        entry["failure_report"] = {"type": "error", "summary": e.summary, "reason_code": e.reason_code}
        return entry
    if int_tol != INT_TOL:
        entry["tolerance_used"]["bf16_island_lsb"] = int_tol
    explained = None if ok or executor != "nss" else bf16_edges.explain(p.model, p.inputs, outs, int_tol)
    if ok:
        entry["status"] = "success"
    elif explained:
        entry.update(status="success", max_diff=diff, explained=explained["explained"])
    else:
        entry.update(status="difference", max_diff=diff,
                     failure_report={"type": "accuracy_failure", "reason_code": "numeric_mismatch",
                                     "summary": f"max abs diff {diff['max_abs_diff']:g}, max rel diff "
                                                f"{diff['max_rel_diff']:g} vs ONNX Runtime"})
    if timing_runs:
        times = [runnable.run(p.inputs)[1] for _ in range(timing_runs)]
        entry["timing"] = {"runtime_ms": round(float(np.mean(times)), 3), "runs": timing_runs}
    return entry


def island_tol(p: Prepared, executor: str, rounding: str) -> int:
    """±LSB a layer's integer result may differ by: a bf16 island on the NSS (an op with no
    integer form, e.g. Softmax) by its stated tolerance, as ``verify`` holds it; else ``INT_TOL``."""
    if executor != "nss" or not getattr(p.compiled, "islands", None):
        return INT_TOL
    from ..numerics import BF16_ISLAND_TOL
    return BF16_ISLAND_TOL.get(rounding, INT_TOL)


MIN_FREE_BYTES = 64 << 20


def check_host(cache_root) -> None:
    """A HostProblem when the temp folder or the cache is full or not writable: an executor
    error seen then is the machine's, so it must stop discover instead of becoming a verdict."""
    import shutil
    import tempfile
    temp = Path(os.environ.get("TMPDIR") or tempfile.gettempdir())   # what IREE and ORT use
    for what, folder in (("the temp folder (TMPDIR)", temp), ("the cache", Path(cache_root))):
        try:
            if folder != temp:
                folder.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(folder).free
            with tempfile.TemporaryFile(dir=folder) as f:
                f.write(b"\0" * 4096)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise HostProblem(f"{what} {folder} is not writable ({e.strerror or type(e).__name__}); "
                              "nothing was cached: fix it and rerun") from None
        if free < MIN_FREE_BYTES:
            raise HostProblem(f"{what} {folder} has {free >> 20} MiB free (IREE and ONNX Runtime need "
                              f"{MIN_FREE_BYTES >> 20} MiB); nothing was cached: free space and rerun")


def write_repro(root: Path, layer_id: str, p: Prepared, results: dict, argv: list[str]) -> Path:
    """A self-contained bundle for a layer that is not a success: ONNX, inputs, IR, command.
    Its folder is the layer id through ``safe_name``; a symlink planted there is refused."""
    try:
        return _write_repro(root, layer_id, p, results, argv)
    except OSError as e:
        raise HostProblem(f"--repro-dir {root}: cannot write the bundle of {layer_id!r}: "
                          f"{e.strerror or type(e).__name__}") from None


def _write_repro(root: Path, layer_id: str, p: Prepared, results: dict, argv: list[str]) -> Path:
    d = inside(root, safe_name(layer_id))
    if p.model is not None:
        save_model(p.model, inside(d, "layer.onnx"))
    for name, arr in p.inputs.items():
        import io
        buf = io.BytesIO()
        np.save(buf, arr)
        atomic_write_bytes(inside(d, "inputs", f"{safe_name(name)}.npy"), buf.getvalue())
    if p.compiled is not None:
        for stage, text in p.compiled.stages.items():
            atomic_write_text(inside(d, "ir", f"layer.{stage}.mlir"), text)
    lines = [f"# {layer_id}", ""]
    for ex, r in results.items():
        fr = r.get("failure_report", {})
        lines.append(f"{ex}: {r['status']} [{fr.get('reason_code', '-')}] {fr.get('summary', '')}")
    lines += ["", "# reproduce the NSS result on this layer:",
              "torq-compile layer.onnx --verify-against-ort", "", "# the discover run that produced it:",
              shlex.join(["torq-gen-config"] + argv)]
    atomic_write_text(inside(d, "README.txt"), "\n".join(lines) + "\n")
    return d
