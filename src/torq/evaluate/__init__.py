"""What INT8 costs: accuracy of FP32 (ORT), INT8 (ORT) and INT8 (NSS) on real labelled data.

    from torq.evaluate import evaluate
    r = evaluate("model.onnx", "/data/imagenet-sample", preprocess="resize=256,crop=224,norm=tf",
                 calibration="photos/", batch=8)
    r.accuracy("int8_nss"), r.agreement("int8_nss", "int8_ort"); r.write("out/")
May import: torq.cluster, torq.compiled, torq.quantize, torq.data, torq.graph, torq.reference, torq.runtime, torq.numerics, torq.errors, torq.fileio, torq.progress, torq.workers.
"""
from ..data.datasets import Dataset, load_dataset
from ..data.preprocess import Preprocess, parse_preprocess
from .result import EvalResult
from .run import EvalOptions, evaluate

__all__ = ["Dataset", "EvalOptions", "EvalResult", "Preprocess", "evaluate", "load_dataset", "parse_preprocess"]
