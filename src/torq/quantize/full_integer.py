"""Full-integer I/O: strip the input QuantizeLinear and output DequantizeLinear of a quantized model.

The NPU consumes and produces int8, so the float<->int8 conversions at the graph boundary belong
to the application, not to the model. Rules (QDQ and QOperator models alike -- both quantize
graph inputs with a plain QuantizeLinear and dequantize graph outputs with a DequantizeLinear):

  * a graph input whose consumers are ALL QuantizeLinear with the same scale/zero point becomes
    an int8 input; those Q nodes are removed;
  * a graph output produced by a DequantizeLinear becomes the DQ's int8 input; the DQ is removed
    (if other nodes also read the float output, the DQ stays for them under a new name).

Names: the graph I/O keep their ORIGINAL names (``input``, ``logits``); the int8 tensors are
renamed to them, so application code and I/O bindings need no change except the dtype. The
scale and zero point of each converted I/O are recorded in ``metadata_props['torq.io_quant']``
(JSON: {"inputs": {name: {"scale", "zero_point", "dtype"}}, "outputs": {...}}) because the
application needs them to quantize inputs and dequantize outputs.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..graph.io_quant import set_io_quant_params
from ..graph.walk import subgraphs


def _init_values(g: onnx.GraphProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in g.initializer}


def _qparams(node: onnx.NodeProto, inits: dict[str, np.ndarray]):
    """(scale array, zero-point array or None, int elem type) of a Q/DQ node, or None if not constant."""
    if len(node.input) < 2 or node.input[1] not in inits:
        return None
    scale = inits[node.input[1]]
    zp = None
    if len(node.input) > 2 and node.input[2]:
        if node.input[2] not in inits:
            return None
        zp = inits[node.input[2]]
    elem = helper.np_dtype_to_tensor_dtype(zp.dtype) if zp is not None else TensorProto.UINT8
    for a in node.attribute:  # QuantizeLinear(opset 21+) may carry output_dtype instead of a zp
        if a.name == "output_dtype" and a.i:
            elem = a.i
    return scale, zp, elem


def _rename_everywhere(g: onnx.GraphProto, old: str, new: str) -> None:
    """Rename a tensor in every node input/output, including implicit uses inside subgraphs."""
    for sub in subgraphs(g):
        for n in sub.node:
            for i, x in enumerate(n.input):
                if x == old:
                    n.input[i] = new
            for i, x in enumerate(n.output):
                if x == old:
                    n.output[i] = new
        for vi in sub.value_info:
            if vi.name == old:
                vi.name = new


def _drop_value_info(g: onnx.GraphProto, names: set[str]) -> None:
    keep = [vi for vi in g.value_info if vi.name not in names]
    del g.value_info[:]
    g.value_info.extend(keep)


def _record(scale, zp, elem) -> dict:
    s = np.asarray(scale).astype(float)
    z = np.asarray(zp if zp is not None else 0).astype(int)
    return {"scale": s.item() if s.size == 1 else s.tolist(),
            "zero_point": z.item() if z.size == 1 else z.tolist(),
            "dtype": helper.tensor_dtype_to_np_dtype(elem).name}


def _consumers(g: onnx.GraphProto, name: str) -> list[onnx.NodeProto]:
    return [n for n in g.node if name in n.input]


def _convert_inputs(g: onnx.GraphProto, inits, record: dict) -> None:
    init_names = {t.name for t in g.initializer}
    for gi in g.input:
        if gi.name in init_names:
            continue
        users = _consumers(g, gi.name)
        if not users or any(u.op_type != "QuantizeLinear" or u.input[0] != gi.name
                            or list(u.input).count(gi.name) != 1 for u in users):
            continue
        params = [_qparams(u, inits) for u in users]
        if any(p is None for p in params):
            continue
        s0, z0, e0 = params[0]
        if any(not (np.array_equal(s, s0) and e == e0 and
                    (z is None) == (z0 is None) and (z is None or np.array_equal(z, z0)))
               for s, z, e in params[1:]):
            continue  # differently quantized consumers: one int8 input cannot serve them all
        for u in users:
            g.node.remove(u)
            _drop_value_info(g, {u.output[0]})
            _rename_everywhere(g, u.output[0], gi.name)
        gi.type.tensor_type.elem_type = e0
        record["inputs"][gi.name] = _record(s0, z0, e0)


def _convert_outputs(g: onnx.GraphProto, inits, record: dict) -> None:
    graph_io = {v.name for v in g.input} | {t.name for t in g.initializer}
    out_names = [o.name for o in g.output]
    for go in g.output:
        dq = next((n for n in g.node if go.name in n.output), None)
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        params = _qparams(dq, inits)
        src = dq.input[0]
        if params is None or src in graph_io or src in out_names:
            continue
        scale, zp, elem = params
        if _consumers(g, go.name):  # float output also read inside the graph: keep DQ for them
            inner = f"{go.name}_dequantized"
            _rename_everywhere(g, go.name, inner)
        else:
            g.node.remove(dq)
        _drop_value_info(g, {src, go.name})
        _rename_everywhere(g, src, go.name)
        go.type.tensor_type.elem_type = elem
        record["outputs"][go.name] = _record(scale, zp, elem)


def convert_to_full_integer(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return a copy of a quantized model with int8 graph inputs/outputs (see module doc)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = _init_values(g)
    record: dict = {"inputs": {}, "outputs": {}}
    _convert_inputs(g, inits, record)
    _convert_outputs(g, inits, record)
    _drop_unused_initializers(g)
    set_io_quant_params(m, record)
    try:
        m = onnx.shape_inference.infer_shapes(m)
    except Exception:
        pass  # best effort: the I/O shapes are already right, value_info is only a hint
    return m


def _drop_unused_initializers(g: onnx.GraphProto) -> None:
    used = {x for n in g.node for x in n.input} | {o.name for o in g.output}
    for sub_n in g.node:
        for a in sub_n.attribute:
            if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                return  # implicit subgraph uses: not worth tracking, keep everything
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
