"""torq-compile: quantized ONNX -> torch-mlir -> linalg -> torq_hl -> Program, and proof against ONNX Runtime.
May import: torq.compiled, torq.compiler, torq.graph, torq.verify, torq.cli_util, torq.errors, torq.fileio.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cli_util import OneLineParser, run_main
from .compiler import STAGES
from .errors import TorqError
from .fileio import refuse_overwrite

EMIT_STAGES = (*STAGES, "program")

EPILOG = """examples:
  torq-compile model.int8.onnx                       # print the torq_hl IR
  torq-compile model.int8.onnx --emit linalg -o m.linalg.mlir
  torq-compile model.int8.onnx --emit program -o m.torq  # the Program the NSS runs (.npz + JSON manifest)
  torq-compile model.int8.onnx --debug-ir ir/        # every stage as ir/<model>.<stage>.mlir
  torq-compile model.int8.onnx --verify-against-ort  # NSS vs ONNX Runtime, both rounding modes

--verify-against-ort feeds random inputs (--seed) to the NSS simulator and to ONNX Runtime
(default graph optimisation + session.qdqisint8allowed=1, i.e. ORT's integer kernels) and prints,
per output, max |delta| in LSB and the number of differing elements; then, per rescaling op and
per rounding mode run, whether the output the simulator executed equals the plain formula of
that mode, and how the native NPU rounding differs from ORT's on the same inputs and why (tie:
exact .5, NTP rounds up where ORT rounds to even; near-tie: multiplier quantisation / float32
rounding; other: a bug).
Exit 0 only if `ort` rounding is bit-exact, every op executed its formula, and every native
difference is <= 1 LSB and explained. Ops with no integer form (Softmax, LayerNorm) run in bf16
("bf16 islands"): each island's int8 result must be within 1 LSB of ORT's (ort) / 8 LSB (native),
and a second run that hands ORT's island results on must keep every int8 op bit-exact."""


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="torq-compile", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Compile an int8 ONNX model (QDQ or QOperator, e.g. from `torq-gen-config quantize`) "
                    "to TORQ NPU ops (torq_hl) and optionally prove it against ONNX Runtime.")
    p.add_argument("model", help="quantized ONNX model (.onnx)")
    p.add_argument("--emit", default="torq_hl", metavar="STAGE",
                   help=f"IR stage to print or write: {', '.join(EMIT_STAGES)} (default torq_hl); "
                        "`program` writes the executable Program (needs -o)")
    p.add_argument("-o", "--output", help="write the IR to this file instead of stdout")
    p.add_argument("--debug-ir", metavar="DIR", help="write every stage to DIR/<model>.<stage>.mlir")
    p.add_argument("--verify-against-ort", action="store_true",
                   help="run random inputs through the NSS simulator and ONNX Runtime and compare")
    p.add_argument("--rounding", choices=("native", "ort", "both"), default="both",
                   help="rounding mode(s) to verify: native (the NPU), ort (ONNX Runtime's float "
                        "requant) or both (default)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random verification inputs (default 0)")
    p.add_argument("--no-bf16-islands", dest="bf16_islands", action="store_false",
                   help="refuse ops with no integer form (Softmax, LayerNorm) instead of running them on the NPU "
                        "in bf16 between the Quantize/Dequantize fallbacks (the default; their int8 results then "
                        "differ from ORT's float32 by a few LSB, checked against a stated tolerance)")
    p.add_argument("--input-shape", action="append", metavar="NAME=D0,D1,...",
                   help="sizes of input dims the model left open (Paddle's -1, a symbolic H/W; an open batch "
                        "is 1), e.g. --input-shape x=1,3,48,192; repeat for several inputs")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return run_main("torq-compile", lambda: _compile(args))


def _compile(args) -> int:
    from .compiled import compile as compile_model
    if args.emit not in EMIT_STAGES:
        raise TorqError(f"--emit: unknown stage {args.emit!r}; choose one of {', '.join(EMIT_STAGES)}")
    if args.emit == "program" and not args.output:
        raise TorqError("--emit program writes a binary file: give it with -o/--output (e.g. -o model.torq)")
    model_path = Path(args.model)
    if args.output:
        refuse_overwrite(args.output, "-o/--output", {"model": model_path})
    model = model_path
    if args.input_shape:
        from .graph.input_shape import parse_input_shape, set_input_shapes
        from .graph.load import load_model
        shapes = [parse_input_shape(t) for t in args.input_shape]
        model = set_input_shapes(load_model(model_path), shapes, str(model_path))
    compiled = compile_model(model, debug_ir=args.debug_ir, name=model_path.stem, bf16_islands=args.bf16_islands)
    if not compiled.report.lowered:
        raise TorqError(f"{model_path}: nothing was lowered to torq_hl; is the model quantized? "
                        f"(run `torq-gen-config quantize --model {model_path}` first)")
    if compiled.report.islands and not args.verify_against_ort:
        print(f"torq-compile: {compiled.report.islands_line()}", file=sys.stderr)
    if not args.verify_against_ort:   # (verification refuses them with the first one named)
        for u in compiled.report.unsupported:
            print(f"torq-compile: warning: {u}", file=sys.stderr)
    if args.output:
        _write(args, compiled)
    elif not args.verify_against_ort:
        sys.stdout.write(compiled.ir(args.emit))
    if args.debug_ir:
        print(f"wrote {len(compiled.stages)} IR stages to {args.debug_ir}/", file=sys.stderr)
    if args.verify_against_ort:
        from .verify import print_report, verify
        result = verify(compiled, seed=args.seed, modes=("native", "ort") if args.rounding == "both"
                        else (args.rounding,))
        print_report(result)
        return 0 if result.ok else 1
    return 0


def _write(args, compiled) -> None:
    from .fileio import atomic_write_text
    try:
        if args.emit == "program":
            compiled.program.save(args.output)
            print(f"wrote the program ({len(compiled.program.steps)} ops) to {args.output}", file=sys.stderr)
        else:
            atomic_write_text(args.output, compiled.ir(args.emit))
            print(f"wrote {args.emit} IR to {args.output}", file=sys.stderr)
    except OSError as e:
        raise TorqError(f"-o/--output {args.output}: cannot write: {e.strerror or type(e).__name__}") from None


if __name__ == "__main__":
    sys.exit(main())
