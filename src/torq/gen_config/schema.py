"""The two JSON files, field for field as the reference tool writes them (research §1.7-1.8).

Report ``torq_gen_config_<stem>.json`` (the source of truth) and compiler
``torq_gen_config_<stem>_compiler.json`` (``op_assignments`` keyed ``LINE:COL``), plus our
``quantization`` fingerprint in both so ``run`` can refuse a map made for another model or
other quantization flags. Every write is atomic.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import TorqError
from ..fileio import atomic_write_json
from .executors import EXECUTOR_ORDER

VERSION = "1.1"
DEFAULT_TOLERANCE = {"fp_avg_tol": 0.01, "fp_max_tol": 0.01}
STATUSES = ("success", "difference", "error")
_LOC = re.compile(r"^\d+:\d+$")


def report_path(out_dir, stem: str, suffix: str = "") -> Path:
    return Path(out_dir) / f"torq_gen_config_{stem}{suffix}.json"


def compiler_path(report: Path) -> Path:
    return report.with_name(report.stem + "_compiler.json")


def new_report(stem: str, quantization: dict) -> dict:
    return {"version": VERSION, "model_name": stem, "default_tolerance": dict(DEFAULT_TOLERANCE),
            "quantization": quantization, "ops": {}, "discovery_report": {},
            "has_critical_failures": False, "final_report_text": ""}


def recommend(executors: dict, by_timing: bool = False) -> str | None:
    """First success in nss -> css -> host, else first difference, else None.
    ``by_timing``: the fastest success (then the fastest difference) among timed executors."""
    order = [e for e in EXECUTOR_ORDER if e in executors]
    for status in ("success", "difference"):
        hits = [e for e in order if executors[e].get("status") == status]
        if by_timing:
            timed = [e for e in hits if "timing" in executors[e]]
            if timed:
                return min(timed, key=lambda e: executors[e]["timing"]["runtime_ms"])
        elif hits:
            return hits[0]
    return None


def tolerance(report: dict, layer_id: str) -> dict:
    """First executor entry with tolerance_used, else the op's, else default_tolerance."""
    op = report["ops"].get(layer_id, {})
    for e in op.get("executors", {}).values():
        if "tolerance_used" in e:
            return e["tolerance_used"]
    return op.get("tolerance_used") or report.get("default_tolerance", DEFAULT_TOLERANCE)


def is_location(value) -> bool:
    """A "LINE:COL" MLIR location (not an op type standing in for a fused layer)."""
    return isinstance(value, str) and bool(_LOC.match(value))


def compiler_config(report: dict) -> dict:
    """``op_assignments`` for every op with a LINE:COL location and a recommended executor."""
    assign = {}
    for op in report["ops"].values():
        loc, ex = op.get("mlir_location"), op.get("recommended_executor")
        if isinstance(loc, str) and _LOC.match(loc) and ex:
            assign[loc] = {"executor": ex}
    out = {"op_assignments": assign, "model_name": report.get("model_name", "")}
    if "quantization" in report:
        out["quantization"] = report["quantization"]
    return out


def summarize(report: dict) -> None:
    """Recompute discovery_report, has_critical_failures and final_report_text from ``ops``."""
    ops = report["ops"]
    status_counts = {s: 0 for s in STATUSES}
    exec_counts = {e: 0 for e in EXECUTOR_ORDER}
    timing: dict[str, list] = {}
    critical = []
    for lid, op in ops.items():
        for ex, r in op.get("executors", {}).items():
            status_counts[r.get("status", "error")] = status_counts.get(r.get("status", "error"), 0) + 1
            if "timing" in r:
                timing.setdefault(ex, []).append(r["timing"]["runtime_ms"])
        rec = op.get("recommended_executor")
        if rec in exec_counts:
            exec_counts[rec] += 1
        execs = op.get("executors", {})
        if execs and all(r.get("status") == "error" for r in execs.values()):
            critical.append({"layer_id": lid, "node_index": op.get("_node_index"),
                             "mlir_location": op.get("mlir_location"),
                             "error_details": {e: {"status": r["status"], "report": r.get("failure_report", {})}
                                               for e, r in execs.items()}})
    summary = {"total_layers": len(ops), "status_counts": status_counts, "executor_counts": exec_counts}
    if timing:
        summary["timing_summary"] = {e: {"avg_ms": round(sum(v) / len(v), 3), "min_ms": round(min(v), 3),
                                         "max_ms": round(max(v), 3), "samples": len(v)} for e, v in timing.items()}
    report["discovery_report"] = {"summary": summary, "critical_failures": critical}
    report["has_critical_failures"] = bool(critical)
    report["final_report_text"] = final_text(report)


def final_text(report: dict) -> str:
    s = report["discovery_report"]["summary"]
    lines = ["FINAL EXECUTOR DISCOVERY REPORT", "=" * 31, f"Model: {report.get('model_name')}",
             f"Total layers: {s['total_layers']}",
             "Recommended executors: " + ", ".join(f"{e}={n}" for e, n in s["executor_counts"].items()),
             "Statuses: " + ", ".join(f"{k}={v}" for k, v in s["status_counts"].items())]
    unassigned = [lid for lid, op in report["ops"].items() if not op.get("recommended_executor")]
    if unassigned:
        lines.append(f"No executor ({len(unassigned)}): " + ", ".join(unassigned[:20])
                     + (" ..." if len(unassigned) > 20 else ""))
    for c in report["discovery_report"]["critical_failures"]:
        lines.append(f"CRITICAL {c['layer_id']}: " + "; ".join(
            f"{e}: {d['report'].get('summary', '')[:120]}" for e, d in c["error_details"].items()))
    return "\n".join(lines)


def save(report: dict, path: Path) -> None:
    """Report and its compiler JSON, each written atomically."""
    atomic_write_json(path, report)
    atomic_write_json(compiler_path(path), compiler_config(report))


def load(path: str | Path) -> dict:
    """Read a report JSON, refusing anything that is not one (with the file and the field named)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise TorqError(f"{path}: no such report (run 'torq-gen-config discover' first)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TorqError(f"{path}: cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise TorqError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(data, dict):
        raise TorqError(f"{path}: not a torq-gen-config report (top level is not an object)")
    if "ops" not in data:
        hint = " (this is a compiler JSON; pass the report JSON)" if "op_assignments" in data else ""
        raise TorqError(f"{path}: not a torq-gen-config report: no 'ops'{hint}")
    if not isinstance(data["ops"], dict):
        raise TorqError(f"{path}: 'ops' must be an object keyed by layer id")
    for lid, op in data["ops"].items():
        if not isinstance(op, dict) or not isinstance(op.get("executors", {}), dict):
            raise TorqError(f"{path}: ops['{lid}'] must be an object with an 'executors' object")
        rec = op.get("recommended_executor")
        if rec is not None and rec not in EXECUTOR_ORDER:
            raise TorqError(f"{path}: ops['{lid}'].recommended_executor is '{rec}'; "
                            f"expected one of {', '.join(EXECUTOR_ORDER)} or null")
        for ex, r in op.get("executors", {}).items():
            if ex not in EXECUTOR_ORDER or not isinstance(r, dict) or r.get("status") not in STATUSES:
                raise TorqError(f"{path}: ops['{lid}'].executors['{ex}'] is not a valid result "
                                f"(executor one of {', '.join(EXECUTOR_ORDER)}, status one of "
                                f"{', '.join(STATUSES)})")
    data.setdefault("default_tolerance", dict(DEFAULT_TOLERANCE))
    data.setdefault("model_name", path.stem.removeprefix("torq_gen_config_"))
    return data
