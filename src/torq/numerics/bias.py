"""A bias in the accumulator's scale: the lecture's trap (seed 002).

The integer datapath adds the bias to the accumulator ``Σ q_W·q_X`` (scale ``S_W·S_X``) before
the rescale, so the bias must be an integer in that scale. ONNX Runtime's quantizer always
writes ``S_b = S_W·S_X`` (zero point 0); a hand-made or other-tool model may not (an int8 bias
at ``|b|/127``, an int32 bias at ``2·S_W·S_X``). Adding such a ``q_b`` as if its scale were
``S_W·S_X`` is wrong by the factor ``S_b / (S_W·S_X)`` -- the lecture's "exam trap".

The bias is moved into the accumulator scale exactly, ``(q_b - Z_b)·S_b / (S_W·S_X)``, when that
is an integer for every channel, up to the float32 rounding of the three scales (relative
``2^-20``: a float32 scale carries ``2^-24``, a ratio of products a few of those). Otherwise there
is no integer that represents it, and the layer is refused with the reason -- never compiled as
if the scales were equal.
"""
from __future__ import annotations

import numpy as np

__all__ = ["BIAS_SCALE_RTOL", "bias_to_accumulator"]

#: relative tolerance of "integer up to the float32 rounding of the scales"
BIAS_SCALE_RTOL = 2.0 ** -20


def bias_to_accumulator(q_b, zp_b, s_b, s_acc) -> np.ndarray:
    """``(q_b - zp_b)·s_b/s_acc`` as int64 per output channel (``s_b``, ``zp_b`` and ``s_acc``
    scalar or per channel); raises ``ValueError`` naming the first channel that is not an
    integer in the accumulator scale."""
    q = np.asarray(q_b, np.float64).reshape(-1) - np.asarray(zp_b, np.float64).reshape(-1)
    ratio = np.asarray(s_b, np.float32).astype(np.float64).reshape(-1) / \
        np.asarray(s_acc, np.float32).astype(np.float64).reshape(-1)
    q, ratio = np.broadcast_arrays(q, ratio)
    r = q * ratio
    n = np.rint(r)
    bad = np.flatnonzero(np.abs(r - n) > BIAS_SCALE_RTOL * np.maximum(1.0, np.abs(r)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"bias scale is {ratio[i]:.6g} x input_scale·weight_scale, so the bias is not an integer "
                         f"in the accumulator scale (output channel {i}: {q[i]:g} x {ratio[i]:.6g} = {r[i]:.6g}); "
                         "quantize the bias with scale input_scale·weight_scale")
    return n.astype(np.int64)
