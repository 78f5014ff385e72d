"""CSS / HOST execution: our torch-mlir linalg IR compiled by IREE and run with IREE's runtime.

Both executors start from the same IR as the NSS path (``torq.compile(m).ir("linalg")``), so a
layer that the NSS refuses is still the *same* integer program on the CPU. ``vmvx`` is IREE's
portable VM interpreter (our stand-in for the NPU's CPU subsystem, CSS); ``llvm-cpu`` is native
x86 code (HOST). A compile costs about a second, so compiled modules are cached by content.
"""
from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import TorqError
from ...fileio import atomic_write_bytes
from . import ExecutorError, Runnable, one_line

BACKENDS = {"css": "vmvx", "host": "llvm-cpu"}
_FUNC = re.compile(r'func\.func\s+@(?:"([^"]+)"|([\w$.-]+))')   # torch exports name graphs "/a/b_output_0"


class IreeCompileError(TorqError):
    """IREE could not compile the module (reason_code ``iree_compile_failed``)."""


def _compiler_version() -> str:
    from importlib.metadata import version
    return version("iree-base-compiler")


def compile_vmfb(linalg_text: str, backend: str, cache_dir: str | Path | None = None) -> bytes:
    """linalg MLIR text -> IREE flatbuffer for ``backend`` (vmvx | llvm-cpu), cached by content."""
    key = hashlib.sha256(f"{_compiler_version()}|{backend}|".encode() + linalg_text.encode()).hexdigest()
    path = Path(cache_dir) / "iree" / f"{key}.vmfb" if cache_dir else None
    if path is not None and path.exists():
        return path.read_bytes()
    import iree.compiler as ic
    flags = ["--iree-llvmcpu-target-cpu=host"] if backend == "llvm-cpu" else []
    try:
        vmfb = ic.compile_str(linalg_text, target_backends=[backend], input_type="none",
                              extra_args=flags)
    except Exception as e:  # noqa: BLE001 - IREE raises CompilerToolError with the full log
        lines = [ln.strip() for ln in str(e).splitlines() if "error:" in ln]
        raise IreeCompileError(f"IREE {backend} compile failed: {(lines or [type(e).__name__])[0][:300]}") from None
    if path is not None:
        atomic_write_bytes(path, vmfb)
    return vmfb


@dataclass
class IreeModule:
    """A compiled module bound to a fresh single-threaded IREE runtime context."""
    backend: str
    function: object

    @classmethod
    def load(cls, vmfb: bytes, linalg_text: str, backend: str) -> "IreeModule":
        import iree.runtime as rt
        m = _FUNC.search(linalg_text)
        if m is None:
            raise TorqError("linalg module has no func.func to run")
        ctx = rt.SystemContext(config=rt.Config("local-sync"))
        ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
        return cls(backend, ctx.modules.module[m.group(1) or m.group(2)])

    def run(self, args: list[np.ndarray]) -> tuple[list[np.ndarray], float]:
        """Outputs (in function order) and the wall time of the call in ms."""
        t0 = time.perf_counter()
        out = self.function(*[np.ascontiguousarray(a) for a in args])
        ms = (time.perf_counter() - t0) * 1e3
        outs = out if isinstance(out, (list, tuple)) else [out]
        return [np.asarray(o.to_host()) for o in outs], ms


def compile_module(linalg_text: str, backend: str, cache_dir=None) -> IreeModule:
    return IreeModule.load(compile_vmfb(linalg_text, backend, cache_dir), linalg_text, backend)


def build(name: str, compiled, cache_dir=None) -> Runnable:
    """The layer's linalg IR compiled by IREE for executor ``name`` (css | host)."""
    try:
        module = compile_module(compiled.ir("linalg"), BACKENDS[name], cache_dir)
    except Exception as e:  # noqa: BLE001
        raise ExecutorError("iree_compile_failed", one_line(e)) from None

    def run(inputs):
        outs, ms = module.run(compiled.feed(inputs))
        return compiled.fetch(outs), ms
    return Runnable(name, run)
