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
from .report_check import STATUSES, report_problem

VERSION = "1.1"
DEFAULT_TOLERANCE = {"fp_avg_tol": 0.01, "fp_max_tol": 0.01}
_LOC = re.compile(r"^\d+:\d+$")


def report_path(out_dir, stem: str, suffix: str = "") -> Path:
    return Path(out_dir) / f"torq_gen_config_{stem}{suffix}.json"


def compiler_path(report: Path) -> Path:
    return report.with_name(report.stem + "_compiler.json")


def is_location(loc) -> bool:
    """``LINE:COL`` of a torch.operator (anything else -- an op type -- is not in the compiler JSON)."""
    return isinstance(loc, str) and bool(_LOC.match(loc))


def find_report(out_dir, stem: str, suffix: str = "") -> Path | None:
    """``torq_gen_config_<stem><suffix>.json``, else the one report in ``out_dir`` whose
    ``model_name`` is ``stem`` (the reference names a quantized discovery ``..._quant.json``)."""
    exact = report_path(out_dir, stem, suffix)
    if exact.exists() or suffix:
        return exact if exact.exists() else None
    hits = []
    for p in sorted(Path(out_dir).glob(f"torq_gen_config_{stem}*.json")):
        if p.stem.endswith(("_compiler", "_mac_debug")):
            continue
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(data, dict) and "ops" in data and data.get("model_name") == stem:
            hits.append(p)
    return hits[0] if len(hits) == 1 else None


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
    """The op's edited tolerance, else the first executor entry with tolerance_used, else the
    op's, else default_tolerance."""
    op = report["ops"].get(layer_id, {})
    edit = op.get("edit") or {}
    if "tolerance" in edit:
        return edit["tolerance"]
    for e in op.get("executors", {}).values():
        if "tolerance_used" in e:
            return e["tolerance_used"]
    return op.get("tolerance_used") or report.get("default_tolerance", DEFAULT_TOLERANCE)


def compiler_config(report: dict) -> dict:
    """``op_assignments`` for every op with a LINE:COL location and a recommended executor (when
    two ops claim one location, the first one's: ``run`` re-derives the locations of this
    model's layers, and discover lists them first)."""
    assign, claimed = {}, set()
    for op in report["ops"].values():
        loc, ex = op.get("mlir_location"), op.get("recommended_executor")
        if is_location(loc) and loc not in claimed:
            claimed.add(loc)
            if ex:
                assign[loc] = {"executor": ex}
    out = {"op_assignments": assign, "model_name": report.get("model_name", "")}
    if "quantization" in report:
        out["quantization"] = report["quantization"]
    return out


def summarize(report: dict) -> None:
    """Recompute discovery_report, has_critical_failures and final_report_text from ``ops``.

    As the reference tool: ``status_counts`` over every executor result, ``executor_counts`` =
    the first executor (nss -> css -> host) that succeeded per layer. Ours in addition:
    ``recommended_counts`` (what the compiler JSON assigns, edits included) and ``macs``."""
    from . import report_text as T
    ops = report["ops"]
    c = T.counts(ops)
    summary = {"total_layers": len(ops), "status_counts": c["status_counts"],
               "executor_counts": c["executor_counts"], "recommended_counts": c["recommended_counts"]}
    timing = T.timing_summary(ops)
    if timing:
        summary["timing_summary"] = timing
    share = T.mac_share(ops)
    if share:
        summary["macs"] = share
    critical = []
    for lid in c["critical"]:
        op = ops[lid]
        critical.append({"layer_id": lid, "node_index": op.get("_node_index"),
                         "mlir_location": op.get("mlir_location"),
                         "error_details": {e: {"status": r["status"], "report": r.get("failure_report", {})}
                                           for e, r in op["executors"].items()}})
    old = (report.get("discovery_report") or {}).get("summary") or {}
    summary.update({k: old[k] for k in ("computed", "from_cache") if k in old})
    report["discovery_report"] = {"summary": summary, "critical_failures": critical}
    report["has_critical_failures"] = bool(critical)
    report["final_report_text"] = T.final_text(report)


def save(report: dict, path: Path, keep_compiler_extras: bool = False) -> None:
    """Report and its compiler JSON, each written atomically. ``keep_compiler_extras``: keys of
    the existing compiler JSON that we do not write (the reference's ``tolerance``) stay."""
    atomic_write_json(path, report)
    comp = compiler_config(report)
    if keep_compiler_extras and compiler_path(path).exists():
        try:
            old = json.loads(compiler_path(path).read_text())
        except (OSError, ValueError, RecursionError):
            old = {}
        for k, v in (old.items() if isinstance(old, dict) else ()):
            comp.setdefault(k, v)
    atomic_write_json(compiler_path(path), comp)


def read_json(path: Path, what: str):
    """The JSON at ``path`` (a report or a compiler JSON), or a one-line error naming the file for
    damage of any kind: unreadable bytes, bad syntax, a 5,000-digit integer, 100,000 nested arrays."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise TorqError(f"{path}: no such {what} (run 'torq-gen-config discover' first)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TorqError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    except json.JSONDecodeError as e:
        raise TorqError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except (ValueError, RecursionError) as e:
        raise TorqError(f"{path}: not a usable JSON {what} ({type(e).__name__}: {str(e)[:80]})") from None


def load(path: str | Path) -> dict:
    """Read a report JSON, refusing anything that is not one (with the file and the field named)."""
    path = Path(path)
    data = read_json(path, "report")
    if not isinstance(data, dict):
        raise TorqError(f"{path}: not a torq-gen-config report (top level is not an object)")
    if "ops" not in data:
        hint = " (this is a compiler JSON; pass the report JSON)" if "op_assignments" in data else ""
        raise TorqError(f"{path}: not a torq-gen-config report: no 'ops'{hint}")
    if not isinstance(data["ops"], dict):
        raise TorqError(f"{path}: 'ops' must be an object keyed by layer id")
    why = report_problem(data)
    if why:
        raise TorqError(f"{path}: not a valid torq-gen-config report: {why}")
    data.setdefault("default_tolerance", dict(DEFAULT_TOLERANCE))
    data.setdefault("model_name", path.stem.removeprefix("torq_gen_config_"))
    return data
