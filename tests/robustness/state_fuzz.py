"""State mutants: the files torq keeps between runs, damaged as an unlucky or hostile user would.

`mutate_json(obj, rng)` changes one value somewhere in a JSON document (a wrong type, a huge or
negative number, markup, a deep nest, a missing key); `damage_file(path, rng)` breaks a file on
disk (truncated, bytes flipped, emptied, replaced by garbage, by a folder, by another JSON);
`mutate_program(manifest, arrays, rng)` tampers with a saved Program (manifest or arrays, re-sealed
or not). The tests (`test_state_fuzz.py`) run the CLIs on the result in a forked child
(`fuzz.run_cli`) and accept only a correct result or one clean error line.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

HOSTILE = [[], {}, "", "x", "[/]<script>alert(1)</script>", 0, -1, 42, 2**31, 10**30, -10**30, 1e308, -1e308,
           float("nan"), float("inf"), None, True, False, [1, 2, 3], {"a": 1}, "success", "nss", "1:1"]


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _slots(obj, path=()):
    """Every (container, key, path) in the document."""
    out = []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else []
    for k, v in items:
        out.append((obj, k, path + (k,)))
        out.extend(_slots(v, path + (k,)))
    return out


_DEEP = "\x00deep:"


def _deep(n: int) -> str:
    """A placeholder that ``dumps`` writes as ``n`` nested lists (json cannot encode them)."""
    return f"{_DEEP}{n}"


def dumps(obj) -> str:
    """JSON text of a mutated document, deep nests written out."""
    text = json.dumps(obj)
    marker = json.dumps(_DEEP)[1:-1]
    while marker in text:
        i = text.index('"' + marker)
        j = text.index('"', i + 1)
        n = int(text[i + 1 + len(marker):j])
        text = text[:i] + "[" * n + "]" * n + text[j + 1:]
    return text


def mutate_json(obj, rng) -> tuple[object, str]:
    """(a mutated deep copy, what changed)."""
    obj = json.loads(json.dumps(obj))
    slots = _slots(obj)
    if not slots:
        return _pick(rng, HOSTILE), "whole document replaced"
    parent, key, path = _pick(rng, slots)
    where = "/".join(map(str, path))
    kind = int(rng.integers(5))
    if kind == 0 and isinstance(parent, dict):
        del parent[key]
        return obj, f"{where}: removed"
    if kind == 1:
        parent[key] = _deep(int(_pick(rng, [50, 3000])))
        return obj, f"{where}: deeply nested"
    if kind == 2 and isinstance(parent, dict):
        parent[f"{key}\n<b>[/]"] = parent.pop(key)
        return obj, f"{where}: key renamed"
    value = _pick(rng, HOSTILE)
    parent[key] = value
    return obj, f"{where}: -> {value!r:.40}"


def damage_file(path: Path, rng) -> str:
    """Break the file at ``path`` one way; says how."""
    data = path.read_bytes()
    kind = _pick(rng, ["truncate", "flip", "empty", "garbage", "folder", "json", "delete", "swap"])
    if kind == "truncate":
        path.write_bytes(data[: int(rng.integers(len(data) + 1))])
    elif kind == "flip" and data:
        b = bytearray(data)
        for _ in range(int(rng.integers(1, 6))):
            k = int(rng.integers(len(b)))
            b[k] ^= 1 << int(rng.integers(8))
        path.write_bytes(bytes(b))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "garbage":
        path.write_bytes(os.urandom(max(1, len(data))))
    elif kind == "folder":
        path.unlink()
        path.mkdir()
    elif kind == "json" and path.suffix == ".json":
        try:
            doc = json.loads(data)
        except ValueError:
            doc = {}
        mutated, what = mutate_json(doc, rng)
        path.write_text(dumps(mutated))
        return f"{path.name}: {what}"
    elif kind == "delete":
        path.unlink()
    else:                                  # swap with a sibling of the same kind
        others = [p for p in path.parent.iterdir() if p != path and p.is_file() and p.suffix == path.suffix]
        if others:
            other = _pick(rng, sorted(others))
            tmp = path.with_name(path.name + ".swap")
            os.replace(path, tmp)
            os.replace(other, path)
            os.replace(tmp, other)
            return f"{path.name}: swapped with {other.name}"
        path.write_bytes(data[::-1])
    return f"{path.name}: {kind}"


def mutate_program(manifest: dict, arrays: dict, rng) -> tuple[dict, dict, str, bool]:
    """(manifest, arrays, what, re-seal?) of a tampered Program."""
    arrays = dict(arrays)
    kind = int(rng.integers(4))
    reseal = bool(rng.random() < 0.5)
    if kind == 0:
        manifest, what = mutate_json(manifest, rng)
        if not isinstance(manifest, dict):
            manifest = {"format": "torq-program", "version": 2, "steps": manifest}
        return manifest, arrays, f"manifest {what}", reseal
    key = _pick(rng, sorted(arrays))
    a = arrays[key]
    if kind == 1:
        arrays[key] = a.astype(_pick(rng, [np.float64, np.int16, np.uint8, np.int64, np.float32]))
        what = f"array {key} as {arrays[key].dtype}"
    elif kind == 2:
        arrays[key] = a.reshape(-1) if a.ndim != 1 else a[: max(0, a.size - 1)]
        what = f"array {key} reshaped to {arrays[key].shape}"
    else:
        flat = a.reshape(-1).copy()
        if flat.size:
            flat[int(rng.integers(flat.size))] = _pick(rng, [0, -1, 1, 127, -128])
        arrays[key] = flat.reshape(a.shape)
        what = f"array {key}: one value changed"
    return manifest, arrays, what, reseal


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst
