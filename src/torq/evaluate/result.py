"""The outcome of one evaluation: numbers, per-image top-5, and its JSON / Markdown / PNG forms."""
from __future__ import annotations

import contextlib
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import metrics

PATHS = ("fp32", "int8_ort", "int8_nss")
ONNX_REFERENCE = "int8_onnx"     # optional: the int8 model as its ONNX definition (ORT, no fusion)


@dataclass
class EvalResult:
    model: str
    dataset: str
    labels: np.ndarray
    settings: dict
    top: dict = field(default_factory=dict)            # path -> N×k class indices
    seconds: dict = field(default_factory=lambda: {p: 0.0 for p in PATHS})
    sqnr: list = field(default_factory=list)
    lsb: Counter = field(default_factory=Counter)      # NSS − ORT int8 logits, in LSB
    ort_margin: np.ndarray | None = None               # ORT int8 top-1 − top-2 logit (LSB)
    precision: dict = field(default_factory=dict)      # quantize.sensitivity.precision_summary
    _ort_logits: dict = field(default_factory=dict, repr=False)

    @classmethod
    def start(cls, model, data, opts, classes: int, calib_images: int, paths=PATHS) -> "EvalResult":
        k = min(5, classes)
        settings = {"preprocess": opts.preprocess.describe(), "batch": opts.batch, "rounding": opts.rounding,
                    "per_channel": opts.per_channel, "calibrate_method": opts.calibrate_method,
                    "bias_correction": opts.bias_correction, "equalize": opts.equalize,
                    "exact_scales": opts.exact_scales, "precision": opts.precision,
                    "accuracy_budget": opts.accuracy_budget if opts.precision == "auto" else None,
                    "onnx_reference": opts.onnx_reference,
                    "calibration": opts.calibration or f"split of {opts.calibration_split}",
                    "calibration_images": min(calib_images, opts.num_calib), "classes": classes}
        r = cls(str(model), data.name, data.labels.copy(), settings)
        paths = tuple(paths) + ((ONNX_REFERENCE,) if opts.onnx_reference and paths == PATHS else ())
        r.top = {p: np.full((len(data), k), -1, np.int64) for p in paths}
        r.seconds = {p: 0.0 for p in paths}
        r.ort_margin = np.full(len(data), -1, np.int64) if classes >= 2 else None
        return r

    @property
    def paths(self) -> tuple:
        return tuple(self.top)

    @property
    def images(self) -> int:
        return len(self.labels)

    def record(self, path: str, start: int, logits: np.ndarray) -> None:
        """Store a batch's top-k; the int8 paths are also compared logit by logit (LSB)."""
        k = self.top[path].shape[1]
        self.top[path][start:start + len(logits)] = metrics.topk(logits, k)
        if path == "int8_ort" and self.ort_margin is not None and np.asarray(logits).dtype.kind in "iu":
            self.ort_margin[start:start + len(logits)] = metrics.top2_margin(logits)
        if path in ("int8_ort", "int8_nss"):
            other = "int8_nss" if path == "int8_ort" else "int8_ort"
            if start in self._ort_logits.get(other, {}):
                a, b = (logits, self._ort_logits[other].pop(start))
                nss, ort = (a, b) if path == "int8_nss" else (b, a)
                self.lsb.update(metrics.lsb_histogram(nss, ort))
            else:
                self._ort_logits.setdefault(path, {})[start] = np.array(logits, copy=True)

    @contextlib.contextmanager
    def progress(self, what: str, total: int, show: bool):
        """A rich progress bar on stderr advanced by finished images (no-op when not shown)."""
        if not show:
            yield lambda n: None
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
        from rich.console import Console
        with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                      TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(what, total=total)
            yield lambda n: bar.advance(task, n)

    def finish(self) -> None:
        self._ort_logits.clear()

    # ------------------------------------------------------------------ numbers
    def accuracy(self, path: str) -> dict:
        return metrics.accuracy(self.top[path], self.labels)

    def agreement(self, a: str, b: str) -> float:
        return metrics.agreement(self.top[a], self.top[b])

    def disagreement_margins(self) -> dict[int, int] | None:
        """NSS-vs-ORT top-1 disagreements counted by ORT's top-2 logit margin (LSB), or None
        when the outputs are not integer logits."""
        if self.ort_margin is None or (self.ort_margin < 0).any() or "int8_ort" not in self.top:
            return None
        return dict(sorted(metrics.disagreement_margins(
            self.top["int8_nss"], self.top["int8_ort"], self.ort_margin).items()))

    def images_per_s(self, path: str) -> float:
        s = self.seconds[path]
        return self.images / s if s > 0 else math.inf

    def to_json(self, per_image: bool = True) -> dict:
        out = {"model": self.model, "dataset": self.dataset, "images": self.images, "settings": self.settings}
        for p in self.paths:
            out[p] = self.accuracy(p)
        for p in self.paths:
            if p != "fp32" and p != ONNX_REFERENCE:
                out[f"agreement_{p}_vs_fp32"] = self.agreement(p, "fp32")
        if "int8_ort" in self.top:
            out["agreement_nss_vs_ort"] = self.agreement("int8_nss", "int8_ort")
        if ONNX_REFERENCE in self.top:
            out["agreement_ort_vs_onnx_reference"] = self.agreement("int8_ort", ONNX_REFERENCE)
            out["agreement_nss_vs_onnx_reference"] = self.agreement("int8_nss", ONNX_REFERENCE)
        margins = self.disagreement_margins()
        if margins is not None:
            out["nss_vs_ort_disagreements_by_ort_margin_lsb"] = {str(k): v for k, v in margins.items()}
            out["ort_margin_lsb_counts"] = {str(k): int(v) for k, v in zip(
                *np.unique(np.minimum(self.ort_margin, 16), return_counts=True))}
        out["images_per_s"] = {p: self.images_per_s(p) for p in self.paths}
        if self.precision:
            out["precision"] = self.precision
        out["sqnr_db"] = [{"tensor": s["tensor"], "sqnr_db": _finite(s["sqnr_db"])} for s in self.sqnr]
        out["lsb_diff_nss_vs_ort"] = {str(k): v for k, v in sorted(self.lsb.items())}
        if per_image:
            out["per_image"] = {"label": self.labels.tolist(),
                                **{p: self.top[p][:, 0].tolist() for p in self.paths}}
        return out

    def markdown(self) -> str:
        from .report import markdown
        return markdown(self)

    def write(self, folder: str | Path, plots: bool = True) -> list[Path]:
        """evaluation.json, evaluation.md and (with matplotlib) sqnr.png, lsb_hist.png in ``folder``."""
        from .report import write
        return write(self, Path(folder), plots)


def _finite(v: float):
    return v if math.isfinite(v) else ("inf" if v > 0 else "-inf")
