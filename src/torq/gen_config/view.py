"""``torq-gen-config view``: the report as a table (layers x executors), one layer's detail, or
one self-contained HTML page (``--html``) with the failure reasons and run's LSB histogram."""
from __future__ import annotations

import argparse
import html
import json
from pathlib import Path

from ..errors import TorqError
from ..fileio import atomic_write_text
from . import schema
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


def print_table(report: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table
    console = console or Console()
    t = Table(title=f"executor map: {report.get('model_name')}")
    mixed = any(op.get("precision", "int8") != "int8" for op in report["ops"].values())   # int16 layers
    for col in ("#", "layer", *(("precision",) if mixed else ()), *EXECUTOR_ORDER, "recommended", "location"):
        t.add_column(col)
    for lid, op in report["ops"].items():
        ex = op.get("executors", {})
        cells = [f"[{_STYLE[ex[e]['status']]}]{_cell(ex[e])}[/]" if e in ex else "-" for e in EXECUTOR_ORDER]
        rec = op.get("recommended_executor") or "[red]null[/]"
        prec = (op.get("precision", "-"),) if mixed else ()
        t.add_row(str(op.get("_orig_index", "")), lid, *prec, *cells, rec, str(op.get("mlir_location", "")))
    console.print(t)
    s = report.get("discovery_report", {}).get("summary", {})
    if s:
        console.print("recommended: " + ", ".join(f"{e} {n}" for e, n in s.get("executor_counts", {}).items())
                      + f" of {s.get('total_layers')} layers")
    m = report.get("full_model_metrics")
    if m:
        console.print(f"full model (run): max |Δ| {m.get('max_abs_lsb')} LSB, within tolerance: {m.get('passed')}")


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
    op = report["ops"][lid]
    lines = [f"{lid}: recommended {op.get('recommended_executor')}, location {op.get('mlir_location')}, "
             f"node {op.get('_orig_index')}" + (f", precision {op['precision']}" if "precision" in op else "")
             + (f", duplicate of {op['duplicate_of']}" if "duplicate_of" in op else "")]
    for ex, r in op.get("executors", {}).items():
        fr = r.get("failure_report")
        why = f" [{fr.get('reason_code')}] {fr.get('summary')}" if fr else ""
        lines.append(f"  {ex}: {r['status']}{why}")
    return "\n".join(lines)


def html_page(report: dict) -> str:
    """One self-contained page: no scripts, no external resources."""
    colour = {"success": "#c8f7c5", "difference": "#fff3b0", "error": "#f7c5c5"}
    rows = []
    for lid, op in report["ops"].items():
        cells = []
        for e in EXECUTOR_ORDER:
            r = op.get("executors", {}).get(e)
            if r is None:
                cells.append("<td>-</td>")
                continue
            fr = r.get("failure_report", {})
            why = f"<div class='why'>[{html.escape(str(fr.get('reason_code', '')))}] " \
                  f"{html.escape(str(fr.get('summary', '')))}</div>" if fr else ""
            cells.append(f"<td class='{r['status']}' style='background:{colour[r['status']]}'>"
                         f"{html.escape(_cell(r))}{why}</td>")
        rows.append(f"<tr><td>{op.get('_orig_index', '')}</td><td>{html.escape(lid)}</td>{''.join(cells)}"
                    f"<td class='rec'>{html.escape(str(op.get('recommended_executor')))}</td>"
                    f"<td>{html.escape(str(op.get('mlir_location', '')))}</td></tr>")
    return _HTML.format(name=html.escape(str(report.get("model_name"))), rows="\n".join(rows),
                        head="".join(f"<th>{e}</th>" for e in EXECUTOR_ORDER),
                        summary=html.escape(report.get("final_report_text", "")),
                        histogram=_histogram(report.get("full_model_metrics")),
                        reasons="".join(f"<li><b>{k}</b>: {html.escape(v)}</li>" for k, v in REASON_CODES.items()))


def _histogram(metrics: dict | None) -> str:
    if not metrics or not metrics.get("lsb_histogram"):
        return "<p id='histogram'>no full-model run yet (torq-gen-config run)</p>"
    hist = metrics["lsb_histogram"]
    top = max(hist.values()) or 1
    bars = "".join(f"<tr><td>{html.escape(k)} LSB</td><td><div class='bar' style='width:{300 * v / top:.0f}px'>"
                   f"</div></td><td>{v}</td></tr>" for k, v in hist.items())
    return (f"<table id='histogram'><caption>full model |Δ| vs ONNX Runtime (max {metrics.get('max_abs_lsb')} LSB, "
            f"{'PASS' if metrics.get('passed') else 'FAIL'})</caption>{bars}</table>")


_HTML = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>torq-gen-config: {name}</title>
<style>body{{font-family:sans-serif}} table{{border-collapse:collapse}} td,th{{border:1px solid #999;
padding:2px 6px;font-size:13px}} .why{{font-size:11px;color:#444}} .bar{{background:#4a7;height:12px}}</style>
</head><body><h1>Executor map: {name}</h1>
<table id="layers"><tr><th>#</th><th>layer</th>{head}<th>recommended</th><th>location</th></tr>
{rows}</table><h2>Full model</h2>{histogram}<h2>Summary</h2><pre>{summary}</pre>
<h2>Reason codes</h2><ul>{reasons}</ul></body></html>
"""


def resolve_report(config: str | None, model: str | None, output_dir: str) -> Path:
    """The report JSON: given explicitly, or torq_gen_config_<model stem>.json in --output-dir."""
    if config:
        return Path(config)
    if model:
        return schema.report_path(output_dir, Path(model).stem)
    found = sorted(p for p in Path(output_dir).glob("torq_gen_config_*.json") if not p.stem.endswith("_compiler"))
    if len(found) != 1:
        raise TorqError(f"pass the report JSON or --model ({len(found)} reports in {output_dir})")
    return found[0]


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
    p.set_defaults(func=cmd_view)


def cmd_view(args) -> int:
    report = schema.load(resolve_report(args.config, args.model, args.output_dir))
    layer = args.layer or args.layer_pos
    if args.html:
        try:
            atomic_write_text(args.html, html_page(report))
        except OSError as e:
            raise TorqError(f"--html {args.html}: cannot write: {e.strerror}") from None
        print(f"view: wrote {args.html}")
    elif layer:
        print(layer_detail(report, layer))
    elif args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0
