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

import onnx

IO_QUANT_KEY = "torq.io_quant"


def io_quant_params(model: onnx.ModelProto) -> dict:
    """``{"inputs"|"outputs": {name: {"scale", "zero_point", "dtype"}}}`` of the model's integer
    graph I/O (empty dicts when it has float I/O)."""
    for p in model.metadata_props:
        if p.key == IO_QUANT_KEY:
            return json.loads(p.value)
    return {"inputs": {}, "outputs": {}}


def set_io_quant_params(model: onnx.ModelProto, record: dict) -> None:
    """Replace the model's ``torq.io_quant`` metadata with ``record`` (in place)."""
    for p in list(model.metadata_props):
        if p.key == IO_QUANT_KEY:
            model.metadata_props.remove(p)
    model.metadata_props.add(key=IO_QUANT_KEY, value=json.dumps(record))
