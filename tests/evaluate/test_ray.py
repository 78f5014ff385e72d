"""``evaluate --ray``: a local Ray instance with 2 workers, one of which dies mid-run.

Per-image results must equal the single-process run: the dead worker's batch is retried, none
is lost and none counted twice."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from torq.evaluate import evaluate

from .fmnist_probe import TEST, TRAIN

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def local_ray(tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'torq[ray]')")
    marker = tmp_path / "worker-died"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"TORQ_RAY_DIE_ONCE": str(marker), "PYTHONPATH": str(SRC)}})
    try:
        yield marker
    finally:
        ray.shutdown()


def test_ray_matches_single_process_with_a_worker_killed(probe_model, local_ray):
    kw = dict(preprocess="norm=unit", calibration=str(TRAIN), num_calib=16, limit=40, batch=4,
              sqnr_images=0, progress=False)
    single = evaluate(probe_model, TEST, **kw)
    distributed = evaluate(probe_model, TEST, ray=True, **kw)
    assert local_ray.exists(), "no worker was killed: the fault injection did not run"
    for path in ("fp32", "int8_ort", "int8_nss"):
        assert np.array_equal(single.top[path], distributed.top[path]), path
    assert (distributed.top["int8_nss"] >= 0).all()           # every image got a result
    assert distributed.lsb == single.lsb and sum(distributed.lsb.values()) == 40 * 10
    assert os.environ.get("TORQ_RAY_DIE_ONCE") is None         # only the workers saw the hook
