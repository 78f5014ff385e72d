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
    args = build_parser().parse_args(argv + ["--calibration-data", "c.npz"])
    assert args.recipe is None          # not given: the recommended recipe
    assert recipe_from_args(args) == preset("recommended").replace(calibration_data="c.npz") \
        == preset(RECOMMENDED).replace(calibration_data="c.npz")


def test_benchmark_accuracy_default_is_the_same(monkeypatch):
    import argparse

    from torq.quantize.recipe_flags import add_recipe_arguments
    ap = argparse.ArgumentParser()
    add_recipe_arguments(ap)
    assert recipe_from_args(ap.parse_args([]), data_elsewhere=True) == preset(RECOMMENDED)


def test_mixed_is_all_int8_where_auto_cannot_apply(capsys):
    """The mixed recipe (the default); where its int16 layers cannot apply it is gptq
    (every layer int8, nothing else changed) with a note: --quant-format qoperator (no QOperator
    int16), --quant-dtype A16W8 (int16 already), no calibration data (synthetic samples). An
    explicit --precision auto is kept: with qoperator a one-line error."""
    from torq.errors import TorqError
    from torq.quantize.recipe_flags import with_flags
    assert RECOMMENDED == "mixed" and ("*", "auto") in preset("mixed").precision
    mixed, gptq = preset("mixed"), preset("gptq")
    data = {"calibration_data": "c.npz"}
    assert with_flags(mixed, data) == (mixed.replace(**data), None)
    r, why = with_flags(mixed, {**data, "format": "qoperator"})
    assert r == gptq.replace(**data, format="qoperator") and why.startswith("--quant-format qoperator")
    r, why = with_flags(mixed, {**data, "quant_dtype": "A16W8", "int16_macs": 7.0})
    assert r == gptq.replace(**data, quant_dtype="A16W8", int16_macs=7.0) and why.startswith("--quant-dtype A16W8")
    r, why = with_flags(mixed, {})
    assert r == gptq and why.startswith("no --calibration-data")
    assert with_flags(mixed, {}, data_elsewhere=True) == (mixed, None)
    assert with_flags(mixed, {**data, "precision": ()}) == (gptq.replace(**data, accuracy_budget=0.0, int16_macs=10.0), None)
    with pytest.raises(TorqError, match="need --quant-format qdq"):
        with_flags(mixed, {**data, "format": "qoperator", "precision": (("*", "auto"),)})
    with pytest.raises(TorqError, match="need --quant-format qdq"):
        with_flags(gptq, {**data, "format": "qoperator", "precision": (("*", "auto"),)})
    # the command line: a note on stderr for the flag, none for missing data (the recipe says it)
    args = build_parser().parse_args(["quantize", "--model", "m.onnx", "--recipe", "mixed", "--quant-format", "qoperator"])
    assert recipe_from_args(args).format == "qoperator" and "note: --quant-format qoperator" in capsys.readouterr().err
    args = build_parser().parse_args(["quantize", "--model", "m.onnx", "--recipe", "mixed"])
    assert recipe_from_args(args) == gptq and capsys.readouterr().err == ""


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


def test_a_preset_with_data_keeps_its_name():
    """Calibration data, preprocessing and input sizes do not make a preset "custom" (summaries and
    evaluation.json name it); any other field does."""
    from torq.quantize.recipe import preset_name
    r = preset("mixed").replace(calibration_data="photos/", preprocess="resize=256,crop=224,norm=tf")
    assert preset_name(r) == "mixed" and r.describe().startswith("mixed [")
    assert preset_name(r.replace(num_calib=7)) is None and r.replace(num_calib=7).describe().startswith("custom [")
