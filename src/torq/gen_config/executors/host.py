"""HOST: the application processor, IREE ``llvm-cpu`` native code from the layer's linalg IR."""
from . import iree

NAME = "host"


def build(compiled, *, cache_dir=None, rounding: str = "native"):
    return iree.build(NAME, compiled, cache_dir)
