"""benchmarks/recipe_choice.py --criterion kl: the rule that picks the recommended mixed recipe."""
from __future__ import annotations

import numpy as np
import pytest

from torq.quantize import Recipe


@pytest.fixture(scope="module")
def rc(benchmark_script):
    return benchmark_script("recipe_choice.py")


def _rows(kls: dict, int8: dict, n=200, seed=0):
    """Two models; per candidate, per-image KL = its level + shared per-image noise."""
    rng = np.random.default_rng(seed)
    rows = {}
    for m in ("a", "b"):
        base = rng.exponential(0.01, n)
        labels = np.ones(n, bool)
        row = {"labels": labels, "fp32": labels, "macs": {c: {"int8": int8.get(c, 1.0)} for c in kls}}
        for c, level in kls.items():
            row[c] = labels
            row[f"{c}.kl"] = base + level + rng.normal(0, 1e-3, n)
        rows[m] = row
    return rows


def test_the_least_int16_candidate_within_noise_of_the_best_is_chosen(rc):
    exact = Recipe(exact_scales=True)
    recipes = {c: exact for c in ("int8", "cap5", "cap10")}
    # cap5 is as good as cap10 (within noise): the simpler one wins over the lowest mean
    chosen, fig = rc.choose_kl(_rows({"int8": 0.004, "cap5": 2e-5, "cap10": 0.0}, {}), list(recipes), recipes)
    assert fig["cap5"]["kl"] > fig["cap10"]["kl"] and fig["int8"]["kl_minus_best"]["ci95"][0] > 0
    assert chosen == "cap5"
    # cap5 clearly worse than cap10: cap10
    chosen, _ = rc.choose_kl(_rows({"int8": 0.004, "cap5": 0.002, "cap10": 0.0}, {}), list(recipes), recipes)
    assert chosen == "cap10"
    # the best by KL is not eligible (< 90 % int8 MACs on a model): it does not count
    chosen, fig = rc.choose_kl(_rows({"int8": 0.004, "cap5": 0.002, "cap10": 0.0}, {"cap10": 0.85}),
                               list(recipes), recipes)
    assert chosen == "cap5" and not fig["cap10"]["eligible"]
    # without exact scales nothing is eligible
    loose = {c: Recipe() for c in recipes}
    with pytest.raises(SystemExit, match="no eligible"):
        rc.choose_kl(_rows({"int8": 0.0, "cap5": 0.0, "cap10": 0.0}, {}), list(loose), loose)


def test_candidate_names_parse_to_recipes(rc):
    entry = {"preprocess": "norm=tf", "calibration": "calib"}
    r = rc.recipe_of("gptq+auto=0@10", entry)
    assert r.precision == (("*", "auto"),) and r.accuracy_budget == 0.0 and r.int16_macs == 10.0
    assert r.replace(calibration_data=None, preprocess="") == rc.recipe_of("mixed", entry).replace(
        calibration_data=None, preprocess="")                       # the preset is the chosen candidate
    assert rc.recipe_of("exact:entropy", entry).calibrate_method == "entropy"
