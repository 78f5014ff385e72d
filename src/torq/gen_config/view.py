"""``torq-gen-config view``: the report as a table (layers x executors), one layer's detail, or
one self-contained HTML page (``--html``) with the failure reasons and run's LSB histogram.

The text around the table follows the reference tool's viewer (``MODEL:``, ``STATUS COUNTS:``,
``TIMING SUMMARY``, ``LAYER:``, ``Executor Results:``); a compiler JSON alone is shown as its
assignments. Reference reports (no fingerprint, no reason codes) are shown as they are."""
from __future__ import annotations

import argparse
import html
import json
import sys
from pathlib import Path

from ..errors import TorqError
from ..fileio import atomic_write_text, refuse_overwrite
from . import compiler_json, schema
from . import report_text as T
from .executors import EXECUTOR_ORDER, REASON_CODES

_STYLE = {"success": "green", "difference": "yellow", "error": "red"}


def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    text = r["status"]
    if "max_diff" in r:
        text += f" ({r['max_diff']['max_abs_diff']:g})"
    if "timing" in r:
        text += f" {r['timing']['runtime_ms']:.2f}ms"
    return text


def layer_counts(report: dict) -> dict:
    """discover's layers by how the whole model holds them: ops of their own, fused into the op
    before them (a Relu into its Conv: no MLIR location of their own), folded constants."""
    ops = list(report["ops"].values())
    n_folded = sum(1 for op in ops if folded(op))
    fused = sum(1 for op in ops if not folded(op) and not schema.is_location(op.get("mlir_location")))
    return {"layers": len(ops), "ops": len(ops) - n_folded - fused, "fused": fused, "folded": n_folded}


def folded(op: dict) -> bool:
    """A layer of constant shape arithmetic, computed at compile time (no executor runs it)."""
    return str(op.get("skipped", "")).startswith("constant")


def _folded_note(report: dict, show_all: bool) -> str:
    n = sum(1 for op in report["ops"].values() if folded(op))
    return f"folded: {n} (constant shape arithmetic computed at compile time" + \
        ("" if show_all else "; --all lists them") + ")" if n else ""


def print_table(report: dict, console=None, show_all: bool = False) -> None:
    """Layers x executors; layer ids whole (a pipe gets the table's full width, ids copy into
    ``edit``); folded constants counted apart unless ``show_all``. Names from the model are data:
    escaped, never read as rich markup."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    console = console or Console(width=None if sys.stdout.isatty() else 100_000)
    t = Table(title=f"executor map: {escape(str(report.get('model_name')))}")
    mixed = any(op.get("precision", "int8") != "int8" for op in report["ops"].values())   # int16 layers
    for col in ("#", "layer", *(("precision",) if mixed else ()), *EXECUTOR_ORDER, "recommended", "location"):
        t.add_column(col, overflow="fold")
    for lid, op in report["ops"].items():
        if folded(op) and not show_all:
            continue
        ex = op.get("executors", {})
        cells = [f"[{_STYLE[ex[e]['status']]}]{escape(_cell(ex[e]))}[/]" if e in ex else "-" for e in EXECUTOR_ORDER]
        rec = op.get("recommended_executor") or "[red]null[/]"
        if "executor" in (op.get("edit") or {}):
            rec += " (edited)"
        prec = (escape(str(op.get("precision", "-"))),) if mixed else ()
        t.add_row(escape(str(T.node_index(op))), escape(lid), *prec, *cells, rec,
                  escape(str(op.get("mlir_location", ""))))
    console.print(t)
    if _folded_note(report, show_all):
        console.print(_folded_note(report, show_all))
    c = T.counts(report["ops"])
    n_folded = sum(1 for op in report["ops"].values() if folded(op))
    console.print("recommended: " + ", ".join(f"{e} {n}" for e, n in c["recommended_counts"].items())
                  + f" of {len(report['ops']) - n_folded} layers" + (f" (+ {n_folded} folded)" if n_folded else ""))
    m = report.get("full_model_metrics")
    if m:
        stale = " (stale: the map changed since; run again)" if m.get("stale") else ""
        verdict = f"judged per layer (int16): {m.get('passed')}" if m.get("judged") == "per-layer" else \
            f"within tolerance: {m.get('passed')}"
        console.print(escape(f"full model (run): max |Δ| {m.get('max_abs_lsb')} LSB, {verdict}{stale}"))


def find_layer(report: dict, name: str) -> str:
    if name in report["ops"]:
        return name
    hits = [lid for lid in report["ops"] if name.lower() in lid.lower()]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise TorqError(f"no layer matches '{name}' (see 'torq-gen-config view' for the layer ids)")
    raise TorqError(f"'{name}' matches {len(hits)} layers ({', '.join(hits[:5])}...); be more specific")


def layer_detail(report: dict, name: str) -> str:
    lid = find_layer(report, name)
    return "\n".join(T.layer_lines(lid, report["ops"][lid]))


def html_page(report: dict, show_all: bool = False) -> str:
    """One self-contained page: no scripts, no external resources (folded constants counted in
    the summary unless ``show_all``)."""
    colour = {"success": "#c8f7c5", "difference": "#fff3b0", "error": "#f7c5c5"}
    rows = []
    for lid, op in report["ops"].items():
        if folded(op) and not show_all:
            continue
        cells = []
        for e in EXECUTOR_ORDER:
            r = op.get("executors", {}).get(e)
            if r is None:
                cells.append("<td>-</td>")
                continue
            fr = r.get("failure_report", {})
            code = f"[{html.escape(fr['reason_code'])}] " if fr.get("reason_code") else ""
            why = f"<div class='why'>{code}{html.escape(str(fr.get('summary', '')))}</div>" if fr else ""
            cells.append(f"<td class='{r['status']}' style='background:{colour[r['status']]}'>"
                         f"{html.escape(_cell(r))}{why}</td>")
        rows.append(f"<tr><td>{html.escape(str(T.node_index(op)))}</td><td>{html.escape(lid)}</td>"
                    f"{''.join(cells)}"
                    f"<td class='rec'>{html.escape(str(op.get('recommended_executor')))}</td>"
                    f"<td>{html.escape(str(op.get('mlir_location', '')))}</td></tr>")
    return _HTML.format(name=html.escape(str(report.get("model_name"))), rows="\n".join(rows),
                        head="".join(f"<th>{e}</th>" for e in EXECUTOR_ORDER),
                        summary=html.escape(str(report.get("final_report_text", "")) + "\n"
                                            + _folded_note(report, show_all)),
                        histogram=_histogram(report.get("full_model_metrics")),
                        reasons="".join(f"<li><b>{k}</b>: {html.escape(v)}</li>" for k, v in REASON_CODES.items()))


def _histogram(metrics: dict | None) -> str:
    if not metrics or not metrics.get("lsb_histogram"):
        return "<p id='histogram'>no full-model run yet (torq-gen-config run)</p>"
    hist = metrics["lsb_histogram"]
    top = max(hist.values()) or 1
    bars = "".join(f"<tr><td>{html.escape(str(k))} LSB</td><td><div class='bar' "
                   f"style='width:{300 * max(0, v) / top:.0f}px'></div></td><td>{html.escape(str(v))}</td></tr>"
                   for k, v in hist.items())
    stale = " stale: the map changed since this run" if metrics.get("stale") else ""
    return (f"<table id='histogram'><caption>full model |Δ| vs ONNX Runtime (max "
            f"{html.escape(str(metrics.get('max_abs_lsb')))} LSB, "
            f"{'PASS' if metrics.get('passed') else 'FAIL'}{stale})</caption>{bars}</table>")


_HTML = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>torq-gen-config: {name}</title>
<style>body{{font-family:sans-serif}} table{{border-collapse:collapse}} td,th{{border:1px solid #999;
padding:2px 6px;font-size:13px}} .why{{font-size:11px;color:#444}} .bar{{background:#4a7;height:12px}}</style>
</head><body><h1>Executor map: {name}</h1>
<table id="layers"><tr><th>#</th><th>layer</th>{head}<th>recommended</th><th>location</th></tr>
{rows}</table><h2>Full model</h2>{histogram}<h2>Summary</h2><pre>{summary}</pre>
<h2>Reason codes</h2><ul>{reasons}</ul></body></html>
"""


def resolve_report(config: str | None, model: str | None, output_dir: str) -> Path:
    """The JSON to show or edit: given explicitly; else for ``--model`` the report in
    ``--output-dir`` (or, when only that was shared, its compiler JSON); else the one report there."""
    if config:
        return Path(config)
    out = Path(output_dir or ".")
    if model:
        stem = Path(model).stem
        found = schema.find_report(out, stem)
        if found is not None:
            return found
        only_compiler = schema.compiler_path(schema.report_path(out, stem))
        if only_compiler.exists():
            return only_compiler
        raise TorqError(f"no report or compiler JSON for {stem} in {out} (torq_gen_config_{stem}.json; "
                        "run 'torq-gen-config discover' first)")
    found = sorted(p for p in out.glob("torq_gen_config_*.json") if not p.stem.endswith(("_compiler", "_mac_debug")))
    if len(found) != 1:
        raise TorqError(f"pass the report JSON or --model ({len(found)} reports in {out})")
    return found[0]


def is_compiler_json(path: Path) -> bool:
    """A JSON with ``op_assignments`` and no ``ops`` (read errors are left to the loaders)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and "op_assignments" in data and "ops" not in data


def register(sub) -> None:
    p = sub.add_parser("view", help="show a discovery report (table, one layer, or --html page)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Show torq_gen_config_<stem>.json as a table of layers x executors.")
    p.add_argument("config", nargs="?", help="report JSON (default: from --model / --output-dir)")
    p.add_argument("layer_pos", nargs="?", metavar="LAYER", help="same as --layer")
    p.add_argument("--model", "-m", help="model whose report to show")
    p.add_argument("--output-dir", default=".", help="folder of the report (default: current)")
    p.add_argument("--layer", help="one layer's detail incl. failure reasons (exact id or substring)")
    p.add_argument("--html", metavar="OUT.html", help="write the table as one self-contained HTML page")
    p.add_argument("--json", action="store_true", help="print the report JSON")
    p.add_argument("--all", action="store_true", dest="show_all",
                   help="also list the folded constants (shape arithmetic computed at compile time)")
    p.set_defaults(func=cmd_view)


def cmd_view(args) -> int:
    path = resolve_report(args.config, args.model, args.output_dir)
    if is_compiler_json(path):
        print("\n".join(compiler_json.summary_lines(compiler_json.load(path))))
        return 0
    report = schema.load(path)
    layer = args.layer or args.layer_pos
    if args.html:
        refuse_overwrite(args.html, "--html", {"report": path, "compiler JSON": schema.compiler_path(path),
                                               "--model": args.model})
        try:
            atomic_write_text(args.html, html_page(report, args.show_all))
        except OSError as e:
            raise TorqError(f"--html {args.html}: cannot write: {e.strerror}") from None
        print(f"view: wrote {args.html}")
    elif layer:
        print(layer_detail(report, layer))
    elif args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(T.summary_lines(report) + [""]))
        print_table(report, show_all=args.show_all)
        print("\n".join(["", *T.tolerance_lines(report), "", T.RULE]))
    return 0
