"""``torq-gen-config edit``: change recommended executors or tolerances by hand, then rewrite
``final_report_text`` and the compiler JSON (the report stays the source of truth).

Messages follow the reference tool (``Batch edit: N layer(s) match``, ``Updated
recommended_executor for ...``, ``--list``'s per-layer status table). Each edit is also recorded
as data (``ops[id].edit``) so a later ``discover`` keeps it, and it is applied to the report on
disk under the report lock, so a running discover or run merges it instead of overwriting it.
When only the compiler JSON was shared, ``edit`` changes its assignments directly
(``compiler_json.py``)."""
from __future__ import annotations

import fnmatch
from pathlib import Path

from ..errors import TorqError
from . import compiler_json, schema, store
from . import report_text as T
from .executors import EXECUTOR_ORDER
from .view import is_compiler_json, resolve_report


def match_layers(report: dict, pattern: str) -> list[str]:
    """ALL; a glob (* or ?); an exact id (case-insensitive); else every id containing it."""
    ids = list(report["ops"])
    if pattern.upper() == "ALL":
        return ids
    if any(c in pattern for c in "*?["):
        hits = [i for i in ids if fnmatch.fnmatchcase(i.lower(), pattern.lower())]
    else:
        hits = [i for i in ids if i.lower() == pattern.lower()] or [i for i in ids if pattern.lower() in i.lower()]
    if not hits:
        raise TorqError(f"--layer '{pattern}': No layers match (see 'torq-gen-config edit --list')")
    return hits


def register(sub) -> None:
    p = sub.add_parser("edit", help="set executors / tolerances of layers by hand",
                       description="Edit a discovery report; the compiler JSON is regenerated. With only "
                                   "the compiler JSON in --output-dir, its assignments are edited "
                                   "(--layer LINE:COL, a glob, ALL, or a layer id with --model).")
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


def _executor(args) -> str | None:
    if args.executor is None:
        return None
    executor = args.executor.strip().lower()
    if executor not in (*EXECUTOR_ORDER, *compiler_json.UNASSIGNED, "auto"):
        raise TorqError(f"--executor '{args.executor}': choose from {', '.join(EXECUTOR_ORDER)}, null "
                        "or auto (discover's choice)")
    return executor


def _check_args(args) -> None:
    if not args.layer:
        raise TorqError("edit needs --layer (or --list)")
    if args.executor is None and args.tolerance_avg is None and args.tolerance_max is None:
        raise TorqError("nothing to change: give --executor, --tolerance-avg or --tolerance-max")
    for v, flag in ((args.tolerance_avg, "--tolerance-avg"), (args.tolerance_max, "--tolerance-max")):
        if v is not None and not v >= 0:
            raise TorqError(f"{flag} must be a non-negative number (got {v})")


def list_layers(report: dict, query: str) -> None:
    ops = {lid: op for lid, op in report["ops"].items() if query.lower() in lid.lower()}
    if not ops:
        print(f"No layers match '{query}'.")
        return
    print("\n".join(T.status_table(ops)))
    print(f"\nTotal: {len(ops)} layer(s)" + (f" (filtered from {len(report['ops'])})" if query else ""))


def cmd_edit(args) -> int:
    path = resolve_report(args.config, args.model, args.output_dir)
    if path.name.endswith("_compiler.json") and is_compiler_json(path):
        return _edit_compiler(path, args)
    report = schema.load(path)
    if args.list is not None:
        list_layers(report, args.list)
        return 0
    _check_args(args)
    executor = _executor(args)
    ids = match_layers(report, args.layer)
    if len(ids) > 1:
        print(f"Batch edit: {len(ids)} layer(s) match '{args.layer}'")
    tol = {k: v for k, v in (("fp_avg_tol", args.tolerance_avg), ("fp_max_tol", args.tolerance_max)) if v is not None}
    store.update(path, lambda disk: apply_edit(_same(disk, path), ids, executor, tol), keep_compiler_extras=True)
    what = f"'{ids[0]}'" if len(ids) == 1 else f"{len(ids)} layer(s)"
    if executor is not None:
        print(f"Updated recommended_executor for {what} to '{executor}'")
    if tol:
        print(f"Updated tolerance for {what}")
    print(f"Updated compiler JSON: {schema.compiler_path(path)}")
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
            edit["executor"] = op["recommended_executor"] = None if executor in compiler_json.UNASSIGNED else executor
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


def _edit_compiler(path: Path, args) -> int:
    """Only the compiler JSON: refuse it when its report is next to it (edit the report, which
    regenerates it), else edit its assignments."""
    report = Path(str(path).removesuffix("_compiler.json") + ".json")
    if report.exists():
        raise TorqError(f"{path} is a compiler JSON; edit the report JSON {report} (the compiler JSON is "
                        "regenerated from it)")
    data = compiler_json.load(path)
    if args.list is not None:
        lines = [ln for ln in compiler_json.summary_lines(data) if args.list in ln or not ln.startswith("  ")]
        print("\n".join(lines))
        return 0
    _check_args(args)
    if args.tolerance_avg is not None or args.tolerance_max is not None:
        raise TorqError(f"{path} is a compiler JSON: it holds no tolerances (edit the report JSON)")
    executor = _executor(args)
    if executor == "auto":
        raise TorqError(f"{path} is a compiler JSON: it holds no discover choice to go back to (--executor auto)")
    locs = compiler_json.select(data, args.layer, _ids_to_locations(args, data))
    if len(locs) > 1:
        print(f"Batch edit: {len(locs)} layer(s) match '{args.layer}'")
    compiler_json.edit(path, data, locs, executor)
    print(f"Updated executor for {len(locs)} assignment(s) ({', '.join(locs[:5])}"
          f"{' ...' if len(locs) > 5 else ''}) to '{executor}'")
    print(f"Updated compiler JSON: {path}")
    return 0


def _ids_to_locations(args, data: dict) -> dict | None:
    """Layer id -> LINE:COL of ``--model`` under the compiler JSON's quantization flags."""
    if not args.model or not Path(args.model).is_file():
        return None
    from .run import layer_locations
    return layer_locations(Path(args.model), data.get("quantization"))
