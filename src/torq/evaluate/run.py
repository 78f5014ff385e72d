"""``evaluate``: FP32 (ORT) vs INT8 (ORT) vs INT8 (NSS) on a labelled dataset.

Data flow: dataset SPEC → declared preprocessing → fp32 model (folded, ``quantize.fold``) →
quantized full-integer model calibrated on images that are never evaluated → every evaluation
image through the three paths → top-k, agreement, per-layer SQNR, LSB histogram.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader

from ..errors import TorqError
from . import metrics
from .datasets import Dataset, load_dataset
from .engines import OrtEngine, quantize_input
from .preprocess import Preprocess, parse_preprocess
from .result import EvalResult

@dataclass
class EvalOptions:
    preprocess: Preprocess = field(default_factory=Preprocess)
    batch: int = 8                         # images per NSS call (the model is compiled for it)
    limit: int | None = None               # evaluate only the first N evaluation images
    calibration: str | None = None         # dataset SPEC (labels optional) held apart from evaluation
    calibration_split: int = 0             # or: take N images out of the evaluation dataset
    num_calib: int = 100                   # at most this many calibration images
    per_channel: bool = True
    calibrate_method: str = "minmax"        # best mean INT8 top-1 drop over (a) and (b), README
    # Default: cross-layer equalization then bias correction, both fp32 transforms before quantizing:
    # the best mean INT8 top-1 drop over (a) EfficientNet-Lite0 and (b) model B, never worse than
    # plain on either (README, "Cross-layer equalization").
    equalize: bool | str = True            # quantize.equalize; True = ReLU6 pairs bounded by calibration,
                                           # "skip" = leave them alone
    bias_correction: bool = True           # quantize.bias_correction
    onnx_reference: bool = False           # also run the int8 model as its ONNX definition (ORT, unfused)
    sqnr_images: int = 8                   # images used for the per-layer SQNR
    jobs: int = 1                          # NSS worker processes
    threads: int = 0                       # NSS threads in this process (0 = every usable core)
    rounding: str = "native"               # NSS rescale: "native" (the NPU's ACT) or "ort" (ORT's floats)
    # Default: weight scales moved (<= 5 %) so that ORT's float requantization is exact; the NSS's
    # native rounding is then bit-exact with INT8 (ORT) (README, "Accuracy").
    exact_scales: bool = True              # quantize.exact_scales
    ray: str | bool | None = None          # Ray cluster address, True = a local instance
    progress: bool = True
    # Activation precision per layer (quantize.precision): "int8", "int16" (every layer), a
    # {node: "int16"} dict, or "auto": chosen by measurement on the calibration images within
    # accuracy_budget top-1 points of FP32 on a held-apart third of them (quantize.auto_precision).
    precision: str | dict = "int8"
    accuracy_budget: float = 0.5


class DatasetReader(CalibrationDataReader):
    """Feeds preprocessed images one by one to ORT's calibrator; ``rewind`` starts over."""

    def __init__(self, data: Dataset, prep: Preprocess, shape, input_name: str, count: int):
        self.data, self.prep, self.shape, self.name = data, prep, shape, input_name
        self.count = min(count, len(data))
        self.i = 0

    def get_next(self):
        if self.i >= self.count:
            return None
        self.i += 1
        return {self.name: self.prep.batch([self.data.load(self.i - 1)], self.shape, self.name)}

    def rewind(self):
        self.i = 0


def input_shape(model: onnx.ModelProto) -> tuple[str, tuple]:
    """(input name, per-image shape) of the model's single image input; static dims required."""
    inits = {t.name for t in model.graph.initializer}
    ins = [i for i in model.graph.input if i.name not in inits]
    if len(ins) != 1:
        raise TorqError(f"evaluate needs a model with one image input, this one has {len(ins)}")
    dims = [d.dim_value if d.HasField("dim_value") else 0 for d in ins[0].type.tensor_type.shape.dim]
    if len(dims) != 4 or min(dims[1:]) <= 0:
        raise TorqError(f"model input {ins[0].name!r} must be N×C×H×W or N×H×W×C with static C, H, W; "
                        f"it is {dims}")
    return ins[0].name, tuple(dims[1:])


def split(data: Dataset, opts: EvalOptions) -> tuple[Dataset, Dataset]:
    """(evaluation, calibration) datasets; they never share an image."""
    if opts.calibration and opts.calibration_split:
        raise TorqError("give either --calibration-data or --calibration-split, not both")
    if opts.calibration_split:
        n = opts.calibration_split
        if n >= len(data):
            raise TorqError(f"--calibration-split {n} leaves no evaluation images ({len(data)} in the dataset)")
        perm = np.random.default_rng(0).permutation(len(data))
        evaluation, calib = data.subset(np.sort(perm[n:])), data.subset(np.sort(perm[:n]))
    elif opts.calibration:
        evaluation, calib = data, load_dataset(opts.calibration, labelled=False)
        if calib.name == data.name:
            raise TorqError("the calibration data is the evaluation dataset; calibration images must never "
                            "be evaluated (use --calibration-split N)")
    else:
        raise TorqError("evaluate needs real calibration images: --calibration-data SPEC or "
                        "--calibration-split N")
    if opts.limit:
        evaluation = evaluation.subset(np.arange(min(opts.limit, len(evaluation))))
    return evaluation, calib


def prepare(model_path, data: Dataset, calib: Dataset, opts: EvalOptions):
    """(fp32 model, full-integer int8 model, input name, per-image shape, classes, SQNR reference).

    The SQNR reference is the fp32 model whose tensors line up with the int8 model's: the
    equalized one when ``opts.equalize`` (same outputs, but channels inside equalized pairs are
    rescaled), else the fp32 model itself."""
    from ..graph.load import load_model
    from ..quantize import quantize
    from ..quantize.dead_channels import zero_dead_channels
    from ..quantize.fold import fold_fp32
    fp32 = fold_fp32(load_model(model_path))
    name, shape = input_shape(fp32)
    reader = DatasetReader(calib, opts.preprocess, shape, name, opts.num_calib)
    to_quantize, _ = zero_dead_channels(fp32)    # the FP32 path keeps the model as given
    if opts.equalize:
        from ..quantize.equalize import equalize
        policy = opts.equalize if isinstance(opts.equalize, str) else "bounded"
        to_quantize = equalize(to_quantize, reader, relu6=policy).model
    reference = to_quantize if opts.equalize else fp32
    if opts.bias_correction:
        from ..quantize.bias_correction import correct_bias
        to_quantize = correct_bias(to_quantize, reader, per_channel=opts.per_channel)
    q = _quantize(to_quantize, reader, opts)
    probe = OrtEngine(fp32)(opts.preprocess.batch([data.load(0)], shape, name))
    classes = int(np.prod(probe.shape[1:]))
    data.check_classes(classes)
    return fp32, q, name, shape, classes, reference


def _quantize(to_quantize, reader, opts: EvalOptions):
    """The full-integer model of ``to_quantize`` at ``opts.precision`` (exact scales after);
    "auto" chooses the int16 layers first (``quantize.auto_precision``) and stamps its report
    on the model (``precision.stamp``)."""
    from ..quantize import quantize
    from ..quantize.precision import stamp

    def make(precision, reader, full_integer=True):
        q = quantize(to_quantize, calibration_data_reader=reader, per_channel=opts.per_channel,
                     full_integer=full_integer, calibrate_method=opts.calibrate_method,
                     quant_dtype="A16W8" if precision == "int16" else "A8W8",
                     precision=precision if isinstance(precision, dict) else None)
        if opts.exact_scales:
            from ..quantize.exact_scales import exact_scales
            q = exact_scales(q, to_quantize)
        return q
    if opts.precision != "auto":
        return make(opts.precision, reader)
    from ..quantize.auto_precision import choose, split_holdout
    from ..quantize.calibration import ArrayDataReader
    from ..quantize.sensitivity import samples_of
    calib, hold = split_holdout(samples_of(reader))
    chosen = choose(to_quantize, lambda p: make(p, ArrayDataReader(calib), False), calib, hold,
                    opts.accuracy_budget)
    return stamp(make(chosen.precision, ArrayDataReader(calib)), chosen.to_json())


def batches(data: Dataset, opts: EvalOptions, name: str, shape):
    """(start, float batch) over the evaluation images, ``opts.batch`` at a time."""
    for start in range(0, len(data), opts.batch):
        stop = min(start + opts.batch, len(data))
        yield start, opts.preprocess.batch([data.load(i) for i in range(start, stop)], shape, name)


def evaluate(model, dataset, *, preprocess: str | Preprocess | None = None, options: EvalOptions | None = None,
             **overrides) -> EvalResult:
    """Evaluate ``model`` (fp32 ONNX path) on ``dataset`` (SPEC or Dataset); see EvalOptions."""
    from dataclasses import replace

    from ..graph.io_quant import io_quant_params
    opts = replace(options or EvalOptions(), **overrides)
    if preprocess is not None:
        opts = replace(opts, preprocess=parse_preprocess(preprocess) if isinstance(preprocess, str) else preprocess)
    if opts.batch < 1:
        raise TorqError(f"--batch {opts.batch} must be at least 1")
    data = dataset if isinstance(dataset, Dataset) else load_dataset(dataset)
    data, calib = split(data, opts)
    fp32, q, name, shape, classes, reference = prepare(model, data, calib, opts)
    qin = io_quant_params(q)["inputs"][name]
    result = EvalResult.start(model, data, opts, classes, len(calib))
    from ..quantize.sensitivity import precision_summary
    result.precision = precision_summary(fp32, q)
    _run_ort_paths(result, data, opts, (fp32, reference), q, name, shape, qin)
    _run_nss_path(result, data, opts, q, name, shape, qin)
    result.finish()
    return result


def _run_ort_paths(result, data, opts, fp32_models, q, name, shape, qin) -> None:
    fp32, reference = fp32_models
    engines = {"fp32": OrtEngine(fp32), "int8_ort": OrtEngine(q)}
    if opts.onnx_reference:
        engines["int8_onnx"] = OrtEngine(q, fused=False)
    sqnr = metrics.LayerSqnr(reference, q) if opts.sqnr_images else None
    with result.progress("FP32 + INT8 (ORT)", len(data), opts.progress) as advance:
        for start, x in batches(data, opts, name, shape):
            xq = quantize_input(x, qin["scale"], qin["zero_point"], qin.get("dtype", "int8"))
            for path, engine in engines.items():
                t0 = time.perf_counter()
                out = engine(x if path == "fp32" else xq)
                result.seconds[path] += time.perf_counter() - t0
                result.record(path, start, out)
            if sqnr is not None and start < opts.sqnr_images:
                sqnr.add(x[:opts.sqnr_images - start], xq[:opts.sqnr_images - start])
            advance(len(x))
    result.sqnr = sqnr.result() if sqnr is not None else []


def _run_nss_path(result, data, opts, q, name, shape, qin) -> None:
    from .parallel import nss_outputs

    feeding = [0.0]                        # preprocessing time, not the simulator's

    def inputs():
        it = batches(data, opts, name, shape)
        while True:
            t0 = time.perf_counter()
            item = next(it, None)
            if item is None:
                return
            start, x = item
            xq = quantize_input(x, qin["scale"], qin["zero_point"], qin.get("dtype", "int8"))
            feeding[0] += time.perf_counter() - t0
            yield start, xq

    with result.progress("INT8 (NSS)", len(data), opts.progress) as advance:
        stream = nss_outputs(q, opts, inputs())
        t0 = time.perf_counter()
        for start, out in stream:
            result.record("int8_nss", start, out)
            advance(len(out))
        result.seconds["int8_nss"] = time.perf_counter() - t0 - feeding[0]
