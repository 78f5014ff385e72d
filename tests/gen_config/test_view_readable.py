"""Reports readable on real models: folded constants counted apart and hidden unless --all,
layer ids whole when piped (copyable into edit), discover's and run's counts reconciled."""
from __future__ import annotations

import json

from torq.gen_config.view import layer_counts

from .conftest import cli

LONG = "Conv_/features/features.17/conv/conv.2/Conv_output_0_with_a_very_long_exporter_name"


def report(tmp_path):
    ops = {LONG: {"executors": {"nss": {"status": "success"}}, "recommended_executor": "nss", "mlir_location": "12:3"},
           "Relu_/features/r": {"executors": {"nss": {"status": "success"}}, "recommended_executor": "nss",
                                "mlir_location": "Relu"},
           "Shape_/Shape_output_0": {"executors": {}, "recommended_executor": None,
                                     "skipped": "constant: folded at compile time", "mlir_location": "Shape"}}
    path = tmp_path / "torq_gen_config_m.json"
    path.write_text(json.dumps({"version": "1.1", "model_name": "m", "ops": ops}))
    return path


def test_piped_table_keeps_ids_whole_and_counts_folded_apart(tmp_path, capsys):
    path = report(tmp_path)
    assert cli("view", path) == 0
    out = capsys.readouterr().out
    assert LONG in out and "Shape_/Shape_output_0" not in out
    assert "folded: 1 (constant shape arithmetic computed at compile time; --all lists them)" in out
    assert cli("view", path, "--all") == 0
    assert "Shape_/Shape_output_0" in capsys.readouterr().out
    html_path = tmp_path / "r.html"
    assert cli("view", path, "--html", html_path) == 0
    page = html_path.read_text()
    assert "Shape_/Shape_output_0" not in page and "folded: 1" in page


def test_counts_reconcile(tmp_path):
    r = json.loads(report(tmp_path).read_text())
    assert layer_counts(r) == {"layers": 3, "ops": 1, "fused": 1, "folded": 1}
