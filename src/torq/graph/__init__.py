"""ONNX graph helpers: safe loading, layer/segment extraction, dedup signatures.
May import: torq.numerics, torq.errors, torq.fileio.
"""
from .extract import Layer, extract_layers, extract_segment, layer_id
from .load import is_quantized, load_model
from .signature import signature, signature_json

__all__ = ["load_model", "is_quantized", "Layer", "extract_layers", "extract_segment", "layer_id",
           "signature", "signature_json"]
