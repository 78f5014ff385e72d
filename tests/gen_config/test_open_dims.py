"""A Paddle-style export (opset 11, open input dims) through discover and run with --input-shape:
each layer is cut from the sized graph (its inputs are inner tensors, not the model's ``x``), and
per-channel quantization of an opset-11 model gives valid ONNX (per-axis DequantizeLinear is opset 13)."""
from __future__ import annotations

import json

import onnx
import pytest

from torq.gen_config.cli import main as cli
from torq.graph.input_shape import set_input_shapes
from torq.quantize import quantize

from graph.test_input_shape import paddle_style


@pytest.mark.parametrize("flags", [[], ["--per-channel"], ["--quant-format", "qoperator"]])
def test_discover_and_run_take_input_shape(flags, tmp_path, capsys):
    fp32 = tmp_path / "paddle.onnx"
    onnx.save(paddle_style(), fp32)
    common = ["--model", str(fp32), "--output-dir", str(tmp_path), "--quantize", "--input-shape", "x=1,3,16,24", *flags]
    assert cli(["discover", *common]) == 0
    report = json.loads((tmp_path / "torq_gen_config_paddle.json").read_text())
    assert {lid: op["recommended_executor"] for lid, op in report["ops"].items()} == \
        {"Conv_c": "nss", "MaxPool_p": "nss", "GlobalAveragePool_y": "nss"}
    assert cli(["run", *common]) == 0
    assert "run: PASS" in capsys.readouterr().out


def test_per_channel_opset11_is_valid_onnx():
    q = quantize(set_input_shapes(paddle_style(), ["x=1,3,16,24"]), per_channel=True, num_calib=2)
    assert [o.version for o in q.opset_import if o.domain == ""] == [13]
    onnx.checker.check_model(q, full_check=True)
    assert any(a.name == "axis" for n in q.graph.node if n.op_type == "DequantizeLinear" for a in n.attribute)


def _paddle_classifier():
    """Opset 11 x[-1,3,-1,?] -> Conv -> MaxPool -> GlobalAveragePool -> Softmax over axis 1 of [1,4,1,1]
    (opset 11: of the input flattened to 2-D): at the per-axis opset 13, ONNX's converter makes it
    Flatten -> Softmax -> Reshape (as it does PP-OCR's head, whose rank it cannot see)."""
    m = paddle_style()
    g = m.graph
    g.node[2].output[0] = "gap"
    g.node.extend([onnx.helper.make_node("Softmax", ["gap"], ["y"], axis=1)])
    return m


def test_per_channel_discover_cuts_layers_from_the_graph_quantize_makes(tmp_path):
    """Per-channel lifts an opset-11 model to opset 13 before anything else; discover's layers (and
    run's map) are cut from that same graph, so the Softmax discover runs on the NSS (a bf16 island)
    is the one the whole-model compile of ``quantize``'s output lowers -- and refuses, islands off, at
    the same LINE:COL (PP-OCR's cls: they were 2 lines apart)."""
    import torq
    from torq.gen_config.agreement import disagreements, whole_model_refusals
    fp32 = tmp_path / "paddle.onnx"
    onnx.save(_paddle_classifier(), fp32)
    common = ["--model", str(fp32), "--input-shape", "x=1,3,16,24", "--per-channel"]
    assert cli(["quantize", *common, "-o", str(tmp_path / "q.onnx")]) == 0
    assert cli(["discover", *common, "--output-dir", str(tmp_path), "--quantize", "--skip-mode"]) == 0
    report = json.loads((tmp_path / "torq_gen_config_paddle.json").read_text())
    softmax = [op for lid, op in report["ops"].items() if lid.startswith("Softmax")]
    assert [op["recommended_executor"] for op in softmax] == ["nss"]
    q = onnx.load(tmp_path / "q.onnx")
    refused = whole_model_refusals(torq.compile(q).report)
    assert refused == {} and disagreements(report, refused) == []
    off = whole_model_refusals(torq.compile(q, bf16_islands=False).report)
    assert [u.onnx_op for u in off.values()] == ["Softmax"] and list(off) == [softmax[0]["mlir_location"]]
    assert cli(["run", *common, "--output-dir", str(tmp_path), "--quantize"]) == 0
