"""``discover --ray`` / ``run --ray`` on a local Ray instance with 2 workers, one of which dies.

The reports must equal the local run's: the dead worker's layer is tested again, none is lost,
none tested twice (``computed`` counts each layer once), and every result reaches this
process's cache (a second discover finds them all)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import cli, conv_chain

SRC = Path(__file__).resolve().parents[2] / "src"
QFLAGS = ["--quantize", "--full-integer", "--num-calib", "4"]


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'torq[ray]')")
    marker = tmp_path_factory.mktemp("ray") / "worker-died"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"TORQ_RAY_DIE_ONCE": str(marker), "PYTHONPATH": str(SRC)}})
    try:
        yield marker
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def discovered(tmp_path_factory, local_ray):
    tmp = tmp_path_factory.mktemp("discover")
    model = conv_chain(tmp / "chain3.onnx", middle="Relu")
    assert cli("discover", "--model", model, "--output-dir", tmp / "local", *QFLAGS, "--recompute-cache") == 0
    old = os.environ["TORQ_GEN_CONFIG_CACHE_DIR"]
    os.environ["TORQ_GEN_CONFIG_CACHE_DIR"] = str(tmp / "ray-cache")          # nothing cached: Ray computes
    try:
        assert cli("discover", "--model", model, "--output-dir", tmp / "ray", *QFLAGS, "--ray") == 0
        again = cli("discover", "--model", model, "--output-dir", tmp / "again", *QFLAGS)
    finally:
        os.environ["TORQ_GEN_CONFIG_CACHE_DIR"] = old
    assert again == 0
    return model, tmp, [json.loads((tmp / d / "torq_gen_config_chain3.json").read_text())
                        for d in ("local", "ray", "again")]


def test_discover_ray_matches_local_with_a_worker_killed(discovered, local_ray):
    _, _, (local, ray, again) = discovered
    assert local_ray.exists(), "no worker was killed: the fault injection did not run"
    assert ray["ops"] == local["ops"] and len(ray["ops"]) == 3
    assert ray["discovery_report"]["summary"]["computed"] == 3               # each layer tested once
    assert again["discovery_report"]["summary"]["computed"] == 0             # all in this process's cache
    assert os.environ.get("TORQ_RAY_DIE_ONCE") is None


def test_run_ray_matches_local(discovered, tmp_path):
    model, tmp, _ = discovered
    metrics = []
    for d, extra in (("local", []), ("ray", ["--ray"])):
        os.environ["TORQ_GEN_CONFIG_CACHE_DIR"], old = str(tmp_path / f"cache-{d}"), os.environ["TORQ_GEN_CONFIG_CACHE_DIR"]
        try:
            assert cli("run", "--model", model, "--output-dir", tmp / d, *QFLAGS, *extra) == 0
        finally:
            os.environ["TORQ_GEN_CONFIG_CACHE_DIR"] = old
        m = json.loads((tmp / d / "torq_gen_config_chain3.json").read_text())["full_model_metrics"]
        metrics.append({k: v for k, v in m.items() if k not in ("run_s", "segments")})
    assert metrics[0] == metrics[1] and metrics[0]["passed"]
    assert list((tmp_path / "cache-ray" / "programs").glob("*.npz"))       # the segment compiled by a task
