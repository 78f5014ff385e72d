"""Choose the recommended recipe on the tuning half of the evaluation images.

    python benchmarks/recipe_choice.py [--only effnet|lite1|lite2|squeeze|fmnist ...] [--candidate NAME ...]
                                       [--criterion kl|top1] [--target POINTS] [--limit N]
                                       [--json OUT] [--cache DIR]

For each benchmark model (benchmarks/models/build.py) and each candidate recipe (a preset,
``NAME:METHOD`` for another calibration method, ``NAME+auto`` for the preset with ``--precision
auto``, ``NAME+auto=B`` with accuracy budget B, ``NAME+auto=0@CAP`` with budget 0 and the int16 MAC
cap CAP %), quantizes with the row's held-apart calibration images and classifies the evaluation
images with FP32 and INT8 (ONNX Runtime; with exact scales the NSS agrees with it, see
accuracy.py). The evaluation images are split by a seeded permutation (torq.evaluate.protocol.halves).

The choice is made on the *tuning* half only. Eligible: candidates with exact scales (the NSS
contract) and at least 90 % of the MACs in int8.

``--criterion kl`` (default; how ``RECOMMENDED`` is chosen): only the tuning half is classified;
per image, KL(FP32 || INT8) of the softmax, pooled over the models. The lowest pooled mean is the
best; chosen is the first eligible candidate in the order given (simplest / least int16 first)
whose KL minus the best's has a 95 % paired-bootstrap interval reaching 0. Top-1 of 250 images
moves by whole images (0.4 points each); the KL of every image moves continuously. The numbers
to quote then come from ``accuracy.py`` on the report half.

``--criterion top1`` (sessions 2–3): every image is classified; the goal is INT8 within
``--target`` top-1 points of FP32 (default 0.5) on every model's tuning half: the first eligible
candidate in the order given that meets it is chosen; when none does, the one whose worst model is
closest. The *report* half gives top-1 with a 95 % Wilson interval, INT8 − FP32 with a 95 %
paired-bootstrap interval, and the chosen recipe against every other candidate.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks" / "models"))

CANDIDATES = ("gptq", "gptq+auto=0@2.5", "mixed", "gptq+auto=0@10")
MIN_INT8_MACS = 0.9
ROWS = ("effnet", "lite1", "lite2")


def recipe_of(name: str, entry: dict):
    """``PRESET[:METHOD][+auto[=BUDGET][@CAP]]`` with the row's calibration images and preprocessing
    (CAP: ``--int16-macs``, percent)."""
    from torq.quantize.recipe_flags import load_recipe
    name, _, auto = name.partition("+")
    base, _, method = name.partition(":")
    r = load_recipe(base).replace(preprocess=entry["preprocess"], calibration_data=entry["calibration"])
    if method:
        r = r.replace(calibrate_method=method)
    if auto:
        auto, _, cap = auto.partition("@")
        _, _, budget = auto.partition("=")
        r = r.replace(precision=(("*", "auto"),), **({"accuracy_budget": float(budget)} if budget else {}),
                      **({"int16_macs": float(cap)} if cap else {}))
    return r


def outcomes(entry: dict, candidates, limit, cache: Path | None = None, half: str = "all") -> dict:
    """{"labels", "fp32": per-image 0/1, candidate: per-image 0/1, "<name>.kl": per-image
    KL(FP32 || candidate) of the softmax, "macs": {candidate: MAC share per precision}} on the
    evaluation images of ``half``.
    With ``cache``: each array is saved there as soon as it is known and reused (a rerun resumes
    at the first candidate not yet measured)."""
    from torq.fileio import atomic_write_json
    out, macs = {}, {}
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        out = {f.stem: np.load(f) for f in cache.glob("*.npy")}
        macs = {f.name[:-len(".macs.json")]: json.loads(f.read_text()) for f in cache.glob("*.macs.json")}
    def kept() -> dict:
        keep = ("labels", "fp32", *candidates, *(f"{c}.kl" for c in candidates if f"{c}.kl" in out))
        return {**{k: out[k] for k in keep}, "macs": macs}
    todo = [c for c in candidates if c not in out]
    if not todo and {"labels", "fp32"} <= set(out):
        return kept()

    def save(key, value):
        out[key] = value
        if cache is not None:
            np.save(cache / f"{key}.npy", value)
    from torq.data import load_dataset
    from torq.evaluate.engines import OrtEngine, quantize_input
    from torq.evaluate.run import EvalOptions, batches, prepare, split
    from torq.graph.io_quant import io_quant_params
    cached = None
    for name in todo:
        opts = EvalOptions(recipe=recipe_of(name, entry), batch=50, limit=limit, progress=False, half=half)
        data, calib = split(load_dataset(entry["dataset"]), opts)
        fp32, q, iname, shape, _, _ = prepare(entry["model"], data, calib, opts)
        if cached is None:                      # the same preprocessed images for every candidate
            cached = list(batches(data, opts, iname, shape))
            f = OrtEngine(fp32)
            ref = np.concatenate([f(x).reshape(len(x), -1) for _, x in cached]).astype(np.float64)
            if "fp32" not in out:
                save("labels", data.labels)
                save("fp32", np.argmax(ref, 1) == data.labels)
        from torq.quantize.precision import mac_share
        macs[name] = mac_share(q)
        if cache is not None:
            atomic_write_json(cache / f"{name}.macs.json", macs[name])
        io = io_quant_params(q)
        qin, (qout,) = io["inputs"][iname], io["outputs"].values()
        i8 = OrtEngine(q)
        logits = np.concatenate([i8(quantize_input(x, qin["scale"], qin["zero_point"])).reshape(len(x), -1)
                                 for _, x in cached]).astype(np.float64)
        logits = (logits - qout["zero_point"]) * qout["scale"]
        save(f"{name}.kl", _kl_rows(ref, logits))
        save(name, np.argmax(logits, 1) == data.labels)
        print(f"  {name}: {100 * out[name].mean():.2f} (fp32 {100 * out['fp32'].mean():.2f}), "
              f"MACs {macs[name]}", file=sys.stderr)
    return kept()


def _kl_rows(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Per image KL(softmax(ref) || softmax(got)), nats."""
    from torq.quantize.sensitivity import softmax_kl
    return np.array([softmax_kl(r[None], g[None]) for r, g in zip(ref, got)])


def eligible(name: str, rows: dict, entry_recipe) -> bool:
    """Exact scales (NSS == ORT) and >= MIN_INT8_MACS of the MACs in int8 on every model."""
    return entry_recipe.exact_scales and all(r["macs"].get(name, {}).get("int8", 0) >= MIN_INT8_MACS
                                             for r in rows.values())


def choose(rows: dict, candidates, half: dict, target: float, recipes: dict) -> tuple[str, dict]:
    """(chosen, tuning): the first eligible candidate whose tuning-half INT8 − FP32 is >= −target
    points on every model; none: the eligible one with the best worst model. ``tuning``: per
    candidate, its per-model tuning-half difference (paired bootstrap), worst, eligibility."""
    from torq.evaluate.protocol import paired_bootstrap
    tuning = {}
    for c in candidates:
        diffs = {k: paired_bootstrap(r["fp32"][half[k]["tune"]], r[c][half[k]["tune"]]) for k, r in rows.items()}
        tuning[c] = {"vs_fp32": diffs, "worst": min(d["diff"] for d in diffs.values()),
                     "eligible": eligible(c, rows, recipes[c])}
    ok = [c for c in candidates if tuning[c]["eligible"]]
    if not ok:
        raise SystemExit("no eligible candidate (exact scales and >= 90 % int8 MACs)")
    meets = [c for c in ok if tuning[c]["worst"] >= -target / 100]
    return (meets[0] if meets else max(ok, key=lambda c: tuning[c]["worst"])), tuning


def choose_kl(rows: dict, candidates, recipes: dict) -> tuple[str, dict]:
    """(chosen, per-candidate figures) by the output KL pooled over every model's images (the
    tuning half): the eligible candidate with the lowest mean KL(FP32 || INT8) is the best; chosen
    is the first eligible candidate in the order given (least int16 first) whose KL minus the
    best's has a 95 % paired-bootstrap interval reaching 0 (not worse beyond noise). Top-1 of a
    few hundred images moves by whole images; the KL of every image moves continuously."""
    from torq.evaluate.protocol import paired_bootstrap
    kl = {c: np.concatenate([r[f"{c}.kl"] for r in rows.values()]) for c in candidates}
    agree = {c: np.concatenate([r[c] == r["fp32"] for r in rows.values()]) for c in candidates}
    ok = [c for c in candidates if eligible(c, rows, recipes[c])]
    if not ok:
        raise SystemExit("no eligible candidate (exact scales and >= 90 % int8 MACs)")
    best = min(ok, key=lambda c: kl[c].mean())
    figures = {c: {"kl": float(kl[c].mean()), "eligible": c in ok,
                   "top1_outcome_agreement": float(agree[c].mean()),
                   "kl_minus_best": paired_bootstrap(kl[best], kl[c]),
                   "per_model_kl": {k: float(r[f"{c}.kl"].mean()) for k, r in rows.items()}} for c in candidates}
    chosen = next(c for c in ok if figures[c]["kl_minus_best"]["ci95"][0] <= 0)
    return chosen, figures


def kl_markdown(rows: dict, candidates, chosen: str, figures: dict) -> str:
    from torq.evaluate.protocol import paired_bootstrap
    lines = ["Tuning half only. Cells: top-1 %, INT8 − FP32 in points (95 % paired bootstrap); mean "
             "KL(FP32 || INT8) of the softmax.", "",
             "| model | images | FP32 | " + " | ".join(candidates) + " |", "|" + "---|" * (3 + len(candidates))]
    for k, r in rows.items():
        cells = [f"{100 * r[c].mean():.1f}, {_pts(paired_bootstrap(r['fp32'], r[c]))}, KL "
                 f"{figures[c]['per_model_kl'][k]:.4f}" for c in candidates]
        lines.append(f"| {k} | {len(r['fp32'])} | {100 * r['fp32'].mean():.1f} | " + " | ".join(cells) + " |")
    lines += ["", "Pooled over the models: " + "; ".join(
        f"{c}: KL {f['kl']:.4f} ({1e3 * f['kl_minus_best']['ci95'][0]:+.2f}…{1e3 * f['kl_minus_best']['ci95'][1]:+.2f}"
        f" e-3 vs the best), top-1 outcome = FP32's on {100 * f['top1_outcome_agreement']:.1f} %"
        f"{'' if f['eligible'] else ' (not eligible)'}" for c, f in figures.items()),
        "", "MACs int8: " + "; ".join(f"{k}: " + ", ".join(f"{c} {100 * r['macs'][c].get('int8', 0):.1f} %"
                                                          for c in candidates) for k, r in rows.items()),
        "", f"Chosen: **{chosen}** (the first eligible candidate whose pooled KL is not above the lowest "
        "beyond its 95 % interval)"]
    return "\n".join(lines)


def report(rows: dict, candidates, chosen: str, half: dict, tests: dict) -> dict:
    """Per model and half: top-1 (Wilson 95 %) of FP32 and every candidate, each candidate minus
    FP32 (paired bootstrap 95 %); on the report half also the chosen candidate minus each other."""
    from torq.evaluate.protocol import paired_bootstrap, wilson
    table = {}
    for k, r in rows.items():
        idx = {h: half[k][h] for h in ("tune", "report")}
        row = {"images": {h: int(len(i)) for h, i in idx.items()}}
        for name in ("fp32", *candidates):
            c = r[name]
            row[name] = {h: {"top1": float(c[i].mean()), "ci95": list(wilson(int(c[i].sum()), len(i)))}
                         for h, i in idx.items()}
            if name == "fp32":
                continue
            for h, i in idx.items():
                row[name][h]["vs_fp32"] = paired_bootstrap(r["fp32"][i], c[i])
            if name != chosen:
                row[name]["report"]["chosen_minus_this"] = paired_bootstrap(c[idx["report"]],
                                                                             r[chosen][idx["report"]])
        table[k] = row
    return {"chosen_on_tuning_half": chosen, "tuning": tests, "rows": table,
            "macs_share": {k: r["macs"] for k, r in rows.items()}}


def _pts(d: dict) -> str:
    return f"{100 * d['diff']:+.1f} ({100 * d['ci95'][0]:+.1f}…{100 * d['ci95'][1]:+.1f})"


def _half_table(res: dict, candidates, h: str) -> list[str]:
    lines = ["| model | images | FP32 | " + " | ".join(candidates) + " |", "|" + "---|" * (3 + len(candidates))]
    for k, row in res["rows"].items():
        f = row["fp32"][h]
        cells = [f"{100 * row[n][h]['top1']:.1f}, {_pts(row[n][h]['vs_fp32'])}" for n in candidates]
        lines.append(f"| {k} | {row['images'][h]} | {100 * f['top1']:.1f} ({100 * f['ci95'][0]:.1f}…"
                     f"{100 * f['ci95'][1]:.1f}) | " + " | ".join(cells) + " |")
    return lines


def markdown(res: dict, candidates, target: float) -> str:
    chosen, tuning = res["chosen_on_tuning_half"], res["tuning"]
    lines = ["Cells: top-1 %, INT8 − FP32 in points (95 % paired bootstrap); FP32 with its Wilson 95 % interval.",
             "", "Tuning half (the choice is made here):", "", *_half_table(res, candidates, "tune"), "",
             "Tuning half, worst model's INT8 − FP32 and eligibility (exact scales, >= 90 % int8 MACs): "
             + "; ".join(f"{n}: {100 * t['worst']:+.1f}{'' if t['eligible'] else ' (not eligible)'}"
                         for n, t in tuning.items()),
             "", f"Chosen: **{chosen}** (the first eligible candidate within {target:g} points of FP32 on every "
             "model's tuning half; none: the closest)", "",
             "Report half (images that played no part in the choice):", "",
             *_half_table(res, candidates, "report"), "",
             "MACs per precision (int8 share): " + "; ".join(
                 f"{k}: " + ", ".join(f"{n} {100 * m.get('int8', 0):.1f} %" for n, m in v.items())
                 for k, v in res["macs_share"].items()), "",
             f"{chosen} minus each other candidate on the report half (points, 95 % paired bootstrap):"]
    for k, row in res["rows"].items():
        parts = [f"{n}: {_pts(row[n]['report']['chosen_minus_this'])} {row[n]['report']['chosen_minus_this']['verdict']}"
                 for n in candidates if n != chosen]
        lines.append(f"- {k}: " + "; ".join(parts))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", choices=[*ROWS, "squeeze", "fmnist"])
    ap.add_argument("--candidate", action="append",
                    help=f"PRESET[:METHOD][+auto[=BUDGET]], simplest first (default: {', '.join(CANDIDATES)})")
    ap.add_argument("--target", type=float, default=0.5, help="top-1 points from FP32 to meet (default 0.5)")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--cache", metavar="DIR", help="keep per-image outcomes here (a rerun resumes)")
    ap.add_argument("--criterion", choices=("top1", "kl"), default="kl", help=(
        "top1: the first candidate within --target of FP32 on every model's tuning half, then the report "
        "half; kl: measure the tuning half only and choose by the pooled output KL (choose_kl)"))
    args = ap.parse_args()
    import onnxruntime as ort
    ort.set_default_logger_severity(3)
    from build import build

    from torq.evaluate.protocol import halves
    candidates = args.candidate or list(CANDIDATES)
    rows = {}
    for name, entry in build(only=args.only or list(ROWS)).items():
        print(f"{name}:", file=sys.stderr)
        rows[name] = outcomes(entry, candidates, args.limit, Path(args.cache) / name if args.cache else None,
                              half="tune" if args.criterion == "kl" else "all")
    recipes = {c: recipe_of(c, entry) for c in candidates}
    if args.criterion == "kl":
        chosen, figures = choose_kl(rows, candidates, recipes)
        print(kl_markdown(rows, candidates, chosen, figures))
        if args.json:
            from torq.fileio import atomic_write_json
            atomic_write_json(args.json, {"chosen_on_tuning_half": chosen, "criterion": "kl", "pooled": figures,
                                          "macs_share": {k: r["macs"] for k, r in rows.items()}})
        return
    half = {k: halves(len(r["labels"]), args.split_seed) for k, r in rows.items()}
    chosen, tests = choose(rows, candidates, half, args.target, recipes)
    res = report(rows, candidates, chosen, half, tests)
    print(markdown(res, candidates, args.target))
    if args.json:
        from torq.fileio import atomic_write_json
        atomic_write_json(args.json, res)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
