"""``evaluate --precision bf16``: FP32 (ORT) vs BF16 (NSS) on a labelled dataset.

The fp32 model goes through the same front end as the int8 path (the recipe's fold and dead
channels, ``quantize.recipe.front_end``), is
converted to bf16 (``graph.bf16``: what ``--auto-convert-bf16`` runs on the NPU), and every
evaluation image is classified by ONNX Runtime fp32 and by the NSS simulator running the bf16
model. No calibration: bf16 needs none. Batches, threads, --jobs and Ray work as for int8 (the
NSS backends take any compiled model; the bf16 model reads float images).
"""
from __future__ import annotations

import time

from ..errors import TorqError
from ..data.datasets import Dataset, load_dataset
from .engines import OrtEngine
from .result import EvalResult

PATHS = ("fp32", "bf16_nss")


def evaluate_bf16(model, dataset, opts) -> EvalResult:
    """Evaluate ``model`` (fp32 ONNX path) in bf16 on the NSS against fp32 on ``dataset``."""
    import numpy as np

    from ..graph.bf16 import convert_to_bf16
    from ..quantize.calibration import image_input
    from ..quantize.recipe import front_end, load_fp32
    from .run import batches
    if opts.batch < 1:
        raise TorqError(f"--batch {opts.batch} must be at least 1")
    data = dataset if isinstance(dataset, Dataset) else load_dataset(dataset)
    if opts.limit:
        data = data.subset(np.arange(min(opts.limit, len(data))))
    fp32 = front_end(opts.recipe, *load_fp32(model, None, opts.recipe.input_shape))
    name, shape = image_input(fp32, "evaluate")
    bf16 = convert_to_bf16(fp32)
    fp32_engine = OrtEngine(fp32)
    classes = int(np.prod(fp32_engine(opts.preprocess.batch([data.load(0)], shape, name)).shape[1:]))
    data.check_classes(classes)
    result = EvalResult.start(model, data, opts, classes, 0, paths=PATHS)
    result.settings.update(precision="bf16", calibration="none (bf16)", calibration_images=0)
    with result.progress("FP32 (ORT)", len(data), opts.progress) as advance:
        for start, x in batches(data, opts, name, shape):
            t0 = time.perf_counter()
            out = fp32_engine(x)
            result.seconds["fp32"] += time.perf_counter() - t0
            result.record("fp32", start, out)
            advance(len(x))
    _run_nss(result, data, opts, bf16, name, shape)
    result.finish()
    return result


def _run_nss(result, data, opts, bf16, name, shape) -> None:
    from .parallel import nss_outputs
    from .run import batches
    feeding = [0.0]

    def inputs():
        it = batches(data, opts, name, shape)
        while True:
            t0 = time.perf_counter()
            item = next(it, None)
            feeding[0] += time.perf_counter() - t0
            if item is None:
                return
            yield item

    with result.progress("BF16 (NSS)", len(data), opts.progress) as advance:
        stream = nss_outputs(bf16, opts, inputs())
        t0 = time.perf_counter()
        for start, out in stream:
            result.record("bf16_nss", start, out)
            advance(len(out))
        result.seconds["bf16_nss"] = time.perf_counter() - t0 - feeding[0]
