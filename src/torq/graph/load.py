"""Safe ONNX model loading: every way a model file can be bad becomes one clear TorqError.

Order matters: parse without external data, vet every external-data location (a model file
must never make us read outside its own folder), only then read the weights, then check
domains, values and the ONNX checker."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ..errors import TorqError, one_line, quote
from .walk import subgraphs

#: Operator domains torq understands; anything else is a custom op nobody can run.
KNOWN_DOMAINS = {"", "ai.onnx", "com.microsoft", "ai.onnx.ml"}

_FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16}
_QUANT_INT_TYPES = {TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16}
_WEIGHT_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul", "ConvInteger", "MatMulInteger"}
_TWO_GB = 2**31


def load_model(model: str | os.PathLike | onnx.ModelProto) -> onnx.ModelProto:
    """Load and validate a model from a path (or validate a ModelProto copy).

    Raises TorqError naming the file / node / tensor for: missing path, directory, empty or
    unparsable file, external data escaping the model folder, unknown custom op domains,
    NaN/Inf float weights, and onnx.checker failures."""
    if isinstance(model, onnx.ModelProto):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        where = f"model {quote(m.graph.name or '<in memory>')}"
        for t, _ in _iter_tensors(m.graph):
            if t.data_location == TensorProto.EXTERNAL:
                raise TorqError(f"{where}: tensor {quote(t.name)} has external data that is not loaded; "
                                "pass the model's file path instead")
        _validate(m, where, None)
        return m
    if not isinstance(model, (str, os.PathLike)):
        raise TorqError(f"expected an ONNX file path or onnx.ModelProto, got {type(model).__name__}")
    path = Path(model)
    m = _parse_file(path)
    _load_external_data(m, path)
    _validate(m, str(path), path)
    return m


def _parse_file(path: Path) -> onnx.ModelProto:
    if not path.exists():
        raise TorqError(f"{path}: no such file")
    if path.is_dir():
        raise TorqError(f"{path}: is a directory, expected an .onnx file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TorqError(f"{path}: cannot read: {e.strerror or e}") from None
    if not data:
        raise TorqError(f"{path}: empty file, expected an ONNX model")
    m = onnx.ModelProto()
    try:
        m.ParseFromString(data)
    except Exception:  # protobuf DecodeError and friends
        raise TorqError(f"{path}: not an ONNX model (the file is not a valid ONNX protobuf; "
                        "truncated or a different format?)") from None
    # Protobuf is lenient: arbitrary bytes can decode into an "empty" message.
    if m.ir_version <= 0 or not m.HasField("graph") or not m.opset_import:
        raise TorqError(f"{path}: not an ONNX model (no ir_version, graph or opset_import; "
                        "truncated or a different format?)")
    return m


def _iter_tensors(g: onnx.GraphProto) -> Iterator[tuple[onnx.TensorProto, str]]:
    """Every stored tensor (initializers, sparse values, Constant/attribute tensors) with an owner label."""
    for sub in subgraphs(g):
        for t in sub.initializer:
            yield t, f"initializer {quote(t.name)}"
        for st in sub.sparse_initializer:
            yield st.values, f"sparse initializer {quote(st.values.name)}"
        for n in sub.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    yield a.t, f"node {quote(n.name or n.output[0])} ({n.op_type}) attribute {quote(a.name)}"
                elif a.type == onnx.AttributeProto.TENSORS:
                    for t in a.tensors:
                        yield t, f"node {quote(n.name or n.output[0])} ({n.op_type}) attribute {quote(a.name)}"


def _load_external_data(m: onnx.ModelProto, path: Path) -> None:
    """Vet each external-data location against the model folder, then read the data."""
    base = path.resolve().parent
    any_external = False
    for t, label in _iter_tensors(m.graph):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        any_external = True
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        name = t.name or label
        if not loc:
            raise TorqError(f"{path}: tensor {quote(name)} has external data without a location")
        if os.path.isabs(loc) or Path(loc).is_absolute() or loc.startswith(("/", "\\")):
            raise TorqError(f"{path}: tensor {quote(name)} external data location {quote(loc)} is an absolute "
                            "path; it must be a file inside the model's folder")
        target = (base / loc).resolve()
        if not target.is_relative_to(base):
            raise TorqError(f"{path}: tensor {quote(name)} external data location {quote(loc)} points outside "
                            f"the model's folder {base}")
        if not target.is_file():
            raise TorqError(f"{path}: tensor {quote(name)} external data file {quote(loc)} not found next to "
                            "the model")
        size = target.stat().st_size
        try:
            offset = int(info.get("offset", 0) or 0)
            length = int(info["length"]) if info.get("length") else size - offset
        except ValueError:
            raise TorqError(f"{path}: tensor {quote(name)} has a non-integer external data offset/length") from None
        if offset < 0 or length < 0 or offset + length > size:
            raise TorqError(f"{path}: tensor {quote(name)} external data [{offset}, {offset + length}) "
                            f"lies beyond the end of {quote(loc)} ({size} bytes)")
    if any_external:
        try:
            onnx.load_external_data_for_model(m, str(base))
        except Exception as e:
            raise TorqError(f"{path}: cannot read external data: {one_line(e)}") from None


def _validate(m: onnx.ModelProto, where: str, path: Path | None) -> None:
    _check_domains(m, where)
    _check_finite(m, where)
    try:
        if path is not None and m.ByteSize() >= _TWO_GB:
            onnx.checker.check_model(str(path))
        else:
            onnx.checker.check_model(m)
    except Exception as e:
        raise TorqError(f"{where}: invalid ONNX model: {one_line(e)}") from None


def _check_domains(m: onnx.ModelProto, where: str) -> None:
    local = {f.domain for f in m.functions}
    for g in subgraphs(m.graph):
        for i, n in enumerate(g.node):
            if n.domain not in KNOWN_DOMAINS and n.domain not in local:
                raise TorqError(f"{where}: node {quote(n.name or f'#{i}')} ({n.op_type}) uses unknown custom "
                                f"op domain {quote(n.domain)} (supported: ai.onnx, com.microsoft, ai.onnx.ml)")


def _check_finite(m: onnx.ModelProto, where: str) -> None:
    """Every stored tensor decodes to its declared dims (the checker does not compare them with the
    data: a later reshape would fail deep inside a pass), and float ones hold no NaN/Inf."""
    for t, label in _iter_tensors(m.graph):
        try:
            arr = numpy_helper.to_array(t)
        except Exception as e:
            raise TorqError(f"{where}: {label} cannot be decoded (dims {list(t.dims)}): {one_line(e)}") from None
        if t.data_type not in _FLOAT_TYPES:
            continue
        arr = np.asarray(arr, dtype=np.float64) if arr.dtype.kind not in "fc" else arr
        if arr.size and not np.isfinite(arr).all():
            bad = "NaN" if np.isnan(arr).any() else "Inf"
            raise TorqError(f"{where}: {label} contains {bad} values")


def is_quantized(model: onnx.ModelProto) -> bool:
    """True if the model already carries quantization (quantizing twice would be meaningless).

    Signs: QuantizeLinear/DequantizeLinear, QLinear* / QGemm / *Integer ops, com.microsoft
    quantization ops, (u)int8/(u)int16 initializers feeding a weight input, or (u)int8/(u)int16
    graph inputs/outputs."""
    g = model.graph
    for sub in subgraphs(g):
        for n in sub.node:
            if _is_quant_op(n):
                return True
    ints = {t.name for t in g.initializer if t.data_type in _QUANT_INT_TYPES}
    for n in g.node:
        if n.op_type in _WEIGHT_OPS and any(i in ints for i in n.input):
            return True
    for v in list(g.input) + list(g.output):
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in _QUANT_INT_TYPES:
            return True
    return False


# com.microsoft quantization ops (QuickGelu etc. are float ops, hence explicit prefixes).
_MS_QUANT_PREFIXES = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantize", "QLinear", "QGemm",
                      "QAttention", "QOrdered", "QEmbed", "QMoE", "MatMulInteger", "MatMulNBits",
                      "ConvInteger", "GatherBlockQuantized", "MatMulBnb4", "MatMulFpQ4")


def _is_quant_op(n: onnx.NodeProto) -> bool:
    if n.domain in ("", "ai.onnx"):
        return n.op_type in {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
                             "ConvInteger", "MatMulInteger"} or n.op_type.startswith("QLinear")
    if n.domain == "com.microsoft":
        return n.op_type.startswith(_MS_QUANT_PREFIXES)
    return False
