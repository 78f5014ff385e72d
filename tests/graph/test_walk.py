"""graph.walk: the one subgraph walker (used by load, canonicalize, extract, full_integer)."""
from __future__ import annotations

from onnx import TensorProto, helper

from torq.graph.walk import node_subgraphs, subgraphs


def _g(name, nodes=()):
    return helper.make_graph(list(nodes), name, [], [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1])])


def test_subgraphs_depth_first_through_graph_and_graphs_attributes():
    inner = _g("inner")
    then = _g("then", [helper.make_node("Loop", ["n", "c"], ["o"], body=inner)])
    orelse = _g("else")
    top = _g("top", [helper.make_node("If", ["c"], ["o"], then_branch=then, else_branch=orelse),
                     helper.make_node("Relu", ["o"], ["r"])])
    # attribute order (helper.make_node sorts them by name: else_branch, then_branch)
    assert [g.name for g in subgraphs(top)] == ["top", "else", "then", "inner"]
    assert [g.name for g in node_subgraphs(top.node[0])] == ["else", "then"]
    assert node_subgraphs(top.node[1]) == []
    scan = helper.make_node("Foo", ["x"], ["y"])
    scan.attribute.append(helper.make_attribute("bodies", [_g("b0"), _g("b1")]))
    assert [g.name for g in node_subgraphs(scan)] == ["b0", "b1"]
