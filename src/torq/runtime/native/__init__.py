"""The native engine: the Program's int8 convolutions and fully connected layers, and its bf16
contractions (``float_ops``: conv, depthwise, fully connected, matmul), as compiled machine
code (AVX512-VNNI / AVX-512 where the CPU has it), bit-identical to the reference simulator.

``Simulator(program, engine="native")`` (the default) binds each step to a native kernel when
this package compiles it (``ops.make``) and to the reference kernel otherwise, per op; the
reference engine (``engine="reference"``) stays the oracle the tests hold it against. The C
library is built for the host at first use and cached by content (``build``). Design notes and
measurements: docs/native-engine.md.
"""
from __future__ import annotations

from .build import amx, int8_features, library, vnni, why

ENGINES = ("native", "reference")

__all__ = ["ENGINES", "amx", "int8_features", "library", "vnni", "why"]
