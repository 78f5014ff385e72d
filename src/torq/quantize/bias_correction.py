"""Bias correction (Nagel et al., "Data-Free Quantization", 2019), as an fp32 graph transform.

Rounding a layer's weights to int8 shifts its expected output: E[W_q·x] − E[W·x] = (W_q − W)·E[x].
Quantizers do not compensate, and a depthwise layer with per-tensor scales can move whole
channels. Before quantization we subtract that shift from each Conv/Gemm bias, with E[x] (per
input channel) measured on the calibration images and W_q the symmetric int8 rounding the
quantizer will apply (scale = max|W| / 127, per output channel or per tensor). The graph's
structure is unchanged; only bias initializers change (or are added).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def _weight_error(w: np.ndarray, per_channel: bool) -> np.ndarray:
    axes = tuple(range(1, w.ndim)) if per_channel else None
    scale = np.max(np.abs(w), axis=axes, keepdims=per_channel) / 127.0
    scale = np.where(scale == 0, 1.0, scale)
    return np.clip(np.rint(w / scale), -127, 127) * scale - w


def _layers(model: onnx.ModelProto):
    """(node, weight name) of every Conv / Gemm(transB=1 or 0) whose weight is an initializer."""
    inits = {t.name for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type in ("Conv", "Gemm") and len(n.input) > 1 and n.input[1] in inits:
            yield n


def _input_means(model: onnx.ModelProto, names: list[str], reader) -> dict[str, np.ndarray]:
    from .calibration import probe_session
    sess = probe_session(model, names)
    sums = {t: 0.0 for t in names}
    count = 0
    reader.rewind()
    while (feed := reader.get_next()) is not None:
        for t, v in zip(names, sess.run(names, feed)):
            axes = (0,) + tuple(range(2, v.ndim))        # N×C×... -> per channel C
            sums[t] = sums[t] + v.astype(np.float64).mean(axis=axes)
        count += 1
    reader.rewind()
    return {t: s / max(count, 1) for t, s in sums.items()}


def correct_bias(model: onnx.ModelProto, reader, per_channel: bool = True) -> onnx.ModelProto:
    """A copy of the fp32 ``model`` with Conv/Gemm biases corrected for int8 weight rounding."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    layers = list(_layers(out))
    inits = {t.name: t for t in out.graph.initializer}
    means = _input_means(out, sorted({n.input[0] for n in layers}), reader)
    for n in layers:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        w = numpy_helper.to_array(inits[n.input[1]]).astype(np.float64)
        if n.op_type == "Gemm":
            if attrs.get("transA", 0):
                continue
            w = w if attrs.get("transB", 0) else w.T              # -> out × in
        shift = _output_shift(_weight_error(w, per_channel), means[n.input[0]], attrs.get("group", 1))
        if n.op_type == "Gemm":
            shift = shift * attrs.get("alpha", 1.0) / attrs.get("beta", 1.0)
        _subtract_bias(out, n, inits, shift.astype(np.float32))
    return out


def _output_shift(err: np.ndarray, mean_in: np.ndarray, groups: int) -> np.ndarray:
    """(W_q − W)·E[x] per output channel; weights out × in/groups × spatial, E[x] per input channel."""
    out_ch, per_group = err.shape[0], err.shape[1]
    err = err.reshape(out_ch, per_group, -1).sum(axis=2)
    group_of = np.arange(out_ch) // (out_ch // groups)
    idx = group_of[:, None] * per_group + np.arange(per_group)[None, :]
    return np.sum(err * np.asarray(mean_in)[idx], axis=1)


def _subtract_bias(model, node, inits, shift: np.ndarray) -> None:
    if len(node.input) > 2 and node.input[2] in inits:
        t = inits[node.input[2]]
        b = numpy_helper.to_array(t).astype(np.float32)
        t.CopyFrom(numpy_helper.from_array((np.broadcast_to(b, shift.shape) - shift).astype(np.float32), t.name))
        return
    if len(node.input) > 2 and node.input[2]:
        return                                             # run-time bias: leave it alone
    name = f"{node.name or node.output[0]}_corrected_bias"
    model.graph.initializer.append(numpy_helper.from_array(-shift.astype(np.float32), name))
    while len(node.input) < 2:
        node.input.append("")
    if len(node.input) == 2:
        node.input.append(name)
    else:
        node.input[2] = name
