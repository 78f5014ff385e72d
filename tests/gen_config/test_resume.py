"""A discover killed mid-way resumes: no layer lost, none computed twice."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from torq.examples import build_example_cnn

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _discover(model, out, cache, kill_after=None):
    env = dict(os.environ, PYTHONPATH=SRC, TORQ_GEN_CONFIG_CACHE_DIR=str(cache))
    if kill_after:
        env["TORQ_DISCOVER_KILL_AFTER"] = str(kill_after)     # SIGKILL once that many layers are saved
    return subprocess.Popen([sys.executable, "-m", "torq.gen_config.cli", "discover", "--model", str(model),
                             "--output-dir", str(out), "--quantize", "--full-integer", "--skip-mode"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_killed_discover_resumes(tmp_path):
    model = build_example_cnn(tmp_path / "example.onnx") and tmp_path / "example.onnx"
    report, cache = tmp_path / "torq_gen_config_example.json", tmp_path / "cache"
    proc = _discover(model, tmp_path, cache, kill_after=4)
    proc.communicate(timeout=600)
    assert proc.returncode == -signal.SIGKILL
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
