"""Edits are data, never lost (audit 3: B1, B6, B17, B22, B25, B27).

Every scenario runs the real CLIs on the example CNN (one shared cache, so only the first
discover computes): an edit survives a rerun, an edit made *during* discover or run is merged,
a report of other flags or a damaged one is refused (kept as .bak with --fresh), and discover
and run on one report exclude each other in one line.
"""
from __future__ import annotations

import json
import os

import pytest

from torq.examples import build_example_cnn
from torq.gen_config import discover as D
from torq.gen_config import run as R
from torq.gen_config.cli import main
from torq.gen_config.options import fingerprint_mismatch

Q = ["--quantize", "--full-integer"]



def cli_quant():
    """The QuantSettings of ``--quantize --full-integer`` on the command line."""
    from torq.gen_config.cli import build_parser
    from torq.gen_config.options import quant_settings
    return quant_settings(build_parser().parse_args(["discover", "--model", "m.onnx", "--quantize", "--full-integer"]))

def cli(*argv) -> int:
    return main([str(a) for a in argv])


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    old = os.environ.get("TORQ_GEN_CONFIG_CACHE_DIR")
    os.environ["TORQ_GEN_CONFIG_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if old is None:
        os.environ.pop("TORQ_GEN_CONFIG_CACHE_DIR")
    else:
        os.environ["TORQ_GEN_CONFIG_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def model(tmp_path_factory, cache):
    path = tmp_path_factory.mktemp("model") / "example.onnx"
    build_example_cnn(path)
    assert cli("discover", "--model", path, "--output-dir", path.parent / "warm", *Q) == 0
    return path


def report(d):
    return json.loads((d / "torq_gen_config_example.json").read_text())


def compiler(d):
    return json.loads((d / "torq_gen_config_example_compiler.json").read_text())


def last_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Traceback" not in "\n".join(err)
    return err[-1]


def test_an_edit_survives_rediscover(model, tmp_path):                       # B1, rerun
    assert cli("discover", "--model", model, "--output-dir", tmp_path, *Q) == 0
    assert cli("edit", "--model", model, "--output-dir", tmp_path, "--layer", "Gemm", "--executor", "host",
               "--tolerance-max", "0.3") == 0
    assert cli("discover", "--model", model, "--output-dir", tmp_path, *Q) == 0
    r = report(tmp_path)
    gemm = next(op for lid, op in r["ops"].items() if lid.startswith("Gemm"))
    assert gemm["recommended_executor"] == "host" and gemm["edit"]["executor"] == "host"
    assert gemm["edit"]["tolerance"]["fp_max_tol"] == 0.3
    assert all(e["tolerance_used"]["fp_max_tol"] == 0.3 for e in gemm["executors"].values())
    assert {"executor": "host"} in compiler(tmp_path)["op_assignments"].values()
    assert cli("edit", "--model", model, "--output-dir", tmp_path, "--layer", "Gemm", "--executor", "auto") == 0
    gemm = next(op for lid, op in report(tmp_path)["ops"].items() if lid.startswith("Gemm"))
    assert gemm["recommended_executor"] == "nss" and "executor" not in gemm["edit"]


def test_an_edit_during_discover_is_merged(model, tmp_path, capsys):        # B1, concurrent; B27
    seen = []

    def progress(i, n, label):
        if i == 3 and not seen:
            seen.append(cli("edit", "--model", model, "--output-dir", tmp_path, "--layer", "ALL",
                            "--executor", "css"))
            seen.append(cli("discover", "--model", model, "--output-dir", tmp_path, *Q))
            seen.append(last_error(capsys))
    opts = D.DiscoverOptions(model=model, output_dir=tmp_path, quant=cli_quant())
    D.SAVE_EVERY_S, old = 0.0, D.SAVE_EVERY_S
    try:
        D.run_discovery(opts, progress)
    finally:
        D.SAVE_EVERY_S = old
    assert seen[:2] == [0, 2] and "is in use by a running discover" in seen[2]
    r = report(tmp_path)
    edited = [op for op in r["ops"].values() if (op.get("edit") or {}).get("executor") == "css"]
    assert 3 <= len(edited) < len(r["ops"])                  # the layers that existed at edit time
    assert all(op["recommended_executor"] == "css" for op in edited)
    assert not list(tmp_path.glob(".torq_gen_config_*"))    # no lock or temp file left behind


def test_an_edit_during_run_is_merged_and_marks_it_stale(model, tmp_path, capsys):   # B1, run; B17
    assert cli("discover", "--model", model, "--output-dir", tmp_path, *Q) == 0
    calls = []

    def log(i, n, label):
        if not calls:
            calls.append(cli("edit", "--model", model, "--output-dir", tmp_path, "--layer", "Gemm",
                             "--executor", "host"))
            calls.append(cli("discover", "--model", model, "--output-dir", tmp_path, *Q))
            calls.append(last_error(capsys))
    opts = R.RunOptions(model, tmp_path, cli_quant())
    R.run_full(opts, log)
    assert calls[:2] == [0, 2] and "is in use by a running run" in calls[2]
    r = report(tmp_path)
    gemm = next(op for lid, op in r["ops"].items() if lid.startswith("Gemm"))
    assert gemm["recommended_executor"] == "host"
    assert r["full_model_metrics"]["stale"] is True
    assert {"executor": "host"} in compiler(tmp_path)["op_assignments"].values()


def test_other_flags_or_damage_refused_then_fresh_keeps_a_backup(model, tmp_path, capsys):   # B6
    assert cli("discover", "--model", model, "--output-dir", tmp_path, *Q) == 0
    assert cli("edit", "--model", model, "--output-dir", tmp_path, "--layer", "Gemm", "--executor", "host") == 0
    before = (tmp_path / "torq_gen_config_example.json").read_text()
    assert cli("discover", "--model", model, "--output-dir", tmp_path, "--quantize", "--no-per-channel") == 2
    line = last_error(capsys)
    assert "discovered with different quantization flags" in line and "--per-channel on -> off" in line \
        and "--fresh" in line
    assert (tmp_path / "torq_gen_config_example.json").read_text() == before
    for damaged in ("", "[]", before[: len(before) // 2]):
        (tmp_path / "torq_gen_config_example.json").write_text(damaged)
        assert cli("discover", "--model", model, "--output-dir", tmp_path, *Q) == 2
        assert "is damaged" in last_error(capsys)
        assert (tmp_path / "torq_gen_config_example.json").read_text() == damaged
    (tmp_path / "torq_gen_config_example.json").write_text(before)
    assert cli("discover", "--model", model, "--output-dir", tmp_path, "--quantize", "--per-channel", "--fresh") == 0
    assert (tmp_path / "torq_gen_config_example.json.bak").read_text() == before
    assert (tmp_path / "torq_gen_config_example_compiler.json.bak").exists()
    assert report(tmp_path)["quantization"]["per_channel"] is True


def test_run_names_an_incomplete_report_and_ignores_ghost_ids(model, tmp_path, capsys):    # B17, B22
    assert cli("discover", "--model", model, "--output-dir", tmp_path, *Q) == 0
    r = report(tmp_path)
    first = next(iter(r["ops"]))
    loc = r["ops"][first]["mlir_location"]
    for lid in list(r["ops"])[5:]:
        del r["ops"][lid]
    r["ops"]["Conv_ghost"] = {"executors": {}, "recommended_executor": "css", "mlir_location": loc}
    (tmp_path / "torq_gen_config_example.json").write_text(json.dumps(r))
    assert cli("run", "--model", model, "--output-dir", tmp_path, *Q) == 0
    out = capsys.readouterr().out
    assert "the report has 5 of 11 layers" in out and "'Conv_ghost'" in out
    m = report(tmp_path)["full_model_metrics"]
    assert "5 of 11" in m["warning"] and m["segments"] and {s["executor"] for s in m["segments"]} == {"nss"}
    assert compiler(tmp_path)["op_assignments"][loc] == {"executor": r["ops"][first]["recommended_executor"]}


@pytest.mark.parametrize("field,value", [
    ("tolerance_used", "loose"), ("tolerance_used", {}), ("max_diff", "big"), ("timing", "fast"),
    ("timing", {}), ("failure_report", "x"), ("failure_report", [1])])
def test_wrong_field_types_are_one_line_errors(model, tmp_path, capsys, field, value):   # B25
    assert cli("discover", "--model", model, "--output-dir", tmp_path, *Q) == 0
    r = report(tmp_path)
    next(iter(r["ops"].values()))["executors"]["nss"][field] = value
    (tmp_path / "torq_gen_config_example.json").write_text(json.dumps(r))
    for argv in (["view"], ["view", "--html", tmp_path / "v.html"], ["edit", "--layer", "ALL", "--executor", "css"],
                 ["discover", *Q], ["run", *Q]):
        assert cli(argv[0], "--model", model, "--output-dir", tmp_path, *argv[1:]) == 2
        line = last_error(capsys)
        assert line.startswith("torq-gen-config: error:") and field in line, line


@pytest.mark.parametrize("doc", [
    '{"ops": {}, "discovery_report": []}', '{"ops": {}, "discovery_report": {"summary": "s"}}',
    '{"ops": {}, "final_report_text": 5}', '{"ops": {}, "full_model_metrics": []}',
    '{"ops": {}, "full_model_metrics": {"lsb_histogram": [1, 2]}}', '{"ops": {}, "quantization": "abc"}',
    '{"ops": {}, "x": ' + "[" * 100000 + "]" * 100000 + "}", '{"ops": {}, "x": ' + "7" * 5000 + "}"])
def test_damaged_top_level_fields_are_one_line_errors(model, tmp_path, capsys, doc):   # B25
    (tmp_path / "torq_gen_config_example.json").write_text(doc)
    for argv in (["view"], ["view", "--html", tmp_path / "v.html"], ["run", *Q]):
        assert cli(argv[0], "--model", model, "--output-dir", tmp_path, *argv[1:]) == 2
        assert last_error(capsys).startswith("torq-gen-config: error:")


@pytest.mark.parametrize("got, shown", [
    ({"precision": 0}, "--precision 0 -> []"), ({"precision": [["c", 1]]}, '--precision [["c", 1]] -> []'),
    ({"precision": "a\nb"}, '--precision "a\\nb" -> []'), ({"per_channel": 2}, "--per-channel 2 -> on"),
    ({"x\n[b]": 2}, '--"x\\n[b]" 2 -> none')])
def test_a_damaged_fingerprint_value_is_shown_on_one_line(got, shown):   # state fuzz: unhashable list
    msg = fingerprint_mismatch({"precision": [], "per_channel": True, **got},
                               {"precision": [], "per_channel": True}, "r.json")
    assert shown in msg and "\n" not in msg, msg


def test_run_names_a_damaged_quantization_field(model, tmp_path, capsys):
    assert cli("discover", "--model", model, "--output-dir", tmp_path, *Q) == 0
    r = report(tmp_path)
    r["quantization"]["precision"] = 0
    (tmp_path / "torq_gen_config_example.json").write_text(json.dumps(r))
    assert cli("run", "--model", model, "--output-dir", tmp_path, *Q) == 2
    assert "--precision 0 -> " in last_error(capsys)
