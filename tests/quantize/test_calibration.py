"""Synthetic calibration samples are drawn once per input shape, and stay the documented sequence."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from torq.quantize.calibration import SyntheticDataReader


def _relu(name: str, shape):
    g = helper.make_graph([helper.make_node("Relu", [name], ["y"])], "g",
                          [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(g)


def _all(reader):
    out = []
    while (s := reader.get_next()) is not None:
        out.append(s)
    return out


def test_samples_are_the_default_rng_sequence_whatever_the_input_name():
    rng = np.random.default_rng(0)
    expected = [(rng.random((1, 3, 4, 4)).astype(np.float32) * 2.0 - 1.0).astype(np.float32) for _ in range(5)]
    a = _all(SyntheticDataReader(_relu("x", [1, 3, 4, 4]), num_samples=5))
    b = _all(SyntheticDataReader(_relu("other", [1, 3, 4, 4]), num_samples=5))   # served from the cache
    for e, sa, sb in zip(expected, a, b, strict=True):
        assert np.array_equal(sa["x"], e) and np.array_equal(sb["other"], e)
    assert a[0]["x"] is b[0]["other"]


def test_reset_replays_and_cached_samples_are_read_only():
    r = SyntheticDataReader(_relu("x", [1, 2, 3, 3]), num_samples=3)
    first = _all(r)
    r.rewind()
    assert all(np.array_equal(p["x"], q["x"]) for p, q in zip(first, _all(r), strict=True))
    with pytest.raises(ValueError):
        first[0]["x"][...] = 0      # a consumer may not alter what the next layer is calibrated with
