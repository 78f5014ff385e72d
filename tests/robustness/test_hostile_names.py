"""Names are data (audit 3: B5, B7, B15, B16, B18, B21, B32).

One model whose tensor names are hostile: rich markup (``[/]``), non-ASCII names that sanitise
alike (``α``, ``β``), a quote and 300 characters. Discover must test every layer truly (CSS and
HOST succeed on the Hardmax layers, which have no NSS pattern), write one distinct repro bundle and
IR set per layer inside the chosen folders, and view / view --html must show the names as text.
"""
from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from torq.fileio import inside, safe_name
from torq.errors import TorqError
from torq.gen_config.cli import main

Q = ["--quantize", "--full-integer"]
LONG = 'q"' + "r" * 300


def cli(*argv) -> int:
    return main([str(a) for a in argv])


def hostile(path):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["[/]"], kernel_shape=[1, 1], name="conv"),
             helper.make_node("Hardmax", ["[/]"], ["α"], axis=1, name="s1"),
             helper.make_node("Hardmax", ["α"], ["β"], axis=1, name="s2"),
             helper.make_node("Hardmax", ["β"], [LONG], axis=1, name="s3")]
    g = helper.make_graph(nodes, "../../../escaped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4])],
                          [helper.make_tensor_value_info(LONG, TensorProto.FLOAT, [1, 4, 4, 4])],
                          [numpy_helper.from_array(rng.normal(0, .5, (4, 4, 1, 1)).astype(np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


@pytest.fixture(scope="module")
def discovered(tmp_path_factory):
    root = tmp_path_factory.mktemp("names")
    os.environ["TORQ_GEN_CONFIG_CACHE_DIR"] = str(root / "cache")
    try:
        model = hostile(root / "h.onnx")
        code = cli("discover", "--model", model, "--output-dir", root / "out", *Q, "--debug-ir", root / "ir",
                   "--repro-dir", root / "repro")
    finally:
        os.environ.pop("TORQ_GEN_CONFIG_CACHE_DIR")
    return root, model, code


def test_every_layer_runs_on_css_and_host(discovered):                      # B7, B15
    root, _, code = discovered
    ops = json.loads((root / "out" / "torq_gen_config_h.json").read_text())["ops"]
    assert code == 0 and len(ops) == 4
    for lid in ("Hardmax_α", "Hardmax_β", f"Hardmax_{LONG}"):
        assert ops[lid]["executors"]["css"]["status"] == "success", ops[lid]
        assert ops[lid]["executors"]["host"]["status"] == "success", ops[lid]


def test_repro_bundles_and_ir_files_are_distinct_and_inside(discovered):     # B5, B15, B18
    root, _, _ = discovered
    bundles = sorted((root / "repro").iterdir())
    assert len(bundles) == 3 and all(len(b.name) <= 80 for b in bundles)
    firsts = {(b / "README.txt").read_text().splitlines()[0] for b in bundles}
    assert firsts == {"# Hardmax_α", "# Hardmax_β", f"# Hardmax_{LONG}"}
    for b in bundles:
        names = [p.name for p in (b / "inputs").iterdir()]
        assert len(names) == 1
    ir = list((root / "ir").iterdir())
    assert all(p.is_file() and len(p.name) < 120 for p in ir)
    assert len({p.name.split(".")[0] for p in ir}) == 4                      # one set per layer
    assert not list(root.parent.glob("*escaped*"))


def test_view_shows_markup_as_text_and_html_escapes(discovered, capsys, tmp_path):   # B16, B21
    root, model, _ = discovered
    assert cli("view", "--model", model, "--output-dir", root / "out") == 0
    assert "[/]" in capsys.readouterr().out
    path = root / "out" / "torq_gen_config_h.json"
    r = json.loads(path.read_text())
    next(iter(r["ops"].values()))["_orig_index"] = "<script>alert(1)</script>"
    r["full_model_metrics"] = {"max_abs_lsb": 3, "lsb_histogram": {"<b>": 4}, "passed": True}
    path.write_text(json.dumps(r))
    assert cli("view", "--model", model, "--output-dir", root / "out", "--html", tmp_path / "v.html") == 0
    page = (tmp_path / "v.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page and "&lt;b&gt;" in page


def test_api_debug_ir_stays_inside(tmp_path):                                # B5
    from torq import compile as torq_compile
    from torq.quantize import quantize
    q = quantize(hostile(tmp_path / "h.onnx"), full_integer=True, num_calib=2)
    for name in ("../../../escaped", "/abs/escaped", "a\0b"):
        q.graph.name = name
        torq_compile(q, debug_ir=tmp_path / "ir")
    assert not list(tmp_path.parent.glob("*escaped*"))
    assert all(p.parent == tmp_path / "ir" for p in (tmp_path / "ir").rglob("*"))


def test_a_planted_symlink_is_not_followed(discovered, tmp_path, capsys):    # B32
    root, model, _ = discovered
    victim = tmp_path / "victim"
    victim.mkdir()
    repro = tmp_path / "repro"
    repro.mkdir()
    os.symlink(victim, repro / safe_name("Hardmax_α"))
    os.environ["TORQ_GEN_CONFIG_CACHE_DIR"] = str(root / "cache")
    try:
        assert cli("discover", "--model", model, "--output-dir", tmp_path / "o", *Q, "--repro-dir", repro) == 2
    finally:
        os.environ.pop("TORQ_GEN_CONFIG_CACHE_DIR")
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "symbolic link" in err
    assert not list(victim.iterdir())


def test_safe_name():
    assert safe_name("Conv_1") == "Conv_1"
    assert safe_name("Hardmax_α") != safe_name("Hardmax_β")
    assert safe_name("a/b") != safe_name("a_b") and "/" not in safe_name("a/b")
    assert len(safe_name("x" * 1000)) <= 80 and safe_name("x" * 1000) != safe_name("x" * 999)
    assert safe_name("..") not in ("..", ".") and safe_name("") != ""
    with pytest.raises(TorqError):
        inside("/tmp", "..")
