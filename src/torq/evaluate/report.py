"""An EvalResult as files: JSON (machines), Markdown (people), PNG plots (SQNR, LSB histogram).

Every file is written atomically (``torq.fileio``). Plots use matplotlib's Agg backend, which
needs no display and no system libraries.
"""
from __future__ import annotations

import io
import math
from pathlib import Path

from ..fileio import atomic_write_bytes, atomic_write_json, atomic_write_text

_LABELS = {"fp32": "FP32 (ORT)", "int8_ort": "INT8 (ORT)", "int8_nss": "INT8 (NSS, {rounding} rounding)",
           "int8_onnx": "INT8 (ONNX reference: ORT, DQ → float op → Q)", "bf16_nss": "BF16 (NSS)"}


def _pct(v: float) -> str:
    return f"{100 * v:.2f}"


def markdown(r) -> str:
    has_top5 = r.top["fp32"].shape[1] >= 5
    setup = (f"calibration: {r.settings['calibration']} ({r.settings['calibration_images']} images); recipe "
             f"{r.settings['recipe_name']} [{r.settings['recipe_fingerprint']}]"
             if r.settings.get("precision") != "bf16" else "bf16 (no calibration)")
    lines = [f"# Accuracy of `{Path(r.model).name}` on `{r.dataset}`", "",
             f"{r.images} evaluation images; {setup}; preprocessing `{r.settings['preprocess']}`"
             + (f"; images: the {r.settings['half']} half (seed {r.settings['split_seed']})"
                if r.settings.get("half", "all") != "all" else "") + ".", "",
             *[f"**WARNING: {w}**" for w in r.warnings()],
             "| path | top-1 % (95 % interval) | Δ top-1 vs FP32, points (95 % interval) | "
             + ("top-5 % | " if has_top5 else "") + "top-1 agreement with FP32 % | images/s |",
             "|---|---|---|" + ("---|" if has_top5 else "") + "---|---|"]
    iv = r.intervals()
    for p in r.paths:
        label, acc = _LABELS[p].format(rounding=r.settings.get("rounding", "native")), r.accuracy(p)
        top5 = f"{_pct(acc['top5'])} | " if has_top5 else ""
        lo, hi = iv["top1_ci95"][p]
        d = iv["top1_diff_vs_fp32"].get(p)
        delta = f"{100 * d['diff']:+.2f} ({100 * d['ci95'][0]:+.2f} … {100 * d['ci95'][1]:+.2f}): {d['verdict']}" \
            if d else "-"
        lines.append(f"| {label} | {_pct(acc['top1'])} ({_pct(lo)} … {_pct(hi)}) | {delta} | {top5}"
                     f"{_pct(r.agreement(p, 'fp32'))} | {r.images_per_s(p):.1f} |")
    lines += [""]
    if "int8_ort" in r.paths:
        lines += [f"INT8 (NSS) vs INT8 (ORT) top-1 agreement: {_pct(r.agreement('int8_nss', 'int8_ort'))} %.", ""]
    margins = r.disagreement_margins()
    if margins:
        worst = max(margins)
        close = int((r.ort_margin <= worst).sum())
        lines += [f"The {sum(margins.values())} disagreements by INT8 (ORT)'s top-1 − top-2 logit margin: "
                  + ", ".join(f"{k} LSB: {v}" for k, v in margins.items())
                  + f" ({close} images, {_pct(close / r.images)} %, have a margin ≤ {worst} LSB).", ""]
    if "int8_onnx" in r.paths:
        lines += [f"Two correct int8 executions disagree too: INT8 (ORT, fused integer kernels) vs the ONNX reference "
                  f"{_pct(r.agreement('int8_ort', 'int8_onnx'))} %, INT8 (NSS) vs the ONNX reference "
                  f"{_pct(r.agreement('int8_nss', 'int8_onnx'))} %.", ""]
    total = sum(r.lsb.values())
    if total:
        lines += ["NSS − ORT integer logits (LSB): " + ", ".join(
            f"{k:+d}: {v} ({100 * v / total:.2f} %)" for k, v in sorted(r.lsb.items())), ""]
    if r.sqnr:
        finite = [s["sqnr_db"] for s in r.sqnr if math.isfinite(s["sqnr_db"])]
        worst = sorted(r.sqnr, key=lambda s: s["sqnr_db"])[:5]
        median = f"median {sorted(finite)[len(finite) // 2]:.1f} dB; " if finite else ""
        lines += [f"Per-layer SQNR of INT8 vs FP32 activations ({len(r.sqnr)} tensors): {median}lowest: "
                  + ", ".join(f"`{s['tensor']}` {s['sqnr_db']:.1f} dB" for s in worst), ""]
    return "\n".join(lines)


def write(r, folder: Path, plots: bool = True) -> list[Path]:
    written = [atomic_write_json(folder / "evaluation.json", r.to_json()),
               atomic_write_text(folder / "evaluation.md", markdown(r) + "\n")]
    if r.int8_model is not None:        # the model measured: what `quantize --recipe` writes
        from ..fileio import save_model
        path = folder / f"{Path(r.model).stem}.int8.onnx"
        save_model(r.int8_model, path)
        written.append(path)
    if plots:
        written += [p for p in (_plot_sqnr(r, folder / "sqnr.png"), _plot_lsb(r, folder / "lsb_hist.png")) if p]
    return written


def _figure():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(plt, fig, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def _plot_sqnr(r, path: Path) -> Path | None:
    if not r.sqnr:
        return None
    plt = _figure()
    vals = [s["sqnr_db"] if math.isfinite(s["sqnr_db"]) else float("nan") for s in r.sqnr]
    fig, ax = plt.subplots(figsize=(max(6, len(vals) * 0.12), 3.5))
    ax.plot(range(len(vals)), vals, marker="o", markersize=3)
    ax.set_xlabel("quantized activation (graph order)")
    ax.set_ylabel("SQNR INT8 vs FP32 (dB)")
    ax.set_title(f"{Path(r.model).name}: per-layer SQNR ({r.settings['recipe']['calibrate_method']})")
    ax.grid(alpha=0.3)
    return _save(plt, fig, path)


def _plot_lsb(r, path: Path) -> Path | None:
    if not r.lsb:
        return None
    plt = _figure()
    keys = sorted(r.lsb)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(keys, [r.lsb[k] for k in keys])
    ax.set_yscale("log")
    ax.set_xlabel("NSS − ORT int8 output (LSB)")
    ax.set_ylabel("logits")
    ax.set_title(f"{Path(r.model).name}: NSS ({r.settings.get('rounding', 'native')} rounding) vs ORT")
    return _save(plt, fig, path)
