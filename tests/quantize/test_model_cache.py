"""The whole-model quantization cache (``quantize.model_cache``): quantize, discover and run of one
model with one recipe and one calibration set quantize it once; a hit is the very model a fresh
quantization writes; any change of model, recipe, calibration data or code misses; a damaged entry
is recomputed, never trusted."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from torq.examples import build_example_cnn
from torq.quantize import model_cache
from torq.quantize.recipe import apply, preset

GPTQ = preset("gptq").replace(num_calib=8)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORQ_QUANTIZE_CACHE", "on")
    monkeypatch.setenv("TORQ_GEN_CONFIG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(model_cache, "stats", {"hits": 0, "misses": 0, "writes": 0})
    return tmp_path / "cache" / "quantized"


def _bytes(recipe, model, **kw) -> bytes:
    return apply(recipe, model, **kw).model.SerializeToString()


def _entries(folder):
    return sorted(folder.glob("*.onnx")) if folder.exists() else []


def test_a_hit_is_the_model_a_fresh_quantization_writes(cache):
    fp32 = build_example_cnn()
    fresh = _bytes(GPTQ, fp32, cache=False)
    assert not _entries(cache)
    first = _bytes(GPTQ, fp32)
    assert model_cache.stats == {"hits": 0, "misses": 1, "writes": 1} and len(_entries(cache)) == 1
    second = _bytes(GPTQ, fp32)
    assert model_cache.stats["hits"] == 1
    assert first == fresh and second == fresh


def test_any_change_of_model_recipe_or_data_misses(cache, tmp_path):
    fp32 = build_example_cnn()
    _bytes(GPTQ, fp32)
    other = onnx.ModelProto()
    other.CopyFrom(fp32)
    w = next(t for t in other.graph.initializer if numpy_helper.to_array(t).ndim == 4)
    a = numpy_helper.to_array(w).copy()
    a.flat[0] += 0.01
    w.CopyFrom(numpy_helper.from_array(a, w.name))
    name, shape = fp32.graph.input[0].name, [d.dim_value for d in fp32.graph.input[0].type.tensor_type.shape.dim]
    data = tmp_path / "calib.npz"
    np.savez(data, **{name: np.random.default_rng(3).uniform(-1, 1, (8, *shape[1:])).astype(np.float32)})
    for recipe, model in ((GPTQ, other),                                   # one weight moved
                          (GPTQ.replace(num_calib=7), fp32),               # the recipe (and so the samples)
                          (GPTQ.replace(per_channel=False), fp32),         # the recipe only
                          (GPTQ.replace(calibration_data=str(data)), fp32)):   # the calibration data
        before = model_cache.stats["misses"]
        _bytes(recipe, model)
        assert model_cache.stats["misses"] == before + 1, recipe.describe()
    assert model_cache.stats["hits"] == 0 and len(_entries(cache)) == 5
    np.savez(data, **{name: np.random.default_rng(4).uniform(-1, 1, (8, *shape[1:])).astype(np.float32)})
    _bytes(GPTQ.replace(calibration_data=str(data)), fp32)                 # same path, other content
    assert model_cache.stats["hits"] == 0 and len(_entries(cache)) == 6


def test_a_change_of_the_code_misses(cache, monkeypatch):
    fp32 = build_example_cnn()
    _bytes(GPTQ, fp32)
    monkeypatch.setattr(model_cache, "_code", "another torq")
    _bytes(GPTQ, fp32)
    assert model_cache.stats == {"hits": 0, "misses": 2, "writes": 2}


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "other key", "garbage", "valid header, not onnx"])
def test_a_damaged_entry_is_recomputed_not_trusted(cache, damage):
    import hashlib
    fp32 = build_example_cnn()
    fresh = _bytes(GPTQ, fp32)
    (entry,) = _entries(cache)
    data = entry.read_bytes()
    head, _, body = data.partition(b"\n")
    if damage == "flip a byte":
        i = len(data) - 100
        data = data[:i] + bytes([data[i] ^ 1]) + data[i + 1:]
    elif damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "other key":
        data = data.replace(entry.stem.encode(), b"0" * 64, 1)
    elif damage == "garbage":
        data = b"\x00" * 1000
    else:
        junk = b"\x08\x07" * 50
        data = b" ".join(head.split(b" ")[:3] + [str(len(junk)).encode(), hashlib.sha256(junk).hexdigest().encode()]
                         ) + b"\n" + junk
    entry.write_bytes(data)
    assert model_cache.get(entry.stem) is None
    again = _bytes(GPTQ, fp32)
    assert again == fresh and model_cache.stats["hits"] == 0
    assert model_cache.get(entry.stem) is not None          # rewritten whole


def test_recompute_and_off(cache, monkeypatch):
    fp32 = build_example_cnn()
    _bytes(GPTQ, fp32)
    with model_cache.recomputing():
        _bytes(GPTQ, fp32)
    assert model_cache.stats == {"hits": 0, "misses": 2, "writes": 2}
    monkeypatch.setenv("TORQ_QUANTIZE_CACHE", "off")
    _bytes(GPTQ.replace(num_calib=5), fp32)
    assert model_cache.stats["misses"] == 2 and len(_entries(cache)) == 1


def test_the_folder_is_bounded_least_recently_used_first(cache, monkeypatch):
    import os
    fp32 = build_example_cnn()
    _bytes(GPTQ, fp32)
    (first,) = _entries(cache)
    size = first.stat().st_size
    os.utime(first, (1, 1))                                   # long unused
    monkeypatch.setenv("TORQ_QUANTIZE_CACHE_MB", str(2.5 * size / (1 << 20)))
    _bytes(GPTQ.replace(num_calib=7), fp32)
    assert len(_entries(cache)) == 2
    _bytes(GPTQ.replace(num_calib=6), fp32)
    left = _entries(cache)
    assert len(left) == 2 and first not in left
    assert sum(p.stat().st_size for p in left) <= 2.5 * size


def test_quantize_discover_and_run_quantize_once(cache, tmp_path, monkeypatch, capsys):
    """The CLI's three commands: the whole model is quantized by `quantize`; `discover --quantize`
    and `run --quantize` take it from the cache (and write the same map / same model)."""
    from torq.gen_config.cli import main
    monkeypatch.setenv("TORQ_PROGRESS", "plain")
    model = tmp_path / "cnn.onnx"
    onnx.save(build_example_cnn(), str(model))
    flags = ["--num-calib", "8"]
    assert main(["quantize", "--model", str(model), "-o", str(tmp_path / "q.onnx"), *flags]) == 0
    assert model_cache.stats == {"hits": 0, "misses": 1, "writes": 1}
    out = tmp_path / "out"
    assert main(["discover", "--model", str(model), "--output-dir", str(out), "--quantize", *flags,
                 "--skip-mode"]) == 0
    assert main(["run", "--model", str(model), "--output-dir", str(out), "--quantize", *flags]) == 0
    assert model_cache.stats["hits"] == 2 and model_cache.stats["writes"] == 1
    assert "whole-model quantization from the cache" in capsys.readouterr().err
    assert main(["run", "--model", str(model), "--output-dir", str(out), "--quantize", *flags,
                 "--recompute-cache"]) == 0
    assert model_cache.stats["hits"] == 2 and model_cache.stats["writes"] == 2


def test_precision_auto_measures_once(cache, tmp_path, monkeypatch):
    """``--precision auto`` (the default ``mixed``) is cached whole: the second apply neither
    measures sensitivity nor chooses, and gives the same model and the same resolved recipe; other
    calibration samples miss."""
    from torq.quantize import auto_precision
    fp32 = build_example_cnn()
    name, shape = fp32.graph.input[0].name, [d.dim_value for d in fp32.graph.input[0].type.tensor_type.shape.dim]

    def data(seed):
        path = tmp_path / f"calib{seed}.npz"
        np.savez(path, **{name: np.random.default_rng(seed).uniform(-1, 1, (9, *shape[1:])).astype(np.float32)})
        return str(path)
    mixed = preset("mixed").replace(num_calib=9, int16_macs=40.0, calibration_data=data(1))
    first = apply(mixed, fp32)
    assert any(p == "int16" for _, p in first.recipe.precision), first.recipe.precision
    monkeypatch.setattr(auto_precision, "choose", lambda *a, **k: pytest.fail("measured again"))
    again = apply(mixed, fp32)
    assert again.model.SerializeToString() == first.model.SerializeToString() and again.recipe == first.recipe
    with pytest.raises(pytest.fail.Exception, match="measured again"):
        apply(mixed.replace(calibration_data=data(2)), fp32)
