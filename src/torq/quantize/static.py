"""Static int8 quantization: a thin, strict wrapper over ``onnxruntime.quantization.quantize_static``.

Choices (and why):
  * A8W8: signed int8 activations and weights, what the NPU computes. ORT's own defaults then
    give symmetric weights (zp 0) and asymmetric activations. A16W8 (and any int16 layer of a
    mixed-precision recipe): int16 activations (ORT's QInt16, QDQ only, opset 21), int8 weights,
    the NPU's int16 path (docs/a16w8.md, docs/mixed-precision.md).
  * ``ForceQuantizeNoInputCheck``: True for QDQ, False for QOperator. In QDQ, without it ORT
    leaves "latent" ops (MaxPool, Reshape, Transpose, ...) in float whenever their input is not
    already quantized -- e.g. a MaxPool right after a graph input, or any single-op layer
    extracted for per-layer tests; an int8 NPU wants them int8 (ORT's ``get_qdq_config`` forces
    it too). In QOperator the same flag does the opposite: ORT's ``Direct8BitOp`` then only
    quantizes ops whose input is an initializer, so every MaxPool/Reshape on an activation is
    left in float between DQ and Q (checked with ORT 1.32); without it they stay int8 whenever
    their producer is quantized, which is what we want.
  * Pre-processing = ORT's ``quant_pre_process`` with ``skip_optimization=True``: shape
    inference and the "pre-processed" marker, but no graph rewrites (the optimizer would fuse
    MatMul+Add into Gemm, fold BatchNorm, ... and the quantized graph would no longer line up
    node-for-node with the fp32 model that layer extraction and the executor map are built
    from). If it fails we fall back to plain ONNX shape inference.
  * Dynamic dims (e.g. batch) are left to ORT: it calibrates with whatever the reader feeds
    (the synthetic reader uses 1) and the quantized model keeps the dynamic dim.
  * Zero-range activations (all-zero tensors): ORT maps a range below float32 tiny to
    scale 1.0, zero point 0, so there is no division by zero; nothing extra is needed.
  * Below opset 13 ORT still writes ``axis`` on DequantizeLinear (per-channel weights, biases),
    an attribute that exists from opset 13 only: such a model is converted up to 13 (ONNX's
    version converter keeps every node name; the compiler's importer would convert it anyway).
  * ``quantize_static`` rewrites a ModelProto passed to it in place (weights moved to external
    data in a temp folder), so we only ever hand it a file path in our own temp folder.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

from ..errors import TorqError, one_line
from ..fileio import save_model
from ..graph.load import is_quantized
from .calibration import rewind

QUANT_FORMATS = ("qdq", "qoperator", "hybrid")
QUANT_DTYPES = {"A8W8": (QuantType.QInt8, QuantType.QInt8),    # (activation, weight)
                "A16W8": (QuantType.QInt16, QuantType.QInt8)}
CALIBRATE_METHODS = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}
#: Hybrid picks QOperator only when every compute op is one of these (compact QLinear* forms the
#: NPU lowering handles directly); anything else (ReduceMean, Gemm, ...) -> the whole model is QDQ.
HYBRID_QOPERATOR_OPS = frozenset({
    "Conv", "Add", "Mul", "MatMul", "MaxPool", "AveragePool", "GlobalAveragePool",
    "Relu", "Clip", "LeakyRelu", "Sigmoid", "Softmax",
})
_NON_COMPUTE_OPS = {"QuantizeLinear", "DequantizeLinear", "Constant"}


def parse_quant_format(value: str) -> str:
    """Normalise ``--quant-format`` (case-insensitive) or raise naming the supported values."""
    v = str(value).strip().lower()
    if v not in QUANT_FORMATS:
        raise TorqError(f"unsupported --quant-format '{value}': supported values are "
                        f"{', '.join(QUANT_FORMATS)}")
    return v


def parse_quant_dtype(value: str) -> tuple[QuantType, QuantType]:
    """``--quant-dtype`` -> (activation type, weight type); only A8W8 (case-insensitive)."""
    v = str(value).strip().upper()
    if v not in QUANT_DTYPES:
        raise TorqError(f"unsupported --quant-dtype '{value}': supported values are "
                        f"{', '.join(QUANT_DTYPES)}")
    return QUANT_DTYPES[v]


def parse_calibrate_method(value: str) -> CalibrationMethod:
    v = str(value).strip().lower()
    if v not in CALIBRATE_METHODS:
        raise TorqError(f"unsupported --calibrate-method '{value}': supported values are "
                        f"{', '.join(CALIBRATE_METHODS)}")
    return CALIBRATE_METHODS[v]


def resolve_hybrid(model: onnx.ModelProto) -> QuantFormat:
    """QOperator if every compute op is in HYBRID_QOPERATOR_OPS, else QDQ (also with no compute ops)."""
    ops = [n.op_type for n in model.graph.node if n.op_type not in _NON_COMPUTE_OPS]
    if ops and all(op in HYBRID_QOPERATOR_OPS for op in ops):
        return QuantFormat.QOperator
    return QuantFormat.QDQ


def resolve_format(model: onnx.ModelProto, quant_format: str) -> QuantFormat:
    fmt = parse_quant_format(quant_format)
    if fmt == "hybrid":
        return resolve_hybrid(model)
    return QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator


def _preprocess(src: Path, dst: Path) -> None:
    """Shape inference + ORT's pre-processed marker, without graph rewrites (see module doc)."""
    from onnxruntime.quantization.shape_inference import quant_pre_process
    try:
        with _quiet():
            quant_pre_process(str(src), str(dst), skip_optimization=True, skip_symbolic_shape=True)
        return
    except Exception:
        pass  # e.g. shape inference trips over an op: quantize_static re-infers what it can
    m = onnx.load(str(src))
    try:
        m = onnx.shape_inference.infer_shapes(m)
    except Exception:
        pass
    onnx.save(m, str(dst))


@contextlib.contextmanager
def _quiet():
    """Silence ORT's calibration chatter (prints + root-logger warnings); torq prints its own summary."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


def _run_ort(tmp: Path, reader, fmt, recipe, selection: dict, where: str) -> onnx.ModelProto:
    """One quantize_static call on tmp/pre.onnx; any ORT failure becomes a one-line TorqError."""
    from .recipe import effective_dtype
    activation_type, weight_type = parse_quant_dtype(effective_dtype(recipe))
    extra = {"ForceQuantizeNoInputCheck": fmt == QuantFormat.QDQ}
    if selection.get("tensor_overrides"):
        extra["TensorQuantOverrides"] = selection["tensor_overrides"]
    try:
        with _quiet(), np.errstate(all="raise"):
            quantize_static(
                str(tmp / "pre.onnx"), str(tmp / "int8.onnx"), reader,
                quant_format=fmt, per_channel=bool(recipe.per_channel),
                activation_type=activation_type, weight_type=weight_type,
                calibrate_method=parse_calibrate_method(recipe.calibrate_method),
                op_types_to_quantize=selection.get("op_types_to_quantize"),
                nodes_to_quantize=selection.get("nodes_to_quantize"),
                nodes_to_exclude=selection.get("nodes_to_exclude"),
                extra_options=extra)
    except TorqError:
        raise
    except Exception as e:
        raise TorqError(f"{where}: ONNX Runtime quantization failed: {ort_failure(e, tmp, where)}") from None
    q = onnx.load(str(tmp / "int8.onnx"))
    _drop_stale_value_info(q)
    return _per_axis_opset(q, where)


def _per_axis_opset(q: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """``q`` as valid ONNX: up to opset 13 when ORT wrote ``axis`` on a Q/DQ of an older opset
    (per-channel weights, and biases even per-tensor)."""
    from ..graph.opset import PER_AXIS, at_least
    qdq = [n for n in q.graph.node if n.domain in ("", "ai.onnx") and n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    if not any(a.name == "axis" for n in qdq for a in n.attribute):
        return q
    return at_least(q, PER_AXIS, f"{where}: ONNX Runtime's per-axis Quantize/DequantizeLinear")


#: ORT messages that mean nothing without context -> what they mean for the user.
_ORT_CONTEXT = {
    "scale issue": "a tensor's calibrated range is NaN or infinite, so no scale exists "
                   "(non-finite activations: check the weights and the calibration data)",
}


def ort_failure(e: BaseException, tmp: Path, where: str) -> str:
    """ORT's error text on one line, naming the user's model instead of our temp copies."""
    msg = one_line(e)
    for name in ("pre.onnx", "fp32.onnx", "int8.onnx"):
        msg = msg.replace(str(tmp / name), where)
    msg = msg.replace(str(tmp), "<temp dir>")
    if isinstance(e, (FloatingPointError, RuntimeWarning)):     # numpy's, raised or escalated
        return f"numeric error during calibration ({msg}); the weights or calibration data overflow"
    return _ORT_CONTEXT.get(msg, msg)


def _drop_stale_value_info(m: onnx.ModelProto) -> None:
    """ORT keeps value_info of float tensors its rewrite removed; drop them (they mislead tools)."""
    g = m.graph
    live = {o for n in g.node for o in n.output} | {v.name for v in g.input}
    keep = [v for v in g.value_info if v.name in live]
    del g.value_info[:]
    g.value_info.extend(keep)


def run_quantizer(prepared: onnx.ModelProto, reader, recipe, selection: dict, where: str
                  ) -> tuple[onnx.ModelProto, str]:
    """(ORT's quantized model, the format used: "qdq" | "qoperator") for a prepared fp32 graph."""
    from .recipe import uses_int16
    fmt = QuantFormat.QDQ if uses_int16(recipe) else resolve_format(prepared, recipe.format)   # ORT: 16-bit in QDQ only
    with tempfile.TemporaryDirectory(prefix="torq-quant-") as tmp:
        tmp = Path(tmp)
        onnx.save(prepared, str(tmp / "fp32.onnx"))
        _preprocess(tmp / "fp32.onnx", tmp / "pre.onnx")
        q = _run_ort(tmp, reader, fmt, recipe, selection, where)
        if not is_quantized(q) and recipe.format == "hybrid" and fmt == QuantFormat.QOperator:
            # ORT's QOperator form only quantizes MaxPool/Relu/... behind an already quantized
            # op; a model made only of such ops stays fp32 there, so hybrid falls back to QDQ.
            rewind(reader)
            fmt = QuantFormat.QDQ
            q = _run_ort(tmp, reader, fmt, recipe, selection, where)
    return q, "qdq" if fmt == QuantFormat.QDQ else "qoperator"


_API_NAMES = {"quant_format": "format"}


def quantize(model: str | os.PathLike | onnx.ModelProto, output: str | os.PathLike | None = None, *,
             recipe=None, calibration_data_reader=None, wrap_lone_ops: bool = False,
             **fields) -> onnx.ModelProto:
    """Statically quantize an fp32 ONNX model to int8 and return it (also written to ``output``).

    ``recipe``: a ``torq.quantize.Recipe`` (default ``Recipe()``: ORT's per-tensor QDQ behind the
    fp32 front end); keyword ``fields`` change single fields (``per_channel=True``,
    ``quant_format="qoperator"``, ``equalize=True`` = "bounded", ...). Calibration:
    ``calibration_data_reader`` (an ORT CalibrationDataReader, used as is), else the recipe's
    ``calibration_data`` (.npz, <input>.npy folder, image folder with ``preprocess``), else
    ``num_calib`` synthetic samples. ``wrap_lone_ops``: when ORT quantizes nothing (a lone Relu,
    Flatten, ... layer), wrap the model's float I/O in Q/DQ instead of refusing (``lone_ops.py``)."""
    from .recipe import Recipe, apply
    changes = {_API_NAMES.get(k, k): v for k, v in fields.items()}
    if isinstance(changes.get("equalize"), bool):
        changes["equalize"] = "bounded" if changes["equalize"] else "off"
    for k in ("format", "calibrate_method"):
        if isinstance(changes.get(k), str):
            changes[k] = changes[k].strip().lower()
    if isinstance(changes.get("quant_dtype"), str):
        changes["quant_dtype"] = changes["quant_dtype"].strip().upper()
    if calibration_data_reader is not None and changes.get("calibration_data") is not None:
        raise TorqError("give either calibration_data_reader or calibration_data "
                        "(--calibration-data), not both")
    try:
        r = (recipe or Recipe()).replace(**changes)
    except TypeError as e:
        raise TorqError(f"quantize: {one_line(e)}") from None
    if calibration_data_reader is not None and not callable(getattr(calibration_data_reader, "get_next", None)):
        raise TorqError("calibration_data_reader must be an onnxruntime.quantization."
                        "CalibrationDataReader (it has no get_next())")
    q = apply(r, model, calibration_data_reader, wrap_lone_ops=wrap_lone_ops).model
    if output is not None:
        save_model(q, output)
    return q
