"""``torq-gen-config edit``: change recommended executors or tolerances by hand, then rewrite
``final_report_text`` and the compiler JSON (the report stays the source of truth).

Each edit is also recorded as data (``ops[id].edit``) so a later ``discover`` keeps it, and it
is applied to the report on disk under the report lock, so a running discover or run merges it
instead of overwriting it."""
from __future__ import annotations

import fnmatch

from ..errors import TorqError
from . import schema, store
from .executors import EXECUTOR_ORDER
from .view import resolve_report


def match_layers(report: dict, pattern: str) -> list[str]:
    """ALL; a glob (* or ?); an exact id (case-insensitive); else every id containing it."""
    ids = list(report["ops"])
    if pattern == "ALL":
        return ids
    if any(c in pattern for c in "*?["):
        hits = [i for i in ids if fnmatch.fnmatchcase(i, pattern)]
    else:
        hits = [i for i in ids if i.lower() == pattern.lower()] or [i for i in ids if pattern.lower() in i.lower()]
    if not hits:
        raise TorqError(f"--layer '{pattern}': no layer matches (see 'torq-gen-config edit --list')")
    return hits


def register(sub) -> None:
    p = sub.add_parser("edit", help="set executors / tolerances of layers by hand",
                       description="Edit a discovery report; the compiler JSON is regenerated.")
    p.add_argument("config", nargs="?", help="report JSON (default: from --model / --output-dir)")
    p.add_argument("--model", "-m", help="model whose report to edit")
    p.add_argument("--output-dir", default=".", help="folder of the report (default: current)")
    p.add_argument("--layer", help="exact id, substring, glob (* ?) or ALL")
    p.add_argument("--executor", help="nss|css|host|null, or auto to undo an edit (discover's choice); "
                                      "an edit is kept by later discovers")
    p.add_argument("--tolerance-avg", type=float, metavar="T", help="set fp_avg_tol of the layers")
    p.add_argument("--tolerance-max", type=float, metavar="T", help="set fp_max_tol of the layers")
    p.add_argument("--list", nargs="?", const="", metavar="FILTER", help="list layer ids (optionally filtered)")
    p.set_defaults(func=cmd_edit)


def cmd_edit(args) -> int:
    path = resolve_report(args.config, args.model, args.output_dir)
    report = schema.load(path)
    if args.list is not None:
        for lid in report["ops"]:
            if args.list.lower() in lid.lower():
                print(f"{lid}\t{report['ops'][lid].get('recommended_executor')}")
        return 0
    if not args.layer:
        raise TorqError("edit needs --layer (or --list)")
    if args.executor is None and args.tolerance_avg is None and args.tolerance_max is None:
        raise TorqError("nothing to change: give --executor, --tolerance-avg or --tolerance-max")
    executor = None
    if args.executor is not None:
        executor = args.executor.strip().lower()
        if executor not in (*EXECUTOR_ORDER, "null", "none", "auto"):
            raise TorqError(f"--executor '{args.executor}': choose from {', '.join(EXECUTOR_ORDER)}, null "
                            "or auto (discover's choice)")
    for v, flag in ((args.tolerance_avg, "--tolerance-avg"), (args.tolerance_max, "--tolerance-max")):
        if v is not None and not v >= 0:
            raise TorqError(f"{flag} must be a non-negative number (got {v})")
    ids = match_layers(report, args.layer)
    tol = {k: v for k, v in (("fp_avg_tol", args.tolerance_avg), ("fp_max_tol", args.tolerance_max)) if v is not None}
    report = store.update(path, lambda disk: apply_edit(_same(disk, path), ids, executor, tol))
    print(f"edit: {len(ids)} layer(s) changed in {path}; regenerated {schema.compiler_path(path)}")
    return 0


def _same(disk: dict | None, path) -> dict:
    if disk is None:
        raise TorqError(f"{path}: the report disappeared while editing it")
    return disk


def apply_edit(report: dict, ids: list[str], executor: str | None, tol: dict) -> dict:
    """Set the layers' executor (``auto``: back to discover's choice) and tolerance, and record
    both in ``ops[id].edit``, where a later discover finds and keeps them."""
    for lid in ids:
        op = report["ops"].get(lid)
        if op is None:
            continue                     # removed by a concurrent discover of another model
        edit = dict(op.get("edit") or {})
        if executor == "auto":
            edit.pop("executor", None)
            op["recommended_executor"] = schema.recommend(op.get("executors", {}))
        elif executor is not None:
            edit["executor"] = op["recommended_executor"] = None if executor in ("null", "none") else executor
        if tol:
            new = dict(schema.tolerance(report, lid), **tol)
            edit["tolerance"] = op["tolerance_used"] = new
            for r in op.get("executors", {}).values():
                r.pop("tolerance_used", None)
        if edit:
            op["edit"] = edit
        else:
            op.pop("edit", None)
    schema.summarize(report)
    return report
