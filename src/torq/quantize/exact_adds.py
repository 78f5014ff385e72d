"""Activation scales on which ONNX Runtime's float32 QLinearAdd is exact: `Q ∘ Add(DQ a, DQ b)`
(QDQ, which ORT fuses into QLinearAdd) and `QLinearAdd` (QOperator) -> same, sA', sB', sC'.

ORT's QLinearAdd is exact when its ratios ``fl32(sA/sC)``, ``fl32(sB/sC)`` sit on a grid of
``2**-g`` fine enough for ~13 significant bits and coarse enough that no float32 step rounds
(``numerics.add_exact_ratios``); the NPU's Add then holds the same ratios exactly and rounds half
to even like ORT. This pass moves the scales of the tensors around each Add (in graph order) to
the nearest such triple: the Add's output scale sC, and the scale of an input produced by a
Conv / Gemm / MatMul (``exact_scales`` then moves that layer's weight scale to match). A tensor
whose scale another op depends on (a windowed pool, a concat, a graph input; a global pool only
where its rescale is exact by luck) or that an earlier Add has fixed keeps its scale; with both inputs fixed only sC can move, which rarely finds a match: such
an Add is left as it was. Typical moves are ~0.005 % (deep-sort MobileNetV2, EfficientNet-Lite0),
at most ``MAX_CHANGE``.

Muls (`Q ∘ Mul(DQ a, DQ b)`, `QLinearMul`) take part in the same walk: ORT's one scale
``fl32(fl32(sA·sB)/sC)`` must be a multiple of 2**-16 (``numerics.mul_scale_exact``); the output
scale moves (else an input's), the nearest float32 that gets there.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from ..numerics import MUL_GRID_BITS, add_exact_ratios, add_grid_bits, add_ratios_ort, mul_scale_exact

_F32 = np.float32
MAX_CHANGE = 0.01        # an activation scale moves at most 1 %
_OUTPUT_ULPS = 1 << 16   # float32 neighbours of sC tried on each side (<= 0.8 %)
_CANDIDATES = 16         # sC candidates (nearest first) tried for the movable inputs
_CONV = ("Conv", "Gemm", "MatMul")
# QOperator ops: input index of an activation scale -> role ("conv": its layer is re-exactified)
_QOPS = {("QLinearConv", ""): {1: "conv", 6: "conv"}, ("QGemm", "com.microsoft"): {1: "conv", 7: "conv"},
         ("QLinearAdd", "com.microsoft"): {1: "add", 4: "add", 6: "add"},
         ("QLinearMul", "com.microsoft"): {1: "add", 4: "add", 6: "add"},
         ("QLinearGlobalAveragePool", "com.microsoft"): {1: "gap"}}


def exact_add_scales(m: onnx.ModelProto, is_layer, keep=frozenset()) -> dict[str, np.float32]:
    """Move (in place) the activation scales of ``m``'s Adds to exact-ratio triples (module
    docstring). ``is_layer(node)``: does the weight pass re-exactify this Conv / Gemm / MatMul /
    QLinearConv / QGemm (and re-quantize its bias when its input scale moves)? ``keep``: scale
    names that must not move. Returns the old value of every scale initializer it changed, by name."""
    g = m.graph
    inits, producer, consumers = graph_index(g)
    sites = [s for s in (_site(n, inits, producer, consumers) for n in g.node) if s is not None]
    site_nodes = {id(s[3]) for s in sites}
    movable = _movable(g, inits, producer, consumers, site_nodes, is_layer) - set(keep)
    moved: dict[str, np.float32] = {}
    frozen: set[str] = set()
    for i, (a, b, c, _, kind) in enumerate(sites):
        scales = {k: _scalar(inits, k) for k in (a, b, c)}
        free = {k for k in (a, b, c) if k in movable and k not in frozen}
        if kind == "mul":
            new = _solve_mul(a, b, c, scales, free)
        else:
            new = _solve(a, b, c, scales, free, _ahead(c, sites[i + 1:], movable, inits)) if c in free else None
            new = new or _solve(a, b, c, scales, free)
        for k, v in (new or {}).items():
            if v != scales[k]:
                moved.setdefault(k, scales[k])
                inits[k].CopyFrom(numpy_helper.from_array(np.asarray(v, _F32).reshape(
                    numpy_helper.to_array(inits[k]).shape), k))
        frozen.update((a, b, c))
    return moved


def _ahead(c, later, movable, inits) -> list[tuple[np.float32, int]]:
    """Constraints on the output scale ``c`` from later Adds reading it whose own output scale
    cannot move (e.g. the last block's Add before a pool): ``fl32(c / sY)`` must be on their grid
    (``(sY, bits)``), else those Adds find ``c`` fixed and no match."""
    out = []
    for a, b, y, _, kind in later:
        if kind == "add" and c in (a, b) and y not in movable:
            ra, rb = (float(r) for r in add_ratios_ort(_scalar(inits, a), _scalar(inits, b), _scalar(inits, y)))
            if ra > 0 and rb > 0 and np.isfinite(ra + rb):
                out.append((_scalar(inits, y), add_grid_bits(ra * (1 + 3 * MAX_CHANGE), rb * (1 + 3 * MAX_CHANGE))))
    return out


def graph_index(g: onnx.GraphProto) -> tuple[dict, dict, dict]:
    """(initializers by name, the node producing each tensor, the nodes reading each name)."""
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    return {t.name: t for t in g.initializer}, {o: n for n in g.node for o in n.output}, consumers


def exact_add_triple(sa, sb, sc, fixed: str = "") -> tuple[np.float32, np.float32, np.float32] | None:
    """The scales ``(sA', sB', sC')`` nearest ``(sa, sb, sc)`` on which ORT's QLinearAdd is exact,
    moving only the ones not named in ``fixed`` (letters ``a``, ``b``, ``c``), each by at most
    MAX_CHANGE; the triple itself if already exact; None if there is none within reach."""
    scales = {"a": _F32(sa), "b": _F32(sb), "c": _F32(sc)}
    if add_exact_ratios(sa, sb, sc):
        return scales["a"], scales["b"], scales["c"]
    new = _solve("a", "b", "c", scales, set("abc") - set(fixed))
    return None if new is None else (new["a"], new["b"], new["c"])


def _scalar(inits, name) -> np.float32:
    return _F32(numpy_helper.to_array(inits[name]).reshape(-1)[0])


def _per_tensor(inits, scale, zp) -> bool:
    """A per-tensor float32 scale and an 8-bit zero point (int16 activations: ORT's float Add)."""
    s, z = inits.get(scale), inits.get(zp) if zp else None
    return (s is not None and s.data_type == onnx.TensorProto.FLOAT and numpy_helper.to_array(s).size == 1
            and (zp == "" or (z is not None and z.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8))))


def _site(n, inits, producer, consumers):
    """(sA, sB, sC initializer names, node, "add" | "mul") of an Add / Mul ORT runs as QLinearAdd /
    QLinearMul, or None."""
    if n.op_type in ("QLinearAdd", "QLinearMul") and n.domain == "com.microsoft" and len(n.input) >= 8:
        names = (n.input[1], n.input[4], n.input[6])
        zps = (n.input[2], n.input[5], n.input[7])
    elif n.op_type in ("Add", "Mul") and n.domain in ("", "ai.onnx") and len(n.input) == 2:
        dqs = [producer.get(i) for i in n.input]
        outs = consumers.get(n.output[0], [])
        if any(d is None or d.op_type != "DequantizeLinear" for d in dqs) or len(outs) != 1 \
                or outs[0].op_type != "QuantizeLinear":
            return None
        names = (dqs[0].input[1], dqs[1].input[1], outs[0].input[1])
        zps = tuple(q.input[2] if len(q.input) > 2 else "" for q in (*dqs, outs[0]))
    else:
        return None
    if not all(_per_tensor(inits, s, z) for s, z in zip(names, zps)):
        return None
    return (*names, n, "mul" if n.op_type.endswith("Mul") else "add")


def _movable(g, inits, producer, consumers, site_nodes, is_layer) -> set[str]:
    """Scale initializers every use of which is an Add / Mul site's or a re-exactified layer's."""
    outputs = {o.name for o in g.output} | {i.name for i in g.input}     # a graph input's int8 scale: the user's
    ok: dict[str, bool] = {}
    for n in g.node:
        for idx, name in enumerate(n.input):
            if name in inits and not any(d != 1 for d in inits[name].dims):      # a per-tensor scale
                ok[name] = ok.get(name, True) and _use_ok(n, idx, inits, producer, consumers, site_nodes,
                                                          outputs, is_layer)
    return {k for k, v in ok.items() if v}


def _use_ok(n, idx, inits, producer, consumers, site_nodes, outputs, is_layer) -> bool:
    """Does this use of a scale follow the scale wherever it moves (module docstring)?"""
    if (n.op_type, n.domain or "") in _QOPS:
        role = _QOPS[(n.op_type, n.domain or "")].get(idx)
        if idx in (1, 4) and n.input[idx - 1] in outputs:       # the scale of a graph input
            return False
        if role == "gap":
            return gap_follows(n.input[1], n.input[3], inits)
        return role == "add" and id(n) in site_nodes or role == "conv" and is_layer(n)
    if idx != 1 or n.input[0] in inits:
        return False
    if n.op_type == "QuantizeLinear":
        p = producer.get(n.input[0])
        return p is not None and (id(p) in site_nodes or (
            p.op_type in _CONV and len(consumers.get(n.input[0], [])) == 1 and n.input[0] not in outputs))
    if n.op_type == "DequantizeLinear":
        uses = consumers.get(n.output[0], [])
        return n.output[0] not in outputs and n.input[0] not in outputs and all(
            id(u) in site_nodes or (u.op_type in _CONV and list(u.input).index(n.output[0]) == 0
                                    and is_layer(u)) or qdq_gap_follows(u, n.input[1], inits, consumers)
            for u in uses)
    return False


def gap_follows(xs: str, ys: str, inits) -> bool:
    """May a global average pool's input scale ``xs`` move? Its rescale ``xs / (ys·n)`` is exact
    only by luck (ys = xs·2**k, as when both are one initializer, which then moves together):
    it follows unless that luck would be lost (``xs/ys`` a power of two)."""
    if xs == ys:
        return True
    if ys not in inits or any(d != 1 for d in inits[ys].dims):
        return False
    r = float(_scalar(inits, xs)) / float(_scalar(inits, ys))
    return not (r > 0 and np.frexp(r)[0] == 0.5)


def qdq_gap_follows(u, xs, inits, consumers) -> bool:
    """``gap_follows`` for a QDQ ``Q ∘ GlobalAveragePool`` reading the scale ``xs``."""
    outs = consumers.get(u.output[0], [])
    return u.op_type == "GlobalAveragePool" and len(outs) == 1 and outs[0].op_type == "QuantizeLinear" \
        and gap_follows(xs, outs[0].input[1], inits)


def _solve(a, b, c, scales, movable, ahead=()) -> dict[str, np.float32] | None:
    """New scales (by name) of the triple with exact ratios, each within MAX_CHANGE, or None;
    ``ahead``: constraints of later Adds on the output scale (``_ahead``)."""
    sa, sb, sc = scales[a], scales[b], scales[c]
    if add_exact_ratios(sa, sb, sc):
        return None
    ra, rb = (float(r) for r in add_ratios_ort(sa, sb, sc))
    if not (ra > 0 and rb > 0 and np.isfinite(ra + rb)):
        return None
    bits = add_grid_bits(ra * (1 + 3 * MAX_CHANGE), rb * (1 + 3 * MAX_CHANGE))
    fixed = [scales[k] for k in dict.fromkeys((a, b)) if k not in movable]
    for c_new in _output_candidates(sc, c in movable, fixed, bits, ahead):
        new = {c: c_new}
        for k in dict.fromkeys((a, b)):
            new[k] = scales[k] if k not in movable else _input_scale(scales[k], c_new, bits)
            if new[k] is None:
                break
        else:
            if add_exact_ratios(new[a], new[b], new[c]):
                return new
    return None


def _solve_mul(a, b, c, scales, movable) -> dict[str, np.float32] | None:
    """New scales of a Mul with ``fl32(fl32(sA·sB)/sC)`` exact (``numerics.mul_scale_exact``):
    the one scale moved is the output's if it can move, else an input's (nearest first)."""
    if mul_scale_exact(scales[a], scales[b], scales[c]):
        return None
    for k in (c, a, b):
        if k not in movable:
            continue
        cands = _neighbours(scales[k])
        trial = {n: np.full(len(cands), scales[n], _F32) for n in (a, b, c)}
        trial[k] = cands
        s = ((trial[a] * trial[b]).astype(_F32) / trial[c]).astype(_F32)
        hit = np.flatnonzero(_on_grid(s, MUL_GRID_BITS))
        if len(hit):
            return {**scales, k: _F32(cands[hit[0]])}
    return None


def _neighbours(s) -> np.ndarray:
    """The float32 neighbours of ``s`` within MAX_CHANGE (up to ``_OUTPUT_ULPS`` each side), nearest first."""
    k = np.arange(-_OUTPUT_ULPS, _OUTPUT_ULPS + 1, dtype=np.int64)
    k = k[np.argsort(np.abs(k), kind="stable")]
    cands = (np.int64(np.asarray(s, _F32).view(np.int32)) + k).astype(np.int32).view(_F32)
    return cands[np.isfinite(cands) & (cands > 0) & (np.abs(cands / s - 1) <= MAX_CHANGE)]


def _on_grid(r, bits) -> np.ndarray:
    t = np.ldexp(np.asarray(r, np.float64), bits)
    return (t > 0) & (t == np.floor(t))


def _output_candidates(sc, movable: bool, fixed, bits, ahead=()) -> list[np.float32]:
    """sC itself, or its float32 neighbours within MAX_CHANGE nearest first, keeping those that
    put every fixed input's ratio on the grid and meet ``ahead`` (at most ``_CANDIDATES``)."""
    cands = _neighbours(sc) if movable else np.array([sc], _F32)
    keep = np.ones(len(cands), bool)
    for s in fixed:
        keep &= _on_grid((_F32(s) / cands).astype(_F32), bits)
    for s, later_bits in ahead:
        keep &= _on_grid((cands / _F32(s)).astype(_F32), later_bits)
    return list(cands[keep][:_CANDIDATES])


def _input_scale(sx, sc, bits) -> np.float32 | None:
    """The float32 ``sx'`` nearest ``sx`` (within MAX_CHANGE) with ``fl32(sx'/sc)`` on the grid."""
    centre = np.ldexp(float(sx) / float(sc), bits)
    lo, hi = int(np.floor(centre)), int(np.ceil(centre))
    for t in sorted(range(max(1, lo - 8), hi + 9), key=lambda t: abs(t - centre)):
        target = _F32(np.ldexp(float(t), -bits))
        s0 = _F32(float(target) * float(sc))
        if abs(float(s0) / float(sx) - 1) > MAX_CHANGE:
            continue
        for d in (0, 1, -1, 2, -2):
            s = (np.asarray(s0, _F32).view(np.int32) + np.int32(d)).view(_F32)
            if _F32(s / _F32(sc)) == target:
                return _F32(s)
    return None
