"""``--precision auto``'s sensitivity streams the calibration samples in chunks
(``sensitivity.chunks``): each layer's KL and SQNR are running sums, so any chunking gives the
one-batch pass's figures up to float summation order, and the ranges are the whole set's.

The models here take a dynamic batch, so a chunk runs as one batch. Chunks of one sample are left
out of the equality: ORT computes a one-row Gemm with another kernel, whose float32 logits differ
in the last bits from the same row in a batch (the pass is the same; ORT's arithmetic is not).
"""
from __future__ import annotations

import onnx
import pytest

from torq.examples import build_cnn20, build_example_cnn
from torq.quantize import memory_bound, sensitivity
from torq.quantize.calibration import SyntheticDataReader
from torq.quantize.precision import name_nodes
from torq.quantize.sensitivity import batched, samples_of

N = 13


def _dynamic_batch(m: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(name_nodes(m))
    del out.graph.value_info[:]
    for v in [*out.graph.input, *out.graph.output]:
        v.type.tensor_type.shape.dim[0].dim_param = "N"
    return onnx.shape_inference.infer_shapes(out)


@pytest.fixture(scope="module", params=["cnn", "cnn20"])
def case(request):
    m = _dynamic_batch({"cnn": build_example_cnn, "cnn20": build_cnn20}[request.param]())
    samples = samples_of(SyntheticDataReader(m, N))
    assert len(batched(m, samples)) == 1                 # one chunk = one batch of every sample
    return m, samples, sensitivity._measure(m, samples, at_once=N)


def _rank(sens):
    return [s.name for s in sorted(sens, key=lambda s: -s.kl / max(s.macs, 1))]


def _same(a, b) -> bool:
    """The same figures to 1e-9 relative and the same ranking."""
    return ([s.name for s in a] == [s.name for s in b] and _rank(a) == _rank(b)
            and [s.kl for s in a] == pytest.approx([s.kl for s in b], rel=1e-9, abs=0)
            and [s.sqnr_db for s in a] == pytest.approx([s.sqnr_db for s in b], rel=1e-9, abs=0))


@pytest.mark.parametrize("at_once, sizes", [(3, [2, 3, 2, 3, 3]), (5, [4, 4, 5]), (7, [6, 7])])
def test_chunked_figures_are_the_one_batch_figures(case, at_once, sizes, monkeypatch):
    m, samples, one = case
    assert [len(p) for p in sensitivity.chunks(m, samples, at_once)] == sizes
    assert max(s.kl for s in one) > 0
    run, rows = sensitivity._run, []

    def counting(model, outputs, batches, optimize=True):
        rows.extend(len(next(iter(b.values()))) for b in batches)
        return run(model, outputs, batches, optimize)
    monkeypatch.setattr(sensitivity, "_run", counting)
    got = sensitivity._measure(m, samples, at_once=at_once)
    assert max(rows) == max(sizes)                       # no ORT run saw more than a chunk
    assert _same(got, one)


def test_a_chunk_counted_twice_is_caught(case, monkeypatch):
    m, samples, one = case
    add = sensitivity._Error.add

    def first_twice(self, reference, got):
        if self.rows == 0:
            add(self, reference, got)
        add(self, reference, got)
    monkeypatch.setattr(sensitivity._Error, "add", first_twice)
    assert not _same(sensitivity._measure(m, samples, at_once=5), one)


def test_ranges_of_the_first_chunk_only_are_caught(case, monkeypatch):
    m, samples, one = case
    ranges = sensitivity._ranges
    monkeypatch.setattr(sensitivity, "_ranges", lambda model, tensors, parts: ranges(model, tensors, parts[:1]))
    assert not _same(sensitivity._measure(m, samples, at_once=5), one)


def test_the_default_chunk_is_what_memory_allows(case, monkeypatch):
    """``samples_at_once``: as many samples' tensors as fit beside every sample's inputs and within
    ``CHUNK_BYTES``, at least one; the chunks evened out; the figures do not move."""
    m, samples, one = case
    inputs, per_sample = memory_bound.sample_bytes(m)
    monkeypatch.setattr(memory_bound, "CHUNK_BYTES", 6 * per_sample)
    assert memory_bound.samples_at_once(m, N) == 6
    assert [len(p) for p in sensitivity.chunks(m, samples)] == [4, 4, 5]     # 13 at 6: not 6, 6, 1
    assert _same(sensitivity._measure(m, samples), one)
    monkeypatch.setattr(memory_bound, "available_bytes", lambda: int((N * inputs + per_sample // 2) / 0.6))
    assert memory_bound.samples_at_once(m, N) == 1                        # not even one fits: one
    monkeypatch.setattr(memory_bound, "available_bytes", lambda: 1 << 40)
    monkeypatch.setattr(memory_bound, "CHUNK_BYTES", 1 << 40)
    assert memory_bound.samples_at_once(m, N) == N


@pytest.mark.parametrize("opset", [17, 18])          # ReduceMin/Max take their axes as an input from 18
def test_ranges_reduced_in_the_graph_are_numpys(opset):
    """``_ranges`` reduces each tensor in ORT's graph, chunk by chunk: the same min and max as the
    tensors fetched and reduced by numpy over every sample."""
    from torq.quantize.calibration import probe_session
    m = onnx.ModelProto()
    m.CopyFrom(_dynamic_batch(build_example_cnn()))
    m.opset_import[0].version = opset
    samples = samples_of(SyntheticDataReader(m, 5))
    tensors = [t for _, t in sensitivity._layer_tensors(m)]
    got = sensitivity._ranges(m, tensors, sensitivity.chunks(m, samples, 2))
    values = [probe_session(m, tensors).run(tensors, s) for s in samples]
    assert got == {t: (min(float(v[i].min()) for v in values), max(float(v[i].max()) for v in values))
                   for i, t in enumerate(tensors)}
