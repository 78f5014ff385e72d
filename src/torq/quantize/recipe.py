"""One quantization ``Recipe``: every choice between an fp32 model and the int8 model torq compiles.

``quantize``, ``discover``/``run``, ``evaluate`` and the benchmarks all build a Recipe (from the
one argparse group in ``recipe_cli.py``) and call ``apply`` — so the model a command deploys is
the model ``evaluate`` measured, and the reports carry the same ``fingerprint()``.

``apply`` runs in one fixed order:

    load → fold (constants/shapes, Pad → Conv, BatchNorm → Conv) → dead channels   (front end)
         → cross-layer equalization → bias correction                               (fp32, calibrated)
         → ONNX Runtime static quantization (include/exclude, per-layer precision)
         → QOperator islands / lone ops → exact scales → full-integer I/O

The first five steps are ``prepare`` (an fp32 model computing the same function, up to dust
channels and CLE's rescaling); ``discover`` cuts its layers from that prepared graph, so each layer
it tests is the layer the whole-model compile sees.
"""
from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace

import onnx

from ..errors import TorqError

FORMATS = ("qdq", "qoperator", "hybrid")
DTYPES = ("A8W8", "A16W8")
METHODS = ("minmax", "entropy", "percentile")
EQUALIZE = ("off", "bounded", "skip")
ROUNDINGS = ("nearest", "gptq")
PRECISIONS = ("int8", "int16", "bf16", "auto")


@dataclass(frozen=True)
class Recipe:
    """How to quantize. Defaults = ORT's static quantization behind torq's fp32 front end."""
    # --- the quantizer (ONNX Runtime quantize_static)
    format: str = "qdq"                 # qdq | qoperator | hybrid (qoperator when every op has a QLinear form)
    per_channel: bool = False           # one weight scale per output channel (depthwise nets need it)
    full_integer: bool = False          # integer graph I/O (int8; int16 from an int16 layer): no input Q / output DQ
    quant_dtype: str = "A8W8"           # activations × weights
    # --- calibration
    calibrate_method: str = "minmax"    # minmax | entropy | percentile (activation ranges)
    calibration_data: str | None = None  # .npz / <input>.npy folder / image folder or dataset SPEC; None = synthetic
    num_calib: int = 20                 # at most this many calibration samples
    preprocess: str = ""                # images -> input tensor (``torq.data.preprocess``), for image data
    # --- fp32 front end (semantics-preserving clean-ups a real export needs)
    fold: bool = True                   # ORT basic rewrites: constant/shape folding, Pad and BatchNorm into Conv
    dead_channels: bool = True          # zero BN-folded "dust" channels (< 1e-4 of the layer max) before per-channel
    input_shape: tuple = ()             # ("NAME=D0,D1,...", ...): sizes of input dims the export left open
    # --- fp32 transforms that trade a little calibration work for accuracy
    equalize: str = "off"               # cross-layer equalization: off | bounded (ReLU6 pairs bounded) | skip (ReLU6 left)
    bias_correction: bool = False       # Conv/Gemm biases corrected for int8 weight rounding (calibration means)
    exact_scales: bool = False          # weight scales moved <= 5 % so ORT's float requant is exact (NSS == ORT)
    weight_rounding: str = "nearest"    # nearest | gptq: int8 weights rounded for least layer-output error (QDQ)
    # --- what gets quantized, with ORT's names
    nodes_to_quantize: tuple = ()       # only these nodes (empty = all)
    nodes_to_exclude: tuple = ()        # these nodes stay float
    op_types_to_quantize: tuple = ()    # only these op types (empty = all)
    op_types_to_exclude: tuple = ()     # these op types stay float
    precision: tuple = ()               # ((node name, int8 | int16 | bf16), ...): per-layer activation precision;
                                        # node "*" = the whole model; ("*", "auto") = chosen by measurement
    accuracy_budget: float = 0.5        # precision auto: expected top-1 loss vs FP32 (points) on held-apart calibration;
                                        # 0 = no search: the most sensitive layers up to the int16 MAC cap
    int16_macs: float = 10.0            # precision auto: at most this % of the MACs int16 x int8

    def __post_init__(self):
        if self.calibration_data is not None and not isinstance(self.calibration_data, str):
            object.__setattr__(self, "calibration_data", str(self.calibration_data))   # a Path
        for f in fields(self):
            if isinstance(getattr(self, f.name), list):
                object.__setattr__(self, f.name, _frozen(getattr(self, f.name)))
        check(self)

    def replace(self, **changes) -> "Recipe":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = [list(x) if isinstance(x, tuple) else x for x in v]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Recipe":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise TorqError(f"recipe: unknown field(s) {', '.join(unknown)}")
        return cls(**{k: _frozen(v) for k, v in d.items()})

    def fingerprint(self) -> str:
        """12 hex digits of sha256 over every field: equal iff the recipes are equal."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def precision_map(self) -> dict[str, str]:
        return dict(self.precision)

    def describe(self) -> str:
        """One line for summaries: the fields that differ from ``Recipe()``."""
        base = Recipe()
        parts = [f"{k}={_show(v)}" for k, v in self.to_dict().items() if getattr(base, k) != getattr(self, k)]
        return f"{preset_name(self) or 'custom'} [{self.fingerprint()}]" + (": " + ", ".join(parts) if parts else "")


def _frozen(v):
    if isinstance(v, list):
        return tuple(tuple(x) if isinstance(x, list) else x for x in v)
    return v


def _show(v) -> str:
    if isinstance(v, list):
        return "|".join("=".join(x) if isinstance(x, list) else str(x) for x in v) or "-"
    return str(v)


def check(r: Recipe) -> None:
    """Every field of ``r`` valid, else a one-line TorqError naming the flag."""
    for flag, value, allowed in (("--quant-format", r.format, FORMATS), ("--quant-dtype", r.quant_dtype, DTYPES),
                                 ("--calibrate-method", r.calibrate_method, METHODS),
                                 ("--equalize", r.equalize, EQUALIZE),
                                 ("--weight-rounding", r.weight_rounding, ROUNDINGS)):
        if value not in allowed:
            raise TorqError(f"unsupported {flag} '{value}': supported values are {', '.join(allowed)}")
    if not isinstance(r.num_calib, int) or isinstance(r.num_calib, bool) or r.num_calib < 1:
        raise TorqError(f"--num-calib must be a positive integer, got {r.num_calib!r}")
    for name in ("nodes_to_quantize", "nodes_to_exclude", "op_types_to_quantize", "op_types_to_exclude"):
        v = getattr(r, name)
        if not isinstance(v, tuple) or not all(isinstance(s, str) and s for s in v):
            raise TorqError(f"--{name.replace('_', '-')}: expected names, got {v!r}")
    from ..graph.input_shape import parse_input_shape
    for text in r.input_shape:
        if not isinstance(text, str) or parse_input_shape(text) != text:
            raise TorqError(f"--input-shape: bad entry {text!r}: expected NAME=D0,D1,... (normalised)")
    for item in r.precision:
        if not (isinstance(item, tuple) and len(item) == 2 and item[1] in PRECISIONS and item[0]) \
                or (item[1] == "auto" and item[0] != "*"):
            raise TorqError(f"--precision: bad entry {item!r}: expected auto or NODE=int8|int16|bf16")
    if uses_int16(r) and r.format == "qoperator":
        raise TorqError("int16 activations (--quant-dtype A16W8, --precision int16 / auto) need --quant-format "
                        "qdq: ONNX Runtime quantizes 16-bit activations in QDQ form only")
    if not isinstance(r.accuracy_budget, (int, float)) or isinstance(r.accuracy_budget, bool) \
            or not r.accuracy_budget >= 0:
        raise TorqError(f"--accuracy-budget must be a number >= 0 (top-1 points), got {r.accuracy_budget!r}")
    if not isinstance(r.int16_macs, (int, float)) or isinstance(r.int16_macs, bool) \
            or not 0 <= r.int16_macs <= 100:
        raise TorqError(f"--int16-macs must be a percentage in [0, 100], got {r.int16_macs!r}")


def uses_int16(r: Recipe) -> bool:
    """Any int16 activation: A16W8, an int16 layer, or a precision chosen by measurement."""
    return r.quant_dtype == "A16W8" or any(p in ("int16", "auto") for _, p in r.precision)


def layer_precision(r: Recipe, node: str) -> str:
    """The activation precision of one node under ``r`` ("auto" until resolved)."""
    whole = dict(r.precision).get("*")
    return dict(r.precision).get(node) or whole or ("int16" if r.quant_dtype == "A16W8" else "int8")


def effective_dtype(r: Recipe) -> str:
    """The default activation/weight types ORT quantizes with: A16W8 for a whole-model int16."""
    return "A16W8" if r.quant_dtype == "A16W8" or ("*", "int16") in r.precision else r.quant_dtype


# ----------------------------------------------------------------------------- presets

#: Named recipes. What each costs and gains is measured by benchmarks/accuracy.py on the tuning half
#: of the evaluation images and reported on the other half (docs/quantization.md).
PRESETS: dict[str, Recipe] = {
    # ORT's defaults (per-tensor MinMax QDQ) behind the front end: the smallest change from fp32.
    "ort": Recipe(),
    # per-channel weights, int8 I/O: what depthwise networks need; 100 calibration samples.
    "per-channel": Recipe(per_channel=True, full_integer=True, num_calib=100),
    # + exact scales: the NSS's native rounding is bit-exact with ORT (weight scales moved <= 5 %).
    "exact": Recipe(per_channel=True, full_integer=True, num_calib=100, exact_scales=True),
    # + cross-layer equalization and bias correction (evaluate's default before the tuning/report split).
    "cle": Recipe(per_channel=True, full_integer=True, num_calib=100, exact_scales=True,
                  equalize="bounded", bias_correction=True),
    # + int8 weights rounded for least layer-output error on the calibration data (GPTQ; scales kept).
    "gptq": Recipe(per_channel=True, full_integer=True, num_calib=100, exact_scales=True, weight_rounding="gptq"),
    # gptq + mixed precision: the layers int8 hurts most (output KL per int16 MAC, measured on the
    # calibration data) get int16 activations (A16W8 on the NSS), up to CAP % of the MACs; the cap
    # chosen on the tuning half by pooled output KL (benchmarks/recipe_choice.py --criterion kl).
    "mixed": Recipe(per_channel=True, full_integer=True, num_calib=100, exact_scales=True, weight_rounding="gptq",
                    precision=(("*", "auto"),), accuracy_budget=0.0, int16_macs=10.0),
}
#: The default of every command (quantize, discover, run, evaluate, the benchmarks) and the
#: ``recommended`` alias: chosen on the tuning half of the evaluation images, reported on the other
#: half (docs/recipes.md). Session 3 (top-1 rule, candidates exact / gptq / cle on EfficientNet-
#: Lite0/1/2) chose gptq. Sessions 4-5 (``benchmarks/recipe_choice.py --criterion kl``: gptq and gptq
#: with an int16 MAC cap of 2.5 / 5 / 10 %) chose the 5 % cap, the ``mixed`` preset; session 7,
#: the same rule once ORT's int16 arithmetic was made exact (exact_int16: the NSS = ORT bit for
#: bit, int16 tensors with 16x headroom), chose the 10 % cap; session 8 let it promote a layer
#: writing a graph output (a classifier: int16 logits at no int16 MAC). Without calibration data, in
#: QOperator or A16W8, ``mixed`` is gptq (recipe_flags.with_flags).
#: ``Recipe()`` itself is ORT's quantize_static defaults behind the front end: the base presets
#: change, and the defaults of the Python ``quantize()`` (which keeps ORT's keyword vocabulary).
RECOMMENDED = "mixed"


def preset(name: str) -> Recipe:
    key = str(name).strip().lower()
    if key == "recommended":
        key = RECOMMENDED
    if key not in PRESETS:
        raise TorqError(f"unknown --recipe '{name}': choose one of {', '.join([*PRESETS, 'recommended'])}")
    return PRESETS[key]


#: What a recipe is given for the model at hand, not how it quantizes: a preset with these set is
#: still that preset (``preset_name``; the fingerprint covers them all the same).
DATA_FIELDS = ("calibration_data", "preprocess", "input_shape")


def preset_name(r: Recipe) -> str | None:
    """The preset ``r`` is, up to its data (``DATA_FIELDS``), or None."""
    bare = r.replace(**{f: getattr(Recipe(), f) for f in DATA_FIELDS})
    return next((k for k, v in PRESETS.items() if v == bare), None)


# ----------------------------------------------------------------------------- apply

@dataclass
class Quantized:
    model: onnx.ModelProto          # the int8 model torq compiles
    fp32: onnx.ModelProto           # the prepared fp32 model its tensors line up with (SQNR reference)
    recipe: Recipe


def load_fp32(model, where: str | None = None, input_shape=()) -> tuple[onnx.ModelProto, str]:
    """(fp32 model with unshared weights and the ``input_shape`` sizes, name for messages);
    refuses a quantized model."""
    from ..graph.input_shape import set_input_shapes
    from ..graph.unshare_weights import fold_constant_identities
    from ..graph.load import is_quantized, load_model
    from ..graph.validate import check_consistent, validate
    where = where or (str(model) if not isinstance(model, onnx.ModelProto) else "model")
    src = fold_constant_identities(load_model(model))   # ORT's quantizers crash on shared weights
    validate(src, where, min_opset=7)   # ORT runs opsets >= 7 (and upgrades them to 11)
    check_consistent(src, where)
    if is_quantized(src):
        raise TorqError(f"{where}: model is already quantized (it has QuantizeLinear/DequantizeLinear, "
                        "QLinear* ops or int8 weights/IO); pass the fp32 model")
    return set_input_shapes(src, input_shape, where), where


def source(recipe: Recipe, model, where: str | None = None) -> tuple[onnx.ModelProto, str]:
    """The fp32 graph ``recipe`` quantizes (``load_fp32``; per-channel: at the per-axis opset, which
    may rewrite ops, e.g. an opset-11 Softmax into Flatten -> Softmax -> Reshape): ``apply`` and
    discover's layers start from it alike."""
    src, where = load_fp32(model, where, recipe.input_shape)
    if recipe.per_channel:
        from ..graph.opset import PER_AXIS, at_least
        src = at_least(src, PER_AXIS, f"{where}: --per-channel (per-axis DequantizeLinear)")
    return src, where


@contextmanager
def _step(what: str, where: str):
    """One fp32 stage under a progress line; ORT failing on the user's model there (or the
    calibration data overflowing) is one line naming the model and the stage."""
    from ..progress import stage
    try:
        with stage(f"quantize: {what}"):
            yield
    except TorqError:
        raise
    except Exception as e:
        if not (type(e).__module__.startswith("onnxruntime") or isinstance(e, (FloatingPointError, RuntimeWarning))):
            raise                                    # our bug: an internal error, not the model's
        from pathlib import Path
        from .static import ort_failure
        raise TorqError(f"{where}: {what.split(' (')[0]} failed: {ort_failure(e, Path('/nonexistent'), where)}"
                        ) from None


def front_end(recipe: Recipe, model: onnx.ModelProto, where: str = "model") -> onnx.ModelProto:
    """The calibration-free fp32 clean-ups (fold, dead channels); the same function as ``model``."""
    if recipe.fold:
        from .fold import fold_fp32
        with _step("fold (constants, shapes, Pad/BatchNorm into Conv)", where):
            model = fold_fp32(model)
    if recipe.dead_channels:
        from .dead_channels import zero_dead_channels
        with _step("dead channels", where):
            model = zero_dead_channels(model)[0]
    return model


def prepare(recipe: Recipe, model: onnx.ModelProto, reader=None, where: str = "model") -> onnx.ModelProto:
    """Front end, then the calibrated fp32 transforms (CLE, bias correction): the graph to quantize."""
    model = front_end(recipe, model, where)
    if recipe.equalize == "off" and not recipe.bias_correction:
        return model
    from .calibration import make_reader, rewind
    reader = reader if reader is not None else make_reader(model, recipe)
    if recipe.equalize != "off":
        from .equalize import equalize
        with _step("cross-layer equalization", where):
            model = equalize(model, reader, relu6=recipe.equalize).model
        rewind(reader)
    if recipe.bias_correction:
        from .bias_correction import correct_bias
        with _step("bias correction", where):
            model = correct_bias(model, reader, per_channel=recipe.per_channel)
        rewind(reader)
    return model


def keeps_tensors(recipe: Recipe) -> bool:
    """Does calibrating ``recipe`` hold every tensor of every sample at once? A histogram calibrator
    does; MinMax, our calibrated passes and ``--precision auto`` (its sensitivity streams the
    samples in chunks that fit, at least one sample) keep ranges and running sums (memory_bound)."""
    return recipe.calibrate_method != "minmax"


def apply(recipe: Recipe, model, reader=None, *, where: str | None = None,
          wrap_lone_ops: bool = False, cache: bool = True) -> Quantized:
    """The int8 model of ``recipe`` for the fp32 ``model`` (path or ModelProto).

    ``reader``: an ORT CalibrationDataReader overriding ``recipe.calibration_data`` (discover's
    per-layer activations, evaluate's held-apart images). ``wrap_lone_ops``: a model ORT leaves
    float (a lone Relu, Flatten, ...) gets Q/DQ around its I/O instead of an error. ``cache``:
    the quantization may come from (and goes to) ``model_cache`` (off for discover's layers)."""
    from . import memory_bound
    from .calibration import make_reader
    src, where = source(recipe, model, where)
    if reader is None:                           # (a caller's reader knows its own sizes)
        reader = make_reader(src, recipe)        # as many samples as the data has, up to --num-calib
        memory_bound.check(src, len(reader), where, "--num-calib", keeps_tensors=keeps_tensors(recipe))
    if ("*", "auto") in recipe.precision:            # int16 layers chosen by measurement first
        from .auto_precision import apply_auto
        return apply_auto(recipe, src, reader, where=where, wrap_lone_ops=wrap_lone_ops)
    prepared = prepare(recipe, src, reader, where)
    q = quantize_prepared(recipe, prepared, reader, where=where, wrap_lone_ops=wrap_lone_ops, cache=cache)
    return Quantized(q, prepared, recipe)


def quantize_prepared(recipe: Recipe, prepared: onnx.ModelProto, reader, *, where: str = "model",
                      wrap_lone_ops: bool = False, cache: bool = True) -> onnx.ModelProto:
    """ORT static quantization of an already prepared fp32 graph, then exact scales / full integer.
    ``cache``: an identical earlier quantization (same prepared graph, recipe, calibration samples
    and code) is reused from ``model_cache`` (quantize, discover and run share one)."""
    if cache:
        from .model_cache import cached
        return cached(recipe, prepared, reader, wrap_lone_ops, lambda: quantize_prepared(
            recipe, prepared, reader, where=where, wrap_lone_ops=wrap_lone_ops, cache=False))
    from ..progress import stage
    from .calibration import rewind
    from .static import run_quantizer
    selection = _ort_selection(recipe, prepared)
    with stage(f"quantize: calibration + ONNX Runtime ({recipe.calibrate_method}, {recipe.format})"):
        q, fmt = run_quantizer(prepared, reader, recipe, selection, where)
    from .islands import unquantized_tensors
    # QOperator leaves float islands between its QLinear ops; QDQ leaves the ops ORT has no
    # QDQ rule for (x.mean(3).mean(2) ending a backbone) float: both get Q/DQ, int8 throughout.
    if _quantized(q) and (fmt == "qoperator" or unquantized_tensors(q)):
        from .islands import quantize_islands
        rewind(reader)
        with stage("quantize: Q/DQ islands"):
            q = quantize_islands(q, prepared, reader, _method(recipe), _activation_type(recipe).tensor_type)
    if not _quantized(q) and wrap_lone_ops:
        from .lone_ops import wrap_in_qdq
        rewind(reader)
        q = wrap_in_qdq(prepared, reader, _method(recipe), _activation_type(recipe).tensor_type)
    if not _quantized(q):
        hint = "; try --quant-format qdq" if recipe.format != "qdq" else " (ONNX Runtime has no int8 form for any of its ops)"
        raise TorqError(f"{where}: ONNX Runtime quantized nothing with --quant-format {recipe.format} "
                        f"(none of its ops has an int8 form in that format){hint}")
    if recipe.exact_scales:
        from .exact_int16 import exact_int16_scales
        from .exact_scales import exact_scales
        with stage("quantize: exact scales"):
            q, fixed = exact_int16_scales(q, prepared)
            q = exact_scales(q, prepared, keep=fixed)
    if recipe.weight_rounding == "gptq" and fmt == "qdq":
        from .weight_rounding import round_weights
        with stage("quantize: weight rounding (gptq)"):
            q = round_weights(q, prepared, reader)
    if recipe.full_integer:
        from .full_integer import convert_to_full_integer
        q = convert_to_full_integer(q)
    _stamp(q, recipe)
    return q


RECIPE_KEY = "torq.recipe"


def _stamp(q: onnx.ModelProto, recipe: Recipe) -> None:
    """The recipe in the model's metadata (``torq.recipe``): a deployed file says how it was made."""
    props = [p for p in q.metadata_props if p.key != RECIPE_KEY]
    del q.metadata_props[:]
    q.metadata_props.extend(props)
    q.metadata_props.add(key=RECIPE_KEY, value=json.dumps(
        {"fingerprint": recipe.fingerprint(), **recipe.to_dict()}, sort_keys=True))


def recipe_of(q: onnx.ModelProto) -> Recipe | None:
    """The recipe stamped into a quantized model, if any."""
    for p in q.metadata_props:
        if p.key == RECIPE_KEY:
            d = json.loads(p.value)
            d.pop("fingerprint", None)
            return Recipe.from_dict(d)
    return None


def _quantized(q) -> bool:
    from ..graph.load import is_quantized
    return is_quantized(q)


def _method(recipe: Recipe):
    from .static import parse_calibrate_method
    return parse_calibrate_method(recipe.calibrate_method)


def _activation_type(recipe: Recipe):
    from .static import parse_quant_dtype
    return parse_quant_dtype(recipe.quant_dtype)[0]


def _ort_selection(recipe: Recipe, model: onnx.ModelProto) -> dict:
    """ORT's ``nodes_to_quantize`` / ``nodes_to_exclude`` / ``op_types_to_quantize`` (+ precision
    overrides) for this model; names that match no node are an error (a typo would be silent)."""
    nodes = {n.name for n in model.graph.node}
    ops = {n.op_type for n in model.graph.node}
    for flag, names, known in (("--nodes-to-quantize", recipe.nodes_to_quantize, nodes),
                               ("--nodes-to-exclude", recipe.nodes_to_exclude, nodes),
                               ("--op-types-to-quantize", recipe.op_types_to_quantize, ops),
                               ("--op-types-to-exclude", recipe.op_types_to_exclude, ops),
                               ("--precision", [n for n, _ in recipe.precision if n != "*"], nodes)):
        missing = [n for n in names if n not in known]
        if missing:
            raise TorqError(f"{flag}: no node {'type ' if 'op-types' in flag else ''}'{missing[0]}' in the "
                            "model after the front end (names as ONNX Runtime sees them; --no-fold keeps the "
                            "exported graph)")
    excluded = set(recipe.nodes_to_exclude) | {n.name for n in model.graph.node
                                               if n.op_type in recipe.op_types_to_exclude}
    sel = {"nodes_to_quantize": list(recipe.nodes_to_quantize) or None,
           "nodes_to_exclude": sorted(excluded) or None,
           "op_types_to_quantize": list(recipe.op_types_to_quantize) or None}
    sel["tensor_overrides"] = _precision_overrides(recipe, model)
    return sel


def _precision_overrides(recipe: Recipe, model: onnx.ModelProto) -> dict:
    """ORT ``TensorQuantOverrides`` for the per-layer precision map: each int16 (or, with A16W8,
    int8) layer's output activation (``precision.tensor_overrides``). bf16 layers are the bf16 path's."""
    from .precision import tensor_overrides
    bf16 = [(n, p) for n, p in recipe.precision if p == "bf16"]
    if bf16 and bf16[0][0] == "*":
        raise TorqError("--precision bf16: a whole bf16 model is not an int8 quantization "
                        "(bf16: discover/run --auto-convert-bf16, evaluate --precision bf16)")
    if bf16:
        raise TorqError(f"--precision {bf16[0][0]}=bf16: per-layer bf16 in an int8 model is not implemented "
                        "(int8 and int16 layers mix; bf16 is whole-model: --auto-convert-bf16)")
    if ("*", "auto") in recipe.precision:
        raise TorqError("--precision auto is resolved by apply() (quantize.auto_precision), not by the quantizer")
    layers = {n: p for n, p in recipe.precision if n != "*"}
    default = "int16" if effective_dtype(recipe) == "A16W8" else "int8"
    return tensor_overrides(onnx.shape_inference.infer_shapes(model), layers, default) if layers else {}
