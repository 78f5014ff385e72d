"""ONNX Runtime as the reference: the same quantized ONNX, on the CPU EP, with int8 QDQ fused
(int16 QDQ runs in float32 as the graph defines it: see ``session``).

On x86, ORT leaves QDQ convs/matmuls with int8 activations in fp32 unless
`session.qdqisint8allowed=1` (research numerics-proto §0); with it, every quantized op runs in
ORT's integer kernels, which our `ort` rounding mode reproduces bit for bit.
May import: torq.errors, torq.numerics, and ONNX Runtime.
"""
from __future__ import annotations

import numpy as np
import onnx

from .errors import TorqError, one_line


def session(model: onnx.ModelProto, threads: int = 0, optimized_model_path: str | None = None,
            fused: bool = True):
    """An ORT CPU session. ``fused=False`` runs the model as its ONNX definition instead: graph
    optimisations off, so every QDQ op executes as DequantizeLinear → float op → QuantizeLinear.
    A model whose QDQ bias scale is not input_scale·weight_scale always runs unfused: ORT's fused
    integer kernels add that bias as if it were (the lecture's trap), which is not the model."""
    import onnxruntime as ort
    fused = fused and bias_scale_mismatch(model) is None
    so = ort.SessionOptions()
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if fused
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    if fused:
        so.add_session_config_entry("session.qdqisint8allowed", "1")
        # A DequantizeLinear of int8 weights feeding a MatMul whose activation stays float (int16
        # activations, numerics.int16) is fused into MatMulNBits, which by default (accuracy
        # level 4) quantizes the activation to int8 on the fly: up to ~1e-3 relative off the
        # model's definition (12 int16 LSB measured on a 2x2 layer). Level 1 computes in float32.
        so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    so.log_severity_level = 4
    if threads:
        so.intra_op_num_threads = threads
    if optimized_model_path:
        so.optimized_model_filepath = str(optimized_model_path)
    try:
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - ORT raises its own types
        raise TorqError(f"ONNX Runtime cannot load the model: {one_line(e)}") from None


def kernels(model: onnx.ModelProto) -> dict[str, int]:
    """Op types ORT actually runs after its graph optimisations (from the saved optimized model)."""
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "optimized.onnx"
        session(model, optimized_model_path=path)
        counts: dict[str, int] = {}
        for n in onnx.load(path, load_external_data=False).graph.node:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


def bias_scale_mismatch(model: onnx.ModelProto) -> str | None:
    """Name of the first Conv / Gemm whose dequantized bias scale is not ``fl32(x_scale·w_scale)``
    (per channel), or None."""
    from onnx import numpy_helper

    from . import numerics
    inits = {t.name: t for t in model.graph.initializer}
    dq = {n.output[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear" and len(n.input) > 1}

    def scale(name):
        n = dq.get(name)
        if n is None or n.input[1] not in inits:
            return None
        return np.asarray(numpy_helper.to_array(inits[n.input[1]]), np.float32).reshape(-1)

    for n in model.graph.node:
        if n.op_type not in ("Conv", "Gemm") or len(n.input) < 3 or not n.input[2]:
            continue
        sx, sw, sb = scale(n.input[0]), scale(n.input[1]), scale(n.input[2])
        if sx is None or sw is None or sb is None or sx.size != 1:
            continue
        if not np.allclose(sb, numerics.dq_scale(sx[0], sw), rtol=1e-6, atol=0):
            return n.name or n.output[0]
    return None


FLOAT_COMPUTE = ("Conv", "MatMul", "Gemm", "AveragePool", "GlobalAveragePool")


def run(model: onnx.ModelProto, inputs: dict[str, np.ndarray], sess=None) -> dict[str, np.ndarray]:
    sess = sess or session(model)
    names = [o.name for o in sess.get_outputs()]
    try:
        return dict(zip(names, sess.run(names, inputs)))
    except Exception as e:  # noqa: BLE001 - ORT refuses the model's values at run time
        raise TorqError(f"ONNX Runtime cannot run the model: {one_line(e)}") from None
