"""The three ways one batch of images is classified: FP32 (ORT), INT8 (ORT), INT8 (NSS).

All three see the same images: FP32 gets the float batch, both INT8 paths get that batch
quantized with the full-integer model's input scale/zero point (exactly what its removed
QuantizeLinear computed) and return int8 logits. The NSS runs a model compiled for a fixed
sub-batch (``with_batch``; a batch of B images runs as sub-batches side by side on every core);
a short sub-batch is padded with zeros and the padding dropped, so every image's result is
independent of the batch it travels in.
"""
from __future__ import annotations

import numpy as np
import onnx

from ..errors import TorqError


def with_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """A copy whose graph inputs/outputs have a fixed first dim ``batch`` (shapes re-inferred)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {t.name for t in m.graph.initializer}
    for v in [i for i in m.graph.input if i.name not in inits] + list(m.graph.output):
        dims = v.type.tensor_type.shape.dim
        if dims:
            dims[0].Clear()
            dims[0].dim_value = batch
    del m.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(m)


def fixed_batch(model: onnx.ModelProto) -> int | None:
    """The first input's batch dim when the model fixes it (e.g. 1), else None (symbolic)."""
    inits = {t.name for t in model.graph.initializer}
    ins = [i for i in model.graph.input if i.name not in inits]
    dims = ins[0].type.tensor_type.shape.dim if ins else []
    return dims[0].dim_value if dims and dims[0].HasField("dim_value") and dims[0].dim_value > 0 else None


def in_chunks(run, x: np.ndarray, n: int) -> np.ndarray:
    """``run`` on ``x`` in chunks of exactly ``n`` images (the last one padded with zeros, whose
    results are dropped): how a model with a fixed batch sees any number of images."""
    outs = []
    for start in range(0, len(x), n):
        chunk = x[start:start + n]
        k = len(chunk)
        if k < n:
            chunk = np.concatenate([chunk, np.zeros((n - k, *chunk.shape[1:]), chunk.dtype)])
        outs.append(run(chunk)[:k])
    return np.concatenate(outs)


def quantize_input(x: np.ndarray, scale: float, zero_point: int, dtype: str = "int8") -> np.ndarray:
    """ONNX QuantizeLinear to int8 (or the input's integer ``dtype``, e.g. int16 for A16W8),
    ORT's recipe (``numerics.quantize_ort``)."""
    from ..numerics import quantize_ort
    info = np.iinfo(np.dtype(dtype))
    return quantize_ort(x, np.float32(scale), int(zero_point), info.min, info.max).astype(dtype)


class OrtEngine:
    """ONNX Runtime on one model (fp32 or the int8 QDQ model with integer kernels). With
    ``fused=False`` the int8 model runs as its ONNX definition (DequantizeLinear → float op →
    QuantizeLinear per op): a second, equally valid INT8 execution, used to measure how often two
    correct int8 executions of the same model disagree on top-1."""

    def __init__(self, model: onnx.ModelProto, threads: int = 0, fused: bool = True):
        from .. import reference
        self.sess = reference.session(model, threads=threads, fused=fused)
        self.input = self.sess.get_inputs()[0].name
        self.batch = fixed_batch(model)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.batch is not None and len(x) != self.batch:
            return in_chunks(self.__call__, x, self.batch)
        return self.sess.run(None, {self.input: x})[0]


MAX_SUB_BATCH = 8    # images per simulator call: bounds each thread's scratch memory (an early
                     # EfficientNet layer needs ~5 MB per image) at no cost in speed (measured,
                     # 2 threads, quiet host: batch 32 as 4 x 8 106, as 2 x 16 109 images/s;
                     # batch 16 as 2 x 8 109, as 4 x 4 105)


def split_batch(batch: int, threads: int) -> tuple[int, int]:
    """(threads, images per sub-batch) for running ``batch`` images on up to ``threads``
    threads: as many sub-batches as threads (a multiple of them when a sub-batch would exceed
    MAX_SUB_BATCH), as equal as possible so that little padding is computed."""
    threads = max(1, min(batch, threads))
    per_thread = -(-batch // threads)
    sub = -(-batch // (threads * -(-per_thread // MAX_SUB_BATCH)))
    return min(threads, -(-batch // sub)), sub


class NssEngine:
    """The NSS simulator on the int8 model, ``batch`` images per call.

    The call runs as sub-batches side by side on ``threads`` threads (``Simulator.run_many``;
    default every core this process may use; ``split_batch``), so the model is compiled for the
    sub-batch size; a short sub-batch is padded with zeros like a short batch. A call that is one
    sub-batch (batch 1) gets every core inside its kernels instead."""

    def __init__(self, qmodel: onnx.ModelProto, batch: int, rounding: str = "native",
                 threads: int | None = None, engine: str | None = None):
        from ..compiled import compile as torq_compile
        from ..runtime.nss import Simulator, usable_cores
        self.batch, self.rounding = batch, rounding
        self.cores = threads or usable_cores()
        self.threads, self.sub = split_batch(batch, self.cores)
        fixed = fixed_batch(qmodel)
        if fixed is not None:            # the model's own batch: compiled as it is
            self.sub, self.threads = fixed, max(1, min(self.threads, -(-batch // fixed)))
        self.compiled = torq_compile(with_batch(qmodel, self.sub), name="evaluate")
        if self.compiled.report.unsupported:
            raise TorqError(str(self.compiled.report.unsupported[0]))
        self.simulator = Simulator(self.compiled.program, engine)
        self.input = self.compiled.input_names[0]
        self.output = self.compiled.output_names[0]
        self._warm_up()

    def _warm_up(self) -> None:
        """Zero sub-batches, run as the calls will run (side by side on the engine's threads):
        the simulator's compiled loops are built, and each thread's native run recorded
        (``runtime.native.plan``), now rather than during timing."""
        port = self.compiled.program.inputs[0]
        feed = self.compiled.program.feed({self.input: np.zeros(port.shape, port.onnx_dtype)})
        self.simulator.run(feed, self.rounding, threads=self.cores)
        if self.threads > 1:
            self.simulator.run_many([feed] * self.threads, self.rounding, self.threads)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        program = self.compiled.program
        calls, sizes = [], []
        for start in range(0, len(x), self.sub):
            chunk = x[start:start + self.sub]
            n = len(chunk)
            if n < self.sub:
                chunk = np.concatenate([chunk, np.zeros((self.sub - n, *chunk.shape[1:]), chunk.dtype)])
            calls.append(program.feed({self.input: chunk}))
            sizes.append(n)
        # one call alone gets every core inside its kernels; several run side by side
        outs = self.simulator.run_many(calls, self.rounding, self.cores if len(calls) == 1 else self.threads)
        return np.concatenate([program.fetch(out)[self.output][:n] for out, n in zip(outs, sizes)])
