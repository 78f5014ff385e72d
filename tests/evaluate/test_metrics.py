"""Metrics with hand-computed answers, and the NSS-vs-ORT comparison fed a wrong answer."""
from __future__ import annotations

import math

import numpy as np

from torq.evaluate import metrics
from torq.data.datasets import Dataset
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


def test_disagreements_counted_by_ort_margin():
    ort = np.array([[5, 5, 0], [9, 2, 1], [4, 3, 0], [0, 8, 1]], np.int8)   # margins 0, 7, 1, 7
    nss = np.array([[5, 6, 0], [9, 2, 1], [3, 4, 0], [0, 8, 1]], np.int8)   # images 0 and 2 flip
    assert metrics.top2_margin(ort).tolist() == [0, 7, 1, 7]
    r = _result(4, 3)
    r.record("int8_nss", 0, nss)
    r.record("int8_ort", 0, ort)
    assert r.disagreement_margins() == {0: 1, 1: 1}
    js = r.to_json()
    assert js["nss_vs_ort_disagreements_by_ort_margin_lsb"] == {"0": 1, "1": 1}
    assert js["ort_margin_lsb_counts"] == {"0": 1, "1": 1, "7": 2}
    assert "2 disagreements by INT8 (ORT)'s top-1 − top-2 logit margin: 0 LSB: 1, 1 LSB: 1 (2 images, 50.00 %" in r.markdown()
    # float logits (not full-integer outputs): no margin in LSB
    f = _result(2, 3)
    f.record("int8_ort", 0, ort[:2].astype(np.float32))
    f.record("int8_nss", 0, ort[:2].astype(np.float32))
    assert f.disagreement_margins() is None and "nss_vs_ort_disagreements_by_ort_margin_lsb" not in f.to_json()
