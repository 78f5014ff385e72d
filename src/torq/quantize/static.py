"""Static int8 quantization: a thin, strict wrapper over ``onnxruntime.quantization.quantize_static``.

Choices (and why):
  * A8W8: signed int8 activations and weights, what the NPU computes. ORT's own defaults then
    give symmetric weights (zp 0) and asymmetric activations. A16W8: int16 activations (ORT's
    QInt16, QDQ only, opset 21), int8 weights: the NPU's int16 path (docs/a16w8.md).
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
from ..graph.unshare_weights import fold_constant_identities
from ..graph.load import is_quantized, load_model
from ..graph.validate import validate
from .calibration import make_reader
from .full_integer import convert_to_full_integer

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
    """``--quant-dtype`` -> (activation type, weight type): A8W8 or A16W8 (case-insensitive)."""
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


def _rewind(reader) -> None:
    for name in ("rewind", "reset"):
        if callable(getattr(reader, name, None)):
            getattr(reader, name)()
            return


def _run_ort(tmp: Path, reader, fmt, per_channel, activation_type, weight_type, method,
             where: str, precision=None) -> onnx.ModelProto:
    """One quantize_static call on tmp/pre.onnx; any ORT failure becomes a one-line TorqError.
    ``precision``: {node: "int8" | "int16"} (``precision.tensor_overrides``), QDQ only."""
    extra = {"ForceQuantizeNoInputCheck": fmt == QuantFormat.QDQ}
    if precision:
        from .precision import tensor_overrides
        default = "int16" if activation_type == QuantType.QInt16 else "int8"
        overrides = tensor_overrides(onnx.load(str(tmp / "pre.onnx")), precision, default)
        if overrides:
            extra["TensorQuantOverrides"] = overrides
    try:
        with _quiet(), np.errstate(all="raise"):
            quantize_static(
                str(tmp / "pre.onnx"), str(tmp / "int8.onnx"), reader,
                quant_format=fmt, per_channel=bool(per_channel),
                activation_type=activation_type, weight_type=weight_type,
                calibrate_method=method, extra_options=extra)
    except TorqError:
        raise
    except Exception as e:
        raise TorqError(f"{where}: ONNX Runtime quantization failed: {ort_failure(e, tmp, where)}") from None
    q = onnx.load(str(tmp / "int8.onnx"))
    _drop_stale_value_info(q)
    return q


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
    if isinstance(e, FloatingPointError):
        return f"numeric error during calibration ({msg}); the weights or calibration data overflow"
    return _ORT_CONTEXT.get(msg, msg)


def _drop_stale_value_info(m: onnx.ModelProto) -> None:
    """ORT keeps value_info of float tensors its rewrite removed; drop them (they mislead tools)."""
    g = m.graph
    live = {o for n in g.node for o in n.output} | {v.name for v in g.input}
    keep = [v for v in g.value_info if v.name in live]
    del g.value_info[:]
    g.value_info.extend(keep)


def quantize(model: str | os.PathLike | onnx.ModelProto, output: str | os.PathLike | None = None, *,
             calibration_data_reader=None, calibration_data: str | os.PathLike | None = None,
             num_calib: int = 20, per_channel: bool = False, full_integer: bool = False,
             quant_format: str = "qdq", quant_dtype: str = "A8W8",
             calibrate_method: str = "minmax", wrap_lone_ops: bool = False,
             equalize: bool = False, exact_scales: bool = False, precision=None) -> onnx.ModelProto:
    """Statically quantize an fp32 ONNX model to int8 and return it (also written to ``output``).

    Calibration: ``calibration_data_reader`` (an ORT CalibrationDataReader, used as is), else
    ``calibration_data`` (.npz or folder of <input>.npy), else ``num_calib`` synthetic samples.
    ``full_integer`` turns the float graph I/O into int8 (see ``full_integer.py``).
    ``wrap_lone_ops``: when ORT quantizes nothing (a lone Relu, Flatten, ... layer), wrap the
    model's float I/O in Q/DQ with calibrated ranges instead of refusing (``lone_ops.py``).
    ``equalize``: fold BatchNorm/Pad into the Convs, zero dead channels, then cross-layer
    equalization on the calibration data before quantizing (``equalize.py``).
    ``exact_scales`` (QDQ): weight scales moved (≤ 5 %) so that ORT's float requantization is
    exact, which makes the NPU's native rounding bit-exact with ORT (``exact_scales.py``).
    ``precision``: {node name: "int8" | "int16"}, a mixed-precision model (QDQ; ``precision.py``)."""
    # Validate every flag before the (slow) model work so a typo fails fast.
    activation_type, weight_type = parse_quant_dtype(quant_dtype)
    method = parse_calibrate_method(calibrate_method)
    parse_quant_format(quant_format)
    src = fold_constant_identities(load_model(model))   # ORT's quantizers crash on shared weights
    if precision:
        from .precision import check_precision, name_nodes
        src = name_nodes(src)
        check_precision(src, precision, str(model) if not isinstance(model, onnx.ModelProto) else "model")
    where = str(model) if not isinstance(model, onnx.ModelProto) else "model"
    validate(src, where, min_opset=7)   # ORT runs opsets >= 7 (and upgrades them to 11)
    if is_quantized(src):
        raise TorqError(f"{where}: model is already quantized (it has QuantizeLinear/DequantizeLinear, "
                        "QLinear* ops or int8 weights/IO); pass the fp32 model")
    fmt = resolve_format(src, quant_format)
    if activation_type == QuantType.QInt16 or precision:
        if parse_quant_format(quant_format) == "qoperator":
            what = f"--quant-dtype {quant_dtype.upper()}" if activation_type == QuantType.QInt16 else "--precision int16"
            raise TorqError(f"{what} needs --quant-format qdq: ONNX Runtime "
                            "quantizes 16-bit activations in QDQ form only")
        fmt = QuantFormat.QDQ
    reader = make_reader(src, calibration_data_reader=calibration_data_reader,
                         calibration_data=calibration_data, num_calib=num_calib)
    if equalize:      # BN folded first (else no Conv → Conv pairs); BN dust zeroed (see dead_channels)
        from .dead_channels import zero_dead_channels
        from .equalize import equalize as cross_layer_equalize
        from .fold import fold_fp32
        src = cross_layer_equalize(zero_dead_channels(fold_fp32(src))[0], reader).model
    with tempfile.TemporaryDirectory(prefix="torq-quant-") as tmp:
        tmp = Path(tmp)
        onnx.save(src, str(tmp / "fp32.onnx"))
        _preprocess(tmp / "fp32.onnx", tmp / "pre.onnx")
        q = _run_ort(tmp, reader, fmt, per_channel, activation_type, weight_type, method, where, precision)
        if not is_quantized(q) and parse_quant_format(quant_format) == "hybrid" \
                and fmt == QuantFormat.QOperator:
            # ORT's QOperator form only quantizes MaxPool/Relu/... behind an already quantized
            # op; a model made only of such ops stays fp32 there, so hybrid falls back to QDQ.
            _rewind(reader)
            fmt = QuantFormat.QDQ
            q = _run_ort(tmp, reader, fmt, per_channel, activation_type, weight_type, method, where, precision)
    if fmt == QuantFormat.QOperator and is_quantized(q):
        from .islands import quantize_islands
        _rewind(reader)
        q = quantize_islands(q, src, reader, method, activation_type.tensor_type)
    if not is_quantized(q) and wrap_lone_ops:
        from .lone_ops import wrap_in_qdq
        _rewind(reader)
        q = wrap_in_qdq(src, reader, method, activation_type.tensor_type)
    if not is_quantized(q):
        raise TorqError(f"{where}: ONNX Runtime quantized nothing with --quant-format "
                        f"{parse_quant_format(quant_format)} (none of its ops has an int8 form "
                        "in that format); try --quant-format qdq")
    if exact_scales and fmt == QuantFormat.QDQ:
        from .exact_scales import exact_scales as move_to_exact_scales
        q = move_to_exact_scales(q, src)
    if full_integer:
        q = convert_to_full_integer(q)
    if output is not None:
        save_model(q, output)
    return q
