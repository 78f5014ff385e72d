"""Progress is never silence: in a pipe or a log, timestamped stage lines, bar lines every 5 %
(or 10 s) and heartbeats while one slow item runs."""
from __future__ import annotations

import re
import time

from torq import progress

LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] ")


def test_plain_bar_every_5_percent_and_at_the_end(monkeypatch, capsys):
    monkeypatch.setenv("TORQ_PROGRESS", "plain")
    with progress.bar("discover", "layers") as update:
        for i in range(201):
            update(i, 200, f"L{i}")
    lines = capsys.readouterr().err.splitlines()
    assert all(LINE.match(ln) for ln in lines) and len(lines) == 21, lines
    assert "discover: 0/200 layers (0 %) L0" in lines[0] and "discover: 200/200 layers (100 %)" in lines[-1]
    assert "ETA" in lines[1]


def test_plain_stage_announced_with_heartbeat_and_duration(monkeypatch, capsys):
    monkeypatch.setenv("TORQ_PROGRESS", "plain")
    monkeypatch.setattr(progress, "STAGE_S", 0.05)
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.1)
    with progress.stage("quantize: calibration"):
        time.sleep(0.35)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 3 and all(LINE.match(ln) for ln in lines), lines
    assert lines[0].endswith(")") and "quantize: calibration ..." in lines[0]
    assert re.search(r"quantize: calibration: done in 0\.\d s$", lines[-1]), lines[-1]


def test_quick_stage_says_nothing_and_heartbeat_in_a_slow_item(monkeypatch, capsys):
    monkeypatch.setenv("TORQ_PROGRESS", "plain")
    with progress.stage("fold"):
        pass
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.1)
    with progress.bar("run", "segments") as update:
        update(0, 3, "segment 0")
        time.sleep(0.35)                  # one slow segment: heartbeats, not silence
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 3 and all("run: 0/3 segments (0 %)" in ln for ln in lines), lines


def test_discover_in_a_pipe_prints_progress(tmp_path):
    import os
    import subprocess
    import sys

    from torq.examples import build_example_cnn
    build_example_cnn(tmp_path / "example.onnx")
    env = dict(os.environ, TORQ_GEN_CONFIG_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("TORQ_PROGRESS", None)
    r = subprocess.run([sys.executable, "-m", "torq.gen_config.cli", "discover", "--model", str(tmp_path / "example.onnx"),
                        "--output-dir", str(tmp_path), "--quantize", "--full-integer", "--skip-mode",
                        "--subgraph-from", "0", "--subgraph-to", "2"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^\[\d\d:\d\d:\d\d\] discover: 3/3 layers \(100 %\)", r.stderr, re.M), r.stderr
