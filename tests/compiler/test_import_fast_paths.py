"""The compile-time shortcuts keep every output: same linalg, same attributes, same Program.

- torch-onnx -> torch skips torch-mlir's shape refinement when every tensor type is static
  (`importer.STATIC_TORCH_PIPELINE`) and falls back to the full pipeline otherwise;
- torq_hl attribute values recorded while lowering are what the IR holds;
- no torq_hl op costs a failed Python import (the bindings' dialect-module lookup);
- per-channel multipliers search one shift (the largest scale's) instead of one per channel.
"""
from __future__ import annotations

import contextlib
import math
import re
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from qmodels import conv_relu_pool_model, model, quantize, reshape_subgraph_model
from torq.compiler import importer, lowering, pipeline, torq_hl
from torq.compiler import linalg_view as L
from torq.compiler.frontend.canonicalize import canonicalize


def _batchnorm_after_concat():
    """Conv -> Concat -> BatchNormalization -> Conv (DenseNet's shape): a per-channel table."""
    rng = np.random.default_rng(3)
    n = helper.make_node
    m = model([n("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
               n("Concat", ["c0", "c0"], ["cc"], axis=1),
               n("BatchNormalization", ["cc", "bs", "bb", "bm", "bv"], ["z"]),
               n("Conv", ["z", "w1"], ["y"])],
              [("x", [1, 3, 6, 6])], ["y"],
              {"w0": rng.normal(0, 0.3, (4, 3, 3, 3)), "w1": rng.normal(0, 0.3, (8, 8, 1, 1)),
               "bs": rng.uniform(0.5, 2, 8), "bb": rng.normal(0, 0.3, 8), "bm": rng.normal(0, 0.3, 8),
               "bv": rng.uniform(0.3, 2, 8)})
    return quantize(m, {"x": [1, 3, 6, 6]}, per_channel=True)


MODELS = {
    "conv-relu-pool per-channel": lambda: quantize(conv_relu_pool_model(), {"x": [1, 3, 8, 8]}, per_channel=True),
    "conv-relu-pool qoperator": lambda: quantize(conv_relu_pool_model(), {"x": [1, 3, 8, 8]}, fmt="qop",
                                                 full_integer=False),
    "batchnorm after concat": _batchnorm_after_concat,
    "reshape from Shape/Gather/Concat": lambda: quantize(reshape_subgraph_model(), {"x": [2, 3, 4, 4]}),
}


def _prepared(m):
    """The ONNX model as `torq.compile` hands it to the importer (the shipped front end)."""
    return pipeline.front_end(m)[0]


def _linalg(imported, torch_pipeline: str | None) -> str:
    module = importer.fresh_module(imported)
    if torch_pipeline is None:
        module = importer._to_torch(module, imported)
    else:
        importer.run_pipeline(module, torch_pipeline, "torch")
    importer.run_pipeline(module, importer.LINALG_PIPELINE, "linalg")
    importer.run_pipeline(module, importer.CLEANUP_PIPELINE, "cleanup")
    return module.operation.get_asm()


@pytest.mark.parametrize("name", list(MODELS))
def test_static_pipeline_gives_the_full_pipelines_linalg(name):
    imported = importer.import_in_process(_prepared(MODELS[name]()))
    assert not importer._NOT_STATIC_RE.search(imported.text)          # the shortcut applies ...
    assert _linalg(imported, None) == _linalg(imported, importer.TORCH_PIPELINE)   # ... changes nothing


@pytest.mark.parametrize("name", list(MODELS))
def test_fresh_module_is_the_import_at_its_text_positions(name):
    """The ops text parsed + the imported attributes == the imported module, weights included,
    and every op sits at its LINE:COL of the full text (the compiler JSON's keys)."""
    imported = importer.import_in_process(_prepared(MODELS[name]()))
    full = imported.module.operation.get_asm(large_elements_limit=None)
    assert "dialect_resources" in full and "dialect_resources" not in imported.text
    fresh = importer.fresh_module(imported)
    assert fresh.operation.get_asm(large_elements_limit=None) == full
    lines = full.splitlines()
    operators = [op for op in importer._all_ops(fresh) if op.name == "torch.operator"]
    for op in operators:
        line, col = map(int, re.search(r":(\d+):(\d+)", str(op.location)).groups())
        assert lines[line - 1][col - 1:].startswith('torch.operator "onnx.'), (line, col)
    assert [(t, loc) for t, loc in imported.operator_locations] == \
        [(str(op.attributes["name"]).strip('"')[5:], L.location_key(op)) for op in operators
         if str(op.attributes["name"]) != '"onnx.Constant"']


def _pipelines_run(monkeypatch, imported):
    ran = []
    real = importer.run_pipeline
    monkeypatch.setattr(importer, "run_pipeline", lambda m, p, what: ran.append(p) or real(m, p, what))
    importer._to_torch(importer.fresh_module(imported), imported)
    return ran


def test_dynamic_types_take_the_full_pipeline(monkeypatch):
    m = quantize(reshape_subgraph_model(), {"x": [2, 3, 4, 4]})      # batch "N", not specialised here
    imported = importer.import_in_process(canonicalize(m))
    assert importer._NOT_STATIC_RE.search(imported.text)
    assert _pipelines_run(monkeypatch, imported) == [importer.TORCH_PIPELINE]
    static = importer.import_in_process(_prepared(m))
    assert _pipelines_run(monkeypatch, static)[-1] == importer.STATIC_TORCH_PIPELINE


def _torch_func(neg_input: str) -> str:
    """%0 has a non-static type; %1 reads `neg_input` and is returned."""
    t, q = "!torch.vtensor<[4],f32>", "!torch.vtensor<[?],f32>"
    return (f"func.func @f(%a: {t}) -> {t} {{\n"
            f"  %0 = torch.aten.neg %a : {t} -> {q}\n"
            f"  %1 = torch.aten.neg {neg_input} : {t if neg_input == '%a' else q} -> {t}\n"
            f"  return %1 : {t}\n}}")


def test_a_live_unrefined_value_is_found():
    """The short pipeline's result is kept only if no op reads a tensor of non-static type."""
    assert not importer._reads_unrefined(importer.parse(_torch_func("%a")))   # %0 unused: dropped later
    assert importer._reads_unrefined(importer.parse(_torch_func("%0")))


def _lowered(m, record: bool):
    module = importer.lower_to_linalg(importer.import_onnx(_prepared(m)))
    if not record:
        return module, None, lowering.lower(module)
    with torq_hl.recording() as recorded:
        report = lowering.lower(module)
    return module, recorded, report


def test_recorded_attributes_are_what_the_ir_holds():
    module, recorded, report = _lowered(_batchnorm_after_concat(), True)
    assert report.unsupported == [] and report.lowered.get("table")
    ops = [op for op in lowering.func_ops(module) if op.name.startswith("torq_hl.")]
    assert ops and all(op in recorded for op in ops)
    for op in ops:
        fast, slow = torq_hl.op_attrs(op, recorded), torq_hl.op_attrs(op)
        assert fast.keys() == slow.keys()
        for k in slow:
            assert type(fast[k]) is type(slow[k]) and np.array_equal(fast[k], slow[k]), (op.name, k)
            if isinstance(slow[k], np.ndarray):
                assert fast[k].dtype == slow[k].dtype
    tables = [torq_hl.op_attrs(op, recorded)["table"] for op in ops if op.name == "torq_hl.table"]
    assert max(t.size for t in tables) == 8 * 256                 # one 256-entry table per channel


def test_recording_is_ignored_for_another_op():
    """A recorded entry answers only for the op it was made for (same address, other op: read)."""
    module, recorded, _ = _lowered(_batchnorm_after_concat(), True)
    ops = [op for op in lowering.func_ops(module) if op.name.startswith("torq_hl.")]
    table = next(op for op in ops if op.name == "torq_hl.table")
    conv = next(op for op in ops if op.name == "torq_hl.conv2d")
    fake = {table: ("torq_hl.conv2d", torq_hl.op_attrs(conv))}
    assert np.array_equal(torq_hl.op_attrs(table, fake)["table"], torq_hl.op_attrs(table)["table"])


@contextlib.contextmanager
def _module_lookups():
    """Names of every module import attempted inside the block (successful or not)."""
    looked_up = []

    class Spy:
        def find_spec(self, name, path=None, target=None):
            looked_up.append(name)
            return None

    sys.meta_path.insert(0, Spy())
    try:
        yield looked_up
    finally:
        sys.meta_path.pop(0)


def test_lowering_makes_no_failed_dialect_imports():
    """MLIR's bindings look up a Python module for each op's dialect and cache only a success;
    torq_hl's is this package's module, so no op triggers an import attempt."""
    m = _batchnorm_after_concat()
    with _module_lookups() as looked_up:
        _, _, report = _lowered(m, False)
    assert report.lowered                                  # torq_hl ops were made and wrapped
    assert not [n for n in looked_up if n.endswith("torq_hl")], looked_up[:5]


def test_the_spy_sees_a_dialect_without_a_module():
    """Positive control for the test above: an op of a dialect with no Python module (a one-op
    IRDL dialect) is looked up when the bindings wrap it, and the spy sees that lookup."""
    from torch_mlir import ir
    from torch_mlir.dialects import irdl
    ctx = importer.new_context()
    with ctx, ir.Location.unknown():
        irdl.load_dialects(ir.Module.parse(
            "irdl.dialect @torq_probe {\n irdl.operation @nop {\n %0 = irdl.any\n irdl.results(r: %0)\n }\n}"))
        module = ir.Module.parse('func.func @f() -> i8 {\n %0 = "torq_probe.nop"() : () -> i8\n return %0 : i8\n}')
        with _module_lookups() as looked_up:
            names = [op.name for op in lowering.func_ops(module)]
    assert names == ["torq_probe.nop", "func.return"]
    assert [n for n in looked_up if n.endswith("torq_probe")]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.one_of(st.just(0.0), st.floats(1e-12, 3e9, allow_nan=False), st.sampled_from([0.5, 2.0 ** -20])),
                min_size=1, max_size=12))
def test_per_channel_multipliers_match_the_per_channel_definition(scales):
    """One shift search for the largest scale == the smallest of every channel's own shift."""
    from torq.numerics import native
    own = [native.multiplier_and_shift(s) for s in scales if s != 0.0 and s < 2.0 ** 31 - 0.5]
    if len(own) != len([s for s in scales if s != 0.0]):
        with pytest.raises(ValueError):
            native.per_channel_multipliers(scales)
        return
    shift = min((sh for _, sh in own), default=native.ZERO_SCALE_SHIFT)
    expect = [native.llround(math.ldexp(s, shift)) if s else 0 for s in scales]
    mults, got = native.per_channel_multipliers(scales)
    assert got == shift and mults.tolist() == expect
