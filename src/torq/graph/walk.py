"""The one walker over ONNX subgraphs (If / Loop / Scan bodies), for every pass that must see
nodes and tensors inside them too."""
from __future__ import annotations

from typing import Iterator

import onnx


def node_subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs held in a node's attributes (an If's branches, a Loop's body, ...)."""
    out: list[onnx.GraphProto] = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def subgraphs(g: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``g`` and every graph nested in it, depth first."""
    yield g
    for n in g.node:
        for sg in node_subgraphs(n):
            yield from subgraphs(sg)
