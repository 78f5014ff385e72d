"""discover + run on the built-in example CNN: JSON schemas, mapping, run exactness, flags."""
from __future__ import annotations

import json

import pytest

from torq.examples import build_example_cnn

from .conftest import cli

QFLAGS = ["--quantize", "--full-integer"]
EXEC_FIELDS = {"status", "tolerance_used", "max_diff", "failure_report", "timing"}


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    d = tmp_path_factory.mktemp("example")
    model = build_example_cnn(d / "example.onnx") and d / "example.onnx"
    assert cli("discover", "--model", model, "--output-dir", d, *QFLAGS, "--skip-mode") == 0
    return model, d


def _report(d, name="example"):
    return json.loads((d / f"torq_gen_config_{name}.json").read_text())


def test_report_schema(example):
    _, d = example
    r = _report(d)
    assert r["version"] == "1.1" and r["model_name"] == "example"
    assert r["default_tolerance"] == {"fp_avg_tol": 0.01, "fp_max_tol": 0.01}
    assert set(r) >= {"ops", "discovery_report", "has_critical_failures", "final_report_text", "quantization"}
    assert list(r["ops"])[:2] == ["Conv_conv1", "Relu_relu1"]
    for lid, op in r["ops"].items():
        assert set(op) >= {"executors", "recommended_executor", "_node_index", "mlir_location"}
        assert set(op["executors"]) == {"nss"}                    # --skip-mode: NSS succeeded first
        assert set(op["executors"]["nss"]) <= EXEC_FIELDS
        assert op["recommended_executor"] == "nss", lid
    # ORT fused both Relus into their Convs: report entry kept, location = op type, not in compiler JSON
    assert r["ops"]["Relu_relu1"]["mlir_location"] == "Relu"
    assert r["ops"]["Conv_conv2"]["_node_index"] == 1
    s = r["discovery_report"]["summary"]
    assert s["total_layers"] == 11 and s["executor_counts"]["nss"] == 11
    assert r["quantization"]["full_integer"] is True and len(r["quantization"]["model_sha256"]) == 64
    assert r["final_report_text"].startswith("FINAL EXECUTOR DISCOVERY REPORT")


def test_compiler_schema(example):
    _, d = example
    c = json.loads((d / "torq_gen_config_example_compiler.json").read_text())
    assert c["model_name"] == "example"
    assert len(c["op_assignments"]) == 9                          # 11 layers - 2 fused Relus
    assert all(v == {"executor": "nss"} for v in c["op_assignments"].values())
    assert all(k.count(":") == 1 and k.replace(":", "").isdigit() for k in c["op_assignments"])


def test_run_native_and_bit_exact_ort(example, capsys):
    model, d = example
    assert cli("run", "--model", model, "--output-dir", d, *QFLAGS, "--rounding", "ort") == 0
    m = _report(d)["full_model_metrics"]
    assert m["max_abs_lsb"] == 0 and m["lsb_histogram"] == {"0": 10} and m["top1_agreement"] == 1.0
    assert cli("run", "--model", model, "--output-dir", d, *QFLAGS) == 0
    m = _report(d)["full_model_metrics"]
    assert m["passed"] and m["max_abs_lsb"] <= 5 and m["rounding"] == "native"
    assert "PASS" in capsys.readouterr().out


def test_run_refuses_other_flags(example, capsys):
    model, d = example
    assert cli("run", "--model", model, "--output-dir", d, "--quantize", "--no-full-integer") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "different quantization" in err and "--full-integer on -> off" in err
    assert len(err) - len("torq-gen-config: error: ") <= 240


def test_run_with_a_reference_shaped_json(example, tmp_path, capsys):
    """A JSON as the reference tool writes it (no fingerprint, its own locations) is read back."""
    model, d = example
    r = _report(d)
    ref = {"version": "1.1", "model_name": "example", "default_tolerance": r["default_tolerance"],
           "ops": {lid: {"executors": {"nss": {"status": "success", "tolerance_used": r["default_tolerance"]}},
                         "recommended_executor": "nss", "_node_index": i, "mlir_location": "999:1"}
                   for i, lid in enumerate(r["ops"])},
           "discovery_report": {}, "has_critical_failures": False, "final_report_text": ""}
    (tmp_path / "torq_gen_config_example.json").write_text(json.dumps(ref))
    assert cli("run", "--model", model, "--output-dir", tmp_path, *QFLAGS, "--rounding", "ort") == 0
    assert "no quantization fingerprint" in capsys.readouterr().out
    back = json.loads((tmp_path / "torq_gen_config_example.json").read_text())
    assert back["ops"]["Conv_conv1"]["mlir_location"] != "999:1"       # re-derived from this model
    comp = json.loads((tmp_path / "torq_gen_config_example_compiler.json").read_text())
    assert len(comp["op_assignments"]) == 9


def test_run_after_edit_conv2_conv3_on_host(example, tmp_path, capsys):
    """Two consecutive layers off the NSS, a later NSS op reading the tensor between them: the
    map that crashed with KeyError '..._QuantizeLinear_Output'."""
    import shutil
    model, d = example
    shutil.copy(d / "torq_gen_config_example.json", tmp_path)
    for layer in ("Conv_conv2", "Conv_conv3"):
        assert cli("edit", "--model", model, "--output-dir", tmp_path, "--layer", layer, "--executor", "host") == 0
    assert cli("run", "--model", model, "--output-dir", tmp_path, *QFLAGS, "--rounding", "ort") == 0
    m = _report(tmp_path)["full_model_metrics"]
    assert [s["executor"] for s in m["segments"]] == ["nss", "host", "nss"] and m["max_abs_lsb"] == 0
    assert "internal error" not in capsys.readouterr().err


def test_second_discover_comes_from_cache(example, capsys):
    model, d = example
    assert cli("discover", "--model", model, "--output-dir", d, *QFLAGS, "--skip-mode") == 0
    s = _report(d)["discovery_report"]["summary"]
    assert s["computed"] == 0 and s["from_cache"] == 11


def test_subgraph_skip_ops_and_timing(example):
    model, d = example
    assert cli("discover", "--model", model, "--output-dir", d, *QFLAGS, "--skip-mode", "--subgraph-from", "2",
               "--subgraph-to", "Add_add1", "--skip-ops", "Relu", "--collect-timing", "--timing-runs", "2") == 0
    r = _report(d, "example_subgraph_2_5")
    assert list(r["ops"]) == ["Conv_conv2", "Relu_relu2", "Conv_conv3", "Add_add1"]
    assert r["ops"]["Relu_relu2"]["recommended_executor"] is None and r["ops"]["Relu_relu2"]["executors"] == {}
    t = r["ops"]["Conv_conv2"]["executors"]["nss"]["timing"]
    assert t["runs"] == 2 and t["runtime_ms"] > 0
    assert "timing_summary" in r["discovery_report"]["summary"]
    comp = json.loads((d / "torq_gen_config_example_subgraph_2_5_compiler.json").read_text())
    assert len(comp["op_assignments"]) == 3                       # conv2 (+fused relu2), conv3, add
    assert cli("run", "--model", model, "--output-dir", d, *QFLAGS, "--subgraph-from", "2",
               "--subgraph-to", "Add_add1", "--rounding", "ort") == 0
    assert _report(d, "example_subgraph_2_5")["full_model_metrics"]["max_abs_lsb"] == 0


def test_debug_ir(example, tmp_path):
    model, d = example
    ir = tmp_path / "ir"
    assert cli("discover", "--model", model, "--output-dir", tmp_path, *QFLAGS, "--skip-mode",
               "--subgraph-from", "0", "--subgraph-to", "0", "--debug-ir", ir, "--recompute-cache") == 0
    assert (ir / "Conv_conv1.linalg.mlir").exists() and (ir / "Conv_conv1.torq_hl.mlir").exists()


def test_run_caches_nss_segments_as_programs(example):
    import os
    from pathlib import Path
    from torq.program import Program
    model, d = example
    import shutil
    programs = Path(os.environ["TORQ_GEN_CONFIG_CACHE_DIR"]) / "programs"
    shutil.rmtree(programs, ignore_errors=True)
    assert cli("run", "--model", model, "--output-dir", d, *QFLAGS, "--rounding", "ort") == 0
    saved = sorted(programs.glob("*.npz"))
    assert saved and all(Program.load(p).steps for p in saved)
    for p in saved:                                   # a damaged cache entry is recompiled, not fatal
        p.write_bytes(b"not a program")
    assert cli("run", "--model", model, "--output-dir", d, *QFLAGS, "--rounding", "ort") == 0
    assert _report(d)["full_model_metrics"]["max_abs_lsb"] == 0
    assert all(Program.load(p).steps for p in saved)


def test_divergence_reference_is_orts_own_run():
    """run's layer-by-layer locator compares with ORT run on the model with its intermediates exposed:
    only the int8 ones (the ones compared), so ORT still fuses DQ -> Conv -> Q and computes what its own
    run of the model computes (a float intermediate exposed made PP-OCR cls's ORT outputs [18, -19]
    instead of [20, -22], and the locator blamed a Conv that computes right)."""
    import numpy as np
    from qmodels import conv_model, quantize
    from torq import reference
    from torq.gen_config.run import ort_intermediates
    from torq.graph.inputs import random_inputs
    q = quantize(conv_model(np.random.default_rng(5), 3, 6, 3, 1, 1, [1, 1, 1, 1], 1, True, True, (9, 9)),
                 {"x": [1, 3, 9, 9]}, "qdq", per_channel=True, full_integer=False)
    inputs = random_inputs(q, 0)
    got, ref = ort_intermediates(q, inputs), reference.run(q, inputs)
    assert all(np.array_equal(got[k], ref[k]) for k in ref)
    exposed = set(got) - set(ref) - set(inputs)
    assert exposed and all(np.issubdtype(got[k].dtype, np.integer) for k in exposed), exposed


def test_mixed_recipe_with_calibration_data(tmp_path):
    """With calibration data the mixed recipe gives int16 layers chosen by measurement, the
    classifier's among them (int16 logits: it costs no int16 MACs); discover puts every layer on
    the NSS and run, comparing the int16 graph output with ORT's, passes in both roundings."""
    import numpy as np
    model = build_example_cnn(tmp_path / "example.onnx") and tmp_path / "example.onnx"
    np.savez(tmp_path / "c.npz", input=np.random.default_rng(0).uniform(-1, 1, (9, 3, 32, 32)).astype(np.float32))
    flags = ["--quantize", "--calibration-data", tmp_path / "c.npz", "--recipe", "mixed"]
    assert cli("discover", "--model", model, "--output-dir", tmp_path, *flags, "--skip-mode") == 0
    r = _report(tmp_path)
    wide = [n for n, p in r["quantization"]["precision"] if p == "int16"]
    assert "logits" in wide and len(wide) > 1
    assert all(op["recommended_executor"] == "nss" for op in r["ops"].values())
    for rounding in ("native", "ort"):
        assert cli("run", "--model", model, "--output-dir", tmp_path, *flags, "--rounding", rounding) == 0
        assert _report(tmp_path)["full_model_metrics"]["passed"]
