"""The compiler JSON on its own: the reference tool's "share only the compiler JSON" workflow.

``torq_gen_config_<stem>_compiler.json`` maps ``LINE:COL`` -> executor. When the report is not
there, ``run`` applies this map as it is, ``view`` shows it and ``edit`` changes assignments in it
(by location, or by layer id when ``--model`` lets us map ids to locations). Our ``quantization``
fingerprint inside it, when present, is still checked; every other key (the reference writes a
``tolerance`` block) is kept as it was.
"""
from __future__ import annotations

import fnmatch
from pathlib import Path

from ..errors import TorqError
from ..fileio import atomic_write_json
from .executors import EXECUTOR_ORDER
from .schema import is_location, read_json

UNASSIGNED = ("null", "none")


def load(path: str | Path) -> dict:
    """Read and check a compiler JSON: ``op_assignments`` of ``LINE:COL`` -> {"executor": ...}."""
    path = Path(path)
    data = read_json(path, "compiler JSON")
    if not isinstance(data, dict) or not isinstance(data.get("op_assignments"), dict):
        raise TorqError(f"{path}: not a compiler JSON (no 'op_assignments' object)")
    for loc, a in data["op_assignments"].items():
        ex = a.get("executor") if isinstance(a, dict) else None
        if not is_location(loc) or ex not in EXECUTOR_ORDER:
            raise TorqError(f"{path}: op_assignments['{loc}'] must map LINE:COL to "
                            f"{{\"executor\": {' | '.join(EXECUTOR_ORDER)}}}")
    return data


def summary_lines(data: dict) -> list[str]:
    """What ``view`` prints for a compiler JSON (the reference's compiler summary)."""
    a = data["op_assignments"]
    lines = ["=" * 60, f"MODEL: {data.get('model_name', 'unknown')}  (compiler format)", "=" * 60, "",
             f"Total assignments: {len(a)}"]
    if a:
        n = {e: sum(1 for v in a.values() if v["executor"] == e) for e in EXECUTOR_ORDER}
        lines += ["", "Executor distribution:"] + [f"  {e.upper()}: {k}" for e, k in n.items() if k]
        lines += ["", "Assignments:"] + [f"  {loc} → {v['executor']}" for loc, v in sorted(a.items(), key=_loc_key)]
    return lines


def _loc_key(item):
    line, col = item[0].split(":")
    return int(line), int(col)


def select(data: dict, pattern: str, id_to_loc: dict | None = None) -> list[str]:
    """Locations matched by ``--layer``: ALL, a LINE:COL, a glob over locations, or a layer id
    (exact, then substring) resolved through ``id_to_loc`` (from the model, when given)."""
    locs = list(data["op_assignments"])
    if pattern.upper() == "ALL":
        return locs
    if is_location(pattern):
        return [pattern]
    if any(c in pattern for c in "*?[") and all(ch.isdigit() or ch in ":*?[]-" for ch in pattern):
        hits = [loc for loc in locs if fnmatch.fnmatchcase(loc, pattern)]
        if hits:
            return hits
    if id_to_loc:
        ids = [i for i in id_to_loc if i.lower() == pattern.lower()] or \
              [i for i in id_to_loc if pattern.lower() in i.lower()]
        found = [id_to_loc[i] for i in ids if id_to_loc[i]]
        if found:
            return found
    how = "" if id_to_loc else " (give --model to edit by layer id)"
    raise TorqError(f"--layer '{pattern}': No layers match in the compiler JSON: use a LINE:COL key, a glob "
                    f"over them or ALL{how}")


def edit(path: Path, data: dict, locations: list[str], executor: str) -> int:
    """Set (or, with null, remove) the executor of each location; returns how many changed."""
    changed = 0
    for loc in locations:
        before = data["op_assignments"].get(loc, {}).get("executor")
        if executor in UNASSIGNED:
            data["op_assignments"].pop(loc, None)
        else:
            data["op_assignments"][loc] = {"executor": executor}
        changed += before != (None if executor in UNASSIGNED else executor)
    try:
        atomic_write_json(path, data)
    except OSError as e:
        raise TorqError(f"{path}: cannot write: {e.strerror}") from None
    return changed
