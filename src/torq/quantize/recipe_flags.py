"""The one argparse group for a ``Recipe``: ``quantize``, ``discover``, ``run``, ``evaluate`` and the
benchmarks add it with ``add_recipe_arguments(parser)`` and read it back with ``recipe_from_args(args)``.
``--recipe NAME`` picks a preset (or a JSON file; default: ``recipe.RECOMMENDED`` on every command); every other flag
changes one field of it and is ``None`` unless given, so a preset plus flags is always explicit.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import TorqError, one_line
from .recipe import PRESETS, RECOMMENDED, Recipe, preset

_BOOL = argparse.BooleanOptionalAction

#: field -> (flags, argparse keywords). Every Recipe field has exactly one entry (a test holds it).
FLAGS: dict[str, tuple[tuple[str, ...], dict]] = {
    "format": (("--quant-format",), dict(metavar="{qdq,qoperator,hybrid}", help=(
        "qdq: QuantizeLinear/DequantizeLinear around float ops; qoperator: QLinearConv/QGemm/..., the ops "
        "ORT leaves float between them (HardSwish, BatchNormalization, a pool head, ...) get Q/DQ with "
        "their calibrated ranges; hybrid: qoperator if every compute op has a compact QLinear form, else qdq"))),
    "per_channel": (("--per-channel",), dict(action=_BOOL, help=(
        "one weight scale per output channel (--no-per-channel or --per-tensor: one per tensor)"))),
    "full_integer": (("--full-integer",), dict(action=_BOOL, help=(
        "int8 graph inputs/outputs: no input QuantizeLinear / output DequantizeLinear (I/O names kept; "
        "scales in model metadata 'torq.io_quant')"))),
    "quant_dtype": (("--quant-dtype",), dict(metavar="{A8W8,A16W8}", help=(
        "activation/weight types: A8W8 int8/int8, A16W8 int16 activations x int8 weights (the NPU's int16 "
        "path, QDQ only; docs/a16w8.md)"))),
    "calibrate_method": (("--calibrate-method",), dict(metavar="{minmax,entropy,percentile}", help=(
        "how activation ranges are chosen from the calibration data"))),
    "calibration_data": (("--calibration-data",), dict(metavar="SPEC", help=(
        "an .npz keyed by input name or a folder of <input>.npy (first axis = samples), or images: a "
        "folder of images, a labels.tsv folder, an IDX file, an .npz with x (then --preprocess says how "
        "pixels become inputs); default: synthetic samples, uniform in [-1, 1)"))),
    "num_calib": (("--num-calib",), dict(type=int, metavar="N", help="use at most N calibration samples")),
    "preprocess": (("--preprocess",), dict(metavar="KEY=VALUE,...", help=(
        "image preprocessing: resize=S (short side), crop=C (centre), norm=tf|imagenet|mnist|unit|raw or "
        "mean=M,std=S (R/G/B allowed), order=rgb|bgr, layout=nchw|nhwc, channels=1|3"))),
    "fold": (("--fold",), dict(action=_BOOL, help=(
        "fp32 front end: fold constants and shape arithmetic, Pad and BatchNormalization into the Conv "
        "(ONNX Runtime's semantics-preserving rewrites); --no-fold keeps the exported graph"))),
    "dead_channels": (("--dead-channels",), dict(action=_BOOL, help=(
        "fp32 front end: zero BN-folded 'dust' output channels (max |w| below 1e-4 of the layer's), "
        "which per-channel scales would blow up"))),
    "input_shape": (("--input-shape",), dict(action="append", metavar="NAME=D0,D1,...", help=(
        "sizes of the input dims the export left open (Paddle's -1, a symbolic H/W; an open batch is 1), "
        "e.g. --input-shape x=1,3,48,192; repeat for several inputs"))),
    "equalize": (("--equalize",), dict(nargs="?", const="bounded", metavar="{off,bounded,skip}", help=(
        "cross-layer equalization before quantizing (Conv → Relu/ReLU6 → Conv channel pairs rescaled to "
        "equal weight ranges; bounded: ReLU6 channels only as far as calibration stays under the clip; "
        "skip: ReLU6 pairs left alone; --equalize alone = bounded, --no-equalize = off)"))),
    "bias_correction": (("--bias-correction",), dict(action=_BOOL, help=(
        "correct Conv/Gemm biases for int8 weight rounding (fp32 transform, calibration means)"))),
    "exact_scales": (("--exact-scales",), dict(action=_BOOL, help=(
        "move each Conv/Gemm/MatMul (QDQ) and QLinearConv/QGemm weight scale (typically 0.1 %%, at most 5 %%), "
        "and the activation scales of each Add and average pool (at most 1 %%), so that ONNX Runtime's float math "
        "is exact; the NPU's native rounding is then bit-exact with ORT"))),
    "weight_rounding": (("--weight-rounding",), dict(metavar="{nearest,gptq}", help=(
        "QDQ int8 weights: nearest integer (default), or gptq: each layer's integers re-chosen to minimise "
        "its output error on the calibration data (scales kept; numerics/weight_rounding.py)"))),
    "nodes_to_quantize": (("--nodes-to-quantize",), dict(metavar="LIST", help=(
        "comma list of node names: quantize only these (names after the front end, as ORT sees them)"))),
    "nodes_to_exclude": (("--nodes-to-exclude",), dict(metavar="LIST", help="comma list of node names left float")),
    "op_types_to_quantize": (("--op-types-to-quantize",), dict(metavar="LIST", help=(
        "comma list of op types: quantize only these (e.g. Conv,Gemm)"))),
    "op_types_to_exclude": (("--op-types-to-exclude",), dict(metavar="LIST", help="comma list of op types left float")),
    "precision": (("--precision",), dict(metavar="P|NODE=P,...|auto", help=(
        "activation precision, int8, int16 or bf16: one for the whole model (evaluate "
        "--precision bf16: FP32 vs BF16 on the NSS, no calibration) or per layer, NODE=P,...; auto (the "
        "mixed recipe's, with --accuracy-budget 0 --int16-macs 10): the fewest int16 layers (by MACs) keeping "
        "top-1 within --accuracy-budget of FP32 on held-apart calibration samples; budget 0: the most "
        "sensitive layers up to --int16-macs (docs/mixed-precision.md); a layer writing a graph output may "
        "be chosen (that output is then int16): auto,NODE=int8 keeps it int8; int8: every layer int8"))),
    "accuracy_budget": (("--accuracy-budget",), dict(type=float, metavar="POINTS", help=(
        "--precision auto: expected top-1 loss vs FP32 allowed on the held-apart third of the calibration "
        "samples (FP32's softmax standing in for their labels), percentage points (default 0.5); 0: no "
        "search, the most sensitive layers are promoted up to --int16-macs"))),
    "int16_macs": (("--int16-macs",), dict(type=float, metavar="PERCENT", help=(
        "--precision auto: at most this share of the MACs may run int16 x int8 (default 10)"))),
}
_LISTS = ("nodes_to_quantize", "nodes_to_exclude", "op_types_to_quantize", "op_types_to_exclude")


def _dest(name: str) -> str:
    return f"recipe_{name}"


def add_recipe_arguments(parser: argparse.ArgumentParser, title: str | None = None):
    """Add ``--recipe`` and one flag per Recipe field to ``parser`` (as one argument group)."""
    g = parser.add_argument_group(title or "quantization recipe (the same flags on quantize, discover, run, evaluate)")
    names = ", ".join([*PRESETS, "recommended"])
    g.add_argument("--recipe", default=None, metavar="NAME|FILE.json", help=(
        f"start from a named recipe ({names}) or a recipe JSON file; the flags below change single "
        f"fields (default: recommended = {RECOMMENDED}, the same on every command: mixed = gptq + int16 "
        "activations on the layers int8 hurts most, measured on the calibration data, at most 10 %% of the "
        "MACs (a classifier writing the graph output may be one: the output is then int16), bit-exact with ONNX "
        "Runtime (exact scales); without --calibration-data, "
        "with --quant-format qoperator or --quant-dtype A16W8 it is gptq: every layer int8, exact scales, GPTQ "
        "weight rounding, per-channel, int8 graph I/O; docs/recipes.md says what each costs and gains)"))
    for name, (flags, kw) in FLAGS.items():
        g.add_argument(*flags, dest=_dest(name), default=None, **kw)
    g.add_argument("--per-tensor", dest=_dest("per_channel"), action="store_false",
                   help="one weight scale per tensor (= --no-per-channel)")
    g.add_argument("--no-equalize", dest=_dest("equalize"), action="store_const", const="off",
                   help="no cross-layer equalization (= --equalize off)")
    return g


def given(args) -> dict:
    """The Recipe fields set explicitly on the command line (parsed, not yet validated)."""
    out = {}
    for name in FLAGS:
        v = getattr(args, _dest(name), None)
        if v is None:
            continue
        if name in _LISTS:
            v = tuple(s.strip() for s in v.split(",") if s.strip())
        elif name == "input_shape":
            from ..graph.input_shape import parse_input_shape
            v = tuple(parse_input_shape(t) for t in v)
        elif name == "precision":
            v = parse_precision(v)
        elif name in ("format", "calibrate_method", "equalize", "weight_rounding"):
            v = v.strip().lower()
        elif name == "quant_dtype":
            v = v.strip().upper()
        out[name] = v
    return out


def recipe_from_args(args, data_elsewhere: bool = False, note: bool = True, notes: list | None = None) -> Recipe:
    """``--recipe`` with every explicitly given flag applied; bad values are one-line errors. A
    precision ``auto`` the recipe brought (not ``--precision``) that cannot apply is dropped
    (``with_flags``): because of a flag (qoperator, A16W8), one timestamped note line on stderr
    when ``--recipe`` was given (``note``, ``say_note``; the default says nothing); for lack of data,
    nothing on stderr (the recipe the command reports says it). ``notes``: both reasons appended
    there instead. ``data_elsewhere``: the command calibrates on data of its own without
    ``--calibration-data`` (evaluate: held-apart dataset images)."""
    chosen = getattr(args, "recipe", None)
    recipe, why = with_flags(load_recipe(chosen or RECOMMENDED), given(args), data_elsewhere)
    if why and not chosen and not why.startswith(NO_DATA):
        why = None                               # the default's int16 off because of a flag: no news
    if why and notes is not None:
        notes.append(why)
    elif why and note and not why.startswith(NO_DATA):
        say_note(why)
    return recipe


def say_note(text: str) -> None:
    """A note on stderr, timestamped like a progress line (so a later error is still the one error
    line a script reads), printed whatever TORQ_PROGRESS says (it is not progress)."""
    import sys
    import time
    print(f"[{time.strftime('%H:%M:%S')}] note: {text}", file=sys.stderr, flush=True)


AUTO = ("*", "auto")
NO_DATA = "no --calibration-data"


def with_flags(base: Recipe, changes: dict, data_elsewhere: bool = False) -> tuple[Recipe, str | None]:
    """(``base`` with ``changes``, note). When ``base`` chooses its int16 layers by measurement
    (``--precision auto``, e.g. the ``mixed`` preset) and ``changes`` does not set ``--precision``,
    auto is dropped (every layer int8, the rest of the recipe as it is: ``mixed`` becomes ``gptq``)
    where it cannot apply, and the note says why:

    - ``--quant-format qoperator``: ONNX Runtime has no QOperator form for int16 activations;
    - ``--quant-dtype A16W8``: every activation is int16 already;
    - no calibration data (synthetic samples): which layers int8 hurts is a property of real inputs.

    An explicit ``--precision auto`` is kept (and refused with qoperator by ``recipe.check``)."""
    if "precision" in changes or AUTO not in base.precision:
        return base.replace(**changes), None
    merged = {**base.to_dict(), **changes}
    if str(merged["format"]).lower() == "qoperator":
        why = ("--quant-format qoperator: int16 activations have no QOperator form in ONNX Runtime, so the "
               "recipe's mixed precision (--precision auto) is off: every layer int8")
    elif str(merged["quant_dtype"]).upper() == "A16W8":
        why = "--quant-dtype A16W8: every activation is int16, so the recipe's --precision auto is off"
    elif not merged["calibration_data"] and not data_elsewhere:
        why = (f"{NO_DATA}: mixed precision (--precision auto) is measured on real inputs, so it is off: "
               "every layer int8")
    else:
        return base.replace(**changes), None
    # auto's own knobs go back to their defaults unless given: mixed without auto is gptq itself
    knobs = {k: getattr(Recipe(), k) for k in ("accuracy_budget", "int16_macs") if k not in changes}
    return base.replace(**changes, **knobs, precision=tuple(p for p in base.precision if p != AUTO)), why


def load_recipe(name: str) -> Recipe:
    """A preset name, or a JSON file holding a recipe (``Recipe.to_dict()``, as the reports write it)."""
    path = Path(str(name))
    if path.suffix == ".json":
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise TorqError(f"--recipe {name}: cannot read a recipe: {one_line(e)}") from None
        if not isinstance(d, dict):
            raise TorqError(f"--recipe {name}: expected a JSON object of recipe fields")
        d = d.get("recipe", d)
        d = {k: v for k, v in d.items() if k != "fingerprint"}
        return Recipe.from_dict(d)
    return preset(name)


def parse_precision(text: str) -> tuple:
    """``NODE=int16,NODE2=bf16`` -> ((NODE, int16), (NODE2, bf16)); a bare ``bf16`` / ``int16`` is
    the whole model (node ``*``), ``auto`` chosen by measurement (``("*", "auto")``; with
    ``NODE=P`` items beside it those layers are given, not chosen), ``int8`` the default (no
    entry); one-line error otherwise."""
    bare = text.strip().lower()
    if bare in ("int8", "int16", "bf16", "auto"):
        return () if bare == "int8" else (("*", bare),)
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if part.lower() == "auto":
            out.append(("*", "auto"))
            continue
        node, sep, prec = part.rpartition("=")
        if not sep or not node or prec.strip().lower() not in ("int8", "int16", "bf16"):
            raise TorqError(f"--precision: bad item {part!r}: expected NODE=int8|int16|bf16")
        out.append((node.strip(), prec.strip().lower()))
    return tuple(out)


def quantizer_flags_given(args) -> list[str]:
    """The recipe flags given that only mean something when a model is quantized (all but the front end
    and the input sizes)."""
    return [FLAGS[k][0][0] for k in given(args) if k not in ("fold", "dead_channels", "input_shape")]


