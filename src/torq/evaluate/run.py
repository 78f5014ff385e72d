"""``evaluate``: FP32 (ORT) vs INT8 (ORT) vs INT8 (NSS) on a labelled dataset.

Data flow: dataset SPEC → declared preprocessing → fp32 model → ``torq.quantize.apply(recipe)``
(its full-integer form) calibrated on images that are never evaluated → every evaluation
image through the three paths → top-k, agreement, per-layer SQNR, LSB histogram.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ..data.datasets import Dataset, load_dataset
from ..data.preprocess import Preprocess, parse_preprocess
from ..errors import TorqError
from ..quantize.recipe import Recipe
from . import metrics
from .engines import OrtEngine, quantize_input
from .result import EvalResult

def _recommended():
    from ..quantize.recipe import RECOMMENDED, preset
    return preset(RECOMMENDED)


@dataclass
class EvalOptions:
    """How to evaluate: the quantization recipe (calibration data and the one --preprocess spec
    included) plus the run options, which change no number but the speed."""
    recipe: Recipe = field(default_factory=_recommended)
    batch: int = 8                         # images per NSS call (the model is compiled for it)
    limit: int | None = None               # evaluate only the first N evaluation images
    calibration_split: int = 0             # or: take N images out of the evaluation dataset
    half: str = "all"                      # all | tune | report: the seeded halves (protocol.py)
    split_seed: int = 0                    # seed of the tune/report halves
    onnx_reference: bool = False           # also run the int8 model as its ONNX definition (ORT, unfused)
    sqnr_images: int = 8                   # images used for the per-layer SQNR
    jobs: int = 1                          # NSS worker processes
    threads: int = 0                       # NSS threads in this process (0 = every usable core)
    rounding: str = "native"               # NSS rescale: "native" (the NPU's ACT) or "ort" (ORT's floats)
    ray: str | bool | None = None          # Ray cluster address, True = a local instance
    progress: bool = True

    @property
    def preprocess(self) -> Preprocess:
        return parse_preprocess(self.recipe.preprocess)

    @property
    def calibration(self) -> str | None:
        return self.recipe.calibration_data

    @property
    def num_calib(self) -> int:
        return self.recipe.num_calib

    @property
    def measured_recipe(self) -> Recipe:
        """The recipe of the model evaluate measures: the full-integer form (same arithmetic)."""
        return self.recipe.replace(full_integer=True)

    def with_changes(self, **changes) -> "EvalOptions":
        """Run options and recipe fields in one call; ``calibration`` = ``calibration_data``,
        ``preprocess`` a spec or a Preprocess, ``equalize`` a bool or a policy name."""
        from dataclasses import fields as dc_fields
        from dataclasses import replace
        recipe_fields = {f.name for f in dc_fields(Recipe)}
        rec, run = {}, {}
        for k, v in changes.items():
            k = {"calibration": "calibration_data"}.get(k, k)
            if k == "preprocess" and isinstance(v, Preprocess):
                v = v.describe()
            if k == "equalize" and isinstance(v, bool):
                v = "bounded" if v else "off"
            (rec if k in recipe_fields else run)[k] = v
        return replace(self, recipe=self.recipe.replace(**rec), **run)


def split(data: Dataset, opts: EvalOptions) -> tuple[Dataset, Dataset]:
    """(evaluation, calibration) datasets; they never share an image."""
    if opts.calibration and opts.calibration_split:
        raise TorqError("give either --calibration-data or --calibration-split, not both")
    if opts.calibration_split < 0:
        raise TorqError(f"--calibration-split {opts.calibration_split} must be at least 0")
    if opts.calibration_split:
        n = opts.calibration_split
        if n >= len(data):
            raise TorqError(f"--calibration-split {n} leaves no evaluation images ({len(data)} in the dataset)")
        perm = np.random.default_rng(0).permutation(len(data))
        evaluation, calib = data.subset(np.sort(perm[n:])), data.subset(np.sort(perm[:n]))
    elif opts.calibration:
        evaluation, calib = data, load_dataset(opts.calibration, labelled=False)
        shared = calib.sources() & data.sources()
        if shared:
            raise TorqError(f"the calibration data shares {len(shared)} image file(s) with the evaluation dataset "
                            f"(e.g. {sorted(shared)[0]}); calibration images must never be evaluated "
                            "(use --calibration-split N)")
    else:
        raise TorqError("evaluate needs real calibration images: --calibration-data SPEC or "
                        "--calibration-split N")
    if opts.half != "all":
        from .protocol import halves
        evaluation = evaluation.subset(halves(len(evaluation), opts.split_seed)[opts.half])
    if opts.limit:
        evaluation = evaluation.subset(np.arange(min(opts.limit, len(evaluation))))
    return evaluation, calib


def prepare(model_path, data: Dataset, calib: Dataset, opts: EvalOptions):
    """(fp32 model, full-integer int8 model, input name, per-image shape, classes, SQNR reference).

    The int8 model is ``torq.quantize.apply(recipe)`` — what ``quantize --recipe`` writes with
    the same calibration data — in its full-integer form (int8 I/O) whatever the recipe says:
    the arithmetic inside is the same. The SQNR reference is the prepared fp32 graph (front end,
    CLE, bias correction), whose tensors line up with the int8 model's."""
    from ..graph.input_shape import set_input_shapes
    from ..graph.load import load_model
    from ..quantize import memory_bound
    from ..quantize.calibration import ImageReader, image_input
    from ..quantize.recipe import apply, keeps_tensors
    fp32 = set_input_shapes(load_model(model_path), opts.recipe.input_shape, str(model_path))
    name, shape = image_input(fp32, "evaluate")
    recipe = opts.measured_recipe
    memory_bound.check(fp32, min(recipe.num_calib, len(calib)), str(model_path), "--num-calib",
                       keeps_tensors=keeps_tensors(recipe))
    memory_bound.check(fp32, opts.batch, str(model_path), "--batch")
    reader = None if opts.recipe.calibration_data else \
        ImageReader(calib, opts.preprocess, shape, name, recipe.num_calib)
    quantized = apply(recipe, model_path, reader)
    probe = OrtEngine(fp32)(opts.preprocess.batch([data.load(0)], shape, name))
    classes = int(np.prod(probe.shape[1:]))
    data.check_classes(classes)
    return fp32, quantized.model, name, shape, classes, quantized.fp32


def batches(data: Dataset, opts: EvalOptions, name: str, shape):
    """(start, float batch) over the evaluation images, ``opts.batch`` at a time."""
    for start in range(0, len(data), opts.batch):
        stop = min(start + opts.batch, len(data))
        yield start, opts.preprocess.batch([data.load(i) for i in range(start, stop)], shape, name)


def evaluate(model, dataset, *, preprocess: str | Preprocess | None = None, options: EvalOptions | None = None,
             **overrides) -> EvalResult:
    """Evaluate ``model`` (fp32 ONNX path) on ``dataset`` (SPEC or Dataset); see EvalOptions."""
    from ..graph.io_quant import io_quant_params
    opts = (options or EvalOptions()).with_changes(**overrides)
    if preprocess is not None:
        opts = opts.with_changes(preprocess=preprocess)
    if opts.batch < 1:
        raise TorqError(f"--batch {opts.batch} must be at least 1")
    from .protocol import HALVES
    if opts.half not in HALVES:
        raise TorqError(f"--half {opts.half}: choose one of {', '.join(HALVES)}")
    data = dataset if isinstance(dataset, Dataset) else load_dataset(dataset)
    data, calib = split(data, opts)
    from ..progress import stage
    with stage(f"evaluate: quantizing with {len(calib)} calibration images"):
        fp32, q, name, shape, classes, reference = prepare(model, data, calib, opts)
    opts = _fixed_batch(fp32, name, opts)
    qin = io_quant_params(q)["inputs"][name]
    result = EvalResult.start(model, data, opts, classes, len(calib))
    result.int8_model = q
    from ..quantize.sensitivity import precision_summary
    result.precision = precision_summary(reference, q)
    _run_ort_paths(result, data, opts, (fp32, reference), q, name, shape, qin)
    _run_nss_path(result, data, opts, q, name, shape, qin)
    result.finish()
    return result


def _fixed_batch(fp32, name: str, opts: EvalOptions) -> EvalOptions:
    """A model exported with a fixed batch of 1 is evaluated one image per call (a note says
    so); another fixed batch would have to be the batch everywhere: refused, naming the input."""
    dim = next(v for v in fp32.graph.input if v.name == name).type.tensor_type.shape.dim[0]
    if not dim.HasField("dim_value") or dim.dim_value <= 0 or dim.dim_value == opts.batch:
        return opts
    if dim.dim_value != 1:
        raise TorqError(f"input {name!r} has a fixed batch of {dim.dim_value}: pass --batch {dim.dim_value}, "
                        "or export the model with a dynamic batch")
    print(f"evaluate: input {name!r} has a fixed batch of 1: one image per call (not --batch {opts.batch})",
          file=sys.stderr)
    return opts.with_changes(batch=1)


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
        stream = nss_outputs(q, opts, inputs(), images=len(data))
        t0 = time.perf_counter()
        for start, out in stream:
            result.record("int8_nss", start, out)
            advance(len(out))
        result.seconds["int8_nss"] = time.perf_counter() - t0 - feeding[0]
