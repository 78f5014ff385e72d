"""Flags shared by ``discover`` and ``run`` (the reference tool's names) and what they imply:
the quantization settings, their fingerprint, the output file names and the cache folder."""
from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import TorqError
from ..quantize.static import parse_calibrate_method, parse_quant_dtype, parse_quant_format
from .executors import EXECUTOR_ORDER


@dataclass
class QuantSettings:
    quantize: bool = False
    per_channel: bool = False
    full_integer: bool = False
    quant_format: str = "qdq"
    quant_dtype: str = "A8W8"
    calibrate_method: str = "minmax"
    calibration_data: str | None = None
    num_calib: int = 20
    auto_convert_bf16: bool = False          # the NPU's float datapath instead of int8

    def kwargs(self) -> dict:
        d = asdict(self)
        d.pop("quantize")
        d.pop("auto_convert_bf16")
        return d

    def fingerprint(self, model_path: Path) -> dict:
        """Flags + sha256 of the model (and of the calibration data): what a map is valid for."""
        fp = asdict(self)
        if not self.auto_convert_bf16:
            fp.pop("auto_convert_bf16")      # an int8 / fp32 fingerprint as before
        fp["quant_format"], fp["quant_dtype"] = self.quant_format.lower(), self.quant_dtype.upper()
        fp["calibrate_method"] = self.calibrate_method.lower()
        fp["model_sha256"] = file_sha256(model_path)
        if self.calibration_data:
            fp["calibration_data"] = Path(self.calibration_data).name
            fp["calibration_sha256"] = path_sha256(Path(self.calibration_data))
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
        for p in sorted(path.glob("*.npy")):
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
    q = p.add_argument_group("quantization (discover and run must use the same flags)")
    q.add_argument("--auto-convert-bf16", action="store_true",
                   help="convert the fp32 model (and each layer) to bf16, the NPU's float datapath, as the "
                        "reference tool does; every layer is compared with ONNX Runtime fp32")
    q.add_argument("--quantize", action="store_true", help="statically quantize the model (and each layer) to int8")
    q.add_argument("--per-channel", action="store_true", help="one weight scale per output channel")
    q.add_argument("--full-integer", action="store_true", help="int8 graph inputs/outputs (no input Q / output DQ)")
    q.add_argument("--quant-format", default="qdq", metavar="{qdq,qoperator,hybrid}", help="default qdq")
    q.add_argument("--quant-dtype", default="A8W8", metavar="A8W8", help="only A8W8")
    q.add_argument("--calibrate-method", default="minmax", metavar="{minmax,entropy,percentile}")
    q.add_argument("--calibration-data", metavar="PATH", help=".npz or folder of <input>.npy (default: synthetic)")
    q.add_argument("--num-calib", type=int, default=20, metavar="N", help="calibration samples (default 20)")


def quant_settings(args) -> QuantSettings:
    parse_quant_format(args.quant_format)
    parse_quant_dtype(args.quant_dtype)
    parse_calibrate_method(args.calibrate_method)
    if args.num_calib < 1:
        raise TorqError(f"--num-calib must be at least 1 (got {args.num_calib})")
    quant_flags = args.per_channel or args.full_integer or args.calibration_data \
        or args.quant_format.lower() != "qdq"
    if quant_flags and not args.quantize:
        raise TorqError("--per-channel/--full-integer/--quant-format/--calibration-data need --quantize")
    bf16 = getattr(args, "auto_convert_bf16", False)
    if bf16 and args.quantize:
        raise TorqError("--auto-convert-bf16 and --quantize are mutually exclusive: "
                        "the model runs on the NPU in bf16 or in int8")
    return QuantSettings(args.quantize, args.per_channel, args.full_integer, args.quant_format.lower(),
                         args.quant_dtype.upper(), args.calibrate_method.lower(), args.calibration_data,
                         args.num_calib, bf16)


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
