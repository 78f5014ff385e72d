"""A discover killed mid-way resumes: no layer lost, none computed twice."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from torq.examples import build_example_cnn

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _discover(model, out, cache):
    env = dict(os.environ, PYTHONPATH=SRC, TORQ_GEN_CONFIG_CACHE_DIR=str(cache))
    return subprocess.Popen([sys.executable, "-m", "torq.gen_config.cli", "discover", "--model", str(model),
                             "--output-dir", str(out), "--quantize", "--full-integer", "--skip-mode"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_killed_discover_resumes(tmp_path):
    model = build_example_cnn(tmp_path / "example.onnx") and tmp_path / "example.onnx"
    report, cache = tmp_path / "torq_gen_config_example.json", tmp_path / "cache"
    proc = _discover(model, tmp_path, cache)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if report.exists() and len(json.loads(report.read_text() or "{}").get("ops", {})) >= 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = len(json.loads(report.read_text())["ops"])
    cached = len(list((cache / "results").rglob("*.json")))
    assert 3 <= done_before < 11 and cached >= done_before
    proc = _discover(model, tmp_path, cache)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    r = json.loads(report.read_text())
    s = r["discovery_report"]["summary"]
    assert len(r["ops"]) == 11 and all(op["recommended_executor"] == "nss" for op in r["ops"].values())
    assert s["from_cache"] == cached and s["computed"] == 11 - cached      # nothing computed twice
    assert not list(tmp_path.glob(".torq_gen_config_*"))                   # no temp file left behind
