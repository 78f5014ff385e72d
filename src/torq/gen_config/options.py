"""Flags shared by ``discover`` and ``run`` (the reference tool's names) and what they imply:
``--quantize`` + the quantization recipe (``torq.quantize.recipe_flags``), their fingerprint, the
output file names and the cache folder."""
from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TorqError
from ..fileio import cache_dir  # noqa: F401  (discover, run and the CLI read it here)
from ..quantize.recipe import RECOMMENDED, Recipe
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
    p.add_argument("--engine", choices=("native", "reference"), default=None,
                   help="NSS simulator engine: native (compiled int8 kernels, the default) or reference "
                        "(numpy); results are identical")
    p.add_argument("--ray", nargs="?", const=True, default=None, metavar="ADDRESS",
                   help="work as Ray tasks: a local instance, or the cluster at ADDRESS (docs/ray.md)")
    p.add_argument("--log-file", metavar="PATH", help="also write everything printed to PATH (plain text)")
    r = p.add_argument_group("reference-tool options without effect here (accepted so its scripts run; a note says so)")
    r.add_argument("--torq-hw", metavar="NAME", help="hardware config of the reference's simulator")
    r.add_argument("--torq-hw-type", metavar="TYPE", help="sim / hardware runtime of the reference tool")
    r.add_argument("--compiler-option", action="append", metavar="OPT", help="extra torq-compile option")
    r.add_argument("--runtime-option", action="append", metavar="OPT", help="extra torq-run-module option")
    r.add_argument("-v", "--verbose", action="store_true", help="the reference's verbose logging")
    p.add_argument("--auto-convert-bf16", action="store_true",
                   help="convert the fp32 model (and each layer) to bf16, the NPU's float datapath, as the "
                        "reference tool does; every layer is compared with ONNX Runtime fp32")
    p.add_argument("--quantize", action="store_true",
                   help="statically quantize the model (and each layer) to int8 with the recipe below")
    add_recipe_arguments(p, title="quantization recipe (discover and run must use the same; "
                         "the fp32 front end applies with or without --quantize)")


INERT = ("torq_hw", "torq_hw_type", "compiler_option", "runtime_option", "verbose")


def note_inert_flags(args, prog: str = "torq-gen-config") -> None:
    """One stderr line naming the reference-tool flags given that change nothing here: torq runs
    its own bit-exact NSS simulator and IREE, not the reference's compiler, runtime or boards."""
    given = [f"--{k.replace('_', '-')}" for k in INERT if getattr(args, k, None)]
    if given:
        print(f"{prog}: note: {', '.join(given)} {'has' if len(given) == 1 else 'have'} no effect here (torq "
              "simulates the NSS itself and compiles CSS/HOST with IREE)", file=sys.stderr)


def quant_settings(args) -> QuantSettings:
    recipe = recipe_from_args(args, note=args.quantize)
    flags = quantizer_flags_given(args) + (["--recipe"] if args.recipe not in (None, RECOMMENDED) else [])
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


def resolve_model(value: str, flag: str = "--model") -> Path:
    """The ONNX file behind ``--model``: a file, or a folder holding exactly one ``.onnx``."""
    path = Path(value)
    if path.is_dir():
        found = sorted(path.glob("*.onnx"))
        if len(found) == 1:
            return found[0]
        names = ", ".join(p.name for p in found[:4]) + (" ..." if len(found) > 4 else "")
        raise TorqError(f"{flag} {path} is a folder with {len(found)} .onnx files"
                        + (f" ({names}); pass one of them" if found else "; pass the model file"))
    if not path.is_file():
        raise TorqError(f"{flag} {path}: no such file")
    return path


def quant_from_fingerprint(fp: dict | None) -> QuantSettings:
    """The settings a report / compiler JSON was made with (fp32 for a reference-tool JSON), for
    mapping layer ids to locations: which ops exist does not depend on the calibration data, so
    the fingerprint's file name (not a path) is dropped."""
    if not fp:
        return QuantSettings()
    from dataclasses import fields
    names = {f.name for f in fields(Recipe)} - {"calibration_data"}
    recipe = Recipe.from_dict({k: v for k, v in fp.items() if k in names})
    return QuantSettings(bool(fp.get("quantize")), recipe, bool(fp.get("auto_convert_bf16")))




def check_output_dir(out: Path) -> None:
    """Refuse early (before any work) an output folder we cannot write."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TorqError(f"--output-dir {out}: cannot create: {e.strerror}") from None
    if not os.access(out, os.W_OK):
        raise TorqError(f"--output-dir {out}: not writable")


def use_engine(engine: str | None) -> None:
    """--engine: the NSS engine of this process and of every worker it starts (TORQ_ENGINE)."""
    if engine:
        os.environ["TORQ_ENGINE"] = engine


_SHOW = {True: "on", False: "off", None: "none"}


def _show(v) -> str:
    """A fingerprint value as the flag's word (on/off/none), else compact and on one line: a
    damaged report may hold anything there (a list, a 1 that is not True, a newline)."""
    if isinstance(v, bool) or v is None:
        return _SHOW[v]
    text = v if isinstance(v, str) and v.isprintable() else json.dumps(v, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _flag(key: str) -> str:
    """The command-line flag behind a fingerprint key (a Recipe field: its flag)."""
    from ..quantize.recipe_flags import FLAGS
    if key in FLAGS:
        return FLAGS[key][0][0]
    return {"calibration_sha256": "--calibration-data (contents)", "recipe_fingerprint": "--recipe"}.get(
        key, "--" + _show(str(key)).replace("_", "-"))


def fingerprint_mismatch(got: dict | None, expected: dict, name: str, limit: int = 240,
                         tail: str = "; rerun discover, or run with its flags") -> str | None:
    """One line (at most ``limit`` characters) naming the flags that differ (``NAME was discovered
    with different quantization flags: --flag old -> new, ...`` + ``tail``), or None."""
    if got is None:
        return None      # a reference-tool JSON: nothing to check against (the CLI says so)
    diff = [k for k in sorted(set(got) | set(expected)) if got.get(k) != expected.get(k)]
    if len(diff) > 1:
        diff = [k for k in diff if k != "recipe_fingerprint"]    # the hash of the fields named
    if not diff:
        return None
    parts = ["the model file changed" if k == "model_sha256" else
             f"{_flag(k)} {_show(got.get(k))} -> {_show(expected.get(k))}"
             for k in diff]
    head = f"{name} was discovered with different quantization flags: "
    shown = []
    for i, part in enumerate(parts):
        more = f" (+{len(parts) - i - 1} more)" if i < len(parts) - 1 else ""
        if len(head + ", ".join(shown + [part]) + more + tail) > limit:
            shown.append(f"+{len(parts) - i} more")
            break
        shown.append(part)
    return (head + ", ".join(shown) + tail)[:limit]
