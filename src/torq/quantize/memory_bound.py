"""How much memory calibration or a batch will take, known from the declared shapes *before*
anything is allocated: a 645-byte model declaring a 1x3x8192x8192 input must be a one-line
refusal, not 12 GiB of resident memory.

ONNX Runtime's histogram calibrators (entropy, percentile) keep every tensor of every
calibration sample until they compute the ranges, so there a sample costs the sum of the model's
tensor sizes (inputs and every intermediate value ONNX shape inference can type; a dynamic dim
counts as 1). MinMax keeps only each tensor's min and max per sample (its augmented graph reduces
them), and our own calibrated passes (CLE, bias correction, GPTQ) keep running sums: there the
samples' inputs are kept and the intermediates of one inference at a time are live (DenseNet-121:
168.6 MiB of tensors a sample, 100 samples refused as 16.5 GiB though they need ~0.2 GiB).
``--precision auto``'s sensitivity pass is of the second kind: it streams the samples in chunks
(``samples_at_once``: as many as fit beside the inputs, at least one) with running sums.
"""
from __future__ import annotations

import math

import onnx

from ..errors import TorqError

FRACTION = 0.6                  # of the memory available now
CHUNK_BYTES = 1 << 30           # a streaming pass's tensors at once: more batching buys little speed
_BYTES = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.DOUBLE: 8, onnx.TensorProto.FLOAT16: 2,
          onnx.TensorProto.BFLOAT16: 2, onnx.TensorProto.INT8: 1, onnx.TensorProto.UINT8: 1,
          onnx.TensorProto.INT16: 2, onnx.TensorProto.INT32: 4, onnx.TensorProto.INT64: 8,
          onnx.TensorProto.BOOL: 1}


def available_bytes() -> int:
    """MemAvailable (Linux), else a generous 8 GiB."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 8 << 30


def _value_bytes(v: onnx.ValueInfoProto) -> int:
    t = v.type.tensor_type
    if not t.HasField("shape"):
        return 0
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in t.shape.dim]
    return math.prod(dims) * _BYTES.get(t.elem_type, 4)


def sample_bytes(model: onnx.ModelProto) -> tuple[int, int]:
    """(bytes of the graph inputs, bytes of every typed tensor) of one sample. Where ONNX's shape
    inference leaves a tensor's size open (a Pad whose pads are computed: an unfolded
    EfficientNet-Lite0 typed 0.75 MiB of its 69), ORT's symbolic inference, which follows shape
    arithmetic, counts it, and the larger count holds."""
    inits = {t.name for t in model.graph.initializer}
    inputs = sum(_value_bytes(v) for v in model.graph.input if v.name not in inits)
    counts = [_tensor_bytes(model, onnx.shape_inference.infer_shapes, strict_mode=False)]
    if counts[0][1]:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
        counts.append(_tensor_bytes(model, SymbolicShapeInference.infer_shapes, auto_merge=True))
    return inputs, inputs + max(n for n, _ in counts)


def _tensor_bytes(model: onnx.ModelProto, infer, **kw) -> tuple[int, bool]:
    """(bytes of the tensors ``infer`` types, whether a node output's size stays open)."""
    try:
        inferred = infer(model, **kw)
    except Exception:  # noqa: BLE001 - a model shape inference cannot type: inputs only
        return 0, True
    values = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output]}
    open_ = any(o not in values or not _sized(values[o]) for n in inferred.graph.node for o in n.output if o)
    return sum(_value_bytes(v) for v in values.values()), open_


def _sized(v: onnx.ValueInfoProto) -> bool:
    t = v.type.tensor_type
    return t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim[1:])


def check(model: onnx.ModelProto, samples: int, what: str, flag: str, *, keeps_tensors: bool = True) -> None:
    """A TorqError when ``samples`` samples would not fit in ``FRACTION`` of the free memory.

    ``keeps_tensors``: every tensor of every sample is held at once (a histogram calibrator, a
    batch); else only the samples' inputs plus one sample's intermediates (MinMax calibration, a
    streaming pass: ``samples_at_once``)."""
    inputs, per_sample = sample_bytes(model)
    budget = int(available_bytes() * FRACTION)
    held, once = (per_sample, 0) if keeps_tensors else (inputs, per_sample - inputs)
    need = samples * held + once
    if need <= budget:
        return
    fits = (budget - once) // held if held and budget > once else 0
    advice = f"use {flag} {fits} or fewer" if fits >= 1 else "the model's declared input is too large for this machine"
    held_text = (f"of {_gib(per_sample)} each (inputs {_gib(inputs)}, plus every intermediate tensor)"
                 if keeps_tensors else f"of {_gib(inputs)} each, plus {_gib(once)} of one inference's tensors,")
    raise TorqError(f"{what}: {samples} sample(s) {held_text} need {_gib(need)}, more than the "
                    f"{_gib(budget)} this machine can spare; {advice}")


def samples_at_once(model: onnx.ModelProto, samples: int) -> int:
    """How many of ``samples`` a streaming pass (``--precision auto``'s sensitivity) may run at
    once: the samples whose tensors fit in ``FRACTION`` of the free memory beside every sample's
    inputs, and in ``CHUNK_BYTES``; at least 1 (``check`` refuses what one does not fit)."""
    inputs, per_sample = sample_bytes(model)
    room = min(int(available_bytes() * FRACTION) - samples * inputs, CHUNK_BYTES)
    return max(1, min(samples, room // max(per_sample, 1)))


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
