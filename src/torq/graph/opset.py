"""A model's default-domain opset, and converting a model up to the opset a feature needs
(per-axis Quantize/DequantizeLinear exist from opset 13; torch-mlir imports MaxPool from 12)."""
from __future__ import annotations

import onnx

from ..errors import TorqError, one_line

PER_AXIS = 13


def default_opset(m: onnx.ModelProto) -> int:
    return next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 0)


def at_least(m: onnx.ModelProto, version: int, why: str) -> onnx.ModelProto:
    """``m`` itself when its opset is ``version`` or newer, else converted (onnx.version_converter);
    a model the converter cannot take is a one-line error that says ``why`` the opset is needed."""
    if default_opset(m) >= version:
        return m
    try:
        return onnx.version_converter.convert_version(m, version)
    except Exception as e:   # noqa: BLE001 - the converter raises plain RuntimeError
        raise TorqError(f"{why} needs opset {version}, and converting the model from opset {default_opset(m)} "
                        f"failed: {one_line(e, 200)}") from None
