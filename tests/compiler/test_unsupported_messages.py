"""What a user reads when an op stays off the NSS: the root cause first (the op without a
pattern and why), its ONNX op type and node name beside LINE:COL, the Q/DQ left around it
counted after it — in the compile report, the program error and discover's failure summary."""
from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qmodels import model, quantize
from torq import compile as torq_compile

LN = "LayerNormalization"


def conv_layernorm_conv():
    """Conv -> LayerNormalization (scale, bias constants) -> Conv: LN has no integer form."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (4, 4, 1, 1)).astype(np.float32), n) for n in ("w1", "w2")]
    inits += [numpy_helper.from_array(rng.uniform(0.5, 1.5, 4).astype(np.float32), "g"),
              numpy_helper.from_array(rng.normal(0, 0.1, 4).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="first_conv"),
             helper.make_node(LN, ["c1", "g", "b"], ["n"], name="the_norm", axis=-1),
             helper.make_node("Conv", ["n", "w2"], ["y"], name="second_conv")]
    return model(nodes, [("x", [1, 4, 3, 4])], ["y"], inits)


def test_root_cause_first_with_node_name_and_consequences_counted():
    """(bf16 islands off: by default the LayerNorm runs on the NSS in bf16)"""
    c = torq_compile(quantize(conv_layernorm_conv(), {"x": [1, 4, 3, 4]}, "qdq"), bf16_islands=False)
    first, *rest = c.report.unsupported
    assert (first.onnx_op, first.node, first.consequence) == (LN, "the_norm", False), first
    assert str(first).startswith("not supported on NSS: ") and f" {LN} 'the_norm': " in str(first)
    assert rest and all(u.consequence for u in rest), [str(u) for u in rest]
    assert {u.onnx_op for u in rest} <= {"QuantizeLinear", "DequantizeLinear", LN}
    assert c.report.lowered.get("conv2d") == 2
    try:
        c.program
        raise AssertionError("a model with a LayerNorm left has no NSS program")
    except Exception as e:   # noqa: BLE001
        msg = str(e)
    assert msg.startswith(str(first)) and msg.endswith(f"(and {len(rest)} op(s) that follow from it)"), msg


def test_discover_failure_summary_names_the_cause(tmp_path):
    """A Hardmax (no NSS pattern) between two convs."""
    from torq.gen_config.cli import main
    m = conv_layernorm_conv()
    m.graph.node[1].CopyFrom(helper.make_node("Hardmax", ["c1"], ["n"], name="the_max", axis=-1))
    p = tmp_path / "hm.onnx"
    onnx.save(m, p)
    assert main(["discover", "--model", str(p), "--output-dir", str(tmp_path), "--quantize", "--skip-mode",
                 "--subgraph-from", "first_conv", "--subgraph-to", "the_max"]) == 0
    r = json.loads((tmp_path / "torq_gen_config_hm_subgraph_0_1.json").read_text())
    nss = r["ops"]["Hardmax_n"]["executors"]["nss"]
    assert nss["failure_report"]["reason_code"] == "no_pattern"
    assert "Hardmax 'the_max': " in nss["failure_report"]["summary"], nss["failure_report"]["summary"]
