"""The second INT8 execution (the int8 model as its ONNX definition): it really runs unfused, it is
a different execution from the fused one on the same int8 model, and evaluate reports it."""
from __future__ import annotations

import numpy as np

from torq.evaluate import EvalOptions, evaluate
from torq.evaluate.engines import OrtEngine
from torq.quantize import quantize

from .fmnist_probe import TEST, TRAIN


def _optimized_ops(model, fused, tmp_path):
    import onnx

    from torq import reference
    path = tmp_path / f"opt_{fused}.onnx"
    reference.session(model, optimized_model_path=path, fused=fused)
    return {n.op_type for n in onnx.load(path).graph.node}


def test_reference_session_is_unfused(probe_model, tmp_path):
    q = quantize(probe_model, per_channel=True, full_integer=True, num_calib=4)
    fused, plain = _optimized_ops(q, True, tmp_path), _optimized_ops(q, False, tmp_path)
    assert "QLinearConv" in fused and "Conv" not in fused
    assert "QLinearConv" not in plain and {"Conv", "DequantizeLinear", "QuantizeLinear"} <= plain
    x = np.random.default_rng(3).integers(-128, 128, (4, 1, 28, 28)).astype(np.int8)
    a, b = OrtEngine(q)(x), OrtEngine(q, fused=False)(x)
    assert a.dtype == b.dtype == np.int8 and np.abs(a.astype(int) - b.astype(int)).max() <= 2


def test_evaluate_reports_onnx_reference(probe_model):
    r = evaluate(probe_model, str(TEST), preprocess="norm=unit", calibration=str(TRAIN), num_calib=16,
                 limit=12, batch=4, onnx_reference=True, sqnr_images=0, progress=False)
    rep = r.to_json()
    assert rep["settings"]["onnx_reference"] is True
    assert len(rep["per_image"]["int8_onnx"]) == 12 and rep["int8_onnx"]["top1"] >= 0.5
    agree = np.mean(np.array(rep["per_image"]["int8_ort"]) == np.array(rep["per_image"]["int8_onnx"]))
    assert rep["agreement_ort_vs_onnx_reference"] == agree
    assert "ONNX reference" in r.markdown() and rep["images_per_s"]["int8_onnx"] > 0
    plain = evaluate(probe_model, str(TEST), preprocess="norm=unit", calibration=str(TRAIN), num_calib=16,
                     limit=4, batch=4, sqnr_images=0, progress=False).to_json()
    assert "int8_onnx" not in plain and "agreement_ort_vs_onnx_reference" not in plain
