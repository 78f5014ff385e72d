"""Metrics with hand-computed answers, and the NSS-vs-ORT comparison fed a wrong answer."""
from __future__ import annotations

import math

import numpy as np

from torq.evaluate import metrics
from torq.evaluate.datasets import Dataset
from torq.evaluate.run import EvalOptions
from torq.evaluate.result import EvalResult


def test_topk_ties_lower_index_first():
    logits = np.array([[3, 7, 7, -128, 7, 0]], np.int8)
    assert metrics.topk(logits, 5).tolist() == [[1, 2, 4, 0, 5]]
    acc = metrics.accuracy(np.array([[1, 2, 4, 0, 5], [3, 1, 2, 0, 4]]), np.array([4, 5]))
    assert acc == {"top1": 0.0, "top5": 0.5}


def test_sqnr_and_lsb():
    assert metrics.sqnr_db(100.0, 1.0) == 20.0
    assert metrics.sqnr_db(1.0, 0.0) == math.inf
    a = np.array([[-128, 0, 127]], np.int8)
    b = np.array([[127, 0, 126]], np.int8)
    assert metrics.lsb_histogram(a, b) == {-255: 1, 0: 1, 1: 1}


def _result(n=4, classes=10):
    data = Dataset("d", np.arange(n) % classes, lambda i: None)
    return EvalResult.start("m.onnx", data, EvalOptions(), classes, 0)


def test_injected_nss_fault_is_seen():
    """Equal outputs give 100 % agreement and a 0-LSB histogram; one flipped logit does not."""
    logits = np.random.default_rng(0).integers(-100, 100, (4, 10)).astype(np.int8)
    good, bad = _result(), _result()
    for r, nss in ((good, logits), (bad, logits.copy())):
        if r is bad:
            nss[2, (np.argmax(logits[2]) + 1) % 10] = 127      # the fault: a new top-1 for image 2
        r.record("int8_ort", 0, logits)
        r.record("int8_nss", 0, nss)
    assert good.agreement("int8_nss", "int8_ort") == 1.0 and set(good.lsb) == {0}
    assert bad.agreement("int8_nss", "int8_ort") == 0.75
    assert sum(v for k, v in bad.lsb.items() if k != 0) == 1 and sum(bad.lsb.values()) == 40
