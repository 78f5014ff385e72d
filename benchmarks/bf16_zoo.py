"""The torchvision zoo in bf16 on the NSS: ``discover --auto-convert-bf16`` then ``run``, one table.

    python benchmarks/bf16_zoo.py                        # every CNN of benchmarks/torchvision_zoo.py + convnext + vit
    python benchmarks/bf16_zoo.py --models resnet18,vit_b_16 --images 8 --json build/bf16_zoo.json

Per model (exported by ``zoo.export``: seeded random weights, batch 1, opset 17):
  layers on NSS / total   discover --auto-convert-bf16 --skip-mode (vit_b_16 with --dedup-layers):
                          layers whose recommended executor is nss / layers discover tested
  run rel / run |Δ|       ``run --auto-convert-bf16`` on one random input: the largest relative
                          difference, and the largest |Δ| as a fraction of max |fp32 logit|
  top-1 agree             the whole bf16 model on the NSS vs ONNX Runtime fp32, --images random inputs
  compile s               bf16 conversion + ONNX -> torq_hl of the whole model
  NSS ms / ORT ms         per image, batch 1, same process, interleaved (the host load is printed:
                          a loaded host inflates both; the ratio is the number to read)
  discover s              wall time of discover (per-layer compiles dominate)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torchvision_zoo as zoo  # noqa: E402

CNNS = [m for m in zoo.MODELS if m not in ("convnext_tiny", "vit_b_16")]
DEFAULT = CNNS + ["convnext_tiny", "vit_b_16"]


def with_live_head(path: Path) -> tuple[Path, bool]:
    """The model, or a copy whose all-zero 2-D float initializers (torchvision's ViT inits its
    classification head to 0: every logit 0, top-1 a tie) are seeded random: (path, changed)."""
    import onnx
    from onnx import numpy_helper
    m = onnx.load(str(path))
    rng = np.random.default_rng(2)
    changed = False
    for t in m.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.ndim == 2 and a.dtype == np.float32 and a.size > 1000 and not a.any():
            t.CopyFrom(numpy_helper.from_array((rng.standard_normal(a.shape) * 0.02).astype(np.float32), t.name))
            changed = True
    if not changed:
        return path, False
    out = path.with_name(path.stem + ".randhead.onnx")
    onnx.save(m, str(out))
    return out, True


def discover_and_run(path: Path, out: Path, dedup: bool) -> dict:
    from torq.gen_config.discover import DiscoverOptions, run_discovery
    from torq.gen_config.options import QuantSettings
    from torq.gen_config.run import RunOptions, run_full
    quant = QuantSettings(auto_convert_bf16=True)
    t0 = time.perf_counter()
    report, _ = run_discovery(DiscoverOptions(model=path, output_dir=out, quant=quant, skip_mode=True, dedup=dedup))
    t_disc = time.perf_counter() - t0
    tested = [op for op in report["ops"].values() if op.get("executors")]
    on_nss = sum(op.get("recommended_executor") == "nss" for op in tested)
    not_nss = sorted({lid.split("_")[0] for lid, op in report["ops"].items()
                      if op.get("executors") and op.get("recommended_executor") != "nss"})
    report, _ = run_full(RunOptions(path, out, quant))
    m = report["full_model_metrics"]
    (o,) = m["outputs"].values()
    return {"nss": on_nss, "layers": len(tested), "off_nss_ops": not_nss, "discover_s": round(t_disc, 1),
            "run_pass": m["passed"], "run_rel": o["max_rel_diff"], "run_abs_frac": o["abs_frac"]}


def speed_and_agreement(path: Path, images: int, rounds: int) -> dict:
    import torq
    from torq import reference
    from torq.graph.bf16 import convert_to_bf16
    from torq.graph.load import load_model
    fp32 = load_model(path)
    t0 = time.perf_counter()
    compiled = torq.compile(convert_to_bf16(fp32))
    compile_s = time.perf_counter() - t0
    sess = reference.session(fp32)
    rng = np.random.default_rng(0)
    name = fp32.graph.input[0].name
    xs = [{name: rng.standard_normal((1, 3, 224, 224)).astype(np.float32)} for _ in range(images)]
    agree = [int(compiled.run(x)[o].argmax() == reference.run(fp32, x, sess)[o].argmax())
             for x in xs for o in [fp32.graph.output[0].name]]
    nss_ms, ort_ms = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        compiled.run(xs[0])
        nss_ms.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        sess.run(None, xs[0])
        ort_ms.append((time.perf_counter() - t) * 1e3)
    ratios = [a / b for a, b in zip(nss_ms, ort_ms)]
    return {"compile_s": round(compile_s, 1), "top1_agree": f"{sum(agree)}/{len(agree)}",
            "nss_ms": round(statistics.median(nss_ms), 1), "ort_ms": round(statistics.median(ort_ms), 1),
            "ratio": round(statistics.median(ratios), 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT))
    ap.add_argument("--images", type=int, default=8, help="random inputs for top-1 agreement (default 8)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds, interleaved with ORT (default 5)")
    ap.add_argument("--out", default=str(zoo.BUILD / "bf16"), help="discover/run output folder")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--no-discover", action="store_true", help="only compile / agreement / speed")
    args = ap.parse_args(argv)
    print(f"host load (1/5/15 min): {' '.join(f'{v:.1f}' for v in os.getloadavg())} on {os.cpu_count()} cores")
    rows = []
    for m in [s.strip() for s in args.models.split(",") if s.strip()]:
        path, random_head = with_live_head(zoo.export(m))
        row = {"model": m + (" (random head)" if random_head else "")}
        try:
            if not args.no_discover:
                row.update(discover_and_run(path, Path(args.out) / m, dedup=m == "vit_b_16"))
            row.update(speed_and_agreement(path, args.images, args.rounds))
        except Exception as e:  # noqa: BLE001 - a failing model is a row, not the end of the table
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"host load after: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    return 0


def print_table(rows) -> None:
    head = "| model | layers on NSS | run max rel | run max abs / max fp32 | top-1 agree | compile s | NSS ms | ORT ms | ratio | discover s |"
    print(head)
    print("|---" * 10 + "|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | error: {r['error']} |")
            continue
        nss = f"{r['nss']}/{r['layers']}" if "layers" in r else "-"
        rel = f"{r['run_rel']:.3g}" if "run_rel" in r else "-"
        frac = f"{r['run_abs_frac']:.2%}" if "run_abs_frac" in r else "-"
        print(f"| {r['model']} | {nss} | {rel} | {frac} | {r['top1_agree']} | {r['compile_s']} | {r['nss_ms']} | "
              f"{r['ort_ms']} | {r['ratio']}x | {r.get('discover_s', '-')} |")


if __name__ == "__main__":
    sys.exit(main())
