"""``--weight-rounding gptq``: `Conv/Gemm/MatMul ∘ DQ(w_q) -> same, w_q'` with each layer's int8
weights rounded to minimise its output error on the calibration data (``numerics.weight_rounding``).

Runs on the finished QDQ model (after exact scales, whose scales it keeps): for each layer whose
weight is a symmetric int8 DequantizeLinear of an initializer with an fp32 original in the
prepared model (the quantizer's ``<name>_quantized`` naming), the second moments ``H`` of the
layer's fp32 input (im2col patches for a Conv, per group) are summed over the calibration
samples, then the integers are re-chosen. Biases and scales are untouched. A layer that saw fewer
input rows than it has inputs keeps nearest rounding: its ``H`` is singular (a classifier after a
global pool sees one row per image), so GPTQ would fit the calibration images, not the data.
"""
from __future__ import annotations

import hashlib

import numpy as np
import onnx
from onnx import numpy_helper

from ..numerics.weight_rounding import gptq_round
from .calibration import probe_session, rewind

PENDING_VALUES = 1 << 20     # rows gathered (over samples) before they are added to H in one matmul
ROWS_PER_SAMPLE = 2048       # im2col rows kept per sample and layer (a fixed random subset)


def round_weights(qmodel: onnx.ModelProto, fp32: onnx.ModelProto, reader) -> onnx.ModelProto:
    """A copy of ``qmodel`` with GPTQ-rounded weights (module docstring); ``fp32``: the prepared
    model that was quantized, ``reader``: its calibration data."""
    m = onnx.ModelProto()
    m.CopyFrom(qmodel)
    layers = _layers(m, fp32)
    if not layers:
        return m
    inits = {t.name: t for t in m.graph.initializer}
    for lay, (h, rows) in zip(layers, _moments(fp32, layers, reader)):
        if h is not None and rows >= h.shape[-1]:
            _reround(lay, h, inits)
    return m


def _layers(m: onnx.ModelProto, fp32: onnx.ModelProto) -> list[dict]:
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    floats = {t.name for t in fp32.graph.initializer}
    producer = {o: n for n in g.node for o in n.output}
    out = []
    for n in g.node:
        if n.op_type not in ("Conv", "Gemm", "MatMul") or len(n.input) < 2:
            continue
        dqx, dqw = producer.get(n.input[0]), producer.get(n.input[1])
        if dqx is None or dqw is None or dqx.op_type != "DequantizeLinear" or dqw.op_type != "DequantizeLinear":
            continue
        qx = producer.get(dqx.input[0])
        wq = dqw.input[0]
        base = wq[:-len("_quantized")] if wq.endswith("_quantized") else None
        if qx is None or qx.op_type != "QuantizeLinear" or wq not in inits or base not in floats \
                or inits[wq].data_type != onnx.TensorProto.INT8 or dqw.input[1] not in inits:
            continue
        zp = numpy_helper.to_array(inits[dqw.input[2]]) if len(dqw.input) > 2 and dqw.input[2] in inits else 0
        if np.any(zp != 0):
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type == "Gemm" and attrs.get("transA", 0):
            continue
        axis = next((a.i for a in dqw.attribute if a.name == "axis"), 1)
        out.append({"node": n, "input": qx.input[0], "weight": wq, "scale": dqw.input[1], "axis": axis,
                    "float": base, "attrs": attrs})
    return out


def _moments(fp32, layers, reader) -> list:
    """Per layer: (G, K, K) summed second moments of its input rows over the calibration samples
    (None when its input has a shape the pass does not handle) and how many rows they summed. The
    last result is kept for the same fp32 model and samples: ``--precision auto`` quantizes one
    prepared model many times."""
    floats = {t.name: t for t in fp32.graph.initializer}
    for lay in layers:
        lay["w"] = numpy_helper.to_array(floats[lay["float"]]).astype(np.float64)
    rewind(reader)
    samples = list(iter(reader.get_next, None))
    rewind(reader)
    digest = hashlib.sha256(fp32.SerializeToString())
    for sample in samples:
        for k in sorted(sample):
            digest.update(k.encode() + np.ascontiguousarray(sample[k]).tobytes())
    key = (digest.hexdigest(), tuple(lay["input"] for lay in layers))
    if _LAST.get("key") != key:
        _LAST.clear()
        _LAST.update(key=key, moments=_sum_moments(fp32, layers, samples))
    return _LAST["moments"]


_LAST: dict = {}


def _sum_moments(fp32, layers, samples) -> list:
    sess = probe_session(fp32, sorted({lay["input"] for lay in layers}))
    names = [o.name for o in sess.get_outputs()]
    rng = np.random.default_rng(0)
    acc: list = [None] * len(layers)
    count = [0] * len(layers)
    pending: list = [[] for _ in layers]       # rows waiting for one matmul (a wide layer gets few
                                                # rows per sample: a K×K update per sample is the cost)

    def flush(i):
        rows = np.concatenate(pending[i], axis=1)
        pending[i] = []
        h = np.swapaxes(rows, 1, 2) @ rows
        count[i] += rows.shape[1]
        acc[i] = h if acc[i] is None else acc[i] + h
    for sample in samples:
        got = dict(zip(names, sess.run(None, sample)))
        for i, lay in enumerate(layers):
            rows = _patches(got[lay["input"]], lay, rng)
            if rows is None:
                continue
            pending[i].append(rows)
            if sum(r.shape[1] for r in pending[i]) * rows.shape[0] * rows.shape[2] >= PENDING_VALUES:
                flush(i)
    for i in range(len(layers)):
        if pending[i]:
            flush(i)
    return list(zip(acc, count))


def _patches(x: np.ndarray, lay: dict, rng) -> np.ndarray | None:
    """(G, rows, K) float64 input rows of the layer (a Conv's im2col patches, per group), at most
    about ``ROWS_PER_SAMPLE`` of them (output positions drawn by ``rng``)."""
    op, w, attrs = lay["node"].op_type, lay["w"], lay["attrs"]
    if op != "Conv":
        k = w.shape[-2] if (op == "MatMul" or not attrs.get("transB", 0)) else w.shape[-1]
        if w.ndim != 2 or x.shape[-1] != k:
            return None
        x = x.reshape(-1, k)
        if len(x) > ROWS_PER_SAMPLE:
            x = x[np.sort(rng.choice(len(x), ROWS_PER_SAMPLE, replace=False))]
        return x.astype(np.float64)[None]
    if x.ndim != 4 or w.ndim != 4 or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    group = int(attrs.get("group", 1))
    kh, kw = w.shape[2:]
    sh, sw = attrs.get("strides", [1, 1])
    dh, dw = attrs.get("dilations", [1, 1])
    t, l, b, r = attrs.get("pads", [0, 0, 0, 0])
    n, c = x.shape[:2]
    xp = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)))
    win = np.lib.stride_tricks.sliding_window_view(xp, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
    win = win[:, :, ::sh, ::sw, ::dh, ::dw]                        # N, C, Ho, Wo, kh, kw (a view)
    ho, wo = win.shape[2:4]
    pos = np.arange(ho * wo)
    if n * len(pos) > ROWS_PER_SAMPLE:
        pos = np.sort(rng.choice(len(pos), max(1, ROWS_PER_SAMPLE // n), replace=False))
    win = win[:, :, pos // wo, pos % wo]                           # N, C, P, kh, kw (a copy of P only)
    win = win.reshape(n, group, c // group, len(pos), kh, kw).transpose(1, 0, 3, 2, 4, 5)
    return win.reshape(group, n * len(pos), (c // group) * kh * kw).astype(np.float64)


def _reround(lay: dict, h: np.ndarray, inits: dict) -> None:
    w = lay["w"]
    scale = numpy_helper.to_array(inits[lay["scale"]]).astype(np.float64).reshape(-1)
    op, attrs = lay["node"].op_type, lay["attrs"]
    if op == "Conv":
        rows = w.reshape(h.shape[0], w.shape[0] // h.shape[0], -1)         # (G, Cout/G, Cin/G·kh·kw)
        ok = scale.size in (1, w.shape[0]) and (scale.size == 1 or lay["axis"] % 4 == 0)

        def back(q):
            return q.reshape(w.shape)
    else:
        flip = op == "MatMul" or not attrs.get("transB", 0)                 # (K, N): rows are columns
        rows = (w.T if flip else w)[None]
        ok = scale.size == 1 or (scale.size == rows.shape[1] and lay["axis"] % 2 == (1 if flip else 0))

        def back(q):
            return q[0].T if flip else q[0]
    if not ok or h.shape[1] != rows.shape[2]:
        return
    s = np.broadcast_to(scale, (rows.shape[0] * rows.shape[1],)).reshape(rows.shape[:2])
    q = gptq_round(rows, s, h)
    inits[lay["weight"]].CopyFrom(numpy_helper.from_array(back(q).astype(np.int8), lay["weight"]))
