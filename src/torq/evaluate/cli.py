"""``torq-gen-config evaluate``: accuracy of FP32 vs INT8 (ORT) vs INT8 (NSS) on a labelled dataset."""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from ..errors import TorqError

DESCRIPTION = """
    Quantize MODEL (fp32 ONNX) with real calibration images, then classify every evaluation
    image with FP32 (ONNX Runtime), INT8 (ONNX Runtime) and INT8 (the NSS simulator, native
    NPU rounding). Prints top-1/top-5, top-1 agreement of each INT8 path with FP32, NSS vs ORT
    agreement and images/s, and writes evaluation.json, evaluation.md, sqnr.png (per-layer SQNR
    of INT8 vs FP32 activations) and lsb_hist.png (NSS − ORT integer logits, int8 or int16) to --output-dir.

    dataset SPEC: a folder with labels.tsv (tab-separated header 'file class_index ...'), an
    .npz with x (images) and y (labels), or an IDX images file (MNIST/Fashion-MNIST
    *-images-idx3-ubyte[.gz]; labels found by name, or IMAGES,LABELS). Calibration data may also
    be a plain folder of images. Calibration images are never evaluation images.

    --preprocess: key=value,... with resize=S (short side), crop=C (centre), norm=tf|imagenet|
    mnist|unit|raw or mean=M,std=S (R/G/B allowed), order=rgb|bgr, layout=nchw|nhwc, channels=1|3;
    the same spec turns calibration images into inputs (quantize/discover/run take it too).

    The int8 model is the recipe's (--recipe, default: the recommended one) in its full-integer
    form: `torq-gen-config quantize --recipe R --full-integer` with the same calibration data
    writes it bit for bit.
"""
EPILOG = """
    examples:
      torq-gen-config evaluate --model effnet_lite0.onnx --dataset imagenet-sample/ \\
          --preprocess resize=256,crop=224,norm=tf --calibration-data photos/ --batch 8
      torq-gen-config evaluate --model fmnist.onnx --dataset t10k-images-idx3-ubyte.gz \\
          --calibration-data train-images-idx3-ubyte.gz --preprocess resize=112,channels=3,norm=tf
      torq-gen-config evaluate --model digits.onnx --dataset mnist.npz --calibration-split 100 --ray
"""


def register(sub) -> None:
    """Add the ``evaluate`` subparser to a ``torq-gen-config`` subparsers object."""
    p = sub.add_parser("evaluate", help="accuracy of FP32 vs INT8 (ORT) vs INT8 (NSS) on labelled data",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=textwrap.dedent(DESCRIPTION).strip(), epilog=textwrap.dedent(EPILOG).strip())
    p.add_argument("--model", "-m", required=True, metavar="MODEL.onnx", help="fp32 ONNX classifier")
    p.add_argument("--dataset", "-d", required=True, metavar="SPEC", help="labelled evaluation data")
    p.add_argument("--calibration-split", type=int, default=0, metavar="N",
                   help="hold N random images of --dataset apart for calibration (not evaluated); "
                        "instead of --calibration-data")
    from ..quantize.recipe_flags import add_recipe_arguments
    add_recipe_arguments(p)
    p.add_argument("--half", choices=["all", "tune", "report"], default="all",
                   help="evaluate a seeded half of the images: choose settings on 'tune', quote numbers from "
                        "'report' (default all)")
    p.add_argument("--split-seed", type=int, default=0, metavar="S", help="seed of the tune/report halves (default 0)")
    p.add_argument("--limit", type=int, metavar="N", help="evaluate only the first N images")
    p.add_argument("--batch", type=int, default=8, metavar="B", help="images per NSS call (default 8)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="NSS worker processes (default 1)")
    p.add_argument("--threads", type=int, default=0, metavar="T",
                   help="NSS threads in this process: a batch runs as sub-batches side by side, identical "
                        "results (default 0: every usable core; --jobs/--ray workers use one each)")
    p.add_argument("--rounding", choices=["native", "ort"], default="native",
                   help="NSS rescale: native (the NPU's fixed-point ACT, default) or ort (ONNX Runtime's float "
                        "requantization, bit-exact with INT8 (ORT): 100 %% agreement unless something is wrong)")
    p.add_argument("--ray", nargs="?", const=True, default=None, metavar="ADDRESS",
                   help="spread NSS batches over a Ray cluster (no ADDRESS: a local Ray instance)")
    p.add_argument("--onnx-reference", action="store_true",
                   help="also run the int8 model as its ONNX definition (ORT without fusion: DequantizeLinear → "
                        "float op → QuantizeLinear) and report how often two correct INT8 executions agree")
    p.add_argument("--sqnr-images", type=int, default=8, metavar="N",
                   help="images used for the per-layer SQNR (0 = skip; default 8)")
    p.add_argument("--output-dir", "-o", default="torq_out/evaluate", metavar="DIR",
                   help="where the JSON, Markdown and PNG files go (default torq_out/evaluate)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..quantize.recipe_flags import recipe_from_args
    from .run import EvalOptions, evaluate
    for flag in ("batch", "jobs"):
        if getattr(args, flag) < 1:
            raise TorqError(f"--{flag.replace('_', '-')} {getattr(args, flag)} must be at least 1")
    for flag in ("threads", "sqnr_images", "calibration_split"):
        if getattr(args, flag) < 0:
            raise TorqError(f"--{flag.replace('_', '-')} {getattr(args, flag)} must be at least 0")
    if args.limit is not None and args.limit < 1:
        raise TorqError(f"--limit {args.limit} must be at least 1")
    if not Path(args.model).is_file():
        raise TorqError(f"--model {args.model}: no such file")
    recipe = recipe_from_args(args, data_elsewhere=True)      # (calibrates on held-apart images)
    opts = EvalOptions(recipe=recipe, batch=args.batch, limit=args.limit, calibration_split=args.calibration_split,
                       half=args.half, split_seed=args.split_seed,
                       sqnr_images=args.sqnr_images, onnx_reference=args.onnx_reference,
                       jobs=args.jobs, threads=args.threads, ray=args.ray, rounding=args.rounding)
    _check_outputs(args, recipe.calibration_data)
    if recipe.precision == (("*", "bf16"),):
        from .bf16_run import evaluate_bf16
        result = evaluate_bf16(args.model, args.dataset, opts)
    else:
        result = evaluate(args.model, args.dataset, options=opts)
    print(result.markdown())
    try:
        written = result.write(args.output_dir)
    except OSError as e:
        raise TorqError(f"--output-dir {args.output_dir}: cannot write: {e.strerror or type(e).__name__}") from None
    for path in written:
        print(f"wrote {path}")
    for w in result.warnings():     # an error without a declared norm (raw pixels), else a warning
        print(f"torq-gen-config evaluate: {'error' if result.refused() else 'WARNING'}: {w}", file=sys.stderr)
    return 1 if result.refused() else 0


OUTPUTS = ("evaluation.json", "evaluation.md", "sqnr.png", "lsb_hist.png")


def _check_outputs(args, calibration_data) -> None:
    """Before any work: --output-dir is a folder, and none of the files written there is an input."""
    from ..fileio import refuse_overwrite
    out = Path(args.output_dir)
    if out.exists() and not out.is_dir():
        raise TorqError(f"--output-dir {out}: is a file, not a folder")
    inputs = {"--model": args.model, "--dataset": args.dataset, "--calibration-data": calibration_data}
    for name in OUTPUTS:
        refuse_overwrite(out / name, "--output-dir", inputs)
