"""Every file torq writes: complete or absent, never onto an input, never outside its folder.
May import: torq.errors.

* ``atomic_write_*``: temp file + rename, created with the user's umask (a replaced file keeps
  its mode); a symlink at the destination is replaced, never followed.
* ``refuse_overwrite``: an output path that is a folder, or is (or links to) one of the
  command's inputs, is a one-line error before any work.
* ``safe_name`` / ``inside``: the one sanitiser for file names derived from a model (layer ids,
  tensor and graph names): a portable, length-capped name whose hash suffix makes two different
  names never collide, joined under a chosen folder without following a planted symlink.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
import threading
from pathlib import Path

from .errors import TorqError

_UMASK_LOCK = threading.Lock()
NAME_LIMIT = 80                       # characters of a derived file name (before its suffixes)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _new_file_mode() -> int:
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def _mode_for(path: Path) -> int:
    """The destination's mode when it is a regular file we replace; else 0666 minus the umask."""
    try:
        st = os.lstat(path)
    except OSError:
        return _new_file_mode()
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else _new_file_mode()


def temp_prefix(name: str) -> str:
    """How the temp file of a write to ``name`` starts (``.<name>.``; long names cut to fit)."""
    return f".{name[:200]}."


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        raise IsADirectoryError(21, "Is a directory", str(path))
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name), suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | os.PathLike, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def save_model(model, path: str | os.PathLike) -> Path:
    """Serialize an onnx.ModelProto atomically (weights inline: torq models stay < 2 GB)."""
    return atomic_write_bytes(path, model.SerializeToString())


# ----------------------------------------------------------------------------- inputs are never outputs

def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Do the two paths name one file (through links, hard links or ``..``)?"""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(os.path.realpath(a)) == Path(os.path.realpath(b))


def refuse_overwrite(output: str | os.PathLike, flag: str, inputs: dict) -> None:
    """One-line TorqError when ``output`` is a folder or would replace an input.

    ``inputs``: flag -> path (None entries ignored). A folder input protects the files in it."""
    out = Path(output)
    if out.is_dir():
        raise TorqError(f"{flag} {out}: is a folder; give a file name")
    for what, src in inputs.items():
        if src is None or not Path(src).exists():
            continue
        src = Path(src)
        hit = same_file(out, src) if out.exists() else False
        if not hit and src.is_dir() and out.exists():
            hit = Path(os.path.realpath(out)).parent == Path(os.path.realpath(src))
        if hit:
            raise TorqError(f"{flag} {out} is the input {what} {src}; refusing to overwrite it "
                            "(choose another output path)")


# ----------------------------------------------------------------------------- names are data

def safe_name(name: object, limit: int = NAME_LIMIT) -> str:
    """A file name for a model-derived name: ``[A-Za-z0-9_.-]`` only, at most ``limit`` chars.

    A name that is already safe and short is kept as is; any other gets ``~`` and 10 hex digits
    of its sha256 (``~`` never survives sanitising, so two different names never collide)."""
    text = str(name)
    clean = _UNSAFE.sub("_", text).strip("._") or "unnamed"
    if clean == text and len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{clean[: max(1, limit - 11)]}~{digest}"


def inside(root: str | os.PathLike, *parts: str) -> Path:
    """``root/part/...`` for already-safe parts, refusing a symlink planted on the way (a link
    named like one of our files or folders would send the write elsewhere)."""
    path = Path(root)
    for part in parts:
        if part in ("", ".", "..") or "/" in part or "\0" in part:
            raise TorqError(f"{root}: unsafe file name {part!r}")
        path = path / part
        if path.is_symlink():
            raise TorqError(f"{path}: is a symbolic link; refusing to write through it (remove it)")
    return path


def cache_dir() -> Path:
    """The user's torq cache folder (per-layer results, quantized models): $TORQ_GEN_CONFIG_CACHE_DIR,
    else $XDG_CACHE_HOME/torq-gen-config."""
    env = os.environ.get("TORQ_GEN_CONFIG_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torq-gen-config"
