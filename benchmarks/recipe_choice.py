"""Choose the recommended int8 recipe on the tuning half, report it on the other half.

    python benchmarks/recipe_choice.py [--only effnet|lite1|lite2|fmnist ...] [--candidate NAME ...]
                                       [--limit N] [--json OUT]

For each benchmark model (benchmarks/models/build.py) and each candidate recipe (named presets, and
``NAME:METHOD`` for another calibration method), quantizes with the row's held-apart calibration
images and classifies every evaluation image with FP32 and INT8 (ONNX Runtime; with exact scales the
NSS reproduces it bit for bit, see accuracy.py). The evaluation images are split by a seeded
permutation (torq.evaluate.protocol.halves): the candidate with the smallest mean top-1 drop over the
models on the *tuning* half is chosen; the *report* half, which played no part in the choice, gives
the numbers quoted: top-1 with a 95 % Wilson interval and INT8 − FP32 with a 95 % paired-bootstrap
interval, and the chosen recipe against every other candidate ("no gain" when the interval includes 0).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks" / "models"))

CANDIDATES = ("per-channel", "exact", "cle", "exact:entropy", "exact:percentile")
ROWS = ("effnet", "lite1", "lite2")


def recipe_of(name: str, entry: dict):
    from torq.quantize.recipe_flags import load_recipe
    base, _, method = name.partition(":")
    r = load_recipe(base).replace(preprocess=entry["preprocess"], calibration_data=entry["calibration"])
    return r.replace(calibrate_method=method) if method else r


def outcomes(entry: dict, candidates, limit) -> dict:
    """{"labels", "fp32": per-image 0/1, candidate: per-image 0/1} on every evaluation image."""
    from torq.data import load_dataset
    from torq.evaluate.engines import OrtEngine, quantize_input
    from torq.evaluate.run import EvalOptions, batches, prepare, split
    from torq.graph.io_quant import io_quant_params
    out, cached = {}, None
    for name in candidates:
        opts = EvalOptions(recipe=recipe_of(name, entry), batch=50, limit=limit, progress=False)
        data, calib = split(load_dataset(entry["dataset"]), opts)
        fp32, q, iname, shape, _, _ = prepare(entry["model"], data, calib, opts)
        if cached is None:                      # the same preprocessed images for every candidate
            cached = list(batches(data, opts, iname, shape))
            f = OrtEngine(fp32)
            out["labels"] = data.labels
            out["fp32"] = np.concatenate([np.argmax(f(x), 1) for _, x in cached]) == data.labels
        qin = io_quant_params(q)["inputs"][iname]
        i8 = OrtEngine(q)
        pred = np.concatenate([np.argmax(i8(quantize_input(x, qin["scale"], qin["zero_point"])), 1)
                               for _, x in cached])
        out[name] = pred == data.labels
        print(f"  {name}: {100 * out[name].mean():.2f} (fp32 {100 * out['fp32'].mean():.2f})", file=sys.stderr)
    return out


def choose(rows: dict, candidates, half: dict) -> str:
    """The candidate with the smallest mean (FP32 − INT8) top-1 over the rows, on the tuning half."""
    def drop(name):
        return np.mean([r["fp32"][half[k]["tune"]].mean() - r[name][half[k]["tune"]].mean()
                        for k, r in rows.items()])
    return min(candidates, key=drop)


def report(rows: dict, candidates, chosen: str, half: dict) -> dict:
    from torq.evaluate.protocol import paired_bootstrap, wilson
    table = {}
    for k, r in rows.items():
        idx = {h: half[k][h] for h in ("tune", "report")}
        row = {"images": {h: int(len(i)) for h, i in idx.items()}}
        for name in ("fp32", *candidates):
            c = r[name]
            row[name] = {h: {"top1": float(c[i].mean()), "ci95": list(wilson(int(c[i].sum()), len(i)))}
                         for h, i in idx.items()}
            if name != "fp32":
                row[name]["report"]["vs_fp32"] = paired_bootstrap(r["fp32"][idx["report"]], c[idx["report"]])
                if name != chosen:
                    row[name]["report"]["chosen_minus_this"] = paired_bootstrap(c[idx["report"]],
                                                                                 r[chosen][idx["report"]])
        table[k] = row
    return {"chosen_on_tuning_half": chosen, "rows": table}


def markdown(res: dict, candidates) -> str:
    chosen = res["chosen_on_tuning_half"]
    lines = [f"Chosen on the tuning half: **{chosen}**. Report half (images that played no part in the choice):", "",
             "| model | images | FP32 | " + " | ".join(candidates) + " |", "|" + "---|" * (3 + len(candidates))]
    for k, row in res["rows"].items():
        f = row["fp32"]["report"]
        cells = []
        for name in candidates:
            rep = row[name]["report"]
            d = rep["vs_fp32"]
            cells.append(f"{100 * rep['top1']:.1f} ({100 * d['diff']:+.1f}, {100 * d['ci95'][0]:+.1f}…"
                         f"{100 * d['ci95'][1]:+.1f})")
        lines.append(f"| {k} | {row['images']['report']} | {100 * f['top1']:.1f} ({100 * f['ci95'][0]:.1f}…"
                     f"{100 * f['ci95'][1]:.1f}) | " + " | ".join(cells) + " |")
    lines += ["", f"{chosen} minus each other candidate on the report half (points, 95 % paired bootstrap):"]
    for k, row in res["rows"].items():
        parts = [f"{n}: {100 * row[n]['report']['chosen_minus_this']['diff']:+.1f} "
                 f"({100 * row[n]['report']['chosen_minus_this']['ci95'][0]:+.1f}…"
                 f"{100 * row[n]['report']['chosen_minus_this']['ci95'][1]:+.1f}, "
                 f"{row[n]['report']['chosen_minus_this']['verdict']})" for n in candidates if n != chosen]
        lines.append(f"- {k}: " + "; ".join(parts))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", choices=[*ROWS, "fmnist"])
    ap.add_argument("--candidate", action="append", help=f"recipe[:method] (default: {', '.join(CANDIDATES)})")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    import onnxruntime as ort
    ort.set_default_logger_severity(3)
    from build import build

    from torq.evaluate.protocol import halves
    candidates = args.candidate or list(CANDIDATES)
    rows = {}
    for name, entry in build(only=args.only or list(ROWS)).items():
        print(f"{name}:", file=sys.stderr)
        rows[name] = outcomes(entry, candidates, args.limit)
    half = {k: halves(len(r["labels"]), args.split_seed) for k, r in rows.items()}
    res = report(rows, candidates, choose(rows, candidates, half), half)
    print(markdown(res, candidates))
    if args.json:
        from torq.fileio import atomic_write_json
        atomic_write_json(args.json, res)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
