"""CSS: the NPU's CPU subsystem, modelled by IREE's portable ``vmvx`` VM on the layer's linalg IR."""
from . import iree

NAME = "css"


def build(compiled, *, cache_dir=None, rounding: str = "native"):
    return iree.build(NAME, compiled, cache_dir)
