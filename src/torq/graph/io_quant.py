"""The ``torq.io_quant`` model metadata: the scale and zero point of each integer graph I/O.

The quantizer writes it (``quantize.full_integer``) and the compiler reads it, so the fact lives
here, below both. The value is JSON::

    {"inputs":  {"input":  {"scale": 0.0186, "zero_point": -3, "dtype": "int8"}},
     "outputs": {"logits": {"scale": 0.1055, "zero_point": 12, "dtype": "int8"}}}

An application quantizes a float input as ``clip(round(x / scale) + zero_point)`` into that
dtype, and dequantizes an output as ``(q - zero_point) * scale``.
"""
from __future__ import annotations

import json
import math

import onnx

from ..errors import TorqError

IO_QUANT_KEY = "torq.io_quant"


def io_quant_params(model: onnx.ModelProto) -> dict:
    """``{"inputs"|"outputs": {name: {"scale", "zero_point", "dtype"}}}`` of the model's integer
    graph I/O (empty dicts when it has float I/O)."""
    for p in model.metadata_props:
        if p.key == IO_QUANT_KEY:
            return _checked(p.value)
    return {"inputs": {}, "outputs": {}}


def _checked(text: str) -> dict:
    """The metadata, or a one-line TorqError saying what is wrong with it."""
    def bad(why: str):
        return TorqError(f"model metadata {IO_QUANT_KEY!r} {why} (expected inputs and outputs, each "
                         "name -> scale, zero_point, dtype); re-quantize the model")
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        raise bad("is not JSON") from None
    if not isinstance(record, dict) or not all(isinstance(record.get(k, {}), dict) for k in ("inputs", "outputs")):
        raise bad("is not an object of inputs and outputs")
    for side in ("inputs", "outputs"):
        record.setdefault(side, {})
        for name, q in record[side].items():
            if not isinstance(q, dict) or not _number(q.get("scale")) or not q["scale"] > 0 \
                    or not isinstance(q.get("zero_point"), int) or isinstance(q.get("zero_point"), bool):
                raise bad(f"has no valid scale > 0 and integer zero_point for {side[:-1]} {name!r}")
            if not math.isfinite(q["scale"]) or not -2**31 <= q["zero_point"] < 2**31:
                raise bad(f"has an out-of-range scale or zero_point for {side[:-1]} {name!r}")
    return record


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def set_io_quant_params(model: onnx.ModelProto, record: dict) -> None:
    """Replace the model's ``torq.io_quant`` metadata with ``record`` (in place)."""
    for p in list(model.metadata_props):
        if p.key == IO_QUANT_KEY:
            model.metadata_props.remove(p)
    model.metadata_props.add(key=IO_QUANT_KEY, value=json.dumps(record))
