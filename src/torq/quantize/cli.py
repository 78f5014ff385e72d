"""``torq-gen-config quantize``: static int8 quantization of an fp32 ONNX model, and what changed."""
from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from ..errors import TorqError


def _fmt(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"


def register(sub) -> None:
    """Add the ``quantize`` subparser to a ``torq-gen-config`` subparsers object."""
    q = sub.add_parser(
        "quantize", help="static int8 quantization of an fp32 ONNX model",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_fmt("""
            Statically quantize an fp32 ONNX model to int8 (A8W8) with ONNX Runtime and print
            what changed (op counts, Q/DQ nodes, graph I/O, file sizes).

            Calibration data: --calibration-data PATH (an .npz keyed by input name, or a folder
            with one <input>.npy per input; first axis = samples); without it, --num-calib
            deterministic synthetic samples, uniform in [-1, 1).
        """),
        epilog=_fmt("""
            examples:
              torq-gen-config quantize --model model.onnx
              torq-gen-config quantize --model model.onnx --per-channel --full-integer
              torq-gen-config quantize --model model.onnx --quant-format hybrid \\
                  --calibration-data calib.npz --calibrate-method entropy -o model.q.onnx
        """))
    q.add_argument("--model", "-m", required=True, metavar="MODEL.onnx", help="fp32 ONNX model to quantize")
    q.add_argument("--output", "-o", metavar="OUT.onnx",
                   help="where to write the quantized model (default: <model stem>.int8.onnx next to the model)")
    q.add_argument("--per-channel", action="store_true",
                   help="one weight scale per output channel instead of one per tensor")
    q.add_argument("--full-integer", action="store_true",
                   help="int8 graph inputs/outputs: drop the input QuantizeLinear and output "
                        "DequantizeLinear (I/O names are kept; scales go to model metadata 'torq.io_quant')")
    q.add_argument("--exact-scales", action="store_true",
                   help="QDQ: move each weight scale (typically 0.1 %%, at most 5 %%) so that ONNX Runtime's "
                        "float requantization is exact; the NPU's native rounding is then bit-exact with ORT")
    q.add_argument("--quant-format", default="qdq", metavar="{qdq,qoperator,hybrid}",
                   help="qdq: QuantizeLinear/DequantizeLinear around float ops (default); qoperator: "
                        "QLinearConv/QGemm/..., and the ops ORT leaves in float between them (HardSwish, "
                        "BatchNormalization, a pool head, ...) get Q/DQ with their calibrated ranges, so "
                        "the model is fully int8; hybrid: qoperator if every compute op has a compact "
                        "QLinear form (Conv, Add, Mul, MatMul, pools, activations), else qdq")
    q.add_argument("--quant-dtype", default="A8W8", metavar="{A8W8,A16W8}",
                   help="activation/weight types: A8W8 (int8/int8, default) or A16W8 (int16 activations, "
                        "int8 weights: the NPU's int16 path, QDQ only; docs/a16w8.md)")
    q.add_argument("--calibrate-method", default="minmax", metavar="{minmax,entropy,percentile}",
                   help="how activation ranges are chosen from calibration data (default minmax)")
    q.add_argument("--num-calib", type=int, default=20, metavar="N",
                   help="number of calibration samples (synthetic, or the first N of the dataset; default 20)")
    q.add_argument("--calibration-data", metavar="PATH",
                   help=".npz keyed by input name, or a folder of <input>.npy files (first axis = samples)")
    q.add_argument("--equalize", action="store_true",
                   help="fold BatchNorm into the Convs, then cross-layer equalization (rescale consecutive "
                        "Conv → Relu/ReLU6 → Conv channel pairs to equal weight ranges; exact on the "
                        "calibration data) before quantizing")
    q.add_argument("--precision", default="int8", metavar="{int8,int16,auto,NODE=int16,...}",
                   help="activation precision per layer: int8 (default), int16 (every layer, as A16W8), "
                        "NODE=int16[,NODE=int16...] (those nodes, by ONNX name), or auto: the fewest int16 "
                        "layers by MACs that keep top-1 within --accuracy-budget of FP32 on held-apart "
                        "calibration samples (needs --calibration-data; writes <output>.precision.json; "
                        "docs/mixed-precision.md)")
    q.add_argument("--accuracy-budget", type=float, default=0.5, metavar="POINTS",
                   help="with --precision auto: allowed top-1 disagreement with FP32 on the held-apart "
                        "calibration samples, in percentage points (default 0.5)")
    q.add_argument("--holdout", type=int, metavar="N",
                   help="with --precision auto: calibration samples held apart for the budget (default a third)")
    q.set_defaults(func=_cmd_quantize)


def _auto(model: Path, out: Path, fp32, args, kwargs):
    """--precision auto: choose by measurement (quantize.auto_precision), write the choice."""
    import json

    from rich.console import Console

    from ..fileio import atomic_write_text
    from .auto_precision import auto_quantize
    from .calibration import make_reader
    from .sensitivity import samples_of
    if not args.calibration_data:
        raise TorqError("--precision auto needs real calibration data (--calibration-data): the choice is "
                        "measured against FP32 on held-apart samples")
    samples = samples_of(make_reader(fp32, calibration_data=args.calibration_data, num_calib=args.num_calib))
    with Console(stderr=True).status(f"Choosing precisions for {model.name} ...") as status:
        q, result = auto_quantize(model, samples, args.accuracy_budget, args.holdout, output=out,
                                  progress=lambda msg: status.update(f"{model.name}: {msg}"), **kwargs)
    report = out.with_name(out.stem + ".precision.json")
    atomic_write_text(report, json.dumps(result.to_json(), indent=1) + "\n")
    verdict = "within" if result.met else "NOT within"
    print(f"torq-gen-config quantize: --precision auto: {len(result.precision)} int16 layers, "
          f"{100 * result.int8_mac_share:.1f} % of MACs in int8; top-1 disagreement with FP32 "
          f"{result.disagreement:.2f} points on {result.holdout_images} held-apart samples ({verdict} "
          f"the budget {args.accuracy_budget:g}); per layer: {report}")
    return q


def default_output(model: Path) -> Path:
    """``<stem>.int8.onnx`` next to the model."""
    return model.with_name(f"{model.stem}.int8.onnx")


def _cmd_quantize(args) -> int:
    from ..graph.load import load_model
    from .static import quantize
    from .summary import summary_lines

    model = Path(args.model)
    out = Path(args.output) if args.output else default_output(model)
    if model.exists() and out.exists() and out.resolve() == model.resolve():
        raise TorqError(f"--output {out} would overwrite the input model; choose another path")
    fp32 = load_model(model)  # validate before the spinner; also the "before" of the summary
    from .precision import parse_precision
    precision = parse_precision(args.precision)
    quant_dtype = "A16W8" if precision == "int16" else args.quant_dtype
    kwargs = dict(per_channel=args.per_channel, full_integer=args.full_integer, quant_format=args.quant_format,
                  quant_dtype=quant_dtype, calibrate_method=args.calibrate_method, equalize=args.equalize,
                  exact_scales=args.exact_scales)
    if precision == "auto":
        q = _auto(model, out, fp32, args, kwargs)
    else:
        from rich.console import Console
        with Console(stderr=True).status(f"Calibrating and quantizing {model.name} ..."):
            q = quantize(model, out, calibration_data=args.calibration_data, num_calib=args.num_calib,
                         precision=precision if isinstance(precision, dict) else None, **kwargs)
    calib = f"{args.calibration_data} (first {args.num_calib})" if args.calibration_data \
        else f"synthetic x{args.num_calib}"
    settings = (f"{quant_dtype.upper()}, precision={args.precision}, per-channel={args.per_channel}, "
                f"full-integer={args.full_integer}, calibration={calib}, "
                f"method={args.calibrate_method.lower()}{', equalized' if args.equalize else ''}"
                f"{', exact scales' if args.exact_scales else ''}")
    print(f"torq-gen-config quantize: wrote {out}")
    for line in summary_lines(fp32, q, src_path=model, out_path=out, settings=settings):
        print("  " + line)
    return 0
