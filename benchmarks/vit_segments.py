"""vit_b_16 on the NSS, one encoder layer at a time: the parts with an exact integer form,
compiled and verified against ONNX Runtime (the whole model cannot be: LayerNorm and Softmax
stay on the CSS/HOST).

    python benchmarks/vit_segments.py                     # encoder layer 0, the three flag sets
    python benchmarks/vit_segments.py --layer 11 --flags qop

Uses `benchmarks/torchvision_zoo.py`'s cached export and quantized models (`build/zoo/vit_b_16.<flags>.onnx`,
made on first use; needs the optional `zoo` extra). Each segment is cut out of the quantized
model with `torq.graph.extract_segment` between a LayerNorm / Softmax and the next one:

  attention scores  LN1's output -> Q/K/V projection, head split, q·s and k·s, Q·Kᵀ
  softmax·V         softmax's output -> softmax·V, head merge, out projection, residual Add
  MLP               LN2's output -> fc1, GELU, fc2, residual Add

and printed with: torq_hl ops, whether `ort` rounding is bit-exact with ORT, native max |Δ|
(float outputs: absolute; the per-op check explains every native difference), compile seconds.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torchvision_zoo as zoo  # noqa: E402 - the sibling benchmark: export + quantize cache


def _segments(nodes, layer: int) -> dict[str, tuple[int, int]]:
    pre = f"/encoder/layers/encoder_layer_{layer}/"

    def first(pred, start=0):
        return next(i for i in range(start, len(nodes)) if pred(nodes[i]))

    def writes(n, prefix):
        return any(o.startswith(pre + prefix) for o in n.output)

    soft = first(lambda n: "Softmax" in n.op_type and writes(n, "self_attention/"))
    ln2 = first(lambda n: n.op_type == "LayerNormalization" and writes(n, "ln_2"))
    return {
        "attention scores (Q·Kᵀ)": (first(lambda n: writes(n, "self_attention/Transpose_output_0")), soft),
        "softmax·V, out proj, residual": (first(lambda n: n.op_type != "QuantizeLinear", soft + 1),
                                          first(lambda n: writes(n, "Add_output_0")) + 1),
        "MLP (GELU), residual": (first(lambda n: n.op_type != "QuantizeLinear", ln2 + 1),
                                 first(lambda n: writes(n, "Add_1_output_0")) + 1),
    }


def _with_qdq(nodes, a: int, b: int) -> list[int]:
    """Nodes a..b-1, the DequantizeLinears they read and the QuantizeLinear of the last one."""
    sel = list(range(a, b))
    need = {x for i in sel for x in nodes[i].input}
    last = set(nodes[b - 1].output)
    sel += [i for i, n in enumerate(nodes) if (n.op_type == "DequantizeLinear" and n.output[0] in need)
            or (n.op_type == "QuantizeLinear" and n.input[0] in last)]
    return sorted(set(sel))


def run(flags: str, layer: int, build: Path) -> list[dict]:
    import torq
    from torq.graph import extract_segment
    from torq.verify import verify
    qpath = build / f"vit_b_16.{flags}.onnx"
    if not qpath.exists():                           # torchvision_zoo.py's export and quantization, cached alike
        torq.quantize(str(zoo.export("vit_b_16", build)), str(qpath), num_calib=zoo.NUM_CALIB, **zoo.FLAGS[flags])
    q = onnx.load(str(qpath))
    nodes = [n for n in q.graph.node if n.op_type != "Constant"]
    rows = []
    for what, (a, b) in _segments(nodes, layer).items():
        t0 = time.perf_counter()
        c = torq.compile(extract_segment(q, _with_qdq(nodes, a, b)))
        seconds = time.perf_counter() - t0
        r = verify(c, seed=0)
        rows.append({"flags": flags, "segment": what, "ops": sum(c.report.lowered.values()),
                     "unsupported": len(c.report.unsupported),
                     "ort_exact": all(o.exact for o in r.outputs if o.mode == "ort"),
                     "native_max": max(o.max_lsb for o in r.outputs if o.mode == "native"),
                     "unexplained": sum(1 for d in r.op_diffs if not d.explained), "compile_s": seconds})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flags", default=",".join(zoo.FLAGS), help=f"comma-separated of {', '.join(zoo.FLAGS)}")
    ap.add_argument("--layer", type=int, default=0, help="encoder layer 0..11")
    ap.add_argument("--build", type=Path, default=zoo.BUILD, help="cache folder (default build/zoo)")
    a = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"vit_b_16 encoder layer {a.layer}: NSS vs ONNX Runtime")
    for col in ("flags", "segment", "torq_hl ops", "unsupported", "ort bit-exact", "native max |Δ|",
                "unexplained ops", "compile s"):
        t.add_column(col)
    for flags in a.flags.split(","):
        for r in run(flags, a.layer, a.build):
            t.add_row(r["flags"], r["segment"], str(r["ops"]), str(r["unsupported"]), str(r["ort_exact"]),
                      f"{r['native_max']:.3g}", str(r["unexplained"]), f"{r['compile_s']:.1f}")
    Console(width=160).print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
