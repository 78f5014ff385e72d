"""Build the native kernels (``conv.c``, ``depthwise.c``, ``eltwise.c``, ``float_conv.c``, ``float_eltwise.c``,
``plan.c``, ``pool.c``) for this CPU once, cache the library by content.

The C source is compiled at first use with the system C compiler (``$CC``, else ``cc`` /
``gcc`` / ``clang``) for the host CPU (``-march=native``: AVX512-VNNI where the CPU has it, a
portable loop otherwise; the results are the same integers everywhere) and loaded with ctypes.
The library is cached under ``$TORQ_CACHE_DIR`` or ``$XDG_CACHE_HOME/torq/native`` (default
``~/.cache``), keyed by the sources, the compiler, the flags and the CPU's identity; a cached
library loads in milliseconds. No compiler, or a failed build, leaves the native engine
unavailable (``library()`` returns None, ``why()`` says why) and every op runs on the reference
kernels.

``TORQ_NATIVE_ISA=portable`` builds the portable variant (no AVX-512: what a CPU without VNNI
runs), so the fallback is tested on any host.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_UNITS = (_HERE / "conv.c", _HERE / "depthwise.c", _HERE / "eltwise.c", _HERE / "float_conv.c", _HERE / "float_depthwise.c",
          _HERE / "float_eltwise.c",
          _HERE / "plan.c", _HERE / "pool.c")
SOURCES = (*_UNITS, _HERE / "common.h", _HERE / "pool.h", _HERE / "float_conv.h", _HERE.parent.parent / "numerics" / "bf16.h",
           _HERE.parent.parent / "numerics" / "act.h")
_BASE_FLAGS = ["-O3", "-std=gnu11", "-fPIC", "-shared", "-pthread", "-ffp-contract=off", "-fno-strict-aliasing"]

_lock = threading.Lock()
_state: dict = {}


class TorqRq(ctypes.Structure):
    """torq_rq of the C kernels: one op's requantisation."""
    _fields_ = [("adj", ctypes.c_void_p), ("mult", ctypes.c_void_p), ("scale", ctypes.c_void_p),
                ("shift", ctypes.c_int32), ("even", ctypes.c_int32), ("zp", ctypes.c_int32),
                ("lo", ctypes.c_int32), ("hi", ctypes.c_int32), ("ort", ctypes.c_int32)]


class TorqGeom(ctypes.Structure):
    """torq_geom of the C kernels: one convolution's geometry."""
    _fields_ = [(n, ctypes.c_int32) for n in (
        "N", "C", "H", "W", "G", "Cg", "Og", "OH", "OW", "T", "nph", "rows", "Wq", "sh", "sw", "pt", "pl",
        "padv", "L", "Lpad", "Lph")] + [("ph_ab", ctypes.c_void_p), ("tap_ph", ctypes.c_void_p),
                                        ("tap_off", ctypes.c_void_p), ("id", ctypes.c_int64)]


class TorqDwq(ctypes.Structure):
    """torq_dwq of the C kernels: a depthwise kernel's taps packed four to a quad."""
    _fields_ = [("nq", ctypes.c_int32), ("win", ctypes.c_void_p), ("idx", ctypes.c_void_p), ("wq", ctypes.c_void_p)]


class TorqFgeom(ctypes.Structure):
    """torq_fgeom of float_conv.c: one float convolution's geometry."""
    _fields_ = [(n, ctypes.c_int32) for n in (
        "N", "C", "H", "W", "G", "Cg", "Og", "OH", "OW", "T", "nph", "rows", "Wq", "sh", "sw", "pt", "pl", "L",
        "RO", "PV", "direct", "bf16", "rowtile")] + [("lo", ctypes.c_float), ("hi", ctypes.c_float),
                                          ("cstride", ctypes.c_int64), ("phstride", ctypes.c_int64),
                                          ("ph_ab", ctypes.c_void_p), ("tap_off", ctypes.c_void_p),
                                          ("kh", ctypes.c_int32), ("kw", ctypes.c_int32), ("dwrows", ctypes.c_int32),
                                          ("pad_", ctypes.c_int32)]


def isa() -> str:
    """The variant to build: "native" (this CPU's instructions) or "portable"."""
    v = os.environ.get("TORQ_NATIVE_ISA", "native")
    return v if v in ("native", "portable") else "native"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty where unknown)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    return set(line.split(":", 1)[1].split()) if ":" in line else set()


def int8_features() -> str:
    """The int8 dot-product features of this CPU, e.g. "avx512_vnni+ amx_int8+ avx_vnni_int8-"."""
    f = cpu_flags()
    keys = ("avx512_vnni", "avx_vnni", "avx_vnni_int8", "amx_int8", "avx512_bf16")
    return " ".join(f"{k}{'+' if k in f else '-'}" for k in keys)


def _compiler() -> str | None:
    for c in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if c and shutil.which(c):
            return shutil.which(c)
    return None


def _cache_dir() -> Path:
    root = os.environ.get("TORQ_CACHE_DIR")
    if root:
        return Path(root) / "native"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "torq" / "native"


def _arch_flags() -> list[str]:
    if isa() == "portable":
        return ["-march=x86-64-v2"] if platform.machine() in ("x86_64", "AMD64") else []
    return ["-march=native"] if platform.machine() in ("x86_64", "AMD64") else ["-mcpu=native"]


def _key(cc: str, flags: list[str]) -> str:
    h = hashlib.sha256()
    for src in SOURCES:
        h.update(src.read_bytes())
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = "?"
    cpu = sorted(cpu_flags()) if isa() == "native" else []
    h.update("\0".join([version, *flags, platform.machine(), *cpu]).encode())
    return h.hexdigest()[:24]


def _build(cc: str, flags: list[str], dest: Path) -> str | None:
    """Compile into ``dest`` (temp file + rename); the compiler's first error line, or None.
    The units compile side by side (one compiler per unit), then link."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        objs = [Path(tmp) / f"{u.stem}.o" for u in _UNITS]
        compile_flags = [f for f in flags if f != "-shared"]
        procs = [subprocess.Popen([cc, *compile_flags, "-I", str(SOURCES[-1].parent), "-c", str(u), "-o", str(o)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for u, o in zip(_UNITS, objs)]
        results = [(p.communicate(timeout=300)[0], p.returncode) for p in procs]
        r = None
        if not any(rc for _, rc in results):
            r = subprocess.run([cc, *flags, *map(str, objs), "-o", str(Path(tmp) / "lib.so"), "-lm", "-lpthread"],
                               capture_output=True, text=True, timeout=300)
            results.append((r.stderr or r.stdout, r.returncode))
        failed = [out for out, rc in results if rc]
        if failed:
            lines = [ln for ln in failed[0].splitlines() if "error" in ln] or ["failed"]
            return lines[0].strip()
        os.replace(Path(tmp) / "lib.so", dest)
        return None


def _load() -> tuple[ctypes.CDLL | None, str]:
    cc = _compiler()
    if cc is None:
        return None, "no C compiler (set CC, or install gcc)"
    flags = [*_BASE_FLAGS, *_arch_flags()]
    path = _cache_dir() / f"torq_kernels_{_key(cc, flags)}.so"
    error = None
    if not path.exists():
        try:
            error = _build(cc, flags, path)
        except OSError:                      # cache not writable: build in a temp dir
            path = Path(tempfile.mkdtemp(prefix="torq-native-")) / path.name
            error = _build(cc, flags, path)
    if error is None:
        try:
            return _bind(ctypes.CDLL(str(path))), ""
        except OSError as e:
            error = str(e)
    return None, f"building the native kernels failed: {error}"


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i = ctypes.c_void_p, ctypes.c_int
    rq, geom, dwq = ctypes.POINTER(TorqRq), ctypes.POINTER(TorqGeom), ctypes.POINTER(TorqDwq)
    lib.torq_conv_i8.argtypes = [p, p, p, geom, rq, i]
    lib.torq_conv_amx_i8.argtypes = [p, p, p, geom, rq, i]
    lib.torq_dw_i8.argtypes = [p, p, p, dwq, geom, rq, i]
    lib.torq_fc_i8.argtypes = [p, p, p, i, i, i, rq]
    lib.torq_requant_i8.argtypes = [p, i, rq, p]
    lib.torq_add_i8.argtypes = [p, p, p, ctypes.c_long] + [i] * 9
    lib.torq_gap_i8.argtypes = [p, p, ctypes.c_long, ctypes.c_long, i, ctypes.c_int64] + [i] * 6 + [ctypes.c_float]
    lib.torq_maxpool_i8.argtypes = [p, p, i, p, i]
    lib.torq_run_calls.argtypes = [p, i, i, i, p]
    lib.torq_conv_f32.argtypes = [p, p, p, p, ctypes.POINTER(TorqFgeom), i]
    lib.torq_matmul_f32.argtypes = [p, p, p, p] + [i] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_float] * 2 + [i, i, i]
    lib.torq_binary_f32.argtypes = [p, p, p, ctypes.c_long, i, i, i]
    lib.torq_lut16_f32.argtypes = [p, p, p, ctypes.c_long, i]
    lib.torq_maxpool_f32.argtypes = [p, p, i, i, i, p, i]
    lib.torq_gap_f32.argtypes = [p, p, ctypes.c_long, ctypes.c_long, i, i]
    for fn in (lib.torq_run_calls, lib.torq_conv_f32, lib.torq_matmul_f32, lib.torq_float_features, lib.torq_binary_f32,
               lib.torq_lut16_f32, lib.torq_maxpool_f32, lib.torq_gap_f32, lib.torq_conv_i8, lib.torq_conv_amx_i8, lib.torq_dw_i8, lib.torq_fc_i8,
               lib.torq_requant_i8,
               lib.torq_features, lib.torq_amx_init, lib.torq_add_i8, lib.torq_gap_i8, lib.torq_maxpool_i8):
        fn.restype = i
    lib.amx = bool(lib.torq_features() & 4) and os.environ.get("TORQ_NATIVE_AMX", "1") != "0" and bool(lib.torq_amx_init())
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernel library for the current ``isa()`` (built on first use), or None."""
    key = isa()
    with _lock:
        if key not in _state:
            _state[key] = _load()
        return _state[key][0]


def why() -> str:
    """Why ``library()`` is None ("" when it is not)."""
    library()
    return _state[isa()][1]


def vnni() -> bool:
    """Whether the loaded library uses AVX512-VNNI."""
    lib = library()
    return bool(lib is not None and lib.torq_features() & 1)


def amx() -> bool:
    """Whether the convolutions run on AMX-INT8 tiles (the CPU has them, the OS granted them, and
    ``$TORQ_NATIVE_AMX`` is not 0)."""
    lib = library()
    return bool(lib is not None and lib.amx)


def int_depthwise() -> bool:
    """Whether the loaded library computes depthwise convolutions in integers (AVX512-VBMI)."""
    lib = library()
    return bool(lib is not None and lib.torq_features() & 2)
