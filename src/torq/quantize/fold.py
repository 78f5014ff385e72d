"""fp32 graph clean-up before quantization: ONNX Runtime's *basic* (semantics-preserving) rewrites.

Exporters leave computed padding (TF "same": Shape → ConstantOfShape → Concat → Slice → Cast →
Pad), BatchNormalization, Identity and constant sub-graphs in the fp32 graph. Quantized as is,
each Pad gets a Q/DQ of its own and a quantized scalar pad value that the NPU lowering cannot
take. ORT's level-1 optimizer folds constants and fuses Pad/BatchNorm into the following Conv:
the result computes the same function (to fp32 rounding), so accuracy is unchanged and every
Conv quantizes with its padding in place. The input's batch dim stays as declared.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import onnx

from ..errors import TorqError, one_line


def fold_fp32(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` after ORT's basic graph optimizations (constant folding, Pad/BN fusion)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="torq-fold-") as tmp:
        out = Path(tmp) / "folded.onnx"
        so.optimized_model_filepath = str(out)
        try:
            ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - ORT raises its own types
            raise TorqError(f"ONNX Runtime cannot load the fp32 model: {one_line(e)}") from None
        folded = onnx.load(str(out))
    del folded.graph.value_info[:]       # re-inferred by the quantizer's pre-processing
    return folded
