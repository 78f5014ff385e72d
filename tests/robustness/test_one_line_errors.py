"""Both CLIs print exactly one stderr line on error: escaped names, ORT and numpy quiet, `| head` clean."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import torq
from robustness.mutants import nodes, qconv, set_attr
from torq.errors import one_line, quote


def cli(module, *args):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def quantize_cli(*args):
    return cli("torq.gen_config.cli", "quantize", *args)


def compile_cli(*args):
    return cli("torq.compile_cli", *args)


def error_line(r, prog) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"{prog}: error: ")
    return lines[0]


def fp32(nodes_, inits, path, n=4):
    g = helper.make_graph(nodes_, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
                          [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, path)
    return path


def test_one_line_helper():
    assert one_line(ValueError()) == "ValueError"
    assert one_line(RuntimeError("a\n\n  b\tc")) == "a b c"
    assert one_line("x" * 500, 20) == "x" * 17 + "..."
    assert quote("a\nb") == "'a\\nb'"


def test_nan_activations_explained_naming_the_users_file(tmp_path):
    big = np.full([4], 1e38)
    path = fp32([helper.make_node("Mul", ["x", "big"], ["a"]), helper.make_node("Mul", ["a", "big"], ["b"]),
                 helper.make_node("Sub", ["b", "b"], ["y"])], {"big": big}, tmp_path / "nan.onnx")
    line = error_line(quantize_cli("--model", path), "torq-gen-config")
    assert f"{path}: ONNX Runtime quantization failed: " in line and "torq-quant-" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nan.onnx"]


def test_numpy_overflow_is_one_line(tmp_path):
    big = np.full([4], 1e38)
    path = fp32([helper.make_node("Mul", ["x", "big"], ["a"]), helper.make_node("Mul", ["a", "big"], ["y"])],
                {"big": big}, tmp_path / "inf.onnx")
    line = error_line(quantize_cli("--model", path), "torq-gen-config")
    assert str(path) in line and "calibration" in line and "Warning" not in line


def test_ort_runtime_failure_is_one_line(tmp_path):
    path = fp32([helper.make_node("Mod", ["x", "three"], ["y"], fmod=0, name="mod")], {"three": np.full([4], 3)},
                tmp_path / "mod.onnx")
    line = error_line(quantize_cli("--model", path), "torq-gen-config")
    assert "Mod node. Name:'mod'" in line


def test_newline_in_name_quantize(tmp_path):
    w = np.ones([4], np.float32)
    w[1] = np.nan
    path = fp32([helper.make_node("Add", ["x", "w\nbias"], ["y"])], {"w\nbias": w}, tmp_path / "n.onnx")
    assert "initializer 'w\\nbias' contains NaN values" in error_line(quantize_cli("--model", path), "torq-gen-config")


def test_newline_in_name_compile(tmp_path):
    m = qconv()
    conv = nodes(m, "Conv")[0]
    conv.name = "conv\n1"
    set_attr(conv, "group", 0)
    onnx.save(m, tmp_path / "g.onnx")
    assert "node 'conv\\n1' (Conv): attribute 'group' is 0" in error_line(compile_cli(tmp_path / "g.onnx"),
                                                                          "torq-compile")


def test_usage_error_is_one_line():
    assert "--rounding" in error_line(compile_cli("m.onnx", "--rounding", "sloppy"), "torq-compile")
    error_line(compile_cli(), "torq-compile")


@pytest.mark.parametrize("module", ["torq.compile_cli"])
def test_broken_pipe_is_a_clean_exit(module, tmp_path):
    """`torq-compile big.onnx --emit torch_onnx | head -1`: no BrokenPipeError, no message."""
    rng = np.random.default_rng(0)
    from qmodels import conv_model, quantize
    m = quantize(conv_model(rng, 64, 64, 3, 1, 1, [1, 1, 1, 1], 1, True, False, (4, 4)), {"x": [1, 64, 4, 4]})
    onnx.save(m, tmp_path / "wide.onnx")
    p = subprocess.Popen([sys.executable, "-m", module, str(tmp_path / "wide.onnx"), "--emit", "torch_onnx"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 0 and err == ""


_HAND_MADE = re.compile(r"""["']\s?["']\.join\(str\(e\)\.split\(\)\)|str\(e\)\.splitlines\(\)\[""")


def test_one_line_text_has_one_home():
    """Error text is made one line by `errors.one_line` only (a hand-written copy drifts: no
    "...", an IndexError on an empty message, a list printed as text)."""
    src = Path(torq.__file__).parent
    bad = [f"{p.relative_to(src)}:{i}" for p in src.rglob("*.py") if p.name != "errors.py"
           for i, line in enumerate(p.read_text().splitlines(), 1) if _HAND_MADE.search(line)]
    assert not bad
    assert _HAND_MADE.search("""raise X(f"{' '.join(str(e).split())[:200]}")""")   # the scan can fail
    assert _HAND_MADE.search("""f"{str(e).splitlines()[0]}" """)


def test_an_initializer_whose_data_does_not_fit_its_dims_is_one_line(tmp_path):
    """onnx.checker does not compare raw data with dims (fuzz: a bias of 4 values declared [1]
    reached a reshape in the compiler front end as an internal error)."""
    m = qconv()
    b = next(t for t in m.graph.initializer if t.name == "b_quantized")
    b.dims[0] = 1
    onnx.save(m, tmp_path / "dims.onnx")
    line = error_line(compile_cli(tmp_path / "dims.onnx", "--verify-against-ort"), "torq-compile")
    assert "initializer 'b_quantized' cannot be decoded (dims [1])" in line


def test_ort_failing_in_an_fp32_step_names_the_model_and_the_step():
    """recipe._step: ONNX Runtime's own error inside fold / CLE / bias correction is one line
    naming the model and that step; an error of ours stays an internal error (not the model's)."""
    import onnxruntime as ort
    from torq.errors import TorqError
    from torq.quantize.recipe import _step
    with pytest.raises(TorqError) as e:
        with _step("fold (constants, shapes, Pad/BatchNorm into Conv)", "m.onnx"):
            ort.InferenceSession(b"not a model", providers=["CPUExecutionProvider"])
    assert str(e.value).startswith("m.onnx: fold failed: ") and "\n" not in str(e.value)
    with pytest.raises(ZeroDivisionError):
        with _step("bias correction", "m.onnx"):
            1 / 0


def test_inconsistent_shapes_are_one_line_in_quantize(tmp_path):
    from robustness.fuzz import seeds
    m = seeds()["cnn"][0]
    set_attr(nodes(m, "MaxPool")[0], "kernel_shape", [2, 5])
    onnx.save(m, tmp_path / "pool.onnx")
    line = error_line(quantize_cli("--model", tmp_path / "pool.onnx", "-o", tmp_path / "q.onnx"), "torq-gen-config")
    assert "the graph's shapes do not agree at node 'fc' (Gemm)" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pool.onnx"]
