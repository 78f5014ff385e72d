"""Calibration data for per-layer quantization: what each layer sees inside the full model.

A user's dataset (``--calibration-data``) holds the *model's* inputs; a layer cut out of the
middle needs the activations that reach it. ``layer_samples`` runs the fp32 model once per
sample with the requested intermediate tensors exposed, so each layer is calibrated on exactly
the values the full model's calibration saw at that point.
"""
from __future__ import annotations

import numpy as np
import onnx

from ..errors import TorqError
from .calibration import ArrayDataReader


def layer_samples(model: onnx.ModelProto, tensors: set[str], reader) -> dict[str, list[np.ndarray]]:
    """tensor name -> its value for each calibration sample of ``reader`` (model inputs included)."""
    import onnxruntime as ort
    from .calibration import rewind
    rewind(reader)
    m = onnx.shape_inference.infer_shapes(model)
    graph_inputs = {v.name for v in m.graph.input}
    typed = {v.name: v for v in list(m.graph.value_info) + list(m.graph.output)}
    wanted = sorted(t for t in tensors if t not in graph_inputs)
    missing = [t for t in wanted if t not in typed]
    if missing:
        raise TorqError(f"cannot type intermediate tensor '{missing[0]}' for per-layer calibration")
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(typed[t] for t in wanted if t not in have)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    out: dict[str, list[np.ndarray]] = {t: [] for t in tensors}
    for sample in iter(reader.get_next, None):
        values = dict(zip(wanted, sess.run(wanted, sample))) if wanted else {}
        for t in tensors:
            out[t].append(sample[t] if t in sample else values[t])
    return out


def reader_for(layer_model: onnx.ModelProto, samples: dict[str, list[np.ndarray]]) -> ArrayDataReader:
    """A calibration reader for one layer from ``layer_samples``' output."""
    inits = {t.name for t in layer_model.graph.initializer}
    names = [v.name for v in layer_model.graph.input if v.name not in inits]
    n = min(len(samples[name]) for name in names)
    return ArrayDataReader([{name: samples[name][i] for name in names} for i in range(n)])


def layer_recipe(recipe, layer_model: onnx.ModelProto):
    """The whole model's recipe for one layer cut from its *prepared* graph: the fp32 steps are
    done (not repeated per layer), calibration comes from ``layer_samples`` (or synthetic data),
    and node / op-type lists keep only this layer's names. None: the recipe quantizes none of the
    layer's nodes (the layer stays fp32, as in the whole model). ``--input-shape`` is done too
    (the prepared graph has the sizes; a layer's inputs are inner tensors, named apart)."""
    names = {n.name for n in layer_model.graph.node}
    ops = {n.op_type for n in layer_model.graph.node}
    keep = {k: tuple(x for x in getattr(recipe, k) if x in (ops if "op_types" in k else names))
            for k in ("nodes_to_quantize", "nodes_to_exclude", "op_types_to_quantize", "op_types_to_exclude")}
    if any(getattr(recipe, k) and not keep[k] for k in ("nodes_to_quantize", "op_types_to_quantize")):
        return None
    return recipe.replace(fold=False, dead_channels=False, equalize="off", bias_correction=False,
                          calibration_data=None, input_shape=(),
                          precision=tuple(p for p in recipe.precision if p[0] in names), **keep)
