"""Cross-layer equalization (Nagel et al., "Data-Free Quantization", 2019): an fp32 graph transform.

    Conv₁ → (Relu | Clip[0, 6] | nothing) → Conv₂  ->  the same ops, rescaled weights

Per-tensor int8 keeps one scale for a whole weight tensor, so a depthwise layer whose channels
span 0.01 .. 20 rounds its small channels to a handful of levels. A positively homogeneous
activation f (f(x/s) = f(x)/s for s > 0) lets us divide output channel c of Conv₁ (weights and
bias) by s_c and multiply input channel c of Conv₂ by s_c without changing the function. With
r1_c = max|W₁[c]| and r2_c = max|W₂[:, c]|, s_c = sqrt(r1_c·r2_c) / r2_c makes both ranges
sqrt(r1_c·r2_c): equal across the pair. Chains (expand → depthwise → project) are swept until
the scales settle, since a middle conv is the second of one pair and the first of the next.

ReLU6 (Clip 0..6) is not homogeneous: s·clip(x/s, 0, 6) = clip(x, 0, 6s). It equals clip(x, 0, 6)
wherever x ≤ 6·min(1, s). With calibration data we keep the Clip and bound each channel's scale:
a channel the clip cuts on the calibration images (max > 6) keeps s = 1, any other channel may be
rescaled only as far as its largest pre-activation value stays ≤ 6 (cumulative s ≥ max/6).
The transform is then exact on the calibration images, which is also the range the quantizer
keeps (it saturates every tensor at its calibrated maximum anyway). AIMET instead replaces
ReLU6 by ReLU, which changes the fp32 model. ``relu6="skip"`` leaves Clip pairs alone.

Every result is checked: the equalized model must reproduce the original's outputs (ORT, a few
calibration samples) within ``RTOL`` of their magnitude, or we raise rather than return it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import TorqError, quote
from .calibration import probe_session

RELU6 = (0.0, 6.0)
ROUNDS = 50                 # sweeps over all pairs; chains settle in a few
SETTLED = 1e-6              # stop when no scale moves by more than this (relative)
RTOL = 1e-3                 # equivalence: max |Δ output| ≤ RTOL · max |output| (+ float32 dust)
CHECK_SAMPLES = 4           # calibration samples the equivalence check runs
RELU6_HEADROOM = 1.0        # ReLU6 channels stay unclipped up to this × their calibrated peak


@dataclass
class Pair:
    """Conv₁ → optional activation → Conv₂, matched in the graph."""
    first: onnx.NodeProto
    act: onnx.NodeProto | None
    second: onnx.NodeProto

    @property
    def name(self) -> str:
        return f"{_label(self.first)} -> {_label(self.second)}"


@dataclass
class Equalized:
    """The equalized model, the pairs it rescaled and why every other Conv was left alone."""
    model: onnx.ModelProto
    pairs: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)      # conv label -> reason
    clip_bound_channels: int = 0                               # ReLU6 channels kept at s = 1
    max_rel_diff: float = 0.0                                  # measured by the equivalence check


def _label(node: onnx.NodeProto) -> str:
    return node.name or node.output[0]


# ----------------------------------------------------------------------------- matching

class _Graph:
    """Initializers, consumers and graph outputs of one model, for the pair matcher."""

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.inits = {t.name: t for t in g.initializer}
        self.outputs = {o.name for o in g.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in g.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)

    def sole_consumer(self, tensor: str) -> onnx.NodeProto | str:
        users = self.consumers.get(tensor, [])
        if tensor in self.outputs:
            return f"{quote(tensor)} is a graph output"
        if len(users) != 1:
            return f"{quote(tensor)} is read by {len(users)} nodes"
        return users[0]

    def own_initializer(self, node: onnx.NodeProto, k: int, what: str) -> str | None:
        """Reason why input k of ``node`` is not an initializer only this node reads, else None."""
        name = node.input[k] if len(node.input) > k else ""
        if not name:
            return None if k == 2 else f"no {what}"
        if name not in self.inits:
            return f"its {what} {quote(name)} is computed at run time"
        if len(self.consumers[name]) != 1:
            return f"its {what} {quote(name)} is shared with another node"
        return None

    def clip_bounds(self, node: onnx.NodeProto) -> tuple[float, float] | None:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        lo, hi = attrs.get("min", -np.inf), attrs.get("max", np.inf)
        for k in (1, 2):
            if len(node.input) > k and node.input[k]:
                if node.input[k] not in self.inits:
                    return None
                v = float(numpy_helper.to_array(self.inits[node.input[k]]))
                lo, hi = (v, hi) if k == 1 else (lo, v)
        return float(lo), float(hi)


def match_pair(g: _Graph, conv: onnx.NodeProto) -> Pair | str:
    """The pair starting at ``conv``, or the reason there is none."""
    for k, what in ((1, "weight"), (2, "bias")):
        if (reason := g.own_initializer(conv, k, what)) is not None:
            return reason
    nxt = g.sole_consumer(conv.output[0])
    if isinstance(nxt, str):
        return nxt
    act = None
    if nxt.op_type in ("Relu", "Clip"):
        if nxt.op_type == "Clip" and g.clip_bounds(nxt) != RELU6:
            return f"its output goes through Clip{g.clip_bounds(nxt) or '(run-time bounds)'}, not Relu or ReLU6"
        act, nxt = nxt, g.sole_consumer(nxt.output[0])
        if isinstance(nxt, str):
            return nxt
    if nxt.op_type != "Conv":
        return f"it feeds {nxt.op_type} {quote(_label(nxt))}, not a Conv"
    if nxt.input[0] != (act or conv).output[0]:
        return f"it is the weight or bias of Conv {quote(_label(nxt))}"
    if (reason := g.own_initializer(nxt, 1, "next Conv's weight")) is not None:
        return reason
    channels = numpy_helper.to_array(g.inits[conv.input[1]]).shape[0]
    w2 = g.inits[nxt.input[1]]
    if w2.dims[1] * _group(nxt) != channels:
        return f"Conv {quote(_label(nxt))} reads {w2.dims[1] * _group(nxt)} channels, not {channels}"
    return Pair(conv, act, nxt)


def find_pairs(model: onnx.ModelProto) -> tuple[list[Pair], dict[str, str]]:
    """(every Conv → act → Conv pair, {conv label: reason} for each Conv that starts none)."""
    g = _Graph(model)
    pairs, skipped = [], {}
    for n in model.graph.node:
        if n.op_type == "Conv":
            found = match_pair(g, n)
            if isinstance(found, Pair):
                pairs.append(found)
            else:
                skipped[_label(n)] = found
    return pairs, skipped


def _group(node: onnx.NodeProto) -> int:
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == "group"), 1)


# ----------------------------------------------------------------------------- scales

def out_ranges(w1: np.ndarray) -> np.ndarray:
    """r1_c: the largest |weight| of each output channel."""
    return np.abs(w1).reshape(len(w1), -1).max(axis=1)


def in_ranges(w2: np.ndarray, groups: int) -> np.ndarray:
    """r2_c: the largest |weight| that reads input channel c (over its group's output rows)."""
    per_group = w2.shape[1]
    blocks = np.abs(w2).reshape(groups, w2.shape[0] // groups, per_group, -1)
    return blocks.max(axis=(1, 3)).reshape(groups * per_group)


def equalizing_scales(r1: np.ndarray, r2: np.ndarray) -> np.ndarray:
    """s_c = sqrt(r1_c·r2_c) / r2_c (both ranges become sqrt(r1_c·r2_c)); 1 where a range is 0."""
    ok = (r1 > 0) & (r2 > 0)
    return np.where(ok, np.sqrt(np.where(ok, r1 / np.where(ok, r2, 1), 1)), 1.0)


def scale_pair(w1, b1, w2, groups2: int, s: np.ndarray) -> None:
    """In place: output channel c of (w1, b1) divided by s_c, input channel c of w2 times s_c."""
    w1 /= s.reshape(-1, *([1] * (w1.ndim - 1)))
    if b1 is not None:
        b1 /= s
    per_group = w2.shape[1]
    view = w2.reshape(groups2, w2.shape[0] // groups2, per_group, -1)
    view *= s.reshape(groups2, 1, per_group, 1)


# ----------------------------------------------------------------------------- the transform

def equalize(model: onnx.ModelProto, reader=None, *, relu6: str = "bounded", check: bool = True) -> Equalized:
    """Cross-layer-equalize a copy of the fp32 ``model`` (BatchNorm already folded into Conv, and
    dead channels zeroed by ``dead_channels``: a 1e-8 channel would be scaled up 1e4, bias too).

    ``reader``: calibration samples (an ORT CalibrationDataReader); they bound ReLU6 pairs and
    feed the equivalence check (without one, ReLU6 pairs are skipped and the check runs on
    synthetic inputs). ``relu6``: ``"bounded"`` (see module doc) or ``"skip"``."""
    if relu6 not in ("bounded", "skip"):
        raise TorqError(f"unknown ReLU6 policy {relu6!r}: use 'bounded' or 'skip'")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    pairs, skipped = find_pairs(out)
    keep = []
    for p in pairs:
        if p.act is not None and p.act.op_type == "Clip" and (relu6 == "skip" or reader is None):
            skipped[_label(p.first)] = ("ReLU6 pairs are skipped" if relu6 == "skip" else
                                        "ReLU6 needs calibration data to show where the clip binds")
        else:
            keep.append(p)
    clipped = [p.first.output[0] for p in keep if p.act is not None and p.act.op_type == "Clip"]
    maxima = channel_maxima(out, clipped, reader) if clipped else {}
    result = Equalized(out, [p.name for p in keep], skipped)
    result.clip_bound_channels = _sweep(out, keep, maxima)
    if check:
        result.max_rel_diff = check_equivalent(model, out, reader)
    return result


def _sweep(model: onnx.ModelProto, pairs: list[Pair], maxima: dict[str, np.ndarray]) -> int:
    """Rescale every pair until the scales settle; write the weights back. Returns the number
    of ReLU6 channels held at s = 1 because the clip cuts them."""
    inits = {t.name: t for t in model.graph.initializer}
    arrays = {name: numpy_helper.to_array(t).astype(np.float64) for name, t in inits.items()
              if any(name in (p.first.input[1:3]) or name == p.second.input[1] for p in pairs)}
    total = {p.first.output[0]: np.ones(len(arrays[p.first.input[1]])) for p in pairs}
    for _ in range(ROUNDS):
        moved = 0.0
        for p in pairs:
            w1, w2 = arrays[p.first.input[1]], arrays[p.second.input[1]]
            b1 = arrays.get(p.first.input[2]) if len(p.first.input) > 2 and p.first.input[2] else None
            s = equalizing_scales(out_ranges(w1), in_ranges(w2, _group(p.second)))
            t = p.first.output[0]
            if t in maxima:
                s = _bound_relu6(s, total[t], maxima[t])
            total[t] *= s
            scale_pair(w1, b1, w2, _group(p.second), s)
            moved = max(moved, float(np.max(np.abs(np.log(s)))))
        if moved < SETTLED:
            break
    for name, a in arrays.items():
        inits[name].CopyFrom(numpy_helper.from_array(a.astype(np.float32), name))
    return sum(int(np.sum(RELU6_HEADROOM * peak > RELU6[1])) for peak in maxima.values())


def _bound_relu6(s: np.ndarray, total: np.ndarray, peak: np.ndarray) -> np.ndarray:
    """Scales that keep clip(x/S, 0, 6)·S = clip(x, 0, 6) for the calibrated peak of x.

    Cumulative scale S = total·s: a channel the clip cuts (headroom × peak > 6) keeps S = 1; any
    other needs headroom × peak / S ≤ 6, i.e. S ≥ headroom × peak / 6."""
    reach = RELU6_HEADROOM * np.maximum(peak, 0.0)
    cut = reach > RELU6[1]
    floor = reach / RELU6[1]
    s = np.where(total * s < floor, floor / total, s)
    return np.where(cut, 1.0, s)


# ----------------------------------------------------------------------------- calibration runs

def _rewind(reader) -> None:
    for name in ("rewind", "reset"):
        if callable(getattr(reader, name, None)):
            getattr(reader, name)()
            return
    raise TorqError("cross-layer equalization reads the calibration data more than once: "
                    "the calibration data reader needs a rewind() method")


def _samples(reader, limit: int | None = None):
    _rewind(reader)
    count = 0
    while (limit is None or count < limit) and (feed := reader.get_next()) is not None:
        count += 1
        yield feed
    _rewind(reader)


def channel_maxima(model: onnx.ModelProto, tensors: list[str], reader) -> dict[str, np.ndarray]:
    """Per-channel maximum of each N×C×… tensor over the calibration samples."""
    sess = probe_session(model, tensors)
    peaks = {t: None for t in tensors}
    for feed in _samples(reader):
        for t, v in zip(tensors, sess.run(tensors, feed)):
            m = np.moveaxis(v, 1, 0).reshape(v.shape[1], -1).max(axis=1)
            peaks[t] = m if peaks[t] is None else np.maximum(peaks[t], m)
    if any(v is None for v in peaks.values()):
        raise TorqError("cross-layer equalization: the calibration data reader gave no samples")
    return peaks


def check_equivalent(before: onnx.ModelProto, after: onnx.ModelProto, reader=None) -> float:
    """Largest output difference relative to the output's magnitude, over a few calibration
    samples (synthetic ones without a reader); TorqError when it exceeds ``RTOL``."""
    if reader is None:
        from .calibration import SyntheticDataReader
        reader = SyntheticDataReader(before, CHECK_SAMPLES)
    a, b = probe_session(before), probe_session(after)
    worst = 0.0
    for feed in _samples(reader, CHECK_SAMPLES):
        for name, x, y in zip([o.name for o in before.graph.output], a.run(None, feed), b.run(None, feed)):
            x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
            rel = float(np.max(np.abs(x - y), initial=0.0) / (np.max(np.abs(x), initial=0.0) + 1e-12))
            worst = max(worst, rel)
            if rel > RTOL:
                raise TorqError(f"cross-layer equalization changed output {quote(name)} by {rel:.3g} of its "
                                f"magnitude (allowed {RTOL:g}): the rescaled model is not equivalent")
    return worst
