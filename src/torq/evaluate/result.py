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
    lsb: Counter = field(default_factory=Counter)      # NSS − ORT integer logits (int8 or int16), in LSB
    ort_margin: np.ndarray | None = None               # ORT integer top-1 − top-2 logit (LSB)
    precision: dict = field(default_factory=dict)      # quantize.sensitivity.precision_summary
    _ort_logits: dict = field(default_factory=dict, repr=False)
    int8_model: object = field(default=None, repr=False)    # the int8 ModelProto measured

    @classmethod
    def start(cls, model, data, opts, classes: int, calib_images: int, paths=PATHS) -> "EvalResult":
        k = min(5, classes)
        from ..quantize.recipe import preset_name
        recipe = opts.measured_recipe
        settings = {"preprocess": opts.preprocess.describe(), "preprocess_spec": recipe.preprocess, "batch": opts.batch, "rounding": opts.rounding,
                    "recipe": recipe.to_dict(), "recipe_fingerprint": recipe.fingerprint(),
                    "recipe_name": preset_name(recipe) or "custom",
                    "onnx_reference": opts.onnx_reference, "half": opts.half, "split_seed": opts.split_seed,
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
        """A progress bar on stderr advanced by finished images (``torq.progress``: rich on a
        terminal, timestamped lines in logs and pipes; no-op when not shown)."""
        if not show:
            yield lambda n: None
            return
        from ..progress import bar
        done = [0]
        with bar(f"evaluate: {what}", "images") as update:
            update(0, total)

            def advance(n):
                done[0] += n
                update(done[0], total)
            yield advance

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

    def correct(self, path: str) -> np.ndarray:
        """Per image: 1 if ``path``'s top-1 is the label."""
        return (self.top[path][:, 0] == self.labels).astype(np.int64)

    def intervals(self) -> dict:
        """95 % intervals: each path's top-1 (Wilson) and each INT8 path minus FP32 (paired bootstrap)."""
        from .protocol import paired_bootstrap, wilson
        out = {"top1_ci95": {p: list(wilson(int(self.correct(p).sum()), self.images)) for p in self.paths}}
        out["top1_diff_vs_fp32"] = {p: paired_bootstrap(self.correct("fp32"), self.correct(p))
                                    for p in self.paths if p != "fp32"} if self.images else {}
        return out

    def refused(self) -> bool:
        """FP32 at chance level with no normalisation declared: the usual raw-pixels mistake."""
        from ..quantize.calibration import has_norm
        return bool(self.warnings()) and not has_norm(self.settings.get("preprocess_spec", ""))

    def warnings(self) -> list[str]:
        """What makes the numbers meaningless: FP32 at chance level (usually the preprocessing)."""
        from .protocol import at_chance
        classes = self.settings.get("classes", 0)
        hits = int(self.correct("fp32").sum())
        if at_chance(hits, self.images, classes):
            return [f"FP32 top-1 {100 * hits / max(1, self.images):.1f} % is at chance level "
                    f"({100 / classes:.1f} % for {classes} classes): the inputs are not what the model was "
                    f"trained on; check --preprocess norm= (now: {self.settings['preprocess']})"]
        return []

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
        out.update(self.intervals())
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
