"""Static int8 quantization of fp32 ONNX models (ONNX Runtime ``quantize_static`` underneath).

    from torq.quantize import Recipe, apply, preset
    q = apply(preset("exact").replace(calibration_data="photos/", preprocess="resize=256,crop=224,norm=tf"),
              "model.onnx").model
    q = quantize("model.onnx", "model.int8.onnx", per_channel=True, full_integer=True)
May import: torq.data, torq.graph, torq.numerics, torq.reference, torq.errors, torq.fileio, torq.cli_util, torq.progress.
"""
import sys
import types

from .calibration import ArrayDataReader, SyntheticDataReader, load_calibration_arrays
from ..graph.io_quant import io_quant_params
from .full_integer import convert_to_full_integer
from .recipe import PRESETS, RECOMMENDED, Quantized, Recipe, apply, preset, recipe_of
from .static import quantize, resolve_hybrid

__all__ = ["quantize", "resolve_hybrid", "convert_to_full_integer", "io_quant_params",
           "SyntheticDataReader", "ArrayDataReader", "load_calibration_arrays",
           "Recipe", "PRESETS", "RECOMMENDED", "Quantized", "apply", "preset", "recipe_of"]


class _CallableModule(types.ModuleType):
    """``torq.quantize`` is both this package and the function (``torq.quantize(model)``).

    ``torq/__init__.py`` exposes a lazy ``quantize()``; importing this package rebinds the
    attribute ``torq.quantize`` to the module, so the module itself must stay callable."""

    def __call__(self, *args, **kwargs):
        return quantize(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
