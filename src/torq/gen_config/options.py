"""Flags shared by ``discover`` and ``run`` (the reference tool's names) and what they imply:
``--quantize`` + the quantization recipe (``torq.quantize.recipe_flags``), their fingerprint, the
output file names and the cache folder."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TorqError
from ..quantize.recipe import DEFAULT, Recipe
from ..quantize.recipe_flags import add_recipe_arguments, quantizer_flags_given, recipe_from_args
from .executors import EXECUTOR_ORDER


@dataclass(frozen=True)
class QuantSettings:
    """What discover/run do to the model before testing it: the recipe's fp32 front end always
    (an fp32 model), the whole recipe under ``--quantize``."""
    quantize: bool = False
    recipe: Recipe = field(default_factory=Recipe)
    auto_convert_bf16: bool = False          # the NPU's float datapath instead of int8

    def fingerprint(self, model_path: Path) -> dict:
        """Recipe + sha256 of the model (and of the calibration data): what a map is valid for."""
        fp = {"quantize": self.quantize, "recipe_fingerprint": self.recipe.fingerprint(), **self.recipe.to_dict()}
        if self.auto_convert_bf16:
            fp["auto_convert_bf16"] = True
        fp["model_sha256"] = file_sha256(model_path)
        if self.recipe.calibration_data:
            fp["calibration_data"] = Path(self.recipe.calibration_data).name
            fp["calibration_sha256"] = path_sha256(Path(self.recipe.calibration_data))
        return fp


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def path_sha256(path: Path) -> str:
    if path.is_dir():
        h = hashlib.sha256()
        for p in sorted(f for f in path.iterdir() if f.is_file()):
            h.update(p.name.encode() + file_sha256(p).encode())
        return h.hexdigest()
    return file_sha256(path) if path.exists() else ""


def add_common_args(p, debug_ir_default=None) -> None:
    p.add_argument("--model", "-m", required=True, metavar="MODEL.onnx", help="the fp32 ONNX model")
    p.add_argument("--output-dir", default=".", metavar="DIR",
                   help="where the report and compiler JSON live (default: current folder)")
    p.add_argument("--subgraph-from", metavar="NODE",
                   help="first node of a sub-graph (non-Constant index, node name or <OpType>_<output>)")
    p.add_argument("--subgraph-to", metavar="NODE", help="last node of the sub-graph (inclusive)")
    p.add_argument("--recompute-cache", action="store_true",
                   help="ignore cached results and compiled artefacts (they are rewritten)")
    p.add_argument("--debug-ir", nargs="?", const="tmp", default=debug_ir_default, metavar="DIR",
                   help="write the IR of every stage of every compiled layer/segment to DIR (default 'tmp')")
    p.add_argument("--rounding", default="native", choices=("native", "ort"),
                   help="NSS rounding: native (the NPU's) or ort (ONNX Runtime's, bit-exact)")
    p.add_argument("--auto-convert-bf16", action="store_true",
                   help="convert the fp32 model (and each layer) to bf16, the NPU's float datapath, as the "
                        "reference tool does; every layer is compared with ONNX Runtime fp32")
    p.add_argument("--quantize", action="store_true",
                   help="statically quantize the model (and each layer) to int8 with the recipe below")
    add_recipe_arguments(p, default=DEFAULT, title="quantization recipe (discover and run must use the same; "
                         "the fp32 front end applies with or without --quantize)")


def quant_settings(args) -> QuantSettings:
    recipe = recipe_from_args(args)
    flags = quantizer_flags_given(args) + (["--recipe"] if args.recipe != DEFAULT else [])
    if flags and not args.quantize:
        raise TorqError(f"{flags[0]}: quantization flags need --quantize (without it only the fp32 front end applies: "
                        "--fold, --dead-channels)")
    bf16 = getattr(args, "auto_convert_bf16", False)
    if bf16 and args.quantize:
        raise TorqError("--auto-convert-bf16 and --quantize are mutually exclusive: "
                        "the model runs on the NPU in bf16 or in int8")
    if args.quantize and ("*", "auto") in recipe.precision:
        from ..quantize.auto_precision import resolve_auto   # measured once; every layer then has its own
        recipe = resolve_auto(recipe, args.model)
    return QuantSettings(args.quantize, recipe, bf16)


def parse_executors(value: str | None, flag: str) -> list[str]:
    names = [v.strip().lower() for v in (value or "").split(",") if v.strip()]
    bad = [n for n in names if n not in EXECUTOR_ORDER]
    if bad:
        raise TorqError(f"{flag}: unknown executor '{bad[0]}'; choose from {', '.join(EXECUTOR_ORDER)}")
    return names


def cache_dir() -> Path:
    env = os.environ.get("TORQ_GEN_CONFIG_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torq-gen-config"


def check_output_dir(out: Path) -> None:
    """Refuse early (before any work) an output folder we cannot write."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TorqError(f"--output-dir {out}: cannot create: {e.strerror}") from None
    if not os.access(out, os.W_OK):
        raise TorqError(f"--output-dir {out}: not writable")
