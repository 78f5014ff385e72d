"""The reference tool's own published reports load in view / view --layer / edit --list / edit.

Fixtures: trimmed transcriptions of three torq-model-configs reports (see
reference_reports/README.md): no fingerprint, no reason codes, ``_node_index`` only or
``_orig_index`` + ``mac_count``, an empty ``executors`` with a null recommendation.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from torq.gen_config import report_text

from .conftest import cli

HERE = Path(__file__).parent / "reference_reports"
REPORTS = ["torq_gen_config_alexnet_Opset17.json", "torq_gen_config_resnet50_Opset18_timm.json",
           "torq_gen_config_efficientnet_b1_Opset17_timm_quant.json"]
#: a layer of each with a failure_report (no reason_code) and its published node index
LAYERS = {"alexnet": ("AveragePool_/avgpool/AveragePool_output_0", 13),
          "resnet50": ("Conv_/layer3/layer3.0/conv2/Conv_output_0", 56),
          "efficientnet": ("Conv_/blocks/blocks.1/blocks.1.0/conv_dw/Conv_output_0", 29)}


@pytest.fixture(params=REPORTS, ids=["alexnet", "resnet50", "efficientnet_quant"])
def ref(request, tmp_path):
    for f in HERE.glob(request.param.removesuffix(".json") + "*.json"):
        shutil.copy(f, tmp_path / f.name)
    return tmp_path / request.param


def _key(path: Path) -> str:
    return next(k for k in LAYERS if k in path.name)


def _table(text: str) -> list[str]:
    lines = text.splitlines()
    return lines[lines.index("Per-Layer Status:"):]


def test_view_summary(ref, capsys):
    assert cli("view", ref) == 0
    out = capsys.readouterr().out
    data = json.loads(ref.read_text())
    assert f"MODEL: {data['model_name']}" in out and "STATUS COUNTS:" in out
    assert "None" not in out, out
    for lid in data["ops"]:
        assert lid[:30] in out
    sc = data["discovery_report"]["summary"]["status_counts"]
    assert f"  success: {sc['success']}" in out and f"  error: {sc['error']}" in out


def test_view_layer_without_reason_codes(ref, capsys):
    lid, node = LAYERS[_key(ref)]
    assert cli("view", ref, lid) == 0
    out = capsys.readouterr().out
    assert f"LAYER: {lid}" in out and f"Node Index: {node}" in out and "Executor Results:" in out
    assert "[None]" not in out and "node None" not in out and "Reason:" not in out
    assert "Summary: " in out and "Tolerance: {'fp_avg_tol': 0.01, 'fp_max_tol': 0.01}" in out


def test_edit_list(ref, capsys):
    assert cli("edit", ref, "--list") == 0
    out = capsys.readouterr().out
    data = json.loads(ref.read_text())
    assert "Per-Layer Status:" in out and f"Total: {len(data['ops'])} layer(s)" in out
    # the table is the reference's own, line for line
    assert out.splitlines()[:len(data["ops"]) + 3] == _table(data["final_report_text"])


def test_edit_changes_only_that_assignment(ref, capsys):
    lid, _ = LAYERS[_key(ref)]
    before = json.loads(ref.read_text())
    comp_path = ref.with_name(ref.stem + "_compiler.json")
    comp_before = json.loads(comp_path.read_text())
    target = "css"
    assert cli("edit", ref, "--layer", lid, "--executor", target) == 0
    after = json.loads(ref.read_text())
    for k, op in before["ops"].items():
        # the edited layer: its executor, and the edit recorded as data (a later discover keeps it)
        want = dict(op, recommended_executor=target, edit={"executor": target}) if k == lid else op
        assert after["ops"][k] == want
    assert {k: v for k, v in after.items() if k not in ("ops", "discovery_report", "final_report_text")} == \
        {k: v for k, v in before.items() if k not in ("ops", "discovery_report", "final_report_text")}
    comp = json.loads(comp_path.read_text())
    loc = before["ops"][lid]["mlir_location"]
    assert comp["op_assignments"].pop(loc) == {"executor": target}
    comp_before["op_assignments"].pop(loc)
    assert comp == comp_before                      # other assignments and extra keys untouched
    table_before, table_after = _table(before["final_report_text"]), _table(after["final_report_text"])
    changed = [i for i, (a, b) in enumerate(zip(table_before, table_after)) if a != b]
    assert len(changed) == 1 and table_after[changed[0]].endswith(f" {target}") and lid[:40] in table_after[changed[0]]


def test_compiler_json_of_the_reference_in_view_and_run_lookup(ref, capsys):
    comp = ref.with_name(ref.stem + "_compiler.json")
    assert cli("view", comp) == 0
    out = capsys.readouterr().out
    n = len(json.loads(comp.read_text())["op_assignments"])
    assert "(compiler format)" in out and f"Total assignments: {n}" in out


def test_quantized_report_found_by_model_name(tmp_path, capsys):
    """The reference names a quantized discovery ..._quant.json: --model finds it by model_name."""
    for f in HERE.glob("torq_gen_config_efficientnet*"):
        shutil.copy(f, tmp_path / f.name)
    assert cli("view", "--model", tmp_path / "efficientnet_b1_Opset17_timm.onnx", "--output-dir", tmp_path) == 0
    out = capsys.readouterr().out
    assert "MODEL: efficientnet_b1_Opset17_timm" in out
    assert "NPU (NSS) share of MACs: 81.7% (12,118,272 of 14,827,776)" in out


def test_mac_share_counts_known_layers_only():
    data = json.loads((HERE / REPORTS[2]).read_text())
    share = report_text.mac_share(data["ops"])
    assert share["total"] == 10838016 + 256 + 2709504 + 1280000
    assert share["by_executor"] == {"nss": 10838016 + 256 + 1280000, "css": 0, "host": 2709504}
