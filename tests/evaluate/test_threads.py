"""``evaluate``'s NSS threads: --threads 1 and 2 (and the default) classify every image the same,
and a bad --threads is a one-line error before any work."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from torq import zoo
from torq.evaluate import evaluate
from torq.gen_config.cli import main


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """MobileNetV2 at 32 px (random weights) and 14 random 32x32 RGB images with labels."""
    d = tmp_path_factory.mktemp("threads")
    m = zoo.mobilenet_v2(32)
    for v in (*m.graph.input, *m.graph.output):             # any batch size
        v.type.tensor_type.shape.dim[0].dim_param = "N"
    onnx.save(m, d / "m.onnx")
    rng = np.random.default_rng(0)
    np.savez(d / "eval.npz", x=rng.integers(0, 256, (14, 32, 32, 3), dtype=np.uint8),
             y=rng.integers(0, 1000, 14))
    np.savez(d / "calib.npz", x=rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8), y=np.zeros(6, int))
    return d


def test_threads_do_not_change_any_image(small):
    kw = dict(preprocess="norm=tf", calibration=str(small / "calib.npz"), num_calib=6, batch=5,
              sqnr_images=0, progress=False, equalize=False, bias_correction=False)
    runs = [evaluate(small / "m.onnx", str(small / "eval.npz"), threads=t, **kw) for t in (1, 2, 0)]
    for r in runs[1:]:
        assert np.array_equal(r.top["int8_nss"], runs[0].top["int8_nss"])
        assert r.lsb == runs[0].lsb
    assert (runs[0].top["int8_nss"] >= 0).all() and runs[0].images == 14


def test_bad_threads_is_a_one_line_error(small, capsys):
    code = main(["evaluate", "--model", str(small / "m.onnx"), "--dataset", str(small / "eval.npz"),
                 "--calibration-data", str(small / "calib.npz"), "--threads", "-1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--threads -1 must be at least 0" in err, err
