"""Graph clean-ups made before quantizing, so ORT's quantizers see one initializer per use.

The torch exporter deduplicates equal weights (e.g. the zero biases of a freshly initialised
network) into one initializer read through `Identity` nodes. ORT's QOperator and per-channel
quantizers look weights up by name and crash on an Identity output ("'NoneType' object has no
attribute 'data_type'"). `fold_constant_identities` gives every such Identity output its own
copy of the initializer and drops the node: same values, same names, no graph change otherwise.
"""
from __future__ import annotations

import onnx

__all__ = ["fold_constant_identities"]


def fold_constant_identities(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` without Identity nodes of initializers (the input is never modified)."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    graph_outputs = {o.name for o in g.output}
    foldable = [n for n in g.node if n.op_type == "Identity" and n.input[0] in inits
                and n.output[0] not in graph_outputs and n.output[0] not in inits]
    if not foldable:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    drop = {id(n) for n in foldable}
    keep = [n for n in g.node if id(n) not in drop]
    del out.graph.node[:]
    out.graph.node.extend(keep)
    for n in foldable:
        t = onnx.TensorProto()
        t.CopyFrom(inits[n.input[0]])
        t.name = n.output[0]
        out.graph.initializer.append(t)
    names = {n.output[0] for n in foldable}
    vi = [v for v in out.graph.value_info if v.name not in names]
    del out.graph.value_info[:]
    out.graph.value_info.extend(vi)
    return out
