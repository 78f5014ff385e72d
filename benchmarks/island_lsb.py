"""How far a bf16 island's int8 result is from ONNX Runtime's, per rounding mode: the measurement
behind ``numerics.BF16_ISLAND_TOL``.

    python benchmarks/island_lsb.py [--seeds 20] [--models a.onnx,b.onnx [--no-builtin]] [--formats qdq,qdq-pc,qoperator]

Built models (seeded weights): a CNN with a Softmax head over 2, 10 and 1000 classes, and a CNN
with a channel LayerNorm; ``--models``: fp32 exports (e.g. PP-OCR cls), quantized the same way.
Each is quantized by ``torq.quantize`` (synthetic calibration), compiled, and verified on
``--seeds`` random inputs; the island's result is measured from ORT's own int8 inputs
(``verify``), so upstream native rounding does not count. Prints, per model and format, the
largest island difference in LSB and the share of differing elements, per mode, with the load.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FORMATS = {"qdq": {}, "qdq-pc": {"per_channel": True}, "qoperator": {"quant_format": "qoperator"}}


def _init(rng, name, shape, scale):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def softmax_head(classes: int, seed: int = 0) -> onnx.ModelProto:
    """x[1,3,16,16] -> Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm(classes) -> Softmax."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["logits"], transB=1),
             helper.make_node("Softmax", ["logits"], ["y"], axis=-1)]
    inits = [_init(rng, "w", (16, 3, 3, 3), 0.4), _init(rng, "b", (16,), 0.1),
             _init(rng, "fw", (classes, 16), 1.5), _init(rng, "fb", (classes,), 0.3)]
    return _model(nodes, [1, 3, 16, 16], inits)


def layernorm_cnn(seed: int = 0) -> onnx.ModelProto:
    """Conv -> Transpose -> LayerNorm over channels -> Transpose -> Conv (ConvNeXt's pattern)."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1] * 4),
             helper.make_node("Transpose", ["c0"], ["t0"], perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["t0", "s", "t"], ["ln"], axis=-1),
             helper.make_node("Transpose", ["ln"], ["t1"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["t1", "w1", "b1"], ["y"])]
    inits = [_init(rng, "w0", (16, 3, 3, 3), 0.4), _init(rng, "b0", (16,), 0.1),
             numpy_helper.from_array((1 + 0.2 * rng.standard_normal(16)).astype(np.float32), "s"),
             _init(rng, "t", (16,), 0.1), _init(rng, "w1", (8, 16, 1, 1), 0.3), _init(rng, "b1", (8,), 0.1)]
    return _model(nodes, [1, 3, 8, 8], inits)


def _model(nodes, shape, inits) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def measure(fp32, fmt: str, seeds: int) -> dict:
    import torq
    from torq.gen_config.compare import dq_output_scales
    from torq.verify import verify
    q = torq.quantize(fp32, num_calib=4, **FORMATS[fmt])
    lsb = dq_output_scales(q)           # float outputs of a DequantizeLinear: |Δ| in its LSB
    c = torq.compile(q)
    row = {"islands": c.report.islands_line() or "none", "unsupported": len([u for u in c.report.unsupported
                                                                           if not u.consequence])}
    for mode in ("native", "ort"):
        row[mode] = [0, 0, 0]                      # max LSB, differing, elements
    row["int8_exact"], row["out"], row["ok"] = True, {}, True
    for seed in range(seeds):
        res = verify(c, seed=seed)
        for d in res.islands:
            r = row[d.mode]
            r[0], r[1], r[2] = max(r[0], d.max_lsb), r[1] + d.differ, r[2] + d.size
        row["int8_exact"] &= all(o.exact for o in res.handed_on if o.mode == "ort")
        row["ok"] &= res.ok
        for o in res.outputs:           # the whole model's outputs against ORT (free run)
            d, row["unit"] = (o.max_lsb / lsb[o.name], "LSB") if o.name in lsb else (o.max_lsb, o.unit)
            row["out"][o.mode] = max(row["out"].get(o.mode, 0.0), d)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--models", default="", help="comma-separated fp32 ONNX files to add")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--no-builtin", action="store_true", help="only the --models files")
    args = ap.parse_args()
    models = {} if args.no_builtin else {f"softmax{k}": softmax_head(k) for k in (2, 10, 1000)}
    if not args.no_builtin:
        models["layernorm"] = layernorm_cnn()
    for p in filter(None, args.models.split(",")):
        models[Path(p).stem] = onnx.load(p)
    print(f"load before: {os.getloadavg()[0]:.2f}; {args.seeds} seeds per row")
    print("| model | format | islands | native max LSB (differing) | ort max LSB (differing) | int8 ops bit-exact (ort) "
          "| output max |Δ| native / ort | verify | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, m in models.items():
        for fmt in args.formats.split(","):
            t0 = time.perf_counter()
            r = measure(m, fmt, args.seeds)
            cell = {k: f"{r[k][0]} ({r[k][1]}/{r[k][2]})" for k in ("native", "ort")}
            print(f"| {name} | {fmt} | {r['islands']}" + (f", {r['unsupported']} refused" if r["unsupported"] else "")
                  + f" | {cell['native']} | {cell['ort']} | {r['int8_exact']} | {r['out'].get('native', 0):.3g} / "
                  f"{r['out'].get('ort', 0):.3g} {r.get('unit', '')} | {'PASS' if r['ok'] else 'FAIL'} | "
                  f"{time.perf_counter() - t0:.0f} |",
                  flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
