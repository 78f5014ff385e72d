"""Whole-model quantizations cached by content, across commands.

``quantize``, ``discover --quantize`` and ``run --quantize`` of one model with one recipe and one
calibration set each quantize the whole model, and with GPTQ weight rounding that is minutes
(ResNet-18: ~300 s each). ``recipe.quantize_prepared`` -- the one function every whole-model int8
model comes from -- looks here first, and so does ``--precision auto``'s whole resolution
(sensitivity, choice, final model: ``auto_precision.apply_auto``, keyed by the fp32 model itself). An entry is keyed by the sha256 of

* the prepared fp32 model's bytes (the graph handed to ONNX Runtime, after the front end / CLE),
* the recipe (every field), and ``wrap_lone_ops``,
* the calibration samples themselves (each sample's input names, dtypes, shapes and bytes, read
  from the reader the quantizer would consume: files, ``--preprocess``, ``--num-calib`` and
  synthetic seeds all show in them),
* the code: every ``.py`` file of the torq package (so a change to exact scales, GPTQ, the
  islands ... is a miss, no version to bump by hand), and the onnx / onnxruntime / numpy versions.

Entries live in ``<cache dir>/quantized/`` (``TORQ_GEN_CONFIG_CACHE_DIR``, default
``$XDG_CACHE_HOME/torq-gen-config``), one file each: a header line with the key and the sha256 of
the model bytes, then the bytes; written atomically (temp + rename). A damaged, truncated or
foreign entry is a miss (recomputed and rewritten), never trusted. The folder is bounded
(``TORQ_QUANTIZE_CACHE_MB``, default 4096: the least recently used entries go first) and can be
deleted at any time. ``TORQ_QUANTIZE_CACHE=off`` turns it off; ``--recompute-cache`` (discover,
run, quantize) recomputes and rewrites.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
from pathlib import Path

from ..fileio import atomic_write_bytes, cache_dir

FORMAT = b"torq-quantized-model 1"
DEFAULT_MAX_MB = 4096
_MAX_BYTES = 1_800_000_000            # protobuf's 2 GB limit: larger models are not cached

_recompute = contextvars.ContextVar("torq_quantize_recompute", default=False)
_code: str | None = None
stats = {"hits": 0, "misses": 0, "writes": 0}


def enabled() -> bool:
    return os.environ.get("TORQ_QUANTIZE_CACHE", "on").strip().lower() not in ("off", "0", "no", "false")


@contextlib.contextmanager
def recomputing(on: bool = True):
    """Within: no entry is used (each is recomputed and rewritten): ``--recompute-cache``."""
    token = _recompute.set(bool(on) or _recompute.get())
    try:
        yield
    finally:
        _recompute.reset(token)


def root() -> Path:
    return cache_dir() / "quantized"


def max_bytes() -> int:
    try:
        return int(float(os.environ.get("TORQ_QUANTIZE_CACHE_MB", DEFAULT_MAX_MB)) * (1 << 20))
    except ValueError:
        return DEFAULT_MAX_MB << 20


def code_digest() -> str:
    """sha256 over the torq package's Python sources (path + bytes), once per process."""
    global _code
    if _code is None:
        import numpy
        import onnx
        import onnxruntime
        pkg = Path(__file__).resolve().parents[1]
        h = hashlib.sha256(f"onnx {onnx.__version__}|ort {onnxruntime.__version__}|numpy {numpy.__version__}|"
                           .encode())
        for p in sorted(pkg.rglob("*.py")):
            h.update(str(p.relative_to(pkg)).encode() + b"\0" + p.read_bytes() + b"\0")
        _code = h.hexdigest()
    return _code


def samples_digest(reader) -> str | None:
    """sha256 of every sample ``reader`` yields (then rewound), or None if it cannot be rewound."""
    import numpy as np
    if not any(callable(getattr(reader, n, None)) for n in ("rewind", "reset")):
        return None
    from .calibration import rewind
    h = hashlib.sha256()
    n = 0
    while (sample := reader.get_next()) is not None:
        for name in sorted(sample):
            a = np.ascontiguousarray(sample[name])
            h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
            h.update(a.tobytes())
        h.update(b"\n")
        n += 1
    rewind(reader)
    h.update(f"{n} samples".encode())
    return h.hexdigest()


def key(recipe, prepared_bytes: bytes, samples: str, wrap_lone_ops: bool) -> str:
    import json
    h = hashlib.sha256(FORMAT + b"|" + code_digest().encode() + b"|")
    h.update(json.dumps(recipe.to_dict(), sort_keys=True).encode())
    h.update(f"|wrap {bool(wrap_lone_ops)}|calib {samples}|model ".encode())
    h.update(hashlib.sha256(prepared_bytes).digest())
    return h.hexdigest()


def path_of(k: str) -> Path:
    return root() / f"{k}.onnx"


def get(k: str, recipe=None):
    """The cached model for key ``k`` (an onnx.ModelProto), or None: missing, damaged, another key,
    or (given ``recipe``) not a model stamped with that recipe."""
    import onnx
    p = path_of(k)
    try:
        data = p.read_bytes()
    except OSError:
        return None
    head, sep, body = data.partition(b"\n")
    fields = head.split(b" ")
    if not sep or len(fields) != 5 or b" ".join(fields[:2]) != FORMAT or fields[2].decode(errors="replace") != k \
            or fields[3] != str(len(body)).encode() or fields[4] != hashlib.sha256(body).hexdigest().encode():
        return None
    try:
        model = onnx.load_from_string(body)
        from .recipe import recipe_of
        made_with = recipe_of(model)
    except Exception:  # noqa: BLE001 - a damaged entry is a miss
        return None
    if not model.graph.node or made_with is None or (recipe is not None and made_with != recipe):
        return None
    with contextlib.suppress(OSError):
        os.utime(p)                                   # recently used: evicted last
    return model


def put(k: str, model) -> None:
    try:
        body = model.SerializeToString()
    except ValueError:                                # > 2 GB
        return
    if len(body) > min(_MAX_BYTES, max_bytes()):
        return
    head = b" ".join([FORMAT, k.encode(), str(len(body)).encode(), hashlib.sha256(body).hexdigest().encode()])
    try:
        atomic_write_bytes(path_of(k), head + b"\n" + body)
        stats["writes"] += 1
        evict(max_bytes())
    except OSError:
        pass                                          # a read-only or full cache only costs time


def evict(limit: int) -> None:
    """Delete the least recently used entries until the folder holds at most ``limit`` bytes."""
    entries = []
    for p in root().glob("*.onnx"):
        with contextlib.suppress(OSError):
            st = p.stat()
            entries.append((st.st_mtime, st.st_size, p))
    total = sum(s for _, s, _ in entries)
    for _, size, p in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        with contextlib.suppress(OSError):
            p.unlink()
            total -= size


def cached(recipe, prepared, reader, wrap_lone_ops: bool, compute, resolves: bool = False):
    """``compute()`` (the whole-model quantization of ``prepared`` with ``reader``), or the model a
    previous identical call stored. ``resolves``: ``recipe`` measures part of itself
    (``--precision auto``), so the model is stamped with the recipe it resolved to, not ``recipe``."""
    if not enabled():
        return compute()
    try:
        prepared_bytes = prepared.SerializeToString()
    except ValueError:
        return compute()
    samples = samples_digest(reader)
    if samples is None:
        return compute()
    k = key(recipe, prepared_bytes, samples, wrap_lone_ops)
    del prepared_bytes
    if not _recompute.get():
        model = get(k, None if resolves else recipe)
        if model is not None:
            stats["hits"] += 1
            from ..progress import say
            say(f"quantize: whole-model quantization from the cache ({root() / path_of(k).name[:16]}...; "
                "--recompute-cache or TORQ_QUANTIZE_CACHE=off to recompute)")
            return model
    stats["misses"] += 1
    model = compute()
    put(k, model)
    return model
