"""The accuracy protocol: seeded tune/report halves, intervals, and a loud FP32-at-chance check."""
from __future__ import annotations

import json

import numpy as np
import pytest

from torq.evaluate.protocol import at_chance, halves, paired_bootstrap, verdict, wilson

from .conftest import need_fmnist
from .fmnist_probe import TEST, TRAIN


def test_halves_are_disjoint_seeded_and_cover_everything():
    h = halves(501)
    assert len(h["tune"]) == 251 and len(h["report"]) == 250
    assert not set(h["tune"]) & set(h["report"])
    assert sorted([*h["tune"], *h["report"]]) == list(range(501))
    assert np.array_equal(halves(501)["report"], h["report"])           # same seed, same halves
    assert not np.array_equal(halves(501, seed=1)["report"], h["report"])


def test_wilson_interval():
    lo, hi = wilson(440, 500)                        # 88 %: about ±2.9 points
    assert lo == pytest.approx(0.8483, abs=1e-3) and hi == pytest.approx(0.9055, abs=1e-3)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == pytest.approx(1.0)


def test_paired_bootstrap_says_no_gain_for_a_few_images():
    rng = np.random.default_rng(3)
    a = (rng.random(500) < 0.88).astype(int)
    b = a.copy()
    flip = rng.choice(500, 3, replace=False)       # three images more right: 0.6 points, noise
    b[flip] = 1
    r = paired_bootstrap(a, b)
    assert r["ci95"][0] <= 0 <= r["ci95"][1] and r["verdict"].startswith("no gain")
    b[rng.choice(np.flatnonzero(b == 0), 40, replace=False)] = 1          # 40 images: a real gain
    assert paired_bootstrap(a, b)["verdict"] == "gain"
    assert paired_bootstrap(b, a)["verdict"] == "loss"
    assert verdict(-0.01, 0.02).startswith("no gain")


def test_at_chance():
    assert at_chance(55, 500, 10) and not at_chance(120, 500, 10)
    assert at_chance(1, 500, 1000) and not at_chance(300, 500, 1000)


def _random_classifier(path):
    """Random conv features + random head: FP32 at chance on any real data set."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (4, 1, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 1, (10, 4)).astype(np.float32), "fc")]
    n = helper.make_node
    g = helper.make_graph([n("Conv", ["input", "w"], ["c"]), n("Relu", ["c"], ["r"]),
                           n("GlobalAveragePool", ["r"], ["p"]), n("Flatten", ["p"], ["f"]),
                           n("Gemm", ["f", "fc"], ["logits"], transB=1)], "g",
                          [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 28, 28])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


CALIB = {"data": ["--calibration-data", str(TRAIN)], "split": ["--calibration-split", "20"]}


@pytest.mark.parametrize("prep,calib,code,needle", [
    ("resize=28", "data", 2, "images need --preprocess with norm="),      # refused before any work
    ("resize=28", "split", 1, "at chance level"),                          # refused after FP32: raw pixels?
    ("norm=unit", "data", 0, "at chance level")])                          # declared: a loud warning
def test_fp32_at_chance_is_refused_without_a_norm_and_loud_with_one(tmp_path, capsys, prep, calib, code, needle):
    need_fmnist()
    from torq.gen_config.cli import main
    model = _random_classifier(tmp_path / "rand.onnx")
    got = main(["evaluate", "--model", str(model), "--dataset", str(TEST), "--limit", "200", *CALIB[calib],
                "--num-calib", "4", "--preprocess", prep, "--sqnr-images", "0", "--per-tensor",
                "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert got == code and any(needle in e and "norm=" in e for e in err), err
    if code != 2:
        assert "WARNING" in (tmp_path / "out" / "evaluation.md").read_text()


def test_report_half_and_intervals_in_the_json(tmp_path, probe_model):
    need_fmnist()
    from torq.gen_config.cli import main
    common = ["--model", str(probe_model), "--dataset", str(TEST), "--limit", "40", "--calibration-data", str(TRAIN),
              "--num-calib", "8", "--preprocess", "norm=unit", "--sqnr-images", "0"]
    assert main(["evaluate", *common, "--half", "report", "-o", str(tmp_path / "r")]) == 0
    rep = json.loads((tmp_path / "r" / "evaluation.json").read_text())
    assert rep["settings"]["half"] == "report" and rep["images"] == 40
    lo, hi = rep["top1_ci95"]["int8_nss"]
    assert lo <= rep["int8_nss"]["top1"] <= hi
    d = rep["top1_diff_vs_fp32"]["int8_ort"]
    assert d["ci95"][0] <= d["diff"] <= d["ci95"][1]
    # the report half holds none of the tuning half's images
    assert main(["evaluate", *common, "--half", "tune", "-o", str(tmp_path / "t")]) == 0
    tune = json.loads((tmp_path / "t" / "evaluation.json").read_text())
    assert tune["per_image"]["label"] != rep["per_image"]["label"]
