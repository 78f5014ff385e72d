"""What quantization did, in a few lines: op counts before/after, Q/DQ nodes, graph I/O, file sizes.

Shared by ``torq-gen-config quantize`` and ``python -m torq.demo`` so both print the same thing."""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import onnx
from onnx import helper

from ..graph.io_quant import io_quant_params

_QDQ = ("QuantizeLinear", "DequantizeLinear")


def quant_format_of(model: onnx.ModelProto) -> str:
    """'qoperator' if any QLinear*/QGemm op is present (DQ/Q islands allowed), else 'qdq'."""
    ops = {n.op_type for n in model.graph.node}
    return "qoperator" if any(o.startswith("QLinear") or o == "QGemm" for o in ops) else "qdq"


def _io(v: onnx.ValueInfoProto) -> str:
    tt = v.type.tensor_type
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
    try:
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type).name
    except Exception:
        dtype = str(tt.elem_type)
    return f"{v.name}: {dtype}[{','.join(dims)}]"


def _counts(model: onnx.ModelProto, skip=()) -> str:
    c = Counter(n.op_type for n in model.graph.node if n.op_type not in skip)
    return ", ".join(f"{op} x{k}" for op, k in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def _size(path) -> str:
    if path is None or not Path(path).exists():
        return "-"
    n = os.path.getsize(path)
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MiB"


def summary_lines(fp32: onnx.ModelProto, q: onnx.ModelProto, *, src_path=None, out_path=None,
                  settings: str = "") -> list[str]:
    """Human-readable summary of one quantization (plain text, one fact per line)."""
    qc = Counter(n.op_type for n in q.graph.node)
    params = io_quant_params(q)
    lines = []
    if src_path is not None or out_path is not None:
        lines.append(f"model:    {src_path or '-'} ({_size(src_path)}) -> {out_path or '-'} ({_size(out_path)})")
    lines.append(f"format:   {quant_format_of(q)}" + (f"  ({settings})" if settings else ""))
    lines.append(f"ops fp32: {_counts(fp32)}")
    lines.append(f"ops int8: {_counts(q, skip=_QDQ)}  (besides Q/DQ)")
    lines.append(f"Q/DQ:     QuantizeLinear x{qc.get('QuantizeLinear', 0)}, "
                 f"DequantizeLinear x{qc.get('DequantizeLinear', 0)}")
    if quant_format_of(q) == "qoperator":   # the float islands torq.quantize put between Q/DQ
        from .islands import island_nodes
        wrapped = Counter(n.op_type for n in island_nodes(q))
        if wrapped:
            lines.append(f"in Q/DQ:  {', '.join(f'{op} x{k}' for op, k in wrapped.most_common())}  "
                         "(no QLinear form: each between a DQ and a Q, int8 in and out)")
    for kind, vals in (("inputs", q.graph.input), ("outputs", q.graph.output)):
        inits = {t.name for t in q.graph.initializer}
        for v in vals:
            if v.name in inits:
                continue
            extra = ""
            p = params.get(kind, {}).get(v.name)
            if p:
                extra = f"  scale={p['scale']:.6g} zero_point={p['zero_point']}" \
                    if isinstance(p["scale"], float) else "  (per-axis scale)"
            lines.append(f"{kind[:-1]:<9} {_io(v)}{extra}")
    return lines
