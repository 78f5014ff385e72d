"""The reference tool's CLI contract, ported from its tests (torq-compiler
``tests/test_gen_config_cli.py``, both the pytest-era and the standalone-engine versions) to our
``torq-gen-config`` on an equivalent of its example model.

The example: ``tests/testdata/onnx_models/example_gen_config.onnx`` upstream -- Conv 3x3 (pad 1,
4 filters, bias) -> Relu -> Add of a constant, input 1x3x8x8, opset 13, tensors ``conv_out``,
``relu_out``, ``output`` -- rebuilt here with our own seeded weights (same graph, names, shapes).
Layer ids follow: ``Conv_conv_out``, ``Relu_relu_out``, ``Add_output``; the Add sits at ``9:10``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from .conftest import cli

IDS = ["Conv_conv_out", "Relu_relu_out", "Add_output"]


def example_gen_config(path: Path) -> Path:
    rng = np.random.default_rng(17)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "conv_w"),
             numpy_helper.from_array(rng.normal(0, 0.1, 4).astype(np.float32), "conv_b"),
             numpy_helper.from_array(rng.normal(0, 1.0, (1, 4, 8, 8)).astype(np.float32), "add_const")]
    nodes = [helper.make_node("Conv", ["input", "conv_w", "conv_b"], ["conv_out"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["conv_out"], ["relu_out"]),
             helper.make_node("Add", ["relu_out", "add_const"], ["output"])]
    g = helper.make_graph(nodes, "example_executor_discovery",
                          [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return example_gen_config(tmp_path_factory.mktemp("ref_example") / "example_gen_config.onnx")


def discover(model: Path, out: Path, *flags) -> dict:
    assert cli("discover", "--model", model, "--output-dir", out, *flags) == 0
    return json.loads((out / "torq_gen_config_example_gen_config.json").read_text())


def _files(out: Path) -> tuple[Path, Path]:
    reports = [f for f in out.glob("torq_gen_config_*.json") if not f.name.endswith(("_compiler.json", "_mac_debug.json"))]
    compilers = list(out.glob("torq_gen_config_*_compiler.json"))
    assert len(reports) == 1 and len(compilers) == 1
    return reports[0], compilers[0]


@pytest.fixture(scope="module")
def shared(model, tmp_path_factory) -> Path:
    """The standalone tests' shared discovery: host only, skip mode, bf16, timing over 2 runs."""
    out = tmp_path_factory.mktemp("shared")
    discover(model, out, "--skip-executors=nss,css", "--skip-mode", "--auto-convert-bf16", "--collect-timing",
             "--timing-runs=2")
    return out


@pytest.fixture
def out(shared, tmp_path) -> Path:
    for f in shared.glob("torq_gen_config_*.json"):
        shutil.copy(f, tmp_path / f.name)
    return tmp_path


def _timing(data: dict, present: bool, runs: int | None = None) -> None:
    """Every timed result has runtime_ms and runs (an executor that failed has nothing to time;
    the reference's tests only ran successful host cases)."""
    for lid, op in data["ops"].items():
        for ex, r in op["executors"].items():
            if present and r["status"] == "error":
                continue
            assert ("timing" in r) == present, (lid, ex)
            if present:
                assert {"runtime_ms", "runs"} <= set(r["timing"]) and (runs is None or r["timing"]["runs"] == runs)


def python_m(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-m", "torq.gen_config", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=600)


# ----------------------------------------------------------------------------- discovery JSON

def test_basic_discovery_version_keys_and_host_result(model, tmp_path):
    data = discover(model, tmp_path)
    assert data["version"] == "1.1" and "ops" in data and "discovery_report" in data and "model_name" in data
    host = data["ops"]["Relu_relu_out"]["executors"]["host"]
    assert host["status"] == "success" and "tolerance_used" in host
    _timing(data, present=False)                        # no timing without --collect-timing


def test_collect_timing_and_timing_runs(model, tmp_path):
    _timing(discover(model, tmp_path, "--skip-executors=nss,css", "--collect-timing", "--timing-runs=3"),
            present=True, runs=3)


def test_skip_executors(shared):
    data = json.loads(_files(shared)[0].read_text())
    for op in data["ops"].values():
        assert set(op["executors"]) == {"host"}
    _timing(data, present=True, runs=2)
    assert data["version"] == "1.1"


def test_executor_skip_mode_stops_at_first_success(model, tmp_path):
    data = discover(model, tmp_path, "--executor-skip-mode")
    for op in data["ops"].values():
        statuses = [op["executors"][e]["status"] for e in ("nss", "css", "host") if e in op["executors"]]
        assert statuses.count("success") == 1 and statuses[-1] == "success"


def test_subgraph_extraction(model, tmp_path):
    assert cli("discover", "--model", model, "--output-dir", tmp_path, "--subgraph-from=Relu_relu_out",
               "--subgraph-to=Relu_relu_out", "--skip-executors=nss,css") == 0
    data = json.loads((tmp_path / "torq_gen_config_example_gen_config_subgraph_1_1.json").read_text())
    assert list(data["ops"]) == ["Relu_relu_out"]


def test_recommend_by_timing(model, tmp_path):
    data = discover(model, tmp_path, "--collect-timing", "--timing-runs=2", "--recommend-by-timing",
                    "--skip-executors=nss")
    for op in data["ops"].values():
        rec = op["recommended_executor"]
        assert rec and "timing" in op["executors"][rec]
        ok = {e: r["timing"]["runtime_ms"] for e, r in op["executors"].items() if r["status"] == "success"}
        assert ok[rec] == min(ok.values())


def test_compiler_json_matches_the_report(shared):
    report, compiler = _files(shared)
    ops, assign = json.loads(report.read_text())["ops"], json.loads(compiler.read_text())["op_assignments"]
    expected = {op["mlir_location"]: op["recommended_executor"] for op in ops.values()
                if ":" in op.get("mlir_location", "") and op.get("recommended_executor")}
    assert {k: v["executor"] for k, v in assign.items()} == expected and len(expected) == 3
    assert ops["Add_output"]["mlir_location"] == "9:10"


@pytest.mark.parametrize("flag", ["--auto-convert-bf16", "--save-bf16-model"])
def test_bf16_flags(model, tmp_path, flag):
    """--auto-convert-bf16 (with timing) and --save-bf16-model: a success, timed; the file written."""
    saved = tmp_path / "m.bf16.onnx"
    extra = ["--auto-convert-bf16"] + ([f"--save-bf16-model={saved}"] if "save" in flag else [])
    data = discover(model, tmp_path, *extra, "--collect-timing", "--timing-runs=2", "--skip-mode")
    assert data["ops"] and any(r["status"] == "success" for op in data["ops"].values() for r in op["executors"].values())
    _timing(data, present=True, runs=2)
    if "save" in flag:
        assert saved.stat().st_size > 0


# ----------------------------------------------------------------------------- view

def test_viewer_summary_via_python_m(out):
    r = python_m("view", _files(out)[0])
    assert r.returncode == 0, r.stderr
    for needle in ("MODEL:", "STATUS COUNTS:", "success:", "TIMING SUMMARY", "HOST:", "ms"):
        assert needle in r.stdout, needle


def test_viewer_layer_details(out, capsys):
    assert cli("view", _files(out)[0], "Relu_relu_out") == 0
    o = capsys.readouterr().out
    for needle in ("LAYER: Relu_relu_out", "Executor Results:", "[HOST]:", "success", "Runtime:", "Tolerance:"):
        assert needle in o, needle


# ----------------------------------------------------------------------------- run

def test_run_with_compiler_json_only(model, out, capsys):
    report, compiler = _files(out)
    report.unlink()
    assert cli("run", f"--model={model}", f"--output-dir={out}", "--auto-convert-bf16") == 0, capsys.readouterr().err
    assert len(json.loads(compiler.read_text())["op_assignments"]) == 3     # not clobbered


def test_edit_then_report_text_then_compiler_json_then_run(model, out, capsys):
    report, compiler = _files(out)
    assert cli("edit", report, "--layer", "Add_output", "--executor", "host") == 0
    data = json.loads(report.read_text())
    assert data["ops"]["Add_output"]["recommended_executor"] == "host"
    add = [ln for ln in data["final_report_text"].split("\n") if "Add_output" in ln]
    assert len(add) == 1 and add[0].endswith(" host")
    loc = data["ops"]["Add_output"]["mlir_location"]
    assert json.loads(compiler.read_text())["op_assignments"][loc]["executor"] == "host"
    capsys.readouterr()
    assert cli("run", f"--model={model}", f"--output-dir={out}", "--auto-convert-bf16") == 0
    o = capsys.readouterr()
    assert any("Add_output" in ln and "host" in ln for ln in (o.out + o.err).split("\n"))


# ----------------------------------------------------------------------------- edit

def test_edit_with_model_flag(model, out):
    assert cli("edit", f"--model={model}", f"--output-dir={out}", "--layer", "Add_output", "--executor", "host") == 0
    assert json.loads(_files(out)[0].read_text())["ops"]["Add_output"]["recommended_executor"] == "host"


def test_edit_list_layers(model, out, capsys):
    assert cli("edit", f"--model={model}", f"--output-dir={out}", "--list") == 0
    o = capsys.readouterr().out
    for needle in ("Per-Layer Status:", "HOST", "Recommended", "Add_output", "Relu_relu_out", "Total:"):
        assert needle in o, needle
    assert cli("edit", f"--model={model}", f"--output-dir={out}", "--list", "add") == 0
    o = capsys.readouterr().out
    assert "Add_output" in o and "filtered from" in o
    assert cli("edit", f"--model={model}", f"--output-dir={out}", "--list", "xyz_nonexistent") == 0
    assert "No layers match" in capsys.readouterr().out


def test_edit_compiler_json_guard(out, capsys):
    _, compiler = _files(out)
    assert cli("edit", compiler, "--layer", "Add_output", "--executor", "host") != 0
    err = capsys.readouterr().err.lower()
    assert "compiler json" in err and "report json" in err


def test_edit_no_args(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli("edit", "--layer", "Add_output", "--executor", "host") != 0


def _edit(model, out, capsys, *args) -> str:
    capsys.readouterr()
    assert cli("edit", f"--model={model}", f"--output-dir={out}", *args) == 0
    return capsys.readouterr().out


def _recommended(out) -> dict:
    return {k: v["recommended_executor"] for k, v in json.loads(_files(out)[0].read_text())["ops"].items()}


def test_edit_layer_substring_single(model, out, capsys):
    _edit(model, out, capsys, "--layer", "add", "--executor", "host")
    assert _recommended(out)["Add_output"] == "host"


@pytest.mark.parametrize("pattern,header", [("_out", "Batch edit"), ("*_*", "3 layer(s) match"), ("ALL", "3 layer(s)")])
def test_edit_batch(model, out, capsys, pattern, header):
    assert cli("edit", f"--model={model}", f"--output-dir={out}", "--layer", "Add_output", "--executor", "nss") == 0
    o = _edit(model, out, capsys, "--layer", pattern, "--executor", "host")
    assert header in o and "3 layer(s)" in o and "Updated recommended_executor for 3 layer(s)" in o
    assert set(_recommended(out).values()) == {"host"}


def test_edit_layer_no_match(model, out, capsys):
    assert cli("edit", f"--model={model}", f"--output-dir={out}", "--layer", "xyz_nonexistent_*",
               "--executor", "host") != 0
    assert "No layers match" in capsys.readouterr().err


def test_edit_batch_tolerance(model, out, capsys):
    o = _edit(model, out, capsys, "--layer", "ALL", "--tolerance-avg", "0.5", "--tolerance-max", "0.8")
    assert "Updated tolerance for 3 layer(s)" in o
    for lid, op in json.loads(_files(out)[0].read_text())["ops"].items():
        tol = op["tolerance_used"]
        assert (tol["fp_avg_tol"], tol["fp_max_tol"]) == (0.5, 0.8), lid


# ----------------------------------------------------------------------------- quantize (library)

def test_quantize_formats_and_full_integer(model):
    from torq.quantize import quantize
    m = onnx.load(str(model))
    q = quantize(m)
    assert q.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in q.graph.node}
    fi = quantize(m, full_integer=True)
    assert fi.graph.input[0].type.tensor_type.elem_type == TensorProto.INT8
    assert fi.graph.output[0].type.tensor_type.elem_type == TensorProto.INT8
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in fi.graph.node}   # inner pairs stay
    for fmt in ("qoperator", "hybrid"):
        qo = quantize(m, quant_format=fmt, full_integer=fmt == "hybrid")
        assert "QLinearConv" in {n.op_type for n in qo.graph.node}, fmt


def test_hybrid_falls_back_to_qdq_for_reducemean():
    from torq.quantize import quantize
    axes = numpy_helper.from_array(np.array([2, 3], dtype=np.int64), name="axes")
    rm = helper.make_node("ReduceMean", ["input", "axes"], ["output"], keepdims=1)
    g = helper.make_graph([rm], "rm", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 4, 4])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, 1, 1])], [axes])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    # hybrid does not force QOperator on it: per layer (discover) the lone op is wrapped in Q/DQ
    ops = [n.op_type for n in quantize(m, quant_format="hybrid", full_integer=True, wrap_lone_ops=True).graph.node]
    assert "ReduceMean" in ops and "QLinearReduceMean" not in ops
    # stricter than the reference (which returns the fp32 model): quantizing nothing is refused, with the reason
    from torq.errors import TorqError
    with pytest.raises(TorqError, match="quantized nothing"):
        quantize(m, quant_format="hybrid", full_integer=True)


def test_parse_quant_dtype():
    from torq.errors import TorqError
    from torq.quantize.static import parse_quant_dtype
    assert parse_quant_dtype("a8w8") == parse_quant_dtype("A8W8")
    assert parse_quant_dtype("a16w8") == parse_quant_dtype("A16W8")   # ours beyond the reference's A8W8
    with pytest.raises((TorqError, ValueError)):
        parse_quant_dtype("a4w4")


# ----------------------------------------------------------------------------- drop-in extras

def test_model_folder_and_log_file(model, tmp_path, capsys):
    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copy(model, folder / model.name)
    log = tmp_path / "discover.log"
    assert cli("discover", "--model", folder, "--output-dir", tmp_path, "--skip-executors=nss,css",
               "--log-file", log) == 0
    assert (tmp_path / "torq_gen_config_example_gen_config.json").exists()
    text = log.read_text()
    assert "discover: 3 layers" in text and "\x1b[" not in text
    shutil.copy(model, folder / "other.onnx")
    capsys.readouterr()
    assert cli("discover", "--model", folder) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is a folder with 2 .onnx files" in err
    assert cli("run", "--model", tmp_path / "empty_dir_missing", "--output-dir", tmp_path) == 2
    assert cli("run", "--model", tmp_path, "--output-dir", tmp_path) == 2          # no .onnx in it
    assert "pass the model file" in capsys.readouterr().err


def test_log_file_gets_the_one_line_error(model, tmp_path, capsys):
    log = tmp_path / "run.log"
    assert cli("run", "--model", model, "--output-dir", tmp_path / "nothing", "--log-file", log) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err in log.read_text()


def test_reference_hardware_flags_are_accepted_with_a_note(model, tmp_path, capsys):
    assert cli("discover", "--model", model, "--output-dir", tmp_path, "--skip-executors=nss,css",
               "--torq-hw=SL2610", "--torq-hw-type=sim", "--compiler-option=--foo", "-v") == 0
    err = capsys.readouterr().err
    assert "note: --torq-hw, --torq-hw-type, --compiler-option, --verbose have no effect here" in err


def test_compiler_json_only_view_and_edit_by_layer_id(model, out, capsys):
    report, compiler = _files(out)
    report.unlink()
    assert cli("view", "--model", model, "--output-dir", out) == 0
    assert "Total assignments: 3" in capsys.readouterr().out
    assert cli("edit", "--model", model, "--output-dir", out, "--layer", "Add_output", "--executor", "css") == 0
    assert json.loads(compiler.read_text())["op_assignments"]["9:10"] == {"executor": "css"}
    assert cli("edit", "--model", model, "--output-dir", out, "--layer", "7:10", "--executor", "null") == 0
    assert "7:10" not in json.loads(compiler.read_text())["op_assignments"]
