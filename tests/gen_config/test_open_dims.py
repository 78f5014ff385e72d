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
