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


_SEAL = b"torq-vmfb-sha256:"


def _key(linalg_text: str, backend: str) -> str:
    return hashlib.sha256(f"{_compiler_version()}|{backend}|".encode() + linalg_text.encode()).hexdigest()


def vmfb_path(linalg_text: str, backend: str, cache_dir: str | Path) -> Path:
    """Where ``compile_vmfb`` caches the module of ``linalg_text`` for ``backend``."""
    return Path(cache_dir) / "iree" / f"{_key(linalg_text, backend)}.vmfb"


def compile_vmfb(linalg_text: str, backend: str, cache_dir: str | Path | None = None) -> bytes:
    """linalg MLIR text -> IREE flatbuffer for ``backend`` (vmvx | llvm-cpu), cached by content.

    A cached module carries the sha256 of its key and bytes (a trailer); a damaged or misplaced
    one is recompiled and rewritten, and a cache we cannot write only costs speed."""
    key = _key(linalg_text, backend)
    path = vmfb_path(linalg_text, backend, cache_dir) if cache_dir else None
    cached = _read_sealed(path, key) if path is not None else None
    if cached is not None:
        return cached
    import iree.compiler as ic
    flags = ["--iree-llvmcpu-target-cpu=host"] if backend == "llvm-cpu" else []
    try:
        vmfb = ic.compile_str(linalg_text, target_backends=[backend], input_type="none",
                              extra_args=flags)
    except Exception as e:  # noqa: BLE001 - IREE raises CompilerToolError with the full log
        raise IreeCompileError(f"IREE {backend} compile failed: {_first_error(str(e)) or type(e).__name__}") from None
    if path is not None:
        try:
            atomic_write_bytes(path, vmfb + _SEAL + _seal(key, vmfb))
        except OSError:
            pass
    return vmfb


_HOST_FAILURES = ("failed to generate temporary file", "No space left", "Permission denied",
                  "File name too long", "Read-only file system", "Cannot allocate memory")


def _first_error(log: str) -> str:
    """The line of IREE's log that says what went wrong: an ``error:`` line, else a line about
    the machine (temp files, disk, memory), else empty."""
    lines = [ln.strip() for ln in log.splitlines()]
    for ln in lines:
        if "error:" in ln:
            return ln[:300]
    for ln in lines:
        for marker in _HOST_FAILURES:
            if marker in ln:
                return ln[ln.index(marker):][:200].split("Please report")[0]
    return ""


def _seal(key: str, body: bytes) -> bytes:
    """sha256 of the module *and* its cache key: a module moved under another key is refused."""
    return hashlib.sha256(key.encode() + b"|" + body).hexdigest().encode()


def _read_sealed(path: Path, key: str) -> bytes | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    body, sep, digest = data.rpartition(_SEAL)
    if not sep or _seal(key, body) != digest:
        return None
    return body


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
