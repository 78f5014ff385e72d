"""NSS: the torq_hl program on the bit-exact simulator (native NPU rounding by default).

``from_model`` caches each compiled ``Program`` by the model's content (``Program.save``), so a
repeated ``run`` simulates its NSS segments without recompiling them."""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

from . import ExecutorError, Runnable, frontend, one_line

NAME = "nss"


FP32_HINT = ("; fp32 layers run on the NPU in bf16 (--auto-convert-bf16) or in int8 (--quantize)")


def build(compiled, *, cache_dir=None, rounding: str = "native") -> Runnable:
    try:
        compiled.program  # noqa: B018 - refuses ops without a torq_hl rule
    except Exception as e:  # noqa: BLE001 - "not supported on NSS: <op> at L:C: <reason>"
        raise ExecutorError("no_pattern", one_line(e) + (FP32_HINT if is_fp32(compiled.model) else "")) from None

    def run(inputs):
        t0 = time.perf_counter()
        out = compiled.run(inputs, rounding=rounding)
        return out, (time.perf_counter() - t0) * 1e3
    return Runnable(NAME, run)


def is_fp32(model) -> bool:
    """A float model that is neither quantized nor bf16: the NSS runs neither fp32 arithmetic."""
    from ...graph.bf16 import is_bf16
    from ...graph.load import is_quantized
    return not is_quantized(model) and not is_bf16(model)


def program_path(model, cache_dir) -> Path:
    """Where ``from_model`` caches the Program of ``model``."""
    from ..._version import __version__
    from ...program import FORMAT_VERSION
    key = hashlib.sha256(f"torq {__version__} program {FORMAT_VERSION}|".encode() + model.SerializeToString())
    return Path(cache_dir) / "programs" / f"{key.hexdigest()}.npz"


def from_model(model, *, cache_dir, rounding: str = "native", recompute: bool = False) -> Runnable:
    """The NSS runnable of an ONNX model, from its cached Program when there is one."""
    from ...runtime.nss import Simulator
    program = cached_program(model, cache_dir=cache_dir, recompute=recompute)
    sim = Simulator(program)

    def run(inputs):
        t0 = time.perf_counter()
        out = program.fetch(sim.run(program.feed(inputs), rounding))
        return out, (time.perf_counter() - t0) * 1e3
    return Runnable(NAME, run)


def cached_program(model, *, cache_dir, recompute: bool = False):
    """The compiled ``Program`` of an ONNX model: loaded from the cache, else compiled and saved."""
    from ...program import Program
    path = program_path(model, cache_dir)
    program = None
    if path.exists() and not recompute:
        try:
            program = Program.load(path)
        except Exception:  # noqa: BLE001 - a damaged cache entry is recompiled
            program = None
        if program is not None and program.cache_key != path.stem:
            program = None               # a valid program of another model, moved here
    if program is None:
        try:
            program = frontend(model).program
        except ExecutorError:
            raise
        except Exception as e:  # noqa: BLE001
            raise ExecutorError("no_pattern", one_line(e) + (FP32_HINT if is_fp32(model) else "")) from None
        try:
            program.save(path, cache_key=path.stem)
        except OSError:
            pass  # a read-only cache only costs speed
    return program
