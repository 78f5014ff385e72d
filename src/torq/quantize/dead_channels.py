"""Zero the weights of "dead" output channels before per-channel quantization (fp32 transform).

BatchNorm folding leaves channels whose weights are numerical dust (EfficientNet-Lite0: max|w|
≈ 1e-8 next to 0.1–20 in the same layer, with a bias of about −1). Per-channel quantization
stretches that dust to ±127, so the channel's scale becomes ~1e-10 and its int32 bias
(bias / (input scale × weight scale)) saturates at 2^31 − 1: the bias is then wrong, and the
NPU lowering rightly refuses the layer (accumulator bound > int32). A channel whose largest
weight is below ``RELATIVE`` × the layer's largest weight contributes less than per-tensor
int8 rounding would keep (that rounds everything below 0.5/127 ≈ 4e-3 of it to 0), so we make it exactly 0: the channel outputs
its bias, the quantizer gives it scale 1.0 and an ordinary int32 bias.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

RELATIVE = 1e-4


def zero_dead_channels(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """(copy of ``model`` with dead Conv output channels zeroed, number of channels zeroed)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in out.graph.initializer}
    uses: dict[str, int] = {}
    for n in out.graph.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    zeroed = 0
    for n in out.graph.node:
        if n.op_type != "Conv" or len(n.input) < 2 or n.input[1] not in inits or uses[n.input[1]] != 1:
            continue
        w = numpy_helper.to_array(inits[n.input[1]])
        peak = np.abs(w).reshape(len(w), -1).max(axis=1)
        dead = (peak > 0) & (peak < RELATIVE * peak.max())
        if dead.any():
            w = w.copy()
            w[dead] = 0
            inits[n.input[1]].CopyFrom(numpy_helper.from_array(w, n.input[1]))
            zeroed += int(dead.sum())
    return out, zeroed
