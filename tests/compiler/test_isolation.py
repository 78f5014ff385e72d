"""The isolated child sends back only locations + linalg bytecode; stage texts print on request."""
from __future__ import annotations

from robustness.mutants import qconv
from torq.compiler import importer, isolation
from torq.compiler import compile as compile_model


def test_child_payload_has_no_stage_texts():
    assert isolation.enabled()
    imported = importer.import_onnx(qconv())
    assert imported.text is None and imported.bytecode and imported.operator_locations
    assert imported.source is not None          # what re-derives the texts on request


def test_stage_texts_are_printed_only_when_read(monkeypatch):
    compiled = compile_model(qconv())
    calls = []
    real = isolation.run_isolated
    monkeypatch.setattr(isolation, "run_isolated", lambda fn, m: calls.append(fn) or real(fn, m))
    linalg = compiled.ir("linalg")               # from the bytecode, in this process
    assert "linalg." in linalg and not calls
    torch_onnx, torch = compiled.ir("torch_onnx"), compiled.ir("torch")
    assert len(calls) == 1                       # one child re-derives both texts
    assert 'torch.operator "onnx.' in torch_onnx and "torch.aten." in torch
    assert compiled.ir("torch_onnx") is torch_onnx and len(calls) == 1   # cached


def test_stage_texts_mapping_resolves_callables_once():
    texts = importer.StageTexts()
    n = []
    texts["a"] = lambda: n.append(1) or "text"
    texts["b"] = "plain"
    assert len(n) == 0 and list(texts) == ["a", "b"]
    assert dict(texts) == {"a": "text", "b": "plain"} and texts["a"] == "text" and n == [1]
