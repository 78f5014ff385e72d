"""discover + run on a ViT encoder block: every compute layer on the NSS, LayerNorm and Softmax (no
exact integer form) as bf16 islands within their tolerance, shape arithmetic folded (no executor
needed), and the whole block run within tolerance."""
from __future__ import annotations

import json

import onnx
import pytest

from vit.attention import encoder_block


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    d = tmp_path_factory.mktemp("vit_block")
    onnx.save(encoder_block(seq=4, dim=8, heads=2), d / "block.onnx")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORQ_GEN_CONFIG_CACHE_DIR", str(d / "cache"))
        yield d


def cli(*argv) -> int:
    from torq.gen_config.cli import main
    return main([str(a) for a in argv])


def test_every_layer_goes_to_the_nss_layernorm_and_softmax_as_bf16_islands(block, capsys):
    flags = ["--model", block / "block.onnx", "--output-dir", block, "--quantize", "--full-integer"]
    assert cli("discover", *flags, "--skip-mode", "--skip-executors", "host") == 0
    ops = json.loads((block / "torq_gen_config_block.json").read_text())["ops"]
    placed = {lid: op["recommended_executor"] for lid, op in ops.items()}
    folded = {lid for lid, op in ops.items() if op.get("skipped") == "constant: folded at compile time"}
    assert {lid.split("_")[0] for lid in folded} <= {"Mod", "Reshape", "Slice", "Add", "Concat", "Cast", "Sqrt", "Div"}
    assert all(ex == "nss" for lid, ex in placed.items() if lid not in folded), placed
    islands = [op for lid, op in ops.items() if lid.startswith(("LayerNormalization_", "Softmax_"))]
    assert len(islands) == 3 and all(op["executors"]["nss"]["status"] == "success" for op in islands)
    assert cli("run", *flags) == 0
    assert "run: PASS" in capsys.readouterr().out
