"""discover / run --auto-convert-bf16: every layer of a small CNN + transformer block on the NSS in
bf16 (LayerNorm and Softmax included), the whole model within tolerance of ONNX Runtime fp32."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from torq.gen_config.compare import BF16_ABS_TOL_FRAC, compare, float_metrics

from .conftest import cli


def block(path):
    """x[1,4,8,8] -> Conv+Relu -> GlobalAveragePool -> Flatten -> Gemm -> LayerNorm -> MatMul
    -> GELU (Erf form) -> Softmax -> y[1,10]."""
    rng = np.random.default_rng(3)
    init = {"w": rng.normal(0, 0.3, (8, 4, 3, 3)), "b": rng.normal(0, 0.1, 8), "g": rng.normal(0, 0.3, (16, 8)),
            "gb": rng.normal(0, 0.1, 16), "s": rng.uniform(0.5, 1.5, 16), "t": rng.normal(0, 0.1, 16),
            "m": rng.normal(0, 0.3, (16, 10)), "r2": np.array(1.4142135), "one": np.array(1.0), "half": np.array(0.5)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "g", "gb"], ["h"], transB=1),
             helper.make_node("LayerNormalization", ["h", "s", "t"], ["ln"], axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["ln", "m"], ["mm"]), helper.make_node("Div", ["mm", "r2"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["e", "one"], ["e1"]),
             helper.make_node("Mul", ["mm", "e1"], ["g1"]), helper.make_node("Mul", ["g1", "half"], ["g2"]),
             helper.make_node("Softmax", ["g2"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                          [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in init.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


@pytest.fixture(scope="module")
def discovered(tmp_path_factory):
    d = tmp_path_factory.mktemp("bf16")
    model = block(d / "block.onnx")
    assert cli("discover", "--model", model, "--output-dir", d, "--auto-convert-bf16", "--skip-mode",
               "--save-bf16-model", d / "block.bf16.onnx") == 0
    return model, d, json.loads((d / "torq_gen_config_block.json").read_text())


def test_every_layer_runs_on_the_nss(discovered):
    _, _, r = discovered
    assert r["quantization"]["auto_convert_bf16"] is True
    ops = r["ops"]
    assert len(ops) == 13 and all(op["recommended_executor"] == "nss" for op in ops.values()), \
        {k: v["executors"] for k, v in ops.items() if v["recommended_executor"] != "nss"}
    nss = ops["LayerNormalization_ln"]["executors"]["nss"]
    assert nss["status"] == "success" and nss["tolerance_used"]["fp_abs_tol_frac"] == BF16_ABS_TOL_FRAC


def test_save_bf16_model(discovered):
    _, d, _ = discovered
    saved = onnx.load(str(d / "block.bf16.onnx"))
    assert {t.data_type for t in saved.graph.initializer} == {TensorProto.BFLOAT16}
    assert saved.graph.input[0].type.tensor_type.elem_type == TensorProto.BFLOAT16


def test_run_is_within_tolerance_of_fp32(discovered, capsys):
    model, d, _ = discovered
    capsys.readouterr()
    assert cli("run", "--model", model, "--output-dir", d, "--auto-convert-bf16") == 0
    out = capsys.readouterr().out
    assert "top-1 agreement with fp32" in out and "run: PASS" in out, out
    m = json.loads((d / "torq_gen_config_block.json").read_text())["full_model_metrics"]
    assert m["passed"] and m["segments"][0]["executor"] == "nss" and m["top1_agreement"] == 1.0
    # run needs the flags of discover
    assert cli("run", "--model", model, "--output-dir", d) == 2


def test_fp32_layer_error_names_both_ways_onto_the_npu(tmp_path):
    model = block(tmp_path / "block.onnx")
    assert cli("discover", "--model", model, "--output-dir", tmp_path, "--skip-executors", "css,host",
               "--subgraph-from", "5", "--subgraph-to", "5") == 1
    r = json.loads(next(tmp_path.glob("torq_gen_config_block*.json")).read_text())
    summary = r["ops"]["LayerNormalization_ln"]["executors"]["nss"]["failure_report"]["summary"]
    assert "--auto-convert-bf16" in summary and "--quantize" in summary, summary


@pytest.mark.parametrize("argv,needle", [
    (["--auto-convert-bf16", "--quantize"], "mutually exclusive"),
    (["--save-bf16-model", "x.onnx"], "--save-bf16-model needs --auto-convert-bf16")])
def test_bad_flag_combinations_are_one_line_errors(tmp_path, capsys, argv, needle):
    model = block(tmp_path / "block.onnx")
    assert cli("discover", "--model", model, "--output-dir", tmp_path, *argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err


def test_abs_gate_ignores_cancellation_but_catches_a_real_error():
    ref = {"y": np.array([100.0, 1e-3, -50.0], np.float32)}
    near_zero = {"y": np.array([100.0, -2e-3, -50.0], np.float32)}     # rel 1, |Δ| 3e-3 of 100
    assert not compare(near_zero, ref, 0.01)[0]
    assert compare(near_zero, ref, 0.01, abs_tol_frac=BF16_ABS_TOL_FRAC)[0]
    wrong = {"y": np.array([100.0, 1e-3, -47.0], np.float32)}          # one element 3 % off
    assert not compare(wrong, ref, 0.01, abs_tol_frac=BF16_ABS_TOL_FRAC)[0]
    m = float_metrics(wrong, ref, 0.01)
    assert not m["passed"] and m["outputs"]["y"]["wrong"] == 1
