"""``evaluate --precision bf16`` on 20 real Fashion-MNIST images: FP32 (ORT) vs BF16 (NSS), the
BF16 answers recomputed here by compiling the converted model and running it image by image."""
from __future__ import annotations

import json

import numpy as np

import torq
from torq.data.datasets import load_dataset
from torq.gen_config.cli import main
from torq.graph.bf16 import convert_to_bf16
from torq.graph.load import load_model
from torq.quantize.fold import fold_fp32

from .fmnist_probe import TEST


def test_bf16_evaluate_20_images(probe_model, tmp_path, capsys):
    out_dir = tmp_path / "out"
    code = main(["evaluate", "--model", str(probe_model), "--dataset", str(TEST), "--limit", "20",
                 "--preprocess", "norm=unit", "--batch", "8", "--precision", "bf16", "-o", str(out_dir)])
    out, err = capsys.readouterr()
    assert code == 0, err
    rep = json.loads((out_dir / "evaluation.json").read_text())
    assert rep["images"] == 20 and rep["settings"]["precision"] == "bf16"
    assert set(rep["per_image"]) == {"label", "fp32", "bf16_nss"}
    test = load_dataset(TEST)
    x = np.stack([test.load(i) for i in range(20)])[:, None].astype(np.float32) / 255
    compiled = torq.compile(convert_to_bf16(fold_fp32(load_model(probe_model))))
    want = [int(compiled.run({"input": x[i:i + 1]})["logits" if "logits" in compiled.output_names
                                                    else compiled.output_names[0]].argmax()) for i in range(20)]
    assert rep["per_image"]["bf16_nss"] == want
    agree = np.mean(np.array(want) == np.array(rep["per_image"]["fp32"]))
    assert rep["agreement_bf16_nss_vs_fp32"] == agree >= 0.9
    assert "| BF16 (NSS) |" in out and "no calibration" in out
