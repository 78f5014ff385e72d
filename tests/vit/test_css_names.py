"""Torch exports name graphs (and so layers and segments) like "/encoder/ln_1/..._output_0": the
graph imports as an ASCII identifier (``pipeline.func_name``; MLIR would quote and escape the
name), and the CSS/HOST executors find it."""
from __future__ import annotations

import numpy as np
from onnx import helper

import torq
from qmodels import model
from torq.quantize import quantize
from torq.gen_config.executors.iree import compile_module


def test_a_layer_named_like_a_torch_export_runs_on_the_css():
    out = "/encoder/ln_1/LayerNormalization_output_0"
    m = model([helper.make_node("LayerNormalization", ["x", "g", "b"], [out], axis=-1)], [("x", [1, 4, 8])], [out],
              {"g": np.linspace(0.5, 1.5, 8), "b": np.linspace(-0.1, 0.1, 8)}, name=f"LayerNormalization_{out}")
    c = torq.compile(quantize(m, full_integer=True))
    assert "func.func @LayerNormalization__encoder_ln_1_" in c.ir("linalg")
    x = np.random.default_rng(0).integers(-128, 128, (1, 4, 8)).astype(np.int8)
    (y,), _ = compile_module(c.ir("linalg"), "vmvx").run([x])
    assert y.shape == (1, 4, 8) and y.dtype == np.int8
