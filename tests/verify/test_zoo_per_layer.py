"""benchmarks/torchvision_zoo.py --per-layer: every layer alone, counted; internal errors told apart."""
from __future__ import annotations

import onnx
import pytest

from quantize.islands_model import island_at_output


@pytest.fixture(scope="module")
def zoo(benchmark_script):
    return benchmark_script("torchvision_zoo.py")


def test_every_layer_of_an_island_model_lowers_alone(zoo, tmp_path, monkeypatch):
    path = tmp_path / "m.onnx"
    onnx.save(island_at_output(), str(path))
    pl = zoo.per_layer(path, "qop", folder=tmp_path)
    assert (pl["layers"], pl["lowered"], pl["exact"], pl["internal"]) == (2, 2, 2, 0)
    # cached by content: a second run tests nothing (a failing check would show otherwise)
    monkeypatch.setattr(zoo, "check_layer", lambda *a: pytest.fail("re-tested a cached layer"))
    assert zoo.per_layer(path, "qop", folder=tmp_path) == pl


def test_an_internal_error_is_counted_as_one(zoo, tmp_path, monkeypatch):
    """Injected fault: compile raising a plain exception is an internal error, not a pass."""
    import torq
    path = tmp_path / "m.onnx"
    onnx.save(island_at_output(), str(path))

    def broken(model, *a, **k):
        raise RuntimeError("injected")
    monkeypatch.setattr(torq, "compile", broken)
    pl = zoo.per_layer(path, "qdq", folder=tmp_path)
    assert (pl["layers"], pl["lowered"], pl["internal"]) == (2, 0, 2)
    assert "RuntimeError" in pl["examples"][0]
    assert zoo.per_layer_cell(pl) == "0/2 (0), 2 INTERNAL"
