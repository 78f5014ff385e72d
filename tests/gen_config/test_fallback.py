"""Layers the NSS refuses land on CSS/HOST, bit-exact vs ORT, and run still passes."""
from __future__ import annotations

import json

import numpy as np
import pytest

from torq.gen_config import executors as X
from torq.graph.inputs import random_inputs
from torq import reference

from .conftest import cli, conv_chain

QFLAGS = ["--quantize", "--full-integer"]


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    d = tmp_path_factory.mktemp("chain")
    model = conv_chain(d / "chain.onnx", "LpNormalization")
    assert cli("discover", "--model", model, "--output-dir", d, *QFLAGS, "--repro-dir", d / "repro") == 0
    return model, d


def test_lpnorm_falls_back_to_css(chain):
    _, d = chain
    r = json.loads((d / "torq_gen_config_chain.json").read_text())
    hs = r["ops"]["LpNormalization_mid"]
    nss = hs["executors"]["nss"]
    assert nss["status"] == "error" and nss["failure_report"]["reason_code"] == "no_pattern"
    assert "not supported on NSS" in nss["failure_report"]["summary"]
    assert hs["executors"]["css"]["status"] == "success" and hs["executors"]["host"]["status"] == "success"
    assert hs["recommended_executor"] == "css"
    comp = json.loads((d / "torq_gen_config_chain_compiler.json").read_text())
    assert sorted(v["executor"] for v in comp["op_assignments"].values()) == ["css", "nss", "nss"]


def test_repro_bundle(chain):
    _, d = chain
    b = d / "repro" / "LpNormalization_mid"
    assert (b / "layer.onnx").exists() and (b / "inputs" / "x.npy").exists() or (b / "inputs").is_dir()
    assert (b / "ir" / "layer.linalg.mlir").exists()
    text = (b / "README.txt").read_text()
    assert "no_pattern" in text and "torq-gen-config discover" in text


def test_run_mixed_segments_bit_exact(chain):
    model, d = chain
    assert cli("run", "--model", model, "--output-dir", d, *QFLAGS, "--rounding", "ort", "--debug-ir", d / "ir") == 0
    m = json.loads((d / "torq_gen_config_chain.json").read_text())["full_model_metrics"]
    assert [s["executor"] for s in m["segments"]] == ["nss", "css", "nss"]
    assert m["max_abs_lsb"] == 0
    names = {p.name for p in (d / "ir").iterdir()}
    assert {"chain.torq_hl.mlir", "chain.segment1_css.linalg.mlir", "chain.segment2_nss.torq_hl.mlir"} <= names


@pytest.mark.parametrize("executor", ["css", "host"])
def test_iree_executors_bit_exact_on_a_layer_nss_refuses(tmp_path, executor):
    from torq.graph import extract_layers
    from torq.quantize import quantize
    layer = [lay for lay in extract_layers(str(conv_chain(tmp_path / "c.onnx"))) if lay.op_type == "LpNormalization"][0]
    q = quantize(layer.model, full_integer=True, wrap_lone_ops=True)
    compiled = X.frontend(q)
    with pytest.raises(X.ExecutorError) as e:
        X.build("nss", compiled)
    assert e.value.reason_code == "no_pattern"
    x = random_inputs(q, 3, float_range=40.0)   # the per-layer feed range (gen_config.layer_test)
    outs, ms = X.build(executor, compiled).run(x)
    ref = reference.run(q, x)
    assert np.array_equal(outs["mid"], ref["mid"]) and ms >= 0


def test_wrong_executor_is_caught_and_named(chain, monkeypatch, capsys):
    """Injected fault: CSS returns outputs off by 3 LSB; run fails and names the LpNormalization layer."""
    model, d = chain
    from torq.gen_config.executors import css
    real = css.build

    def off_by_three(compiled, **kw):
        inner = real(compiled, **kw)

        def run(inputs):
            outs, ms = inner.run(inputs)
            return {k: np.clip(v.astype(np.int16) + 3, -128, 127).astype(v.dtype) for k, v in outs.items()}, ms
        return X.Runnable("css", run)
    monkeypatch.setattr(css, "build", off_by_three)
    assert cli("run", "--model", model, "--output-dir", d, *QFLAGS, "--rounding", "ort", "--tolerance-lsb", "1") == 1
    m = json.loads((d / "torq_gen_config_chain.json").read_text())["full_model_metrics"]
    assert not m["passed"] and m["first_divergence"]["layer_id"] == "LpNormalization_mid"
    assert m["first_divergence"]["executor"] == "css"
    assert "first diverging layer: LpNormalization_mid on css" in capsys.readouterr().out
