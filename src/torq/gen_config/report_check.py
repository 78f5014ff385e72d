"""What a report (or a cached result) may hold: every field torq reads, by type.

A report is a file anyone can edit, copy from a colleague or receive damaged; a cache entry can
be truncated or planted. Everything that ``discover``, ``run``, ``view`` and ``edit`` read is
checked here first, so a wrong type is a one-line error naming the field (reports) or a cache
miss (results), never an internal error deep in a table or an HTML page.
"""
from __future__ import annotations

import math

from .executors import EXECUTOR_ORDER, REASON_CODES

STATUSES = ("success", "difference", "error")


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _nums(d, keys, optional=()) -> str | None:
    if not isinstance(d, dict):
        return "is not an object"
    for k in keys:
        if k not in d:
            return f"has no {k!r}"
    for k in (*keys, *optional):
        if k in d and not _num(d[k]):
            return f"{k!r} is not a number"
    return None


def result_problem(r, strict: bool = False) -> str | None:
    """Why ``r`` is not an executor result (None: it is one).

    ``strict`` (our own cache): the fields ``discover`` always writes must all be there and agree
    with the status (a difference has max_diff, an error a known reason_code)."""
    if not isinstance(r, dict):
        return "is not an object"
    status = r.get("status")
    if status not in STATUSES:
        return f"status {status!r} is not one of {', '.join(STATUSES)}"
    checks = [("tolerance_used", ("fp_max_tol",) if not strict else ("fp_avg_tol", "fp_max_tol"), ()),
              ("max_diff", (), ("max_abs_diff", "max_rel_diff")), ("timing", ("runtime_ms",), ("runs",))]
    for field, keys, optional in checks:
        if field in r or (strict and field == "tolerance_used"):
            why = _nums(r.get(field), keys, optional)
            if why:
                return f"{field} {why}"
    fr = r.get("failure_report")
    if fr is not None:
        if not isinstance(fr, dict) or not all(isinstance(fr.get(k, ""), str)
                                               for k in ("summary", "reason_code", "type")):
            return "failure_report is not an object of strings"
    if strict:
        if status == "difference" and ("max_diff" not in r or fr is None):
            return "a difference without max_diff"
        if status == "error" and (fr is None or fr.get("reason_code") not in REASON_CODES):
            return "an error without a known reason_code"
        if status == "success" and fr is not None:
            return "a success with a failure_report"
    return None


def report_problem(data: dict) -> str | None:
    """Why ``data`` (a parsed JSON object with an ``ops`` object) is not a usable report, naming
    the field; None when it is one."""
    for k, kind in (("model_name", str), ("final_report_text", str), ("version", str)):
        if k in data and not isinstance(data[k], kind):
            return f"{k!r} is not a {kind.__name__}"
    for k in ("quantization", "discovery_report", "full_model_metrics"):
        if data.get(k) is not None and not isinstance(data[k], dict):
            return f"{k!r} is not an object"
    if "default_tolerance" in data and _nums(data["default_tolerance"], ("fp_max_tol",)):
        return "'default_tolerance' needs a numeric fp_max_tol"
    summary = (data.get("discovery_report") or {}).get("summary")
    if summary is not None and not isinstance(summary, dict):
        return "discovery_report.summary is not an object"
    why = _metrics_problem(data.get("full_model_metrics"))
    if why:
        return f"full_model_metrics {why}"
    for lid, op in data["ops"].items():
        why = _op_problem(op)
        if why:
            return f"ops[{lid!r}] {why}"
    return None


def _op_problem(op) -> str | None:
    if not isinstance(op, dict) or not isinstance(op.get("executors", {}), dict):
        return "must be an object with an 'executors' object"
    rec = op.get("recommended_executor")
    if rec is not None and rec not in EXECUTOR_ORDER:
        return f".recommended_executor is {rec!r}; expected one of {', '.join(EXECUTOR_ORDER)} or null"
    for ex, r in op.get("executors", {}).items():
        why = result_problem(r) if ex in EXECUTOR_ORDER else "is not an executor"
        if why:
            return f".executors[{ex!r}] {why} (executor one of {', '.join(EXECUTOR_ORDER)})"
    for k in ("_node_index", "_orig_index"):
        v = op.get(k)
        if isinstance(v, bool) or (v is not None and not isinstance(v, (int, str))):
            return f".{k} is not an integer"
    if "mlir_location" in op and not isinstance(op["mlir_location"], (str, type(None))):
        return ".mlir_location is not a string"
    if "tolerance_used" in op and _nums(op["tolerance_used"], ("fp_max_tol",), ("fp_avg_tol",)):
        return ".tolerance_used needs numeric fp_avg_tol/fp_max_tol"
    edit = op.get("edit")
    if edit is not None:
        if not isinstance(edit, dict):
            return ".edit is not an object"
        if edit.get("executor") not in (None, *EXECUTOR_ORDER):
            return f".edit.executor is {edit.get('executor')!r}"
        if "tolerance" in edit and _nums(edit["tolerance"], ("fp_max_tol",), ("fp_avg_tol",)):
            return ".edit.tolerance needs numeric fp_avg_tol/fp_max_tol"
    return None


def _metrics_problem(m) -> str | None:
    if m is None:
        return None
    if "max_abs_lsb" in m and not _num(m["max_abs_lsb"]):
        return "max_abs_lsb is not a number"
    hist = m.get("lsb_histogram", {})
    if not isinstance(hist, dict) or not all(_num(v) and not (isinstance(v, float) and math.isnan(v))
                                             for v in hist.values()):
        return "lsb_histogram is not an object of counts"
    for k in ("outputs", "first_divergence"):
        if m.get(k) is not None and not isinstance(m[k], dict):
            return f"{k} is not an object"
    if not isinstance(m.get("segments", []), list):
        return "segments is not a list"
    return None
