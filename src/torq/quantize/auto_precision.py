"""``--precision auto --accuracy-budget X``: the fewest int16 layers (by MACs) that keep the model
within X of FP32, chosen by measurement on calibration data only.

1. Sensitivity (``sensitivity.measure``) on the calibration split: each layer's output KL with
   only that layer in int8.
2. Layers are ranked by KL per MAC (what int16 buys per unit of int16 work: the MACs of the
   layers that read its output, ``int16_macs``) and promoted as a
   prefix of that ranking: the smallest prefix whose quantized model (the caller's recipe with
   those layers in int16, ``quantize_fn``) is within the budget on a *held-apart* calibration
   split, found by doubling then bisection. The held-apart samples are unlabelled: FP32's own
   softmax stands in for their labels, and the budget is the *expected top-1 loss* against it in
   percentage points, mean of ``p_fp32[top-1 of FP32] − p_fp32[top-1 of the quantized model]``
   (0 when they agree; small when FP32 itself hesitates between the two classes). Top-1
   disagreement, which counts every flip between two near-tied classes as a whole error (13 % of
   int8 EfficientNet-Lite0's top-1s on photos unlike ImageNet, where FP32 is unsure), is reported
   beside it. Promotion stops at ``max_int16_share`` of the MACs (``--int16-macs``).
   Never promoted: a layer read by an op with no int16 form on the NSS (a Sigmoid / HardSwish
   table, a Mul: promoting it would make the model uncompilable; ``precision.int8_only_layers``),
   and a layer given as ``NODE=int8`` beside ``auto``. A layer writing a graph output may be
   promoted (a classifier's costs no int16 MACs): under full-integer I/O that output is then int16,
   a 256 times finer grid for the caller's top-1 (exact int16 scales keep it ORT's, bit for bit).
   Budget 0 asks for no search: the longest prefix within the MAC cap is promoted outright (the
   knob is then the cap, chosen on a tuning set: benchmarks/recipe_choice.py); the held-apart
   samples are not needed to judge it, and no trial model is quantized.
3. The result says, per layer, what it chose and why (``AutoPrecision.layers``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

import numpy as np
import onnx

from ..errors import TorqError
from .sensitivity import LayerSensitivity, batched, chunks, measure, samples_of, softmax_kl


@dataclass(frozen=True)
class LayerChoice:
    name: str
    op_type: str
    macs: int
    kl: float
    sqnr_db: float
    precision: str          # "int8" | "int16"
    why: str

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class AutoPrecision:
    precision: dict                     # {node: "int16"} (every other layer int8)
    layers: list                        # [LayerChoice], graph order
    budget: float                       # allowed expected top-1 loss vs FP32, percentage points
    loss: float | None                  # that of the chosen model on the held-apart split (None: budget 0)
    disagreement: float | None          # its top-1 disagreement with FP32 there, percentage points
    kl: float | None                    # its mean output KL vs FP32 there
    met: bool
    int8_mac_share: float
    holdout_images: int
    trials: list = field(default_factory=list)   # [{"promoted", "int16_mac_share", "loss", "disagreement", "kl"}]

    def to_json(self) -> dict:
        return {"budget_top1_points": self.budget, "met": self.met,
                "holdout_images": self.holdout_images, "expected_top1_loss_points": self.loss,
                "disagreement_top1_points": self.disagreement,
                "kl": self.kl, "int8_mac_share": self.int8_mac_share,
                "int16_layers": sorted(self.precision), "trials": self.trials,
                "layers": [c.to_json() for c in self.layers]}


def outputs_of(model: onnx.ModelProto, samples, fused: bool = True) -> np.ndarray:
    """First output of ``model`` on the samples (an iterable of input dicts, each run as it comes),
    rows = samples (ORT; int8 QDQ fused)."""
    from ..reference import session
    sess = session(model, fused=fused)
    name = sess.get_outputs()[0].name
    rows = [np.asarray(sess.run([name], s)[0], np.float64) for s in samples]
    out = np.concatenate([r.reshape(-1, r.shape[-1]) for r in rows])
    return out


def compare(reference: np.ndarray, got: np.ndarray) -> tuple[float, float, float]:
    """(expected top-1 loss with FP32's softmax as the labels, top-1 disagreement — both in
    percentage points — and mean softmax KL) of two logit matrices (module docstring)."""
    if reference.shape[-1] < 2:
        raise TorqError("--precision auto compares top-1 with FP32: the model's first output must have "
                        "at least two classes on its last axis")
    z = reference - reference.max(axis=-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
    rows = np.arange(len(p))
    loss = 100.0 * float(np.mean(p[rows, reference.argmax(-1)] - p[rows, got.argmax(-1)]))
    dis = 100.0 * float(np.mean(reference.argmax(-1) != got.argmax(-1)))
    return loss, dis, softmax_kl(reference, got)


def choose(fp32: onnx.ModelProto, quantize_fn, calibration: list[dict], holdout: list[dict], budget: float,
           max_int16_share: float = 0.10, progress=None, keep_int8: Mapping[str, str] | None = None) -> AutoPrecision:
    """See the module docstring. ``quantize_fn(precision) -> quantized model`` (float I/O or
    full-integer with the same input; ``precision`` a {node: "int16"} dict); ``calibration`` /
    ``holdout``: disjoint lists of input dicts; ``keep_int8``: {layer: why} never promoted (measured
    and reported all the same; ``precision.int8_only_layers``)."""
    keep_int8 = keep_int8 or {}
    if not holdout:
        raise TorqError("--precision auto needs held-apart calibration images (none left after the split)")
    say = progress or (lambda *_: None)
    sens = measure(fp32, calibration, progress=lambda i, n, name: say(f"sensitivity {i + 1}/{n}: {name}"))
    cost, total = int16_macs(fp32, sens)
    sens = [replace(s, macs=cost[s.name]) for s in sens]
    ranked = sorted((s for s in sens if s.kl > 0 and s.name not in keep_int8), key=lambda s: -s.kl / max(s.macs, 1))
    cap = _cap(ranked, total, max_int16_share)
    if budget == 0:                   # no search: the cap decides (module docstring)
        share = sum(s.macs for s in ranked[:cap]) / total
        return _result(sens, ranked, cap, cap, budget, (None, None, share, None), {}, total, 0, keep_int8)
    # the held-apart samples in chunks (``sensitivity.chunks``), each batched when it is run
    reference = outputs_of(fp32, (b for part in chunks(fp32, holdout) for b in batched(fp32, part)), fused=False)
    cache: dict[int, tuple] = {}

    def trial(k: int):
        if k not in cache:
            prec = {s.name: "int16" for s in ranked[:k]}
            say(f"trying {k} int16 layers")
            model = quantize_fn(prec)
            loss, dis, kl = compare(reference, outputs_of(model, holdout))
            cache[k] = (loss, kl, sum(s.macs for s in ranked[:k]) / total, dis)
        return cache[k]

    k = _search(trial, budget, cap)
    if trial(k)[0] > budget:          # never within: the best prefix tried (loss, then KL)
        k = min(cache, key=lambda n: (cache[n][0], cache[n][1], n))
    return _result(sens, ranked, k, cap, budget, trial(k), cache, total, len(reference), keep_int8)


def int16_macs(fp32: onnx.ModelProto, sens: list[LayerSensitivity]) -> tuple[dict[str, int], int]:
    """({layer: the MACs that run int16 × int8 when its output is int16}, the model's MACs), by
    ``graph.macs``: a layer's int16 output is read by the Conv / Gemm / MatMul layers behind it
    (through data movement), which then multiply two byte planes; the layer itself still
    multiplies at its input's width. The cap and the MAC shares count this, as
    ``precision.mac_share`` does on the quantized model."""
    from ..graph.macs import macs_by_node
    from .precision import MOVES, _batch_of_one
    macs = macs_by_node(_batch_of_one(fp32))
    readers: dict[str, list] = {}
    for n in fp32.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)

    def behind(tensor: str, seen: set) -> int:
        got = 0
        for r in readers.get(tensor, []):
            if (r.name or r.output[0]) in seen:
                continue
            seen.add(r.name or r.output[0])
            if r.op_type in MOVES:
                got += sum(behind(o, seen) for o in r.output)
            elif r.input and r.input[0] == tensor:
                got += macs.get(r.name or r.output[0]) or 0
        return got
    return {s.name: behind(s.tensor, set()) for s in sens}, sum(v or 0 for v in macs.values()) or 1


def _cap(ranked: list[LayerSensitivity], total: int, share: float) -> int:
    """The longest prefix of ``ranked`` within ``share`` of the MACs."""
    macs, k = 0, 0
    for s in ranked:
        if (macs + s.macs) / total > share:
            break
        macs += s.macs
        k += 1
    return k


def _search(trial, budget: float, cap: int) -> int:
    """Smallest prefix length k <= cap with trial(k) within budget (doubling, then bisection on
    the assumption that more int16 never hurts); cap when none is (the caller then takes the
    best prefix it tried: a few held-apart images make the loss noisy)."""
    if trial(0)[0] <= budget or cap == 0:
        return 0
    lo, hi = 0, 1
    while hi < cap and trial(hi)[0] > budget:
        lo, hi = hi, min(cap, hi * 2)
    if trial(hi)[0] > budget:
        return cap
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if trial(mid)[0] > budget else (lo, mid)
    return hi


def _result(sens, ranked, k, cap, budget, chosen, cache, total, images, keep_int8=None) -> AutoPrecision:
    keep_int8 = keep_int8 or {}
    loss, kl, share, dis = chosen
    promoted = {s.name for s in ranked[:k]}
    rank = {s.name: i + 1 for i, s in enumerate(ranked)}
    met = loss is None or loss <= budget
    layers = []
    for s in sens:
        mac = f"int16 output: {100 * s.macs / total:.2f} % of MACs int16 × int8"
        if s.name in keep_int8:
            why = f"int8: {keep_int8[s.name]} (KL {s.kl:.2e} in int8)"
        elif loss is None:            # budget 0: the MAC cap decides
            why = (f"int16: rank {rank[s.name]} by KL per MAC (KL {s.kl:.2e} in int8, {mac}), within the int16 "
                   "MAC cap" if s.name in promoted else
                   f"int8: promoting it would pass the int16 MAC cap ({mac}, rank {rank[s.name]})"
                   if s.name in rank else "int8: no measurable sensitivity")
        elif s.name in promoted:
            why = (f"int16: rank {rank[s.name]} by KL per MAC (KL {s.kl:.2e} in int8, {mac}); "
                   f"the budget needed the first {k}")
        elif not met and s.name in rank and rank[s.name] > cap:
            why = f"int8: promoting it would pass the int16 MAC cap ({mac}, rank {rank[s.name]})"
        elif not met and s.name in rank:
            why = (f"int8: the budget was not met by any prefix tried; the first {k} were the closest "
                   f"({loss:.2f} expected top-1 points)")
        elif k == 0:
            why = f"int8: all-int8 is within the budget ({loss:.2f} <= {budget:g} expected top-1 points)"
        else:
            why = f"int8: the budget held with the {k} layers ranked above it" if s.name in rank else \
                "int8: no measurable sensitivity"
        layers.append(LayerChoice(s.name, s.op_type, s.macs, s.kl, s.sqnr_db,
                                  "int16" if s.name in promoted else "int8", why))
    trials = [{"promoted": n, "int16_mac_share": round(v[2], 6), "loss": v[0], "disagreement": v[3], "kl": v[1]}
              for n, v in sorted(cache.items())]
    return AutoPrecision({n: "int16" for n in sorted(promoted)}, layers, budget, loss, dis, kl, met,
                         1.0 - share, images, trials)


def split_holdout(samples: list[dict], holdout: int | None = None) -> tuple[list, list]:
    """(calibration, held-apart) samples: the last ``holdout`` (default a third, at least one)."""
    n = len(samples)
    h = max(1, n // 3) if holdout is None else int(holdout)
    if not 0 < h < n:
        raise TorqError(f"--holdout {h}: need at least one calibration and one held-apart sample of {n}")
    return samples[:n - h], samples[n - h:]


def apply_auto(recipe, src: onnx.ModelProto, reader, *, where: str = "model", wrap_lone_ops: bool = False):
    """``recipe.apply`` for ``--precision auto``: the calibration samples split (last third held
    apart), the recipe's fp32 transforms and ranges on the calibration part, the int16 layers
    chosen (``choose``), then the final model quantized with them on every calibration sample
    and the choice stamped on it (``precision.stamp``). Returns a ``recipe.Quantized`` whose recipe
    names the chosen layers. The whole resolution is cached like any quantization
    (``model_cache``, keyed by the fp32 model, the auto recipe and the samples): ``quantize``,
    ``discover`` and ``run`` of one model measure its sensitivity once."""
    from .calibration import ArrayDataReader
    from .model_cache import cached
    from .precision import name_nodes
    from .recipe import Quantized, prepare, recipe_of
    calib, hold = split_holdout(samples_of(reader))
    base = recipe.replace(precision=tuple(p for p in recipe.precision if p[0] != "*"))
    # the final model's fp32 graph: on *every* calibration sample (the held-apart ones only judge
    # the choice), so `quantize --recipe <resolved>.json` writes the same model
    prepared = name_nodes(prepare(base, src, ArrayDataReader(calib + hold), where))
    q = cached(recipe, src, reader, wrap_lone_ops, resolves=True, compute=lambda: _resolve(
        recipe, base, src, prepared, calib, hold, where=where, wrap_lone_ops=wrap_lone_ops))
    return Quantized(q, prepared, recipe_of(q))


def _resolve(recipe, base, src, prepared, calib: list, hold: list, *, where: str, wrap_lone_ops: bool):
    """The int16 layers chosen on ``calib`` / ``hold`` and the final model quantized with them
    (on ``prepared``: every sample), the choice stamped on it."""
    from ..progress import stage
    from .calibration import ArrayDataReader
    from .precision import int8_only_layers, name_nodes, stamp
    from .recipe import prepare, quantize_prepared
    measured = prepared if base.equalize == "off" and not base.bias_correction else \
        name_nodes(prepare(base, src, ArrayDataReader(calib), where))   # CLE / bias correction: calibration part only

    def with_layers(chosen: dict):
        return base.replace(precision=tuple(sorted({**dict(base.precision), **chosen}.items())))

    def trial(chosen: dict):
        return quantize_prepared(with_layers(chosen).replace(full_integer=False), measured,
                                 ArrayDataReader(calib), where=where)
    keep = {**int8_only_layers(measured),
            **{n: f"given as --precision {n}=int8" for n, p in base.precision if p == "int8"}}
    with stage(f"quantize: precision auto (per-layer sensitivity on {len(calib)} samples"
               + (")" if recipe.accuracy_budget == 0 else ", trial models)")):
        result = choose(measured, trial, calib, hold, recipe.accuracy_budget,
                        max_int16_share=recipe.int16_macs / 100, keep_int8=keep)
    q = quantize_prepared(with_layers(result.precision), prepared, ArrayDataReader(calib + hold), where=where,
                          wrap_lone_ops=wrap_lone_ops)
    return stamp(q, result.to_json())


def resolve_auto(recipe, model):
    """The concrete recipe ``--precision auto`` resolves to for ``model`` (the chosen int16 layers
    as NODE=int16 entries): what discover / run carry layer by layer. Deterministic for the same
    model, recipe and calibration data."""
    from rich.console import Console

    from .recipe import apply, recipe_of
    if ("*", "auto") not in recipe.precision:
        return recipe
    if recipe.accuracy_budget > 0 and not recipe.calibration_data:
        raise TorqError("--precision auto needs real calibration data (--calibration-data): the choice is "
                        "measured against FP32 on held-apart samples")
    with Console(stderr=True).status("--precision auto: measuring which layers need int16 ..."):
        return recipe_of(apply(recipe, model).model)
