"""The cache holds results, not accidents (audit 3: B2, B12, B13, B14, B31).

A two-layer model (Conv on the NSS, Hardmax, which has no NSS pattern, on CSS/HOST through IREE) is discovered once as the
reference; then every kind of cache damage the audit tried must give the reference report again
(recomputed, counted as computed, never as a cache hit), and a failure caused by the machine
must stop discover in one line without leaving a verdict behind.
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from torq.gen_config.cli import main

Q = ["--quantize", "--full-integer"]


def cli(*argv) -> int:
    return main([str(a) for a in argv])


def tiny(path, op="Hardmax"):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="c"),
             helper.make_node(op, ["c"], ["y"], axis=1, name="s")]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [numpy_helper.from_array(rng.normal(0, .3, (4, 4, 3, 3)).astype(np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """(model, the cache of a clean discover, its report's ops)."""
    root = tmp_path_factory.mktemp("ref")
    model, cache = tiny(root / "tiny.onnx"), root / "cache"
    os.environ["TORQ_GEN_CONFIG_CACHE_DIR"] = str(cache)
    try:
        assert cli("discover", "--model", model, "--output-dir", root / "out", *Q) == 0
    finally:
        os.environ.pop("TORQ_GEN_CONFIG_CACHE_DIR")
    ops = json.loads((root / "out" / "torq_gen_config_tiny.json").read_text())["ops"]
    assert ops["Hardmax_y"]["executors"]["css"]["status"] == "success"
    return model, cache, ops


@pytest.fixture()
def cache(reference, tmp_path, monkeypatch):
    """A private copy of the reference cache."""
    shutil.copytree(reference[1], tmp_path / "cache")
    monkeypatch.setenv("TORQ_GEN_CONFIG_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def rediscover(reference, tmp_path, *flags):
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    code = cli("discover", "--model", reference[0], "--output-dir", out, *Q, *flags)
    r = json.loads((out / "torq_gen_config_tiny.json").read_text())
    return code, r["ops"], r["discovery_report"]["summary"]


def test_an_island_result_is_a_cache_hit(tmp_path, monkeypatch):
    """A Softmax in an int8 model is a bf16 island on the NSS: its result records the island's LSB
    tolerance beside the requested one, and is still the requested tolerance's cache hit."""
    model = tiny(tmp_path / "tiny.onnx", "Softmax")
    monkeypatch.setenv("TORQ_GEN_CONFIG_CACHE_DIR", str(tmp_path / "cache"))
    for i, (hits, computed) in enumerate([(0, 2), (6, 0)]):
        assert cli("discover", "--model", model, "--output-dir", tmp_path / f"o{i}", *Q) == 0
        r = json.loads((tmp_path / f"o{i}" / "torq_gen_config_tiny.json").read_text())
        assert r["ops"]["Softmax_y"]["executors"]["nss"]["status"] == "success"
        summary = r["discovery_report"]["summary"]
        assert (summary["from_cache"], summary["computed"]) == (hits, computed)


@pytest.mark.parametrize("damage", ["[]", '"hello"', "42", "null", "{}", '{"status": "bogus"}', "half",
                                    "bytes", "unsealed-error", "no-tolerance", "max_diff-str"])
def test_damaged_results_are_recomputed(reference, cache, tmp_path, damage):        # B13, B14, B31
    files = sorted((cache / "results").rglob("*.json"))
    assert len(files) == 6
    for f in files:
        entry = json.loads(f.read_text())
        body = entry["body"]
        text = {"half": f.read_text()[: len(f.read_text()) // 2],
                "bytes": f.read_text()[:40] + "\x00\x17\xff!#" + f.read_text()[45:],
                "unsealed-error": json.dumps({"status": "error", "tolerance_used": body["tolerance_used"],
                                              "failure_report": {"summary": "x", "reason_code": "no_pattern"}}),
                "no-tolerance": json.dumps(dict(entry, body={"status": "success"})),
                "max_diff-str": json.dumps(dict(entry, body=dict(body, max_diff="big")))}.get(damage, damage)
        f.write_text(text)
    code, ops, summary = rediscover(reference, tmp_path)
    assert ops == reference[2] and code == 0
    assert summary["from_cache"] == 0 and summary["computed"] == 2
    code, ops, summary = rediscover(reference, tmp_path)                    # and rewritten
    assert summary["from_cache"] == 6 and summary["computed"] == 0


@pytest.mark.parametrize("damage", ["[]", "[1, 2, 3]", "null", "first", "rotated", "garbage"])
def test_damaged_layer_maps_are_recomputed(reference, cache, tmp_path, damage):     # B12, B13
    (f,) = (cache / "maps").glob("*.json")
    entry = json.loads(f.read_text())
    places = entry["body"]
    f.write_text({"first": json.dumps(dict(entry, body=places[:1])),
                  "rotated": json.dumps(dict(entry, body=places[1:] + places[:1])),
                  "garbage": "\x00garbage"}.get(damage, damage))
    code, ops, _ = rediscover(reference, tmp_path)
    assert code == 0 and ops == reference[2]


@pytest.mark.parametrize("damage", ["truncated", "garbage", "zeroed", "swapped"])
def test_damaged_iree_modules_are_rebuilt(reference, cache, tmp_path, damage):      # B14
    shutil.rmtree(cache / "results")
    modules = sorted((cache / "iree").glob("*.vmfb"))
    assert len(modules) >= 2
    if damage == "swapped":                  # each intact, each under the other's key
        a, b = modules[0].read_bytes(), modules[1].read_bytes()
        modules[0].write_bytes(b)
        modules[1].write_bytes(a)
    for m in modules if damage != "swapped" else []:
        data = m.read_bytes()
        m.write_bytes({"truncated": data[:1000], "garbage": os.urandom(len(data)),
                       "zeroed": bytes(len(data))}[damage])
    code, ops, _ = rediscover(reference, tmp_path)
    assert code == 0 and ops == reference[2]
    assert all(m.read_bytes() != bytes(len(m.read_bytes())) for m in modules)


def test_an_unwritable_cache_only_costs_speed(reference, cache, tmp_path):           # B2
    shutil.rmtree(cache / "iree")
    shutil.rmtree(cache / "results")
    (cache / "iree").write_text("a file where the module folder should be")
    code, ops, _ = rediscover(reference, tmp_path)
    assert code == 0 and ops == reference[2]


def test_a_broken_temp_folder_stops_discover_and_caches_nothing_false(reference, cache, tmp_path,
                                                                     monkeypatch, capsys):  # B2
    shutil.rmtree(cache / "iree")
    shutil.rmtree(cache / "results")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "no-such-folder"))
    assert cli("discover", "--model", reference[0], "--output-dir", tmp_path / "o", *Q) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "TMPDIR" in err and "nothing was cached" in err
    monkeypatch.delenv("TMPDIR")
    code, ops, _ = rediscover(reference, tmp_path)
    assert code == 0 and ops == reference[2]


@pytest.fixture()
def full_disk(tmp_path):
    """A 48 KiB tmpfs, filled (needs the right to mount: root in a container; else skipped)."""
    import subprocess
    d = tmp_path / "full"
    d.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(d)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (d / "fill").write_bytes(bytes(40 << 10))
        yield d
    finally:
        subprocess.run(["umount", str(d)], capture_output=True)


@pytest.mark.parametrize("where", ["output", "cache", "TMPDIR"])
def test_a_full_disk_is_one_line_and_caches_nothing(reference, cache, tmp_path, monkeypatch, capsys,
                                                    full_disk, where):           # B2, B30
    shutil.rmtree(cache / "iree")
    shutil.rmtree(cache / "results")
    out = full_disk if where == "output" else tmp_path / "o"
    if where == "cache":
        monkeypatch.setenv("TORQ_GEN_CONFIG_CACHE_DIR", str(full_disk))
    if where == "TMPDIR":
        monkeypatch.setenv("TMPDIR", str(full_disk))
    assert cli("discover", "--model", reference[0], "--output-dir", out, *Q) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and ("No space left" in err or "MiB free" in err), err
    monkeypatch.setenv("TORQ_GEN_CONFIG_CACHE_DIR", str(cache))
    monkeypatch.delenv("TMPDIR", raising=False)
    code, ops, _ = rediscover(reference, tmp_path)
    assert code == 0 and ops == reference[2]
