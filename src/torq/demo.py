"""``python -m torq.demo`` (``make demo``): the whole toolchain on the built-in example model.

Each step is one function taking the output folder and returning what it produced: quantize,
compile + verify against ONNX Runtime, then the user workflow: discover the per-layer executor
map (NSS / CSS / HOST) and run the whole model with it.
May import: torq.examples, torq.quantize, torq.compiled, torq.verify, torq.gen_config, torq.graph, torq.cli_util.
"""
from __future__ import annotations

import sys
from pathlib import Path

from .cli_util import run_main

OUT_DIR = Path("torq_out")


def quantize_step(out_dir: str | Path = OUT_DIR) -> Path:
    """Build the example CNN (fp32) and quantize it: QDQ, per-tensor, full-integer int8 I/O."""
    from .examples import build_example_cnn
    from .graph.load import load_model
    from .quantize import quantize
    from .quantize.summary import summary_lines

    out_dir = Path(out_dir)
    fp32_path = out_dir / "example.onnx"
    q_path = out_dir / "example.int8.onnx"
    build_example_cnn(fp32_path)
    print(f"[1] built the example CNN -> {fp32_path}")
    q = quantize(fp32_path, q_path, quant_format="qdq", per_channel=False, full_integer=True)
    print(f"[2] quantized (ONNX Runtime static, 20 synthetic calibration samples) -> {q_path}")
    for line in summary_lines(load_model(fp32_path), q, src_path=fp32_path, out_path=q_path,
                              settings="A8W8, per-channel=False, full-integer=True"):
        print("    " + line)
    return q_path


def compile_step(q_path: Path, out_dir: str | Path = OUT_DIR):
    """Compile the quantized model to torq_hl (every stage's IR written to out_dir/ir/)."""
    from .compiled import compile as compile_model

    ir_dir = Path(out_dir) / "ir"
    compiled = compile_model(q_path, debug_ir=ir_dir)
    t = compiled.timings
    print(f"[3] compiled ONNX -> torch-mlir -> linalg -> torq_hl -> program in {sum(t.values()):.2f} s: "
          + ", ".join(f"{k}×{v}" for k, v in sorted(compiled.report.lowered.items())))
    for u in compiled.report.unsupported:
        print(f"    {u}")
    print(f"    IR of every stage: {', '.join(str(ir_dir / f'{q_path.stem}.{s}.mlir') for s in compiled.stages)}")
    return compiled


def verify_step(compiled) -> bool:
    """Run the NSS simulator (native and ORT rounding) and ONNX Runtime on random int8 inputs."""
    from .verify import print_report, verify

    print("[4] NSS simulator vs ONNX Runtime (session.qdqisint8allowed=1), random int8 inputs:")
    result = verify(compiled, seed=0)
    print_report(result)
    return result.ok


def discover_step(out_dir: str | Path = OUT_DIR):
    """torq-gen-config discover: every layer quantized alone, tried on NSS, CSS and HOST."""
    from .gen_config.discover import DiscoverOptions, run_discovery
    from .gen_config.options import QuantSettings
    from .quantize import Recipe
    from .gen_config.progress import layer_progress
    from .gen_config.view import print_table

    out_dir = Path(out_dir)
    opts = DiscoverOptions(model=out_dir / "example.onnx", output_dir=out_dir,
                           quant=QuantSettings(quantize=True, recipe=Recipe(full_integer=True)))
    print("[5] torq-gen-config discover --quantize --full-integer (each layer on nss, css, host vs ORT):")
    with layer_progress("discover") as bar:
        report, path = run_discovery(opts, bar)
    print_table(report)
    print(f"    report -> {path}")
    return opts


def run_step(opts) -> bool:
    """torq-gen-config run: the whole model with the discovered map, vs ONNX Runtime."""
    from .gen_config.run import RunOptions, run_full

    print("[6] torq-gen-config run (whole model, executor segments, native rounding) vs ONNX Runtime:")
    report, _ = run_full(RunOptions(opts.model, opts.output_dir, opts.quant))
    m = report["full_model_metrics"]
    segs = ", ".join(f"{s['executor']} ({s['layers']} layers)" for s in m["segments"])
    print(f"    segments: {segs}; "
          f"max |Δ| {m['max_abs_lsb']:g} LSB (tolerance ±{m['tolerance_lsb']:g}), "
          f"top-1 agreement {m.get('top1_agreement', 1):.0%}: {'PASS' if m['passed'] else 'FAIL'}")
    return m["passed"]


def main() -> int:
    def body() -> int:
        q_path = quantize_step(OUT_DIR)
        compiled = compile_step(q_path, OUT_DIR)
        ok = verify_step(compiled)
        opts = discover_step(OUT_DIR)
        return 0 if run_step(opts) and ok else 1
    return run_main("torq.demo", body)


if __name__ == "__main__":
    sys.exit(main())
