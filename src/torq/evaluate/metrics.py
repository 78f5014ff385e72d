"""Accuracy numbers: top-k, agreement, per-layer SQNR, LSB differences.

Ranking rule for every path: larger logit first, ties broken by the lower class index (a stable
sort), so int8 logits -- which tie often -- rank the same way in ORT and in the NSS.
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx


def topk(logits: np.ndarray, k: int = 5) -> np.ndarray:
    """Class indices of the k largest logits per row (ties: lower index first)."""
    scores = np.asarray(logits).reshape(len(logits), -1).astype(np.float64)
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def accuracy(top: np.ndarray, labels: np.ndarray) -> dict:
    """{"top1", "top5"} fractions in [0, 1] from top-k indices (top5 only if k >= 5)."""
    labels = np.asarray(labels).reshape(-1, 1)
    out = {"top1": float(np.mean(top[:, 0] == labels[:, 0]))}
    if top.shape[1] >= 5:
        out["top5"] = float(np.mean(np.any(top[:, :5] == labels, axis=1)))
    return out


def agreement(top_a: np.ndarray, top_b: np.ndarray) -> float:
    """Fraction of images whose top-1 class is the same on both paths."""
    return float(np.mean(top_a[:, 0] == top_b[:, 0]))


def top2_margin(logits: np.ndarray) -> np.ndarray:
    """Largest minus second-largest logit per row (integer logits: in LSB; 0 = a tie)."""
    scores = np.sort(np.asarray(logits).reshape(len(logits), -1).astype(np.float64), axis=1)
    return scores[:, -1] - scores[:, -2]


def disagreement_margins(top_a: np.ndarray, top_b: np.ndarray, margin_b: np.ndarray) -> Counter:
    """For the images whose top-1 differs between a and b: how many had each top-2 margin on b.

    A path that differs from b by a few LSB of logits can only change b's top-1 where b's two
    best classes are that close; this shows whether the disagreements are such near-ties."""
    differ = top_a[:, 0] != top_b[:, 0]
    values, counts = np.unique(margin_b[differ], return_counts=True)
    return Counter({int(v): int(c) for v, c in zip(values, counts)})


def sqnr_db(signal_power: float, noise_power: float) -> float:
    """10·log10(Σref² / Σ(ref−test)²); +inf when the test is exact."""
    if noise_power == 0:
        return math.inf
    if signal_power == 0:
        return -math.inf
    return 10.0 * math.log10(signal_power / noise_power)


def lsb_histogram(a: np.ndarray, b: np.ndarray) -> Counter:
    """Counts of (a − b) over all elements of two int8 tensors (differences in LSB)."""
    d = a.astype(np.int16) - b.astype(np.int16)
    values, counts = np.unique(d, return_counts=True)
    return Counter({int(v): int(c) for v, c in zip(values, counts)})


class LayerSqnr:
    """Per-layer SQNR of the int8 model's activations against the fp32 model's.

    A layer is every fp32 tensor that the quantizer wraps in QuantizeLinear → DequantizeLinear;
    its int8 value is that DequantizeLinear's output. Both models run in ORT without graph
    optimizations so every such tensor can be read out (the int8 path is then ORT's float
    Q/DQ reference, within 1 LSB of its integer kernels)."""

    def __init__(self, fp32: onnx.ModelProto, qmodel: onnx.ModelProto):
        produced = {o for n in fp32.graph.node for o in n.output}
        consumers: dict[str, list] = {}
        for n in qmodel.graph.node:
            for i in n.input:
                consumers.setdefault(i, []).append(n)
        self.pairs: list[tuple[str, str]] = []
        for n in qmodel.graph.node:
            if n.op_type == "QuantizeLinear" and n.input[0] in produced:
                dq = [c for c in consumers.get(n.output[0], []) if c.op_type == "DequantizeLinear"]
                if dq:
                    self.pairs.append((n.input[0], dq[0].output[0]))
        self.model = fp32
        self.fp32 = self._session(fp32, [t for t, _ in self.pairs])
        self.q = self._session(qmodel, [d for _, d in self.pairs])
        self.signal = np.zeros(len(self.pairs))
        self.noise = np.zeros(len(self.pairs))

    @staticmethod
    def _session(model, names):
        from ..quantize.calibration import probe_session
        sess = probe_session(model, names)
        return sess, sess.get_inputs()[0].name, names

    def add(self, x_float: np.ndarray, x_int8: np.ndarray) -> None:
        """Images of a batch; a model with a fixed batch N sees them N at a time (a remainder
        of fewer than N images is left out of the SQNR)."""
        from .engines import fixed_batch
        n = fixed_batch(self.model)
        if n is not None and len(x_float) != n:
            for start in range(0, len(x_float) - n + 1, n):
                self.add(x_float[start:start + n], x_int8[start:start + n])
            return
        (fs, fin, fnames), (qs, qin, qnames) = self.fp32, self.q
        ref = fs.run(fnames, {fin: x_float})
        test = qs.run(qnames, {qin: x_int8})
        for k, (r, t) in enumerate(zip(ref, test)):
            r = r.astype(np.float64)
            self.signal[k] += float(np.sum(r * r))
            self.noise[k] += float(np.sum((r - t) ** 2))

    def result(self) -> list[dict]:
        return [{"tensor": t, "sqnr_db": sqnr_db(s, n)}
                for (t, _), s, n in zip(self.pairs, self.signal, self.noise)]
