"""One default recipe on every command, and quantize says what it is doing (stage lines)."""
from __future__ import annotations

import re

import pytest

from torq import progress
from torq.examples import build_example_cnn
from torq.gen_config.cli import build_parser
from torq.quantize import RECOMMENDED, apply, preset
from torq.quantize.recipe_flags import recipe_from_args


@pytest.mark.parametrize("command", ["quantize", "discover", "run", "evaluate"])
def test_every_command_starts_from_the_recommended_recipe(command):
    argv = [command, "--model", "m.onnx"] + (["--dataset", "d"] if command == "evaluate" else [])
    args = build_parser().parse_args(argv)
    assert args.recipe == RECOMMENDED
    assert recipe_from_args(args) == preset("recommended") == preset(RECOMMENDED)


def test_benchmark_accuracy_default_is_the_same(monkeypatch):
    import argparse

    from torq.quantize.recipe_flags import add_recipe_arguments
    ap = argparse.ArgumentParser()
    add_recipe_arguments(ap)
    assert recipe_from_args(ap.parse_args([])) == preset(RECOMMENDED)


def test_quantize_prints_a_line_per_stage(tmp_path, monkeypatch, capsys):
    """In a pipe every step (fold, CLE, calibration + ORT, exact scales) is a timestamped line
    once it passes STAGE_S (0 here, so every step shows)."""
    monkeypatch.setenv("TORQ_PROGRESS", "plain")
    monkeypatch.setattr(progress, "STAGE_S", 0.0)
    build_example_cnn(tmp_path / "m.onnx")
    apply(preset("cle").replace(num_calib=4), tmp_path / "m.onnx")
    err = capsys.readouterr().err
    for what in ("fold", "dead channels", "cross-layer equalization", "bias correction",
                 "calibration + ONNX Runtime", "exact scales"):
        assert re.search(rf"^\[\d\d:\d\d:\d\d\] quantize: {re.escape(what)}.*: done in \d+\.\d s$", err, re.M), (what, err)
