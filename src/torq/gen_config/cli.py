"""``torq-gen-config``: the user-facing CLI. One subparser per subcommand, each registered by its own module.

Adding a subcommand: a module with ``register(sub)`` that adds its parser with
``set_defaults(func=...)``, and one ``<module>.register(sub)`` line in ``build_parser``. Every error
goes through ``run_main``: one line on stderr, exit code 2, no traceback, no partial output.
"""
from __future__ import annotations

import argparse
import sys
import textwrap

from ..cli_util import OneLineParser as _Parser
from ..cli_util import log_to, run_main

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
    from ..quantize import cli as quantize
    quantize.register(sub)
    discover.register(sub)
    run.register(sub)
    view.register(sub)
    edit.register(sub)
    evaluate.register(sub)
    return p


# ----------------------------------------------------------------------------- entry point

def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]   # for reproduction commands

    def body():
        from ..quantize.model_cache import recomputing    # --recompute-cache: no cached quantization either
        with log_to(getattr(args, "log_file", None), PROG), recomputing(getattr(args, "recompute_cache", False)):
            return args.func(args)
    return run_main(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
