"""``torq-gen-config``: the user-facing CLI. One subparser + one ``_cmd_<name>(args)`` per subcommand.

Adding a subcommand: a module with ``register(sub)`` that adds its parser with
``set_defaults(func=...)``, and one ``<module>.register(sub)`` line in ``build_parser``. Every error
goes through ``run_main``: one line on stderr, exit code 2, no traceback, no partial output.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from ..cli_util import OneLineParser as _Parser
from ..cli_util import run_main
from ..errors import TorqError

PROG = "torq-gen-config"


def _fmt(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_fmt("""
            Quantize ONNX models for the TORQ NPU and find, layer by layer, which executor
            (NSS / CSS / HOST) can run each op.

            subcommands:
              quantize   static int8 quantization of an fp32 ONNX model (ONNX Runtime)
              discover   per-layer executor discovery: NSS simulator, CSS (IREE vmvx), HOST (IREE llvm-cpu)
              run        apply the discovered executor map to the whole model, compare with ONNX Runtime
              view       show a discovery report (table, one layer, or a self-contained HTML page)
              edit       change a layer's executor or tolerance by hand
              evaluate   accuracy of FP32 vs INT8 (ORT) vs INT8 (NSS) on labelled data
        """),
        epilog="Run '%(prog)s COMMAND --help' for the options of a subcommand.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    from . import discover, edit, run, view
    from ..evaluate import cli as evaluate
    _add_quantize(sub)
    discover.register(sub)
    run.register(sub)
    view.register(sub)
    edit.register(sub)
    evaluate.register(sub)
    return p


# ----------------------------------------------------------------------------- quantize

def _add_quantize(sub) -> None:
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
              torq-gen-config quantize --model model.onnx --recipe recommended \
                  --calibration-data photos/ --preprocess resize=256,crop=224,norm=tf
              torq-gen-config quantize --model model.onnx --quant-format hybrid \\
                  --calibration-data calib.npz --calibrate-method entropy -o model.q.onnx
        """))
    q.add_argument("--model", "-m", required=True, metavar="MODEL.onnx", help="fp32 ONNX model to quantize")
    q.add_argument("--output", "-o", metavar="OUT.onnx",
                   help="where to write the quantized model (default: <model stem>.int8.onnx next to the model)")
    from ..quantize.recipe import DEFAULT
    from ..quantize.recipe_flags import add_recipe_arguments
    add_recipe_arguments(q, default=DEFAULT)
    q.set_defaults(func=_cmd_quantize)


def default_output(model: Path) -> Path:
    """``<stem>.int8.onnx`` next to the model."""
    return model.with_name(f"{model.stem}.int8.onnx")


def _cmd_quantize(args) -> int:
    from ..graph.load import load_model
    from ..quantize import apply
    from ..quantize.recipe_flags import recipe_from_args
    from ..quantize.summary import summary_lines
    from ..fileio import save_model

    recipe = recipe_from_args(args)          # every flag checked before the model work
    model = Path(args.model)
    out = Path(args.output) if args.output else default_output(model)
    if model.exists() and out.exists() and out.resolve() == model.resolve():
        raise TorqError(f"--output {out} would overwrite the input model; choose another path")
    fp32 = load_model(model)  # validate before the spinner; also the "before" of the summary
    from rich.console import Console
    with Console(stderr=True).status(f"Calibrating and quantizing {model.name} ..."):
        q = apply(recipe, model).model
    save_model(q, out)
    calib = f"{recipe.calibration_data} (first {recipe.num_calib})" if recipe.calibration_data \
        else f"synthetic x{recipe.num_calib}"
    settings = f"recipe {recipe.describe()}; calibration={calib}"
    print(f"{PROG} quantize: wrote {out}")
    for line in summary_lines(fp32, q, src_path=model, out_path=out, settings=settings):
        print("  " + line)
    return 0


# ----------------------------------------------------------------------------- entry point

def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]   # for reproduction commands
    return run_main(PROG, lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
