"""Per-layer quantization of lone ops that ONNX Runtime's quantizer leaves in float.

Extracted on its own, a Relu, HardSwish, Flatten or (QOperator) GlobalAveragePool has no
quantized producer, so ``quantize_static`` keeps it fp32 -- yet in the full model it runs on
int8 tensors between a DequantizeLinear and a QuantizeLinear. ``wrap_in_qdq`` builds exactly
that: every float graph input and output gets Q -> DQ with the range ORT's own calibrator
measures for that tensor (same calibration data and method as the rest of the model), so the
layer is tested as the int8 op it is in the full model:

    x -> Q -> DQ -> op -> Q -> DQ -> y      (full-integer then drops the outer Q and DQ)
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import TorqError

def calibrated_ranges(model: onnx.ModelProto, reader, method, names: list[str] | None = None,
                      op_types: list[str] | None = None) -> dict[str, tuple[float, float]]:
    """(min, max) of each tensor in ``names`` (default: every float graph input/output), measured
    by ORT's calibrator over ``reader``; ``op_types`` limits what the calibrator records to the
    tensors of those ops (it records every float tensor otherwise)."""
    from onnxruntime.quantization.calibrate import create_calibrator
    names = _float_io(model) if names is None else names
    with tempfile.TemporaryDirectory(prefix="torq-lone-") as tmp:
        path = Path(tmp) / "fp32.onnx"
        onnx.save(model, str(path))
        cal = create_calibrator(path, op_types_to_calibrate=op_types,
                                augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                                calibrate_method=method)
        try:
            cal.collect_data(reader)
        except ValueError as e:   # ORT: "No data is collected." -- an exhausted reader
            raise TorqError(f"calibration of the float tensors failed ({e}): a calibration reader "
                            "must support rewind() to be read a second time") from None
        data = cal.compute_data()
    ranges = {}
    for name in names:
        if name not in data:
            raise TorqError(f"calibration found no range for tensor '{name}'")
        lo, hi = data[name].range_value
        ranges[name] = (float(np.asarray(lo).min()), float(np.asarray(hi).max()))
    return ranges


def _float_io(model: onnx.ModelProto) -> list[str]:
    inits = {t.name for t in model.graph.initializer}
    io = [v for v in model.graph.input if v.name not in inits] + list(model.graph.output)
    return [v.name for v in io if v.type.tensor_type.elem_type == TensorProto.FLOAT]


def activation_qparams(lo: float, hi: float, elem: int) -> tuple[np.float32, np.ndarray]:
    """ORT's own asymmetric activation scale / zero point for a calibrated range."""
    from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType
    qmin, qmax = get_qmin_qmax_for_qType(elem)
    zp, scale = compute_scale_zp(np.float32(lo), np.float32(hi), qmin, qmax, symmetric=False)
    dt = np.int8 if elem == TensorProto.INT8 else np.uint8
    return np.float32(scale), np.asarray(zp, dtype=dt)


def wrap_in_qdq(model: onnx.ModelProto, reader, method, elem: int = TensorProto.INT8) -> onnx.ModelProto:
    """A copy of ``model`` with Q -> DQ on every float graph input and output (see module doc)."""
    ranges = calibrated_ranges(model, reader, method)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inputs = {v.name for v in g.input}
    new_nodes, tail = [], []
    for name, (lo, hi) in ranges.items():
        scale, zp = activation_qparams(lo, hi, elem)
        s, z = f"{name}__torq_scale", f"{name}__torq_zp"
        g.initializer.extend([numpy_helper.from_array(np.asarray(scale), s), numpy_helper.from_array(zp, z)])
        if name in inputs:   # x -> Q -> DQ -> (consumers read x_dq)
            for n in g.node:
                n.input[:] = [f"{name}__torq_dq" if i == name else i for i in n.input]
            new_nodes += [helper.make_node("QuantizeLinear", [name, s, z], [f"{name}__torq_q"]),
                          helper.make_node("DequantizeLinear", [f"{name}__torq_q", s, z], [f"{name}__torq_dq"])]
        else:                # producer writes y_f -> Q -> DQ -> y
            for n in g.node:
                n.output[:] = [f"{name}__torq_f" if o == name else o for o in n.output]
            tail += [helper.make_node("QuantizeLinear", [f"{name}__torq_f", s, z], [f"{name}__torq_q"]),
                     helper.make_node("DequantizeLinear", [f"{name}__torq_q", s, z], [name])]
    nodes = new_nodes + list(g.node) + tail
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]
    return onnx.shape_inference.infer_shapes(m)
