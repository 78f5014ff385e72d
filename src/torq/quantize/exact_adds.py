"""Activation scales on which ONNX Runtime's float32 QLinearAdd is exact: `Q ∘ Add(DQ a, DQ b)`
(QDQ, which ORT fuses into QLinearAdd) and `QLinearAdd` (QOperator) -> same, sA', sB', sC'.

ORT's QLinearAdd is exact when its ratios ``fl32(sA/sC)``, ``fl32(sB/sC)`` sit on a grid of
``2**-g`` fine enough for ~13 significant bits and coarse enough that no float32 step rounds
(``numerics.add_exact_ratios``); the NPU's Add then holds the same ratios exactly and rounds half
to even like ORT. This pass moves the scales of the tensors around each Add (in graph order) to
the nearest such triple: the Add's output scale sC, and the scale of an input produced by a
Conv / Gemm / MatMul (``exact_scales`` then moves that layer's weight scale to match). A tensor
whose scale another op depends on (a pool, a concat, a graph input) or that an earlier Add has
fixed keeps its scale; with both inputs fixed only sC can move, which rarely finds a match: such
an Add is left as it was. Typical moves are 0.01-0.1 %, at most ``MAX_CHANGE``.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from ..numerics import add_exact_ratios, add_grid_bits, add_ratios_ort

_F32 = np.float32
MAX_CHANGE = 0.01        # an activation scale moves at most 1 %
_OUTPUT_ULPS = 1 << 16   # float32 neighbours of sC tried on each side (<= 0.8 %)
_CANDIDATES = 16         # sC candidates (nearest first) tried for the movable inputs
_CONV = ("Conv", "Gemm", "MatMul")
# QOperator ops: input index of an activation scale -> role ("conv": its layer is re-exactified)
_QOPS = {("QLinearConv", ""): {1: "conv", 6: "conv"}, ("QGemm", "com.microsoft"): {1: "conv", 7: "conv"},
         ("QLinearAdd", "com.microsoft"): {1: "add", 4: "add", 6: "add"}}


def exact_add_scales(m: onnx.ModelProto, is_layer) -> dict[str, np.float32]:
    """Move (in place) the activation scales of ``m``'s Adds to exact-ratio triples (module
    docstring). ``is_layer(node)``: does the weight pass re-exactify this Conv / Gemm / MatMul /
    QLinearConv / QGemm (and re-quantize its bias when its input scale moves)? Returns the old
    value of every scale initializer it changed, by name."""
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    sites = [s for s in (_site(n, inits, producer, consumers) for n in g.node) if s is not None]
    site_nodes = {id(n) for *_, n in sites}
    movable = _movable(g, inits, producer, consumers, site_nodes, is_layer)
    moved: dict[str, np.float32] = {}
    frozen: set[str] = set()
    for a, b, c, _ in sites:
        scales = {k: _scalar(inits, k) for k in (a, b, c)}
        new = _solve(a, b, c, scales, {k for k in (a, b, c) if k in movable and k not in frozen})
        for k, v in (new or {}).items():
            if v != scales[k]:
                moved.setdefault(k, scales[k])
                inits[k].CopyFrom(numpy_helper.from_array(np.asarray(v, _F32).reshape(
                    numpy_helper.to_array(inits[k]).shape), k))
        frozen.update((a, b, c))
    return moved


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
    """(sA, sB, sC initializer names, node) of an Add ORT runs as QLinearAdd, or None."""
    if n.op_type == "QLinearAdd" and n.domain == "com.microsoft" and len(n.input) >= 8:
        names = (n.input[1], n.input[4], n.input[6])
        zps = (n.input[2], n.input[5], n.input[7])
    elif n.op_type == "Add" and n.domain in ("", "ai.onnx") and len(n.input) == 2:
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
    return (*names, n)


def _movable(g, inits, producer, consumers, site_nodes, is_layer) -> set[str]:
    """Scale initializers every use of which is an Add site's or a re-exactified layer's."""
    outputs = {o.name for o in g.output}
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
        return role == "add" and id(n) in site_nodes or role == "conv" and is_layer(n)
    if idx != 1 or n.input[0] in inits:
        return False
    if n.op_type == "QuantizeLinear":
        p = producer.get(n.input[0])
        return p is not None and (id(p) in site_nodes or (
            p.op_type in _CONV and len(consumers.get(n.input[0], [])) == 1 and n.input[0] not in outputs))
    if n.op_type == "DequantizeLinear":
        uses = consumers.get(n.output[0], [])
        return n.output[0] not in outputs and all(
            id(u) in site_nodes or (u.op_type in _CONV and list(u.input).index(n.output[0]) == 0
                                    and is_layer(u)) for u in uses)
    return False


def _solve(a, b, c, scales, movable) -> dict[str, np.float32] | None:
    """New scales (by name) of the triple with exact ratios, each within MAX_CHANGE, or None."""
    sa, sb, sc = scales[a], scales[b], scales[c]
    if add_exact_ratios(sa, sb, sc):
        return None
    ra, rb = (float(r) for r in add_ratios_ort(sa, sb, sc))
    if not (ra > 0 and rb > 0 and np.isfinite(ra + rb)):
        return None
    bits = add_grid_bits(ra * (1 + 3 * MAX_CHANGE), rb * (1 + 3 * MAX_CHANGE))
    fixed = [scales[k] for k in dict.fromkeys((a, b)) if k not in movable]
    for c_new in _output_candidates(sc, c in movable, fixed, bits):
        new = {c: c_new}
        for k in dict.fromkeys((a, b)):
            new[k] = scales[k] if k not in movable else _input_scale(scales[k], c_new, bits)
            if new[k] is None:
                break
        else:
            if add_exact_ratios(new[a], new[b], new[c]):
                return new
    return None


def _on_grid(r, bits) -> np.ndarray:
    t = np.ldexp(np.asarray(r, np.float64), bits)
    return (t > 0) & (t == np.floor(t))


def _output_candidates(sc, movable: bool, fixed, bits) -> list[np.float32]:
    """sC itself, or its float32 neighbours within MAX_CHANGE nearest first, keeping those that
    put every fixed input's ratio on the grid (at most ``_CANDIDATES``)."""
    if not movable:
        cands = np.array([sc], _F32)
    else:
        k = np.arange(-_OUTPUT_ULPS, _OUTPUT_ULPS + 1, dtype=np.int64)
        k = k[np.argsort(np.abs(k), kind="stable")]
        cands = (np.int64(np.asarray(sc, _F32).view(np.int32)) + k).astype(np.int32).view(_F32)
        cands = cands[np.isfinite(cands) & (cands > 0) & (np.abs(cands / sc - 1) <= MAX_CHANGE)]
    keep = np.ones(len(cands), bool)
    for s in fixed:
        keep &= _on_grid((_F32(s) / cands).astype(_F32), bits)
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
