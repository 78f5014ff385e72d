"""``torq-gen-config quantize``: static int8 quantization of an fp32 ONNX model, and what changed."""
from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from ..errors import TorqError
from ..fileio import refuse_overwrite


def _fmt(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"


def register(sub) -> None:
    """Add the ``quantize`` subparser to a ``torq-gen-config`` subparsers object."""
    from .recipe_flags import add_recipe_arguments
    q = sub.add_parser(
        "quantize", help="static int8 quantization of an fp32 ONNX model",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_fmt("""
            Statically quantize an fp32 ONNX model to int8 (A8W8) with ONNX Runtime and print
            what changed (op counts, Q/DQ nodes, graph I/O, file sizes). How: a recipe (--recipe
            NAME, then single flags), the same on quantize, discover, run and evaluate, so this
            writes exactly the model `evaluate --recipe NAME` measured with the same data.

            Calibration data: --calibration-data SPEC (an .npz keyed by input name, a folder of
            <input>.npy, or images with --preprocess); without it, --num-calib deterministic
            synthetic samples, uniform in [-1, 1).
        """),
        epilog=_fmt("""
            examples:
              torq-gen-config quantize --model model.onnx
              torq-gen-config quantize --model model.onnx --per-channel --full-integer
              torq-gen-config quantize --model model.onnx --recipe recommended \\
                  --calibration-data photos/ --preprocess resize=256,crop=224,norm=tf
              torq-gen-config quantize --model model.onnx --quant-format hybrid \\
                  --calibration-data calib.npz --calibrate-method entropy -o model.q.onnx
        """))
    q.add_argument("--model", "-m", required=True, metavar="MODEL.onnx", help="fp32 ONNX model to quantize")
    q.add_argument("--output", "-o", metavar="OUT.onnx",
                   help="where to write the quantized model (default: <model stem>.int8.onnx next to the model)")
    add_recipe_arguments(q)
    q.add_argument("--recompute-cache", action="store_true",
                   help="quantize again even if an identical quantization (same model, recipe, calibration "
                        "samples, torq) is cached; the entry is rewritten (TORQ_QUANTIZE_CACHE=off: no cache)")
    q.set_defaults(func=_cmd_quantize)


def default_output(model: Path) -> Path:
    """``<stem>.int8.onnx`` next to the model."""
    return model.with_name(f"{model.stem}.int8.onnx")


def _auto_report(q, out: Path, recipe) -> None:
    """--precision auto: the choice per layer next to the model (``<output stem>.precision.json``)."""
    import json

    from ..fileio import atomic_write_text
    from .precision import stamped
    result = stamped(q)
    if result is None:
        return
    report = out.with_name(out.stem + ".precision.json")
    atomic_write_text(report, json.dumps(result, indent=1) + "\n")
    head = (f"torq-gen-config quantize: --precision auto: {len(result['int16_layers'])} int16 layers, "
            f"{100 * result['int8_mac_share']:.1f} % of MACs in int8")
    if result["expected_top1_loss_points"] is None:
        print(f"{head} (budget 0: the most sensitive layers within --int16-macs {recipe.int16_macs:g} %); "
              f"per layer: {report}")
        return
    verdict = "within" if result["met"] else "NOT within"
    print(f"{head}; expected top-1 loss vs FP32 {result['expected_top1_loss_points']:.2f} points (top-1 "
          f"disagreement {result['disagreement_top1_points']:.2f}) on {result['holdout_images']} held-apart "
          f"samples ({verdict} the budget {recipe.accuracy_budget:g}); per layer: {report}")


def _cmd_quantize(args) -> int:
    from ..fileio import save_model
    from ..graph.load import load_model
    from .recipe import apply
    from .recipe_flags import NO_DATA, recipe_from_args, say_note
    from .summary import summary_lines

    notes: list = []
    recipe = recipe_from_args(args, notes=notes)          # every flag checked before the model work
    model = Path(args.model)
    out = Path(args.output) if args.output else default_output(model)
    refuse_overwrite(out, "--output", {"--model": model, "--calibration-data": recipe.calibration_data})
    fp32 = load_model(model)  # validated before the slow steps; also the "before" of the summary
    if ("*", "auto") in recipe.precision and recipe.accuracy_budget > 0 and not recipe.calibration_data:
        raise TorqError("--precision auto needs real calibration data (--calibration-data): the choice is "
                        "measured against FP32 on held-apart samples")
    for n in notes:
        if not n.startswith(NO_DATA):
            say_note(n)
    q = apply(recipe, model).model        # stage lines (fold, CLE, calibration, ...) on stderr
    save_model(q, out)
    _auto_report(q, out, recipe)
    calib = f"{recipe.calibration_data} (first {recipe.num_calib})" if recipe.calibration_data \
        else f"synthetic x{recipe.num_calib}"
    print(f"torq-gen-config quantize: wrote {out}")
    for line in summary_lines(fp32, q, src_path=model, out_path=out,
                              settings=f"recipe {recipe.describe()}; calibration={calib}"
                              + "".join(f"; {n}" for n in notes if n.startswith(NO_DATA))):
        print("  " + line)
    return 0
