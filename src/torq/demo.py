"""``python -m torq.demo`` (``make demo``): the whole toolchain on the built-in example model.

Each step is one function taking the output folder and returning what it produced, so later
steps (compile, simulate, compare) are appended to ``main`` after ``quantize_step``."""
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


def main() -> int:
    def body() -> int:
        q_path = quantize_step(OUT_DIR)
        compiled = compile_step(q_path, OUT_DIR)
        return 0 if verify_step(compiled) else 1
    return run_main("torq.demo", body)


if __name__ == "__main__":
    sys.exit(main())
