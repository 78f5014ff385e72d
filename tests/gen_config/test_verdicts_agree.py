"""Discover's per-layer verdict is the whole model's: on a ResNet-, an EfficientNet- and a real-style CNN, in qdq,
qdq per-channel and qoperator, the layers ``discover --quantize`` puts off the NSS are exactly the
ops the whole-model compile refuses. Float I/O (no --full-integer): a lone layer's bf16 Q/DQ edges
are judged by ``bf16_edges`` and must not send it off the NSS. A Softmax (no integer form) is a bf16
island in both: on the NSS within the island's tolerance."""
from __future__ import annotations

import copy

import onnx
import pytest

from torq.compiler import compile as compile_model
from torq.gen_config.agreement import disagreements, whole_model_refusals
from torq.gen_config.discover import DiscoverOptions, run_discovery
from torq.gen_config.options import QuantSettings
from torq.quantize import Recipe
from torq.quantize.recipe import apply

from .netmodels import efficientnet_style, realworld_style, resnet_style

MODELS = {"resnet": resnet_style, "efficientnet": efficientnet_style, "realworld": realworld_style}
FLAGS = {"qdq": Recipe(), "qdq-pc": Recipe(per_channel=True),
         "qoperator": Recipe(format="qoperator")}
_DONE: dict = {}


def verdicts(model: str, flags: str, tmp_path_factory) -> tuple[dict, dict]:
    """(discover's report, the whole-model compile's refusals), once per session (the quantized
    model in ``_DONE[model, flags, "q"]``)."""
    if (model, flags) not in _DONE:
        d = tmp_path_factory.mktemp(f"{model}-{flags}")
        onnx.save(MODELS[model](), d / f"{model}.onnx")
        recipe = FLAGS[flags]
        report, _ = run_discovery(DiscoverOptions(model=d / f"{model}.onnx", output_dir=d,
                                                  quant=QuantSettings(True, recipe), skip_mode=True))
        q = apply(recipe, d / f"{model}.onnx").model
        refused = whole_model_refusals(compile_model(q).report)
        _DONE[model, flags] = report, refused
        _DONE[model, flags, "q"] = q
    return _DONE[model, flags]


@pytest.mark.parametrize("flags", list(FLAGS))
@pytest.mark.parametrize("model", list(MODELS))
def test_discover_puts_off_the_nss_what_the_whole_model_refuses(model, flags, tmp_path_factory):
    report, refused = verdicts(model, flags, tmp_path_factory)
    assert disagreements(report, refused) == []
    off = [lid for lid, op in report["ops"].items() if op.get("recommended_executor") not in ("nss", None)]
    assert refused == {} and off == []
    if model == "realworld":      # the Softmax tail: a bf16 island, on the NSS per layer and whole
        softmax = next(lid for lid in report["ops"] if lid.startswith("Softmax"))
        assert report["ops"][softmax]["recommended_executor"] == "nss"


def test_a_verdict_apart_is_named(tmp_path_factory):
    """The checker handed wrong answers: a layer moved off the NSS, and a refusal discover missed."""
    report, refused = verdicts("realworld", "qdq", tmp_path_factory)
    wrong = copy.deepcopy(report)
    conv = next(lid for lid, op in wrong["ops"].items() if lid.startswith("Conv_") and ":" in op["mlir_location"])
    wrong["ops"][conv]["recommended_executor"] = "css"
    softmax = next(lid for lid in wrong["ops"] if lid.startswith("Softmax"))
    wrong["ops"][softmax]["recommended_executor"] = "css"
    assert disagreements(wrong, refused) == sorted([f"-{conv}", f"-{softmax}"])
    # islands off, the whole model refuses the Softmax discover ran on the NSS
    off = whole_model_refusals(compile_model(_DONE["realworld", "qdq", "q"], bf16_islands=False).report)
    assert disagreements(report, off) == [f"+{softmax}"]
