"""Split the quantized full model into consecutive segments by executor, cut at int8 tensors.

Every compute node gets its layer's executor; a DequantizeLinear goes with the node that reads
it and a QuantizeLinear with the node that feeds it, so segment boundaries are the int8
tensors between a Q and the next DQ (or between QLinear ops). Weight DQs move next to their
consumer, which keeps the order topological and the segments few.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .mapping import QDQ


@dataclass
class Segment:
    executor: str
    nodes: list = field(default_factory=list)     # non-Constant node indices (extract_segment's)
    groups: list = field(default_factory=list)    # [[indices]] one per compute node, in order


def owners(nodes) -> list[list[int]]:
    """For each node, the compute node(s) it belongs to: itself for compute nodes, the producer's
    for a Q, every reader's for a DQ (a DQ read on two executors is computed in both segments)."""
    producer = {o: j for j, n in enumerate(nodes) for o in n.output}
    consumers: dict[str, list[int]] = {}
    for j, n in enumerate(nodes):
        for i in n.input:
            consumers.setdefault(i, []).append(j)
    memo: dict[int, list[int]] = {}

    def owner(j: int, depth: int = 0) -> list[int]:
        if j in memo:
            return memo[j]
        n = nodes[j]
        if n.op_type not in QDQ or depth > len(nodes):
            return [j]
        after = [k for o in n.output for k in consumers.get(o, [])]
        before = [producer[i] for i in n.input[:1] if i in producer]
        if n.op_type == "DequantizeLinear" and after:
            found = sorted({o for k in after for o in owner(k, depth + 1)})
        else:
            nxt = before + after
            found = owner(nxt[0], depth + 1) if nxt else [j]
        memo[j] = found
        return found
    return [owner(j) for j in range(len(nodes))]


def segments(nodes, executor_of: dict[int, str], default: str = "nss") -> list[Segment]:
    """Consecutive runs of nodes with the same executor (``executor_of``: compute index -> name)."""
    own = owners(nodes)
    order = sorted((o, j) for j in range(len(nodes)) for o in own[j])
    out: list[Segment] = []
    for o, j in order:
        ex = executor_of.get(o) or default
        if not out or out[-1].executor != ex:
            out.append(Segment(ex))
        seg = out[-1]
        if j not in seg.nodes:
            seg.nodes.append(j)
        if not seg.groups or seg.groups[-1][0] != o:
            seg.groups.append([o])
        if j != o:
            seg.groups[-1].append(j)
    return out
