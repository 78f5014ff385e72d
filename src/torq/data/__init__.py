"""Images and labels on disk -> model inputs: datasets named by a SPEC and declared preprocessing.

Below both ``quantize`` (calibration from an image folder) and ``evaluate`` (labelled data).

May import: torq.errors."""
from .datasets import Dataset, load_dataset
from .preprocess import Preprocess, parse_preprocess

__all__ = ["Dataset", "Preprocess", "load_dataset", "parse_preprocess"]
