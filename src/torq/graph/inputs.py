"""What a model takes: each graph input's name, shape and dtype, and seeded random feeds for it."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ..errors import TorqError


def input_specs(model: onnx.ModelProto) -> list[tuple[str, list[int | None], np.dtype]]:
    """(name, shape with None for dynamic dims, numpy dtype) of each real graph input."""
    inits = {t.name for t in model.graph.initializer}
    specs = []
    for v in model.graph.input:
        if v.name in inits:
            continue
        tt = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                for d in tt.shape.dim]
        specs.append((v.name, dims, np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))))
    return specs


def random_inputs(model: onnx.ModelProto, seed: int = 0, float_range: float = 1.0) -> dict[str, np.ndarray]:
    """One seeded feed per graph input (dynamic dims 1): integers over their full range, booleans,
    floats uniform in [-float_range, float_range). ``verify`` uses 1 (the scale of normalised
    images); per-layer tests use 40, as the reference tool does, to reach every quantized level."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, dims, dt in input_specs(model):
        shape = [d or 1 for d in dims]
        if np.issubdtype(dt, np.integer):
            info = np.iinfo(dt)
            out[name] = rng.integers(info.min, int(info.max) + 1, shape, dtype=np.int64).astype(dt)
        elif dt == bool:
            out[name] = rng.integers(0, 2, shape).astype(bool)
        elif np.issubdtype(dt, np.floating):
            out[name] = rng.uniform(-float_range, float_range, shape).astype(dt)
        else:
            raise TorqError(f"input {name!r} has unsupported type {dt}")
    return out
