"""``torq-gen-config evaluate --equalize`` end to end on 20 real Fashion-MNIST images: the NSS runs
the equalized int8 model, and the per-layer SQNR compares tensors that line up."""
from __future__ import annotations

import json

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from torq.gen_config.cli import main

from .conftest import need_fmnist
from .fmnist_probe import TEST, TRAIN



def _skewed_cnn(path):
    """Conv 3×3/s2 (1→8) → Relu → depthwise 3×3 → Relu → Conv 1×1 (8→8) → Relu → GAP → Gemm(10),
    with the depthwise channels scaled by d_c (1000× apart) and the 1×1 conv's inputs by 1/d_c."""
    rng = np.random.default_rng(21)
    d = np.geomspace(1e-3, 1, 8)[rng.permutation(8)].astype(np.float32)
    w = {"w0": rng.normal(0, 0.5, (8, 1, 3, 3)), "b0": rng.normal(0, 0.1, 8),
         "w1": rng.normal(0, 0.5, (8, 1, 3, 3)) * d.reshape(-1, 1, 1, 1), "b1": rng.normal(0, 0.1, 8) * d,
         "w2": rng.normal(0, 0.5, (8, 8, 1, 1)) / d.reshape(1, -1, 1, 1), "b2": rng.normal(0, 0.1, 8),
         "wf": rng.normal(0, 1, (10, 8)), "bf": np.zeros(10)}
    n = [helper.make_node("Conv", ["input", "w0", "b0"], ["c0"], name="c0", kernel_shape=[3, 3], pads=[1] * 4,
                          strides=[2, 2]),
         helper.make_node("Relu", ["c0"], ["r0"]),
         helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], name="c1", kernel_shape=[3, 3], pads=[1] * 4, group=8),
         helper.make_node("Relu", ["c1"], ["r1"]),
         helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="c2", kernel_shape=[1, 1]),
         helper.make_node("Relu", ["c2"], ["r2"]),
         helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
         helper.make_node("Flatten", ["g"], ["f"]),
         helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1)]
    g = helper.make_graph(n, "skewed", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, 1, 28, 28])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, 10])],
                          [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in w.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path.write_bytes(m.SerializeToString())
    return path


def test_evaluate_equalize(tmp_path, capsys):
    need_fmnist()
    model = _skewed_cnn(tmp_path / "skewed.onnx")
    reports = {}
    for flag in (["--no-equalize", "--no-bias-correction"], ["--equalize", "--bias-correction"]):
        out = tmp_path / ("plain" if "--no-equalize" in flag else "eq")
        code = main(["evaluate", "--model", str(model), "--dataset", str(TEST), "--limit", "20",
                     "--calibration-data", str(TRAIN), "--num-calib", "16", "--preprocess", "norm=unit",
                     "--batch", "10", "--per-tensor", "-o", str(out), *flag])
        assert code == 0, capsys.readouterr().err
        reports["--no-equalize" not in flag] = json.loads((out / "evaluation.json").read_text())
    eq, plain = reports[True], reports[False]
    assert eq["settings"]["recipe"]["equalize"] == "bounded" and plain["settings"]["recipe"]["equalize"] == "off"
    assert eq["per_image"]["fp32"] == plain["per_image"]["fp32"]        # the FP32 row is the model as given
    assert eq["agreement_nss_vs_ort"] >= 0.95
    sqnr = {s["tensor"]: s["sqnr_db"] for s in eq["sqnr_db"]}
    before = {s["tensor"]: s["sqnr_db"] for s in plain["sqnr_db"]}
    # r1 (depthwise → Relu) is rescaled by CLE: compared with the equalized fp32 model it is a clean
    # int8 tensor (against the original model its channels would read as noise); r2, after the
    # 1×1 conv that un-skews it, gains most (measured 4.6 → 34.6 dB)
    assert sqnr["r1"] > 25 and sqnr["r1"] >= before["r1"], (before, sqnr)
    assert sqnr["r2"] > before["r2"] + 15, (before, sqnr)
