"""A Program on disk: one ``.npz`` (every array under its own key + a JSON ``__manifest__``),
checked whole before anything in it is trusted.
May import: torq.errors (never the compiler, MLIR or ONNX Runtime).

``Program.load`` refuses, in one line naming the file, anything ``Program.save`` would not have
written: another format or version, a manifest of the wrong shape, an array missing, of another
dtype or shape than the manifest's sha256 covers, slots read before they are written, outputs
whose declared type is not the type of the value they point at. Arrays are inflated only after
their declared sizes are bounded by the file's own size (a 1 MB file cannot unpack to 1 GB),
and never with pickles.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import zipfile
from pathlib import Path

import numpy as np

from .errors import TorqError, one_line

FORMAT = "torq-program"
FORMAT_VERSION = 2
MIN_INFLATE_BOUND = 64 << 20        # arrays may always unpack to this much ...
INFLATE_FACTOR = 2                  # ... or to twice the file's size (save() never compresses)
_ALLOWED = {"b", "i", "u", "f"}     # bool, signed, unsigned, float arrays only


class Damaged(Exception):
    """Internal: the file is not a valid program (the message says why)."""


def to_bytes(manifest: dict, arrays: dict[str, np.ndarray]) -> bytes:
    manifest = dict(manifest, format=FORMAT, version=FORMAT_VERSION)
    manifest["sha256"] = _digest(manifest, arrays)
    buf = io.BytesIO()
    np.savez(buf, __manifest__=np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8), **arrays)
    return buf.getvalue()


def _digest(manifest: dict, arrays: dict) -> str:
    h = hashlib.sha256(json.dumps({k: v for k, v in manifest.items() if k != "sha256"}, sort_keys=True).encode())
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(f"|{key}|{a.dtype.str}|{list(a.shape)}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def read(path: Path) -> tuple[dict, dict]:
    """(manifest, arrays) of a program file, checked against each other; TorqError otherwise."""
    try:
        return _read(path)
    except FileNotFoundError:
        raise TorqError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TorqError(f"{path}: is a folder, not a torq program") from None
    except Damaged as e:
        raise TorqError(f"{path}: damaged torq program ({e}); recompile the model") from None
    except (OSError, ValueError, KeyError, EOFError, UnicodeDecodeError, RecursionError, NotImplementedError,
            zipfile.BadZipFile, zipfile.LargeZipFile) as e:
        raise TorqError(f"{path}: not a torq program ({type(e).__name__}: {one_line(e, 100)})") from None


def _read(path: Path) -> tuple[dict, dict]:
    with zipfile.ZipFile(path) as zf:
        infos = {i.filename.removesuffix(".npy"): i for i in zf.infolist()}
        if "__manifest__" not in infos:
            raise Damaged(f"no {FORMAT} manifest")
        bound = max(MIN_INFLATE_BOUND, INFLATE_FACTOR * os.path.getsize(path))
        declared = sum(i.file_size for i in infos.values())
        if declared > bound:
            raise Damaged(f"its arrays declare {declared / 2**20:.0f} MiB in a "
                          f"{os.path.getsize(path) / 2**20:.1f} MiB file")
        manifest = json.loads(bytes(_array(zf, infos["__manifest__"])).decode())
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise Damaged(f"no {FORMAT} manifest")
        if manifest.get("version") != FORMAT_VERSION:
            raise TorqError(f"{path}: program format version {manifest.get('version')!r}, this torq reads "
                            f"version {FORMAT_VERSION}; recompile the model")
        arrays = {k: _array(zf, i) for k, i in infos.items() if k != "__manifest__"}
    if manifest.get("sha256") != _digest(manifest, arrays):
        raise Damaged("its checksum does not match its content")
    return manifest, arrays


def _array(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    """One member, its npy header checked (no objects, sizes that add up) before its data is read."""
    with zf.open(info) as f:
        version = np.lib.format.read_magic(f)
        shape, _, dtype = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)(f)
        if dtype.hasobject or dtype.kind not in _ALLOWED:
            raise Damaged(f"array {info.filename!r} has dtype {dtype}")
        if math.prod(shape) * dtype.itemsize > info.file_size:
            raise Damaged(f"array {info.filename!r} is shorter than its header says")
    with zf.open(info) as f:
        return np.lib.format.read_array(f, allow_pickle=False)


# ----------------------------------------------------------------------------- manifest -> values

def integer(v, what: str, lo: int = 0, hi: int = 2**31 - 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise Damaged(f"{what} is {v!r}, expected an integer in [{lo}, {hi}]")
    return v


def shape(v, what: str) -> tuple:
    if not isinstance(v, list) or len(v) > 16:
        raise Damaged(f"{what} is not a shape")
    return tuple(integer(d, what, 0, 2**40) for d in v)


def text(v, what: str, optional: bool = False) -> str | None:
    if v is None and optional:
        return None
    if not isinstance(v, str):
        raise Damaged(f"{what} is not a string")
    return v


def value(v, arrays: dict, what: str):
    """An attribute or constant: a number, string, bool, None, list of those, or an array."""
    if isinstance(v, dict):
        key = v.get("__array__")
        if len(v) != 1 or key not in arrays:
            raise Damaged(f"{what} refers to a missing array {key!r}")
        return arrays[key]
    if isinstance(v, list):
        return [value(x, arrays, what) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise Damaged(f"{what} has a value of type {type(v).__name__}")
