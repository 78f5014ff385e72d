"""discover + run on a ViT encoder block: every compute layer on the NSS except LayerNorm and
Softmax (no exact integer form: placed on the CSS), shape arithmetic folded (no executor needed),
and the whole block run across NSS/CSS segments within tolerance."""
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


def test_layernorm_and_softmax_go_to_the_css_and_the_rest_to_the_nss(block, capsys):
    flags = ["--model", block / "block.onnx", "--output-dir", block, "--quantize", "--full-integer"]
    assert cli("discover", *flags, "--skip-mode", "--skip-executors", "host") == 0
    ops = json.loads((block / "torq_gen_config_block.json").read_text())["ops"]
    placed = {lid: op["recommended_executor"] for lid, op in ops.items()}
    assert {lid for lid, ex in placed.items() if ex == "css"} == {
        lid for lid in ops if lid.startswith(("LayerNormalization_", "Softmax_"))}
    folded = {lid for lid, op in ops.items() if op.get("skipped") == "constant: folded at compile time"}
    assert {lid.split("_")[0] for lid in folded} <= {"Mod", "Reshape", "Slice", "Add", "Concat", "Cast", "Sqrt", "Div"}
    assert all(ex == "nss" for lid, ex in placed.items() if lid not in folded and ex != "css"), placed
    nss_reason = ops[next(lid for lid in ops if lid.startswith("Softmax_"))]["executors"]["nss"]["failure_report"]
    assert "no exact integer form" in nss_reason["summary"]
    assert cli("run", *flags) == 0
    assert "run: PASS" in capsys.readouterr().out
