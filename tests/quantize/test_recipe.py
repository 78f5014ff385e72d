"""The quantization Recipe: one value, one flag vocabulary on every command, one fingerprint, and
`quantize --recipe X` writes the model `evaluate --recipe X` measured, byte for byte."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

from torq.errors import TorqError
from torq.examples import build_example_cnn
from torq.gen_config.cli import build_parser
from torq.quantize import PRESETS, Recipe, apply, preset, recipe_of
from torq.quantize.recipe_flags import FLAGS, recipe_from_args

FIELDS = [f.name for f in dataclasses.fields(Recipe)]

#: a value different from the default for every field
CHANGED = {"input_shape": ("x=1,3,8,8",), "format": "hybrid", "per_channel": True, "full_integer": True,
           "calibrate_method": "entropy", "calibration_data": "calib.npz", "num_calib": 7,
           "preprocess": "norm=tf", "fold": False, "dead_channels": False, "equalize": "skip",
           "bias_correction": True, "exact_scales": True, "nodes_to_quantize": ("a",),
           "nodes_to_exclude": ("b",), "op_types_to_quantize": ("Conv",), "op_types_to_exclude": ("Gemm",),
           "precision": (("c", "int16"),), "quant_dtype": "A16W8", "accuracy_budget": 2.0,
           "weight_rounding": "gptq", "int16_macs": 5.0}


def test_every_field_changes_the_fingerprint():
    base = Recipe()
    seen = {base.fingerprint()}
    for name in FIELDS:
        r = base.replace(**{name: CHANGED[name]})
        assert r.fingerprint() not in seen, name
        seen.add(r.fingerprint())
    assert Recipe().fingerprint() == base.fingerprint()           # and it is a function of the fields
    assert len({p.fingerprint() for p in PRESETS.values()}) == len(PRESETS)


def test_round_trip_through_json():
    r = Recipe(**{k: v for k, v in CHANGED.items()})
    assert Recipe.from_dict(json.loads(json.dumps(r.to_dict()))) == r


def test_every_field_has_a_flag_on_every_command():
    assert set(FLAGS) == set(FIELDS)
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    for command in ("quantize", "discover", "run", "evaluate"):
        options = {s for a in sub[command]._actions for s in a.option_strings}
        for name, (flags, _) in FLAGS.items():
            assert flags[0] in options, (command, flags[0])
        assert "--recipe" in options


@pytest.mark.parametrize("command", ["quantize", "discover", "run", "evaluate"])
def test_flags_build_the_same_recipe_on_every_command(command):
    argv = [command, "--model", "m.onnx", "--recipe", "exact", "--per-tensor", "--equalize", "--num-calib", "9",
            "--nodes-to-exclude", "a,b", "--precision", "x=int8", "--no-fold"]
    if command == "evaluate":
        argv += ["--dataset", "d"]
    if command in ("discover", "run"):
        argv += ["--quantize"]
    r = recipe_from_args(build_parser().parse_args(argv))
    assert r == preset("exact").replace(per_channel=False, equalize="bounded", num_calib=9,
                                        nodes_to_exclude=("a", "b"), precision=(("x", "int8"),), fold=False)


BAD = [(["--quant-format", "int4"], "unsupported --quant-format 'int4'"),
       (["--calibrate-method", "median"], "unsupported --calibrate-method 'median'"),
       (["--equalize", "always"], "unsupported --equalize 'always'"),
       (["--quant-dtype", "A4W4"], "unsupported --quant-dtype 'A4W4'"),
       (["--num-calib", "0"], "--num-calib must be a positive integer"),
       (["--precision", "conv1=int4"], "--precision: bad item 'conv1=int4'"),
       (["--recipe", "fastest"], "unknown --recipe 'fastest'"),
       (["--preprocess", "norm=tf", "--calibration-data", "IMAGES", "--num-calib", "2"], "calibration data not found"),
       (["--nodes-to-exclude", "no_such_node"], "--nodes-to-exclude: no node 'no_such_node'"),
       (["--op-types-to-quantize", "Softmax"], "--op-types-to-quantize: no node type 'Softmax'")]


@pytest.mark.parametrize("flags,needle", BAD, ids=[b[0][0] for b in BAD])
def test_bad_values_are_one_line_errors(tmp_path, flags, needle):
    build_example_cnn(tmp_path / "m.onnx")
    flags = [str(tmp_path / "missing") if f == "IMAGES" else f for f in flags]
    r = subprocess.run([sys.executable, "-m", "torq.gen_config.cli", "quantize", "--model", str(tmp_path / "m.onnx"),
                        "-o", str(tmp_path / "q.onnx"), *flags], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in err and needle in err, err
    assert not (tmp_path / "q.onnx").exists()


def test_images_without_a_declared_norm_are_refused(tmp_path):
    from PIL import Image
    build_example_cnn(tmp_path / "m.onnx")
    (tmp_path / "photos").mkdir()
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(tmp_path / "photos" / "a.png")
    with pytest.raises(TorqError, match="need --preprocess with norm="):
        apply(Recipe(calibration_data=str(tmp_path / "photos"), preprocess="resize=32"), tmp_path / "m.onnx")


def test_calibration_from_an_image_folder(tmp_path):
    """A plain folder of photos + --preprocess calibrates like the same pixels given as arrays."""
    from PIL import Image
    from torq.data import parse_preprocess
    build_example_cnn(tmp_path / "m.onnx")
    (tmp_path / "photos").mkdir()
    rng = np.random.default_rng(0)
    raws = [rng.integers(0, 256, (36, 48, 3), dtype=np.uint8) for _ in range(3)]
    for i, img in enumerate(raws):
        Image.fromarray(img).save(tmp_path / "photos" / f"{i}.png")
    spec = "resize=32,crop=32,norm=tf"
    x = parse_preprocess(spec).batch(raws, (3, 32, 32))
    np.savez(tmp_path / "arrays.npz", input=x)
    from_images = apply(Recipe(calibration_data=str(tmp_path / "photos"), preprocess=spec), tmp_path / "m.onnx")
    from_arrays = apply(Recipe(calibration_data=str(tmp_path / "arrays.npz")), tmp_path / "m.onnx")
    assert from_images.model.graph.SerializeToString() == from_arrays.model.graph.SerializeToString()


def test_the_model_says_its_recipe(tmp_path):
    build_example_cnn(tmp_path / "m.onnx")
    r = preset("exact").replace(num_calib=3)
    assert recipe_of(apply(r, tmp_path / "m.onnx").model) == r


def test_front_end_folds_pad_and_batchnorm_by_default(tmp_path):
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w")
    bn = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in
          (("s", rng.uniform(0.5, 2, 4)), ("b", rng.normal(size=4)), ("m", rng.normal(size=4)), ("v", rng.uniform(0.5, 2, 4)))]
    pads = numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")
    g = helper.make_graph([helper.make_node("Pad", ["x", "pads"], ["p"]),
                           helper.make_node("Conv", ["p", "w"], ["c"], name="conv"),
                           helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w, pads, *bn])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    ops = lambda q: {n.op_type for n in q.graph.node}
    assert "Pad" not in ops(apply(Recipe(), m).model) and "BatchNormalization" not in ops(apply(Recipe(), m).model)
    assert {"Pad", "BatchNormalization"} <= ops(apply(Recipe(fold=False), m).model)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["exact", "cle"])
def test_quantize_writes_the_model_evaluate_measured(probe_model_path, tmp_path, name):
    """`evaluate --recipe X` then `quantize --recipe X` with the same calibration data: same bytes."""
    from torq.gen_config.cli import main
    from evaluate.fmnist_probe import TEST, TRAIN
    common = ["--model", str(probe_model_path), "--recipe", name, "--calibration-data", str(TRAIN),
              "--num-calib", "12", "--preprocess", "norm=unit"]
    assert main(["evaluate", *common, "--dataset", str(TEST), "--limit", "16", "--sqnr-images", "0",
                 "-o", str(tmp_path / "ev")]) == 0
    assert main(["quantize", *common, "-o", str(tmp_path / "q.onnx")]) == 0
    measured = (tmp_path / "ev" / f"{probe_model_path.stem}.int8.onnx").read_bytes()
    assert (tmp_path / "q.onnx").read_bytes() == measured
    assert recipe_of(onnx.load(tmp_path / "q.onnx")) == preset(name).replace(
        calibration_data=str(TRAIN), num_calib=12, preprocess="norm=unit")
    # and a different recipe is a different model
    assert main(["quantize", *common, "--no-exact-scales", "-o", str(tmp_path / "other.onnx")]) == 0
    assert (tmp_path / "other.onnx").read_bytes() != measured


@pytest.mark.slow
def test_torq_compile_runs_what_evaluate_measured(probe_model_path, tmp_path):
    """The recommended recipe (today mixed: gptq + int16 layers by measurement) through the
    user's path — `quantize --recipe recommended` then `torq-compile --emit program` — is the model
    evaluate measured: the same ONNX bytes, and the Program's NSS top-1 on the evaluated images is
    evaluate's INT8-NSS top-1, image by image."""
    from torq.compile_cli import main as compile_main
    from torq.data import load_dataset
    from torq.data.preprocess import parse_preprocess
    from torq.evaluate.engines import quantize_input
    from torq.gen_config.cli import main
    from torq.graph.io_quant import io_quant_params
    from torq.program import Program
    from torq.runtime.nss import Simulator
    from evaluate.fmnist_probe import TEST, TRAIN
    common = ["--model", str(probe_model_path), "--calibration-data", str(TRAIN), "--num-calib", "12",
              "--preprocess", "norm=unit"]
    n = 12
    assert main(["evaluate", *common, "--dataset", str(TEST), "--limit", str(n), "--sqnr-images", "0",
                 "--batch", "4", "-o", str(tmp_path / "ev")]) == 0
    assert main(["quantize", *common, "-o", str(tmp_path / "q.onnx")]) == 0
    assert (tmp_path / "q.onnx").read_bytes() == (tmp_path / "ev" / f"{probe_model_path.stem}.int8.onnx").read_bytes()
    assert compile_main([str(tmp_path / "q.onnx"), "--emit", "program", "-o", str(tmp_path / "q.torq")]) == 0
    measured = json.loads((tmp_path / "ev" / "evaluation.json").read_text())
    program, q = Program.load(tmp_path / "q.torq"), onnx.load(tmp_path / "q.onnx")
    name = program.inputs[0].name
    qin = io_quant_params(q)["inputs"][name]
    data = load_dataset(str(TEST))
    x = parse_preprocess("norm=unit").batch([data.load(i) for i in range(n)], (1, 28, 28), name)
    sim, top = Simulator(program), []
    for img in quantize_input(x, qin["scale"], qin["zero_point"]):
        out = program.fetch(sim.run(program.feed({name: img[None]}), "native"))
        top.append(int(np.argmax(next(iter(out.values())))))
    assert measured["per_image"]["label"] == data.labels[:n].tolist()
    assert top == measured["per_image"]["int8_nss"]


@pytest.fixture(scope="module")
def probe_model_path(tmp_path_factory):
    from evaluate import fmnist_probe
    if not fmnist_probe.TRAIN.exists():
        pytest.skip("Debian package dataset-fashion-mnist is not installed")
    return fmnist_probe.build(tmp_path_factory.mktemp("probe") / "fmnist_probe.onnx")
