"""``run`` on models with int16 layers: judged layer by layer on ORT's own inputs (layer_judgment).

ORT runs int16 QDQ in float32: with exact scales (the default recipe) that arithmetic is exact
and the model is held to the whole-model tolerance like an int8 one; with calibrated scales an
int16 layer is bounded, not exact, and its admissible LSBs move later layers: the whole-model
difference of a correct model can exceed a tight tolerance.
Each layer fed ORT's own inputs must then be within the tolerance or, with int16, explained by the
bounded contract; a fault the compiler or the simulator could make still fails, naming the layer.
An int8-only model keeps the whole-model tolerance and the first-divergence locator.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qmodels import combine_shift_by_seven

from .conftest import cli

#: conv1 (int8 in, int16 out) and conv2 (int16 in and out: the graph output) are int16 layers,
#: their scales as calibrated (a recipe without exact scales: ORT's float path rounds)
INT16 = ["--quantize", "--recipe", "per-channel", "--precision", "conv1=int16,conv2=int16"]
#: the same layers under the default recipe: exact scales make ORT's int16 arithmetic exact
EXACT16 = ["--quantize", "--precision", "conv1=int16,conv2=int16"]
INT8 = ["--quantize"]


def _chain(path):
    """x[1,8,16,16] -> conv0 (8->16) -> conv1 (16->16) -> conv2 (16->8) -> y, 3x3 convs (fp32)."""
    rng = np.random.default_rng(3)
    nodes, inits, x = [], [], "x"
    for i, (ci, co) in enumerate(((8, 16), (16, 16), (16, 8))):
        w = rng.normal(0, 1 / np.sqrt(9 * ci), (co, ci, 3, 3))
        inits += [numpy_helper.from_array(w.astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(rng.normal(0, 0.1, co).astype(np.float32), f"b{i}")]
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"conv{i}"], name=f"conv{i}", pads=[1] * 4,
                                      kernel_shape=[3, 3]))
        x = f"conv{i}"
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 8, 16, 16])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


@pytest.fixture(scope="module")
def chains(tmp_path_factory):
    """{flags name: (model, output dir)} discovered once: every layer on the NSS."""
    out = {}
    for name, flags in (("int16", INT16), ("exact16", EXACT16), ("int8", INT8)):
        d = tmp_path_factory.mktemp(name)
        model = _chain(d / "chain.onnx")
        assert cli("discover", "--model", model, "--output-dir", d, *flags, "--skip-mode") == 0
        out[name] = model, d
    return out


def _metrics(d):
    return json.loads((d / "torq_gen_config_chain.json").read_text())["full_model_metrics"]


def _off_by_one_weight(monkeypatch):
    """An injected compiler fault: conv1's (its 16x16x3x3 int8 weights) first weight one more than
    quantized, in every Program the NSS runs (segments and single layers). The op then executes
    its own formula exactly; only ORT's output shows it."""
    from torq.gen_config.executors import nss
    real = nss.cached_program

    def corrupted(model, **kw):
        program = real(model, **kw)
        for st in program.steps:
            w = program.constants.get(st.args[0]) if st.op == "torq_hl.conv2d" else None
            if w is not None and w.shape == (16, 16, 3, 3):
                w = w.copy()
                w.flat[0] = w.flat[0] + 1 if w.flat[0] < 127 else w.flat[0] - 1
                program.constants[st.args[0]] = w
        return program
    monkeypatch.setattr(nss, "cached_program", corrupted)


@pytest.mark.parametrize("rounding", ["ort", "native"])
def test_int16_drift_beyond_a_tight_tolerance_passes_layer_by_layer(chains, rounding, capsys):
    model, d = chains["int16"]
    assert cli("run", "--model", model, "--output-dir", d, *INT16, "--rounding", rounding, "--tolerance-lsb", "0") == 0
    m = _metrics(d)
    assert m["max_abs_lsb"] > 0 and m["judged"] == "per-layer" and m["passed"]       # drift, yet a PASS
    j = m["per_layer"]
    assert j["int16_layers"] == ["Conv_conv1", "Conv_conv2"] and j["failed"] is None and j["explained"] > 0
    rows = {r["layer_id"]: r for r in j["layers"]}
    assert rows["Conv_conv0"]["max_abs_lsb"] == 0 and not rows["Conv_conv0"]["int16"]
    assert all(r["unexplained"] == 0 for r in rows.values() if r["int16"])
    out = capsys.readouterr().out
    assert "run: PASS (int16 drift explained" in out and "whole-model max |Δ|" in out
    assert cli("view", "--model", model, "--output-dir", d) == 0
    assert "judged per layer (int16): True" in capsys.readouterr().out


def test_exact_scales_make_an_int16_model_bit_exact(chains, monkeypatch, capsys):
    """Under the default recipe (exact scales: quantize/exact_int16.py) the int16 layers compute
    ORT's own integers: 0 LSB at tolerance 0, no per-layer judgment needed; a wrong weight in
    the int16 layer then fails, judged per layer and named."""
    model, d = chains["exact16"]
    for rounding in ("native", "ort"):
        assert cli("run", "--model", model, "--output-dir", d, *EXACT16, "--rounding", rounding,
                   "--tolerance-lsb", "0") == 0
        m = _metrics(d)
        assert m["max_abs_lsb"] == 0 and "judged" not in m and m["passed"]
    _off_by_one_weight(monkeypatch)
    assert cli("run", "--model", model, "--output-dir", d, *EXACT16, "--tolerance-lsb", "0") == 1
    f = _metrics(d)["per_layer"]["failed"]
    assert f["layer_id"] == "Conv_conv1" and f["unexplained"] > 0
    assert "run: FAIL: layer Conv_conv1 on nss:" in capsys.readouterr().out


def test_a_weight_the_compiler_got_wrong_fails_naming_the_layer(chains, monkeypatch, capsys):
    model, d = chains["int16"]
    _off_by_one_weight(monkeypatch)
    assert cli("run", "--model", model, "--output-dir", d, *INT16) == 1          # the default ±5 too
    m = _metrics(d)
    f = m["per_layer"]["failed"]
    assert not m["passed"] and f["layer_id"] == "Conv_conv1" and f["executor"] == "nss" and f["unexplained"] > 0
    assert "run: FAIL: layer Conv_conv1 on nss:" in capsys.readouterr().out


def test_a_byte_plane_fault_in_the_simulator_fails_naming_the_layer(chains, monkeypatch, capsys):
    """act_lsh 7 instead of 8: conv2 is the layer reading int16 (conv1 reads int8)."""
    import torq.runtime.kernels.byteplanes as bp
    model, d = chains["int16"]
    monkeypatch.setattr(bp, "combine_partials", combine_shift_by_seven)
    assert cli("run", "--model", model, "--output-dir", d, *INT16, "--rounding", "ort") == 1
    f = _metrics(d)["per_layer"]["failed"]
    assert f["layer_id"] == "Conv_conv2" and f["unexplained"] > 0
    assert "run: FAIL: layer Conv_conv2 on nss:" in capsys.readouterr().out


def test_a_layer_that_does_not_compile_alone_is_no_pass(chains, monkeypatch, capsys):
    """conv1 runs inside its segment but its single-layer program is refused: not judged, so FAIL."""
    from torq.gen_config.executors import ExecutorError, nss
    model, d = chains["int16"]
    real = nss.cached_program

    def refusing(model, **kw):
        program = real(model, **kw)
        if len(program.steps) == 1 and program.constants[program.steps[0].args[0]].shape == (16, 16, 3, 3):
            raise ExecutorError("no_pattern", "injected: conv1 alone has no pattern")
        return program
    monkeypatch.setattr(nss, "cached_program", refusing)
    assert cli("run", "--model", model, "--output-dir", d, *INT16, "--rounding", "ort", "--tolerance-lsb", "0") == 1
    f = _metrics(d)["per_layer"]["failed"]
    assert f["layer_id"] == "Conv_conv1" and "injected" in f["error"]
    assert "run: FAIL: layer Conv_conv1 on nss could not be judged alone" in capsys.readouterr().out


def test_int8_model_keeps_the_whole_model_tolerance(chains, monkeypatch, capsys):
    model, d = chains["int8"]
    assert cli("run", "--model", model, "--output-dir", d, *INT8, "--rounding", "ort", "--tolerance-lsb", "0") == 0
    m = _metrics(d)
    assert m["max_abs_lsb"] == 0 and "judged" not in m
    _off_by_one_weight(monkeypatch)
    assert cli("run", "--model", model, "--output-dir", d, *INT8, "--rounding", "ort", "--tolerance-lsb", "0") == 1
    m = _metrics(d)
    assert "per_layer" not in m and m["first_divergence"]["layer_id"] == "Conv_conv1"
    assert "first diverging layer: Conv_conv1 on nss" in capsys.readouterr().out


def test_an_iree_layer_of_an_int16_model_is_held_to_the_tolerance(chains):
    """conv1 (int16 out) on the host: IREE compiles the QDQ graph itself, so it gets the tolerance,
    not the NSS's int16 bound, whatever its difference from ORT on these inputs."""
    model, d = chains["int16"]
    assert cli("edit", "--model", model, "--output-dir", d, "--layer", "Conv_conv1", "--executor", "host") == 0
    try:
        rc = cli("run", "--model", model, "--output-dir", d, *INT16, "--rounding", "ort", "--tolerance-lsb", "0")
    finally:
        assert cli("edit", "--model", model, "--output-dir", d, "--layer", "Conv_conv1", "--executor", "auto") == 0
    m = _metrics(d)
    assert m["judged"] == "per-layer" and rc == (0 if m["passed"] else 1)
    row = next(r for r in m["per_layer"]["layers"] if r["layer_id"] == "Conv_conv1")
    assert row["executor"] == "host" and row["int16"] and "explained" not in row
    assert row["ok"] == (row["beyond"] == 0)
