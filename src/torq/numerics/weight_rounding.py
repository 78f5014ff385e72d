"""Int8 weight rounding that minimises a layer's output error, not each weight's own error.

Rounding every weight to its nearest integer minimises ``|w − q·s|`` weight by weight; what the
network sees is the layer's output ``x·w``, whose error for input samples ``x`` is
``e·H·eᵀ`` with ``e = w − q·s`` and ``H = E[xᵀx]`` (the input's second moments). Optimal Brain
Quantization in its GPTQ form (Frantar et al., 2022, arXiv:2210.17323) rounds one input
coordinate at a time and lets the coordinates not yet rounded absorb that error through ``H⁻¹``
(its upper Cholesky factor), so correlated inputs cancel each other's rounding errors.

Scales stay as given (``q`` in [−qmax, qmax], zero point 0): only which integer each weight takes
changes, so every scale contract (exact requant scales, the NPU's multipliers) is untouched.
Each row keeps whichever of the two roundings has the smaller ``e·H·eᵀ``: never worse than
nearest rounding on the data ``H`` came from. Layers with more than ``MAX_INPUTS`` inputs are
rounded in chunks of inputs, each against its diagonal block of ``H`` (H⁻¹ costs k³; EfficientNet-Lite's
widest layer has exactly 1280).
"""
from __future__ import annotations

import numpy as np

__all__ = ["gptq_round", "output_error"]

MAX_INPUTS = 1280    # wider layers are rounded in chunks of inputs, each with its own block of H
BLOCK = 128          # columns rounded between two matmul updates of the rest
DAMP = 0.01          # of the mean diagonal added to H: keeps H⁻¹ well conditioned (GPTQ's default)


def output_error(w: np.ndarray, q: np.ndarray, scale: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Per-row ``e·H·eᵀ`` of ``e = w − q·scale``: (G, R, K), (G, R, K), (G, R), (G, K, K) -> (G, R)."""
    e = w - q * scale[..., None]
    return np.sum((e @ h) * e, axis=-1)


def gptq_round(w: np.ndarray, scale: np.ndarray, h: np.ndarray, qmax: int = 127) -> np.ndarray:
    """Integer weights (float64 holding integers in [−qmax, qmax]) for ``G`` independent groups of
    ``R`` rows × ``K`` inputs: ``w`` (G, R, K) float, ``scale`` (G, R) > 0, ``h`` (G, K, K) the
    inputs' second moments of each group. Module docstring."""
    w = np.asarray(w, np.float64)
    scale = np.asarray(scale, np.float64)
    g, r, k = w.shape
    if k > MAX_INPUTS:          # H⁻¹ costs k³: a ResNet's 512×3×3 inputs (k = 4608) in four chunks
        parts = np.array_split(np.arange(k), -(-k // MAX_INPUTS))
        return np.concatenate([gptq_round(w[..., p], scale, np.asarray(h)[:, p[:, None], p], qmax)
                               for p in parts], axis=-1)
    h = np.array(h, np.float64)
    nearest = np.clip(np.rint(w / scale[..., None]), -qmax, qmax)
    diag = np.einsum("gkk->gk", h)
    dead = diag <= 0                                      # an input that is always 0: any weight will do
    idx = np.arange(k)
    h[:, idx, idx] += DAMP * np.maximum(diag.mean(axis=1, keepdims=True), 1e-30) + dead
    try:
        upper = np.swapaxes(np.linalg.cholesky(np.linalg.inv(h)), 1, 2)   # H⁻¹ = Uᵀ·U
    except np.linalg.LinAlgError:
        return nearest
    work = w.copy()
    q = np.empty_like(w)
    for b0 in range(0, k, BLOCK):               # GPTQ's lazy batch: rank-1 updates inside a block,
        b1 = min(b0 + BLOCK, k)                 # one matmul to the columns after it
        block = work[..., b0:b1].copy()
        errs = np.empty_like(block)
        for i in range(b1 - b0):
            c = b0 + i
            q[..., c] = np.clip(np.rint(block[..., i] / scale), -qmax, qmax)
            errs[..., i] = (block[..., i] - q[..., c] * scale) / upper[:, c, c][:, None]
            block[..., i + 1:] -= errs[..., i, None] * upper[:, None, c, c + 1:b1]
        work[..., b1:] -= errs @ upper[:, b0:b1, b1:]
    h_true = np.array(h)
    h_true[:, idx, idx] -= DAMP * np.maximum(diag.mean(axis=1, keepdims=True), 1e-30) + dead
    better = output_error(w, q, scale, h_true) < output_error(w, nearest, scale, h_true)
    return np.where(better[..., None], q, nearest)
