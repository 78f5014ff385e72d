"""Workers that die are noticed (audit 3: B3, B10): retried once, then named; never a hang.

The tasks below kill their own worker process (SIGKILL, as the OOM killer does); the pool must
retry the task on a fresh worker, and after a second death raise one line naming the task.
The end-to-end test SIGKILLs a real ``discover --jobs 2`` worker mid-run.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time

import pytest

from torq.errors import HostProblem, TorqError
from torq.workers import WorkerPool, cap_jobs, usable_cores



def cli_quant():
    """The QuantSettings of ``--quantize --full-integer`` on the command line."""
    from torq.gen_config.cli import build_parser
    from torq.gen_config.options import quant_settings
    return quant_settings(build_parser().parse_args(["discover", "--model", "m.onnx", "--quantize", "--full-integer"]))

def square(x):
    return x * x


def die_once(args):
    """Kill this worker the first time task ``x`` runs (a marker file remembers it)."""
    x, marker = args
    if x == 2 and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return x * 10


def always_die(x):
    if x == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def refuse(x):
    raise TorqError(f"task {x} is bad")


def broken_init():
    raise TorqError("cannot start")


def test_results_in_order():
    with WorkerPool(2) as pool:
        assert list(pool.map(square, range(7))) == [x * x for x in range(7)]
        assert list(pool.map(square, [])) == []


def test_a_dead_worker_s_task_is_retried_once(tmp_path):
    marker = str(tmp_path / "died")
    with WorkerPool(2) as pool:
        assert list(pool.map(die_once, [(x, marker) for x in range(5)])) == [0, 10, 20, 30, 40]
    assert os.path.exists(marker)


def test_a_second_death_is_one_line_naming_the_task():
    t0 = time.monotonic()
    with pytest.raises(HostProblem) as e, WorkerPool(2, what="discover") as pool:
        list(pool.map(always_die, range(4), label=lambda x: f"testing layer {x}"))
    msg = str(e.value)
    assert "\n" not in msg and "testing layer 1" in msg and "SIGKILL" in msg and "twice" in msg
    assert time.monotonic() - t0 < 60


def test_errors_come_back_as_themselves():
    with pytest.raises(TorqError, match="task 3 is bad"), WorkerPool(2) as pool:
        list(pool.map(refuse, [3]))
    with pytest.raises(TorqError, match="cannot start"):
        pool = WorkerPool(2, init=broken_init)
        try:
            pool.wait_ready()
        finally:
            pool.close()
    assert not multiprocessing.active_children()


def test_jobs_are_capped_by_cores_and_work():
    assert cap_jobs(1000, 3) == min(3, usable_cores())
    assert cap_jobs(1000, 1000) == usable_cores()
    assert cap_jobs(1, 0) == 1


@pytest.mark.skipif(usable_cores() < 2, reason="--jobs is capped at the cores: needs 2")
def test_discover_survives_a_killed_worker(tmp_path, monkeypatch):
    from torq.examples import build_example_cnn
    from torq.gen_config import discover as D
    monkeypatch.setenv("TORQ_GEN_CONFIG_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "example.onnx"
    build_example_cnn(model)
    killed = []

    def progress(i, n, label):
        kids = multiprocessing.active_children()
        if i == 2 and not killed and kids:
            os.kill(kids[0].pid, signal.SIGKILL)
            killed.append(kids[0].pid)
    opts = D.DiscoverOptions(model=model, output_dir=tmp_path, quant=cli_quant(),
                             jobs=2, skip_mode=True)
    D.run_discovery(opts, progress)
    r = json.loads((tmp_path / "torq_gen_config_example.json").read_text())
    assert killed and len(r["ops"]) == 11
    assert all(op["recommended_executor"] == "nss" for op in r["ops"].values())


def sleep_forever(x):
    if x == 1:
        time.sleep(3600)
    return x


def test_a_task_that_never_ends_is_killed_and_named(monkeypatch):
    import torq.workers as W
    monkeypatch.setattr(W, "TASK_TIMEOUT_S", 3.0)
    with pytest.raises(HostProblem, match="longer than 3 s .* twice while testing layer 1"), \
            WorkerPool(2, what="discover") as pool:
        list(pool.map(sleep_forever, range(3), label=lambda x: f"testing layer {x}"))
