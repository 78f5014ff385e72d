"""Per-layer precision (mixed int8 / int16): ORT's tensor overrides, the compiled mixed model
against ORT, and the choice by measurement (``--precision auto --accuracy-budget``)."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnxruntime.quantization import QuantType

from torq import compile
from torq.errors import TorqError
from torq.examples import build_example_cnn
from torq.quantize import quantize
from torq.quantize.auto_precision import choose
from torq.quantize.calibration import SyntheticDataReader
from torq.quantize.precision import layers, name_nodes, parse_precision, resolve, tensor_overrides
from torq.quantize.sensitivity import layer_macs, measure, samples_of
from torq.verify import verify


@pytest.fixture(scope="module")
def cnn():
    return onnx.shape_inference.infer_shapes(name_nodes(build_example_cnn()))


def test_layers_and_resolution(cnn):
    assert layers(cnn) == ["conv1", "conv2", "conv3", "add1", "dwconv", "gap", "logits"]
    p = resolve(cnn, {"conv2": "int16", "add1": "int16"})
    # Relu / MaxPool / Flatten follow their producer's layer
    assert p["relu1"] == "int8" and p["relu2"] == "int16" and p["pool1"] == "int16" and p["flatten"] == "int8"


def test_tensor_overrides_make_each_layer_output_int16(cnn):
    o = tensor_overrides(cnn, {"conv2": "int16", "add1": "int16"})
    wide = [{"quant_type": QuantType.QInt16}]
    assert o == {"conv2": wide, "relu2": wide, "add1": wide, "pool1": wide}
    assert tensor_overrides(cnn, {}) == {} and tensor_overrides(cnn, {"conv1": "int8"}) == {}


@pytest.mark.parametrize("bad, expect", [((("nope", "int16"),), "no node 'nope'"),
                                         ((("conv1", "int4"),), "bad entry"),
                                         ((("conv1", "auto"),), "bad entry")])
def test_bad_precision_is_a_one_line_error(cnn, bad, expect):
    with pytest.raises(TorqError, match=expect):
        quantize(cnn, precision=bad)


def test_parse_precision(cnn):
    assert parse_precision(None) == "int8" and parse_precision("AUTO") == "auto"
    assert parse_precision("conv1=int16, add1=int16", cnn) == {"conv1": "int16", "add1": "int16"}
    for bad in ("conv1:int16", "=int16", "conv1=fp8"):
        with pytest.raises(TorqError, match="--precision"):
            parse_precision(bad)
    with pytest.raises(TorqError, match="no node named 'x'"):
        parse_precision("x=int16", cnn)


@pytest.mark.parametrize("promoted", [["conv2"], ["conv1", "add1", "gap"], ["dwconv", "logits"]])
def test_mixed_model_runs_on_the_nss_and_verifies_against_ort(cnn, promoted):
    """int8 and int16 layers side by side (int8 in / int16 out, int16 in / int8 out, mixed Add
    inputs): every op on the NSS, verify ok against ORT."""
    q = quantize(cnn, precision=tuple((n, "int16") for n in promoted), per_channel=True, full_integer=True)
    wide = {n.input[2] for n in q.graph.node if n.op_type == "QuantizeLinear"
            and next(t for t in q.graph.initializer if t.name == n.input[2]).data_type == onnx.TensorProto.INT16}
    assert wide
    c = compile(q)
    assert c.report.unsupported == [], [str(u) for u in c.report.unsupported]
    ops = Counter(c.report.lowered)
    assert not ops.get("act") and not ops.get("fma")          # no bf16 Q/DQ fallback
    for seed in (0, 1):
        r = verify(c, seed=seed)
        assert r.ok and r.float_steps >= 1, [od for od in r.op_diffs if not od.explained]


def test_sensitivity_and_macs(cnn):
    samples = samples_of(SyntheticDataReader(cnn, 4))
    sens = measure(cnn, samples)
    assert [s.name for s in sens] == layers(cnn)
    macs = layer_macs(cnn)
    assert macs["conv1"] == 8 * 32 * 32 * 3 * 3 * 3 and macs["logits"] == 10 * 8
    assert all(s.kl >= 0 and np.isfinite(s.sqnr_db) for s in sens)
    assert max(s.kl for s in sens) > 0


def test_sensitivity_is_kept_only_for_the_same_model_and_samples(cnn):
    """Recipes differing only in the MAC cap measure once; other samples or another model re-measure."""
    from torq.quantize import sensitivity
    samples = samples_of(SyntheticDataReader(cnn, 8))
    first = measure(cnn, samples[:4])
    assert measure(cnn, samples[:4]) == first
    other = measure(cnn, samples[4:])
    assert other != first and [s.name for s in other] == [s.name for s in first]
    assert sensitivity._LAST["result"] == other
    doubled = measure(cnn, [{k: 2 * v for k, v in s.items()} for s in samples[4:]])
    assert doubled != other


def test_resolve_auto_with_budget_zero_needs_no_calibration_data(cnn, tmp_path):
    """discover / run resolve auto once per model: budget 0 judges nothing on held-apart samples,
    so synthetic calibration will do; a positive budget still refuses it."""
    from torq.quantize.auto_precision import resolve_auto
    from torq.quantize.recipe import Recipe
    onnx.save(cnn, tmp_path / "m.onnx")
    base = Recipe(per_channel=True, precision=(("*", "auto"),), num_calib=9)
    got = resolve_auto(base.replace(accuracy_budget=0.0, int16_macs=30.0), tmp_path / "m.onnx")
    assert ("*", "auto") not in got.precision and got.precision and all(p == "int16" for _, p in got.precision)
    with pytest.raises(TorqError, match="needs real calibration data"):
        resolve_auto(base, tmp_path / "m.onnx")


def _auto(cnn, budget, cap=0.5):
    samples = samples_of(SyntheticDataReader(cnn, 12))
    calib, hold = samples[:6], samples[6:]

    def qfn(prec):
        from torq.quantize.calibration import ArrayDataReader
        reader = ArrayDataReader(calib)
        return quantize(cnn, calibration_data_reader=reader, per_channel=True, precision=tuple(prec.items()))
    return choose(cnn, qfn, calib, hold, budget, max_int16_share=cap)


def test_auto_precision_reports_every_layer_and_keeps_the_mac_cap(cnn):
    res = _auto(cnn, 1e-9, cap=0.3)
    assert [c.name for c in res.layers] == layers(cnn)
    assert all(c.why.startswith(c.precision + ":") for c in res.layers)
    assert res.int8_mac_share >= 0.7
    assert res.trials[0]["promoted"] == 0
    assert set(res.precision) == {c.name for c in res.layers if c.precision == "int16"}
    j = res.to_json()
    assert j["budget_top1_points"] == 1e-9 and len(j["layers"]) == 7


def test_auto_precision_promotes_nothing_when_int8_is_within_budget(cnn):
    res = _auto(cnn, 100.0)
    assert res.precision == {} and res.met and res.int8_mac_share == 1.0
    assert all("all-int8 is within the budget" in c.why for c in res.layers)
    with pytest.raises(TorqError, match="accuracy-budget"):
        quantize(cnn, precision=(("*", "auto"),), accuracy_budget=-1.0)


@pytest.mark.parametrize("cap", [0.0, 0.02, 0.3])
def test_auto_budget_zero_promotes_the_most_sensitive_layers_up_to_the_cap(cnn, cap):
    """Budget 0: no search and no trial model; the longest KL-per-MAC prefix within the cap."""
    from torq.quantize.auto_precision import int16_macs
    samples = samples_of(SyntheticDataReader(cnn, 12))

    def no_trials(prec):
        raise AssertionError("budget 0 quantized a trial model")
    res = choose(cnn, no_trials, samples[:6], samples[6:], 0.0, max_int16_share=cap)
    sens = measure(cnn, samples[:6])
    cost, total = int16_macs(cnn, sens)
    ranked = sorted((s for s in sens if s.kl > 0), key=lambda s: -s.kl / max(cost[s.name], 1))
    k, used = 0, 0
    while k < len(ranked) and (used + cost[ranked[k].name]) / total <= cap:
        used += cost[ranked[k].name]
        k += 1
    assert set(res.precision) == {s.name for s in ranked[:k]}
    assert res.trials == [] and res.loss is None and res.met
    assert res.int8_mac_share == pytest.approx(1 - used / total) and res.int8_mac_share >= 1 - cap
    assert all(("within the int16 MAC cap" in c.why) == (c.precision == "int16") for c in res.layers)
    if cap == 0.3:
        assert res.precision                       # the cap admits some layers: they are promoted


def test_recipe_precision_auto_applies_the_choice_and_stamps_it(cnn):
    """quantize(precision=auto): the chosen int16 layers are in the recipe stamped on the model,
    the per-layer report in its metadata, and the model's own int16 tensors are theirs."""
    from torq.quantize.calibration import ArrayDataReader
    from torq.quantize.precision import precision_of, stamped
    from torq.quantize.recipe import recipe_of
    samples = samples_of(SyntheticDataReader(cnn, 9))
    q = quantize(cnn, calibration_data_reader=ArrayDataReader(samples), per_channel=True,
                 precision=(("*", "auto"),), accuracy_budget=1e-9)
    report, recipe = stamped(q), recipe_of(q)
    assert report["holdout_images"] == 3 and len(report["layers"]) == 7
    chosen = {n for n, p in recipe.precision if p == "int16"}
    assert chosen == set(report["int16_layers"])
    assert {n for n, p in precision_of(q).items() if p == "int16"} >= chosen


def test_mac_share_counts_each_layer_at_its_input_width(cnn):
    """A layer multiplies at the width of the activation it reads: promoting conv2's output to
    int16 makes conv3 (which reads it) an int16 × int8 layer, while conv2 itself still multiplies
    int8 × int8 (graph.macs counts: conv1 221184, conv2 147456, conv3 16384, dwconv 4608, fc 80)."""
    from torq.quantize.precision import mac_share
    total = 221184 + 147456 + 16384 + 4608 + 80
    assert mac_share(quantize(cnn, per_channel=True, full_integer=True)) == {"int8": 1.0}
    share = mac_share(quantize(cnn, precision=(("conv2", "int16"),), per_channel=True, full_integer=True))
    assert share["int16"] == pytest.approx(16384 / total) and share["int8"] == pytest.approx(1 - 16384 / total)
    share = mac_share(quantize(cnn, precision=(("conv1", "int16"),), per_channel=True))
    assert share["int16"] == pytest.approx(147456 / total)
    q = quantize(cnn, per_channel=True, nodes_to_exclude=("conv3",))     # a float layer is neither
    assert mac_share(q)["float"] == pytest.approx(16384 / total)


def test_auto_model_is_its_resolved_recipe_applied_on_every_sample(cnn):
    """The held-apart samples only judge the choice: the final model is calibrated on every sample,
    so it is the model its resolved recipe (`quantize --recipe` of the stamped recipe) gives, and
    with nothing promoted it is the base recipe's model."""
    from torq.quantize.calibration import ArrayDataReader
    from torq.quantize.recipe import recipe_of
    samples = samples_of(SyntheticDataReader(cnn, 9))
    graph = lambda q: q.graph.SerializeToString()                       # noqa: E731 (metadata aside)
    for budget in (0.0, 100.0):
        q = quantize(cnn, calibration_data_reader=ArrayDataReader(samples), per_channel=True,
                     precision=(("*", "auto"),), accuracy_budget=budget)
        again = quantize(cnn, calibration_data_reader=ArrayDataReader(samples), recipe=recipe_of(q))
        assert graph(again) == graph(q)
    plain = quantize(cnn, calibration_data_reader=ArrayDataReader(samples), per_channel=True)
    assert recipe_of(q).precision == () and graph(q) == graph(plain)


def test_auto_budget_is_the_expected_loss_with_fp32_as_the_labels():
    """A flip between two classes FP32 hesitates over costs little; a confident one costs all."""
    from torq.quantize.auto_precision import compare
    ref = np.array([[2.0, 2.0 - 1e-3, -5.0], [9.0, 0.0, 0.0]])
    tied_flip = np.array([[2.0, 2.1, -5.0], [9.0, 0.0, 0.0]])
    loss, dis, kl = compare(ref, tied_flip)
    assert dis == 50.0 and 0 < loss < 0.1 and kl > 0
    loss, dis, _ = compare(ref, np.array([[2.0, 1.0, -5.0], [0.0, 9.0, 0.0]]))
    assert dis == 50.0 and loss > 49.9
    assert compare(ref, ref)[:2] == (0.0, 0.0)


def _with_extra_output(m, tensor):
    out = onnx.ModelProto()
    out.CopyFrom(m)
    out.graph.output.extend([onnx.helper.make_empty_tensor_value_info(tensor)])
    return onnx.shape_inference.infer_shapes(out)


@pytest.mark.parametrize("which", ["cnn", "cnn20", "relu2 also an output"])
def test_sensitivity_in_pieces_is_the_whole_model_pass(cnn, which, monkeypatch):
    """The pass that runs the model in pieces (fp32 values once, each variant only behind its cut)
    gives the whole-model-per-layer pass's result: bit for bit without ORT's graph optimisations,
    the same ranking with them (fused vs unfused float32 at the cuts). A variant rounding on the wrong
    int8 range is caught."""
    from torq.examples import build_cnn20
    from torq.quantize import sensitivity
    m = {"cnn": cnn, "cnn20": name_nodes(build_cnn20()), "relu2 also an output": _with_extra_output(cnn, "relu2")}[which]
    samples = samples_of(SyntheticDataReader(m, 6))
    pieces = sensitivity._measure(m, samples, optimize=False)
    assert pieces == sensitivity._measure(m, samples, whole=True, optimize=False)
    fast, slow = sensitivity._measure(m, samples), sensitivity._measure(m, samples, whole=True)
    rank = lambda sens: [s.name for s in sorted(sens, key=lambda s: -s.kl / max(s.macs, 1))]   # noqa: E731
    assert rank(fast) == rank(slow)
    # (one int8 rounding flipped by a float32 ulp moves a 1e-7 KL of this toy by up to ~10 %;
    # EfficientNet-Lite0's KLs moved by at most 0.45 %, the ranking unchanged)
    assert [s.kl for s in fast] == pytest.approx([s.kl for s in slow], rel=0.2)
    variant = sensitivity._Pieces._variant           # a fault: the variants round on a range 1 % too wide
    monkeypatch.setattr(sensitivity._Pieces, "_variant", lambda self, t, lo, hi: variant(self, t, 1.01 * lo, 1.01 * hi))
    assert sensitivity._measure(m, samples, optimize=False) != pieces


def test_auto_may_promote_the_head_and_a_pin_keeps_it_int8(cnn):
    """The classifier writing the graph output costs no int16 MACs: auto may promote it, and under
    full-integer I/O the output is then int16 (with exact scales the NSS computes ORT's integers
    there, bit for bit); ``auto,logits=int8`` keeps it int8 and says why."""
    from torq import reference
    from torq.quantize.calibration import ArrayDataReader
    from torq.quantize.precision import stamped
    from torq.quantize.recipe_flags import parse_precision
    samples = samples_of(SyntheticDataReader(cnn, 9))
    auto = dict(per_channel=True, full_integer=True, exact_scales=True, accuracy_budget=0.0, int16_macs=100.0)
    q = quantize(cnn, calibration_data_reader=ArrayDataReader(samples), precision=(("*", "auto"),), **auto)
    assert "logits" in stamped(q)["int16_layers"]
    assert q.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.INT16
    c = compile(q)
    x = np.random.default_rng(1).integers(-128, 128, size=[d.dim_value for d in
                                          q.graph.input[0].type.tensor_type.shape.dim], dtype=np.int8)
    name = q.graph.input[0].name
    ort = reference.run(q, {name: x})[q.graph.output[0].name]
    nss = c.simulator.run(c.program.feed({name: x}), "native")[0]
    assert ort.dtype == np.int16 and np.array_equal(np.asarray(nss).reshape(ort.shape), ort)
    pinned = parse_precision("auto, logits=int8")
    assert pinned == (("*", "auto"), ("logits", "int8"))
    q = quantize(cnn, calibration_data_reader=ArrayDataReader(samples), precision=pinned, **auto)
    assert q.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.INT8
    report = stamped(q)
    assert report["int16_layers"] and "logits" not in report["int16_layers"]
    why = {c["name"]: c["why"] for c in report["layers"]}
    assert why["logits"].startswith("int8: given as --precision logits=int8")


def _silu_cnn():
    """x -> conv1 -> Sigmoid · conv1 (SiLU, EfficientNet-B0's activation) -> conv2 -> HardSwish -> conv3."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = {f"w{i}": numpy_helper.from_array(rng.standard_normal((4, 4 if i > 1 else 3, 3, 3)).astype(np.float32) * 0.3,
                                          f"w{i}") for i in (1, 2, 3)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c1"], ["s1"], name="sig1"),
             helper.make_node("Mul", ["c1", "s1"], ["m1"], name="mul1"),
             helper.make_node("Conv", ["m1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c2"], ["h2"], name="hswish2"),
             helper.make_node("Conv", ["h2", "w3"], ["y"], name="conv3", pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], list(w.values()))
    return onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def test_auto_never_promotes_a_layer_whose_reader_has_no_int16_form():
    """A conv read by a Sigmoid / Mul / HardSwish (tables and Mul take int8 only on the NSS) stays
    int8 under auto whatever the cap, says why, and the model compiles; int16 given by hand to such
    a layer is what the compiler refuses (so the guard is what keeps auto's models compilable)."""
    from torq.quantize.calibration import ArrayDataReader
    from torq.quantize.precision import int8_only_layers, stamped
    m = _silu_cnn()
    keep = int8_only_layers(m)
    assert set(keep) == {"conv1", "conv2", "sig1", "mul1", "hswish2"}
    assert "Sigmoid 'sig1'" in keep["conv1"] and "HardSwish 'hswish2'" in keep["conv2"]
    assert keep["mul1"] == "its op (Mul) has no int16 form on the NSS"
    from onnx import helper
    cat = onnx.ModelProto()
    cat.CopyFrom(m)                                      # GoogLeNet's branches: conv -> Relu -> Concat
    g = cat.graph
    g.node.append(helper.make_node("Relu", ["y"], ["r3"], name="relu3"))
    g.node.append(helper.make_node("Concat", ["r3", "h2"], ["cat"], name="cat", axis=1))
    g.output[0].CopyFrom(helper.make_tensor_value_info("cat", onnx.TensorProto.FLOAT, [1, 8, 8, 8]))
    assert "Concat 'cat' joins it" in int8_only_layers(cat)["conv3"]
    samples = samples_of(SyntheticDataReader(m, 9))
    auto = dict(per_channel=True, precision=(("*", "auto"),), accuracy_budget=0.0, int16_macs=100.0)
    q = quantize(m, calibration_data_reader=ArrayDataReader(samples), full_integer=True, **auto)
    report = stamped(q)
    assert report["int16_layers"] == [] or not set(report["int16_layers"]) & {"conv1", "conv2"}
    why = {c["name"]: c["why"] for c in report["layers"]}
    assert "has no int16 form" in why["conv1"]
    assert verify(compile(q)).ok                          # every op has a pattern, NSS = ORT
    for layer, op in (("conv1", "Sigmoid"), ("conv2", "HardSwish"), ("mul1", "Mul")):
        forced = quantize(m, calibration_data_reader=ArrayDataReader(samples), full_integer=True,
                          per_channel=True, precision=((layer, "int16"),))
        with pytest.raises(TorqError, match=f"not supported on NSS.*{op}"):
            compile(forced).program
