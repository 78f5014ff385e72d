"""--jobs workers: a model they cannot compile is the parent's one-line error, not a hang."""
import types

import numpy as np
import pytest

from torq.errors import TorqError
from torq.evaluate import parallel


def test_worker_compile_error_reaches_the_parent():
    with pytest.raises(TorqError) as e:
        parallel._start_pool(b"this is not an ONNX model", 4, 2)
    assert "\n" not in str(e.value).strip() and str(e.value)


def test_jobs_below_one_is_an_error():
    class Model:
        def SerializeToString(self):
            return b""
    opts = types.SimpleNamespace(ray=None, jobs=0, batch=1)
    with pytest.raises(TorqError, match="--jobs 0 must be at least 1"):
        parallel.nss_outputs(Model(), opts, iter([(0, np.zeros((1, 1), np.int8))]))
