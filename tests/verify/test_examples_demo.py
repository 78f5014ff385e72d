"""Built-in example models, the demo's quantize step, and the package-level entry points."""
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

from qmodels import rand_input, run
from torq.examples import build_cnn20, build_example_cnn


def test_example_cnn_is_deterministic_valid_and_runs(tmp_path):
    m = build_example_cnn(tmp_path / "e.onnx")
    assert onnx.load(tmp_path / "e.onnx") == m == build_example_cnn()
    onnx.checker.check_model(m, full_check=True)
    assert m.opset_import[0].version == 17
    assert Counter(n.op_type for n in m.graph.node) == Counter(
        Conv=4, Relu=2, Add=1, MaxPool=1, GlobalAveragePool=1, Flatten=1, Gemm=1)
    dw = next(n for n in m.graph.node if n.name == "dwconv")
    assert {a.name: onnx.helper.get_attribute_value(a) for a in dw.attribute}["group"] == 8
    assert run(m, {"input": rand_input((1, 3, 32, 32))})["logits"].shape == (1, 10)


def test_cnn20_has_twenty_convs_and_runs():
    m = build_cnn20()
    assert sum(n.op_type == "Conv" for n in m.graph.node) == 20
    assert m.SerializeToString() == build_cnn20().SerializeToString()
    assert run(m, {"input": rand_input((1, 3, 64, 64))})["logits"].shape == (1, 10)


def test_demo_quantize_step(tmp_path, capsys):
    from torq.demo import quantize_step
    q_path = quantize_step(tmp_path / "out")
    assert q_path == tmp_path / "out" / "example.int8.onnx"
    assert (tmp_path / "out" / "example.onnx").is_file()
    q = onnx.load(q_path)
    assert q.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT8
    out = capsys.readouterr().out
    assert "ops fp32: Conv x4" in out and "input: int8[1,3,32,32]" in out


def test_torq_quantize_is_callable_before_and_after_submodule_import():
    import torq
    import torq.quantize  # noqa: F401 - rebinds torq.quantize to the package
    q = torq.quantize(build_example_cnn(), full_integer=True)
    x = np.zeros((1, 3, 32, 32), np.int8)
    assert run(q, {"input": x})["logits"].dtype == np.int8


def test_console_script_installed():
    exe = shutil.which("torq-gen-config", path=str(Path(sys.executable).parent))
    assert exe, "pip install -e . should install the torq-gen-config console script"
    r = subprocess.run([exe, "quantize", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--full-integer" in r.stdout
