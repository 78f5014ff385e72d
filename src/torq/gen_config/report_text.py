"""The report as text, in the reference tool's layout (its users parse and grep these lines).

``final_text`` is the report's ``final_report_text``: header, status counts, first working
executor distribution, critical failures, and one line per layer ending in its recommended
executor (``edit`` rewrites it, so the line follows the edit). ``summary_lines`` is what
``view`` prints above its table, ``layer_lines`` what ``view --layer`` prints. They read only
``ops`` (and ``model_name``), so they work on the reference tool's own reports too.
"""
from __future__ import annotations

from .executors import EXECUTOR_ORDER, REASON_CODES

STATUS_COL = 12      # the reference's fixed status column width
ID_WIDTH = 60        # layer ids are cut to 60 characters in the table
RULE = "=" * 80


def ordered_ops(ops: dict) -> list[tuple[str, dict]]:
    """Layers in model order: by ``_orig_index`` (ours) or ``_node_index`` (the reference's);
    layers without either (or fused, index null) keep their place after the numbered ones."""
    def key(kv):
        for k in ("_orig_index", "_node_index"):
            if isinstance(kv[1].get(k), int):
                return kv[1][k]
        return float("inf")
    return sorted(ops.items(), key=key)


def node_index(op: dict):
    """The layer's node index: ours (``_orig_index``) or the reference's (``_node_index``)."""
    v = op.get("_orig_index", op.get("_node_index"))
    return "N/A" if v is None else v


def status_table(ops: dict) -> list[str]:
    """The reference's "Per-Layer Status" table: NSS / CSS / HOST status and the recommendation."""
    if not ops:
        return ["Per-Layer Status:", "  (no layers)"]
    rows = ordered_ops(ops)
    width = max(len(lid[:ID_WIDTH]) for lid, _ in rows)
    head = " ".join(f"{e.upper():<{STATUS_COL}}" for e in EXECUTOR_ORDER)
    lines = ["Per-Layer Status:", f"  {'Layer':<{width}}  {head} Recommended",
             "-" * (width + STATUS_COL * len(EXECUTOR_ORDER) + 25)]
    for lid, op in rows:
        ex = op.get("executors", {})
        cells = " ".join(f"{ex.get(e, {}).get('status', '-'):<{STATUS_COL}}" for e in EXECUTOR_ORDER)
        lines.append(f"  {lid[:ID_WIDTH]:<{width}}  {cells} {op.get('recommended_executor') or '-'}")
    return lines


def counts(ops: dict) -> dict:
    """Status counts over every executor result, first-success and recommendation per executor,
    layers with no executor, layers whose every tested executor errs (critical)."""
    status = {"success": 0, "difference": 0, "error": 0}
    first = {e: 0 for e in EXECUTOR_ORDER}
    rec = {e: 0 for e in EXECUTOR_ORDER}
    critical, unassigned = [], 0
    for lid, op in ordered_ops(ops):
        ex = op.get("executors", {})
        for r in ex.values():
            status[r.get("status", "error")] = status.get(r.get("status", "error"), 0) + 1
        ok = next((e for e in EXECUTOR_ORDER if ex.get(e, {}).get("status") == "success"), None)
        if ok:
            first[ok] += 1
        r = op.get("recommended_executor")
        if r in rec:
            rec[r] += 1
        else:
            unassigned += 1
        if ex and all(v.get("status") == "error" for v in ex.values()):
            critical.append(lid)
    return {"status_counts": status, "executor_counts": first, "recommended_counts": rec,
            "unassigned": unassigned, "critical": critical}


def mac_share(ops: dict) -> dict | None:
    """MACs per recommended executor and the NSS share, over layers with a known ``mac_count``."""
    known = [op for op in ops.values() if isinstance(op.get("mac_count"), int)]
    if not known:
        return None
    total = sum(op["mac_count"] for op in known)
    by = {e: sum(op["mac_count"] for op in known if op.get("recommended_executor") == e) for e in EXECUTOR_ORDER}
    return {"total": total, "by_executor": by, "nss_share": round(by["nss"] / total, 6) if total else None}


def mac_line(share: dict | None) -> str | None:
    if not share or not share["total"]:
        return None
    return (f"NPU (NSS) share of MACs: {100 * share['nss_share']:.1f}% "
            f"({share['by_executor']['nss']:,} of {share['total']:,})")


def final_text(report: dict) -> str:
    """``final_report_text``: the reference's sections, then ours (recommendations, MAC share)."""
    ops = report.get("ops", {})
    c = counts(ops)
    lines = ["FINAL EXECUTOR DISCOVERY REPORT", "", f"Model: {report.get('model_name', 'unknown')}",
             f"Total layers tested: {len(ops)}", "", "Status Summary:"]
    lines += [f"  {k}: {v}" for k, v in c["status_counts"].items()]
    lines += ["", "First Working Executor Distribution:"]
    lines += [f"  {e.upper()}: {n}" for e, n in c["executor_counts"].items()]
    lines += ["", "Recommended Executors:"]
    lines += [f"  {e.upper()}: {n}" for e, n in c["recommended_counts"].items()]
    lines.append(f"  none: {c['unassigned']}")
    share = mac_line(mac_share(ops))
    if share:
        lines.append(share)
    lines.append("")
    if c["critical"]:
        lines += [f"CRITICAL: {len(c['critical'])} layer(s) with ALL executors ERRORS", ""]
        lines += [f"  - {lid} (node: {ops[lid].get('_node_index')})" for lid in c["critical"]]
    else:
        lines.append("No critical failures - all layers have at least one working executor")
    m = report.get("full_model_metrics")
    if m:
        lines += ["", "Full Model Comparison:",
                  f"  max |Δ| {m.get('max_abs_lsb')} LSB (tolerance {m.get('tolerance_lsb')}): "
                  f"{'PASS' if m.get('passed') else 'FAIL'}"
                  + (" (judged per layer: int16 layers are bounded, not exact)" if m.get("judged") == "per-layer" else "")]
    return "\n".join(lines + [""] + status_table(ops))


def summary_lines(report: dict) -> list[str]:
    """``view``'s header: model, status counts, timing per executor, critical failures."""
    ops = report.get("ops", {})
    c = counts(ops)
    lines = [RULE, f"MODEL: {report.get('model_name', 'unknown')}", RULE, "", "STATUS COUNTS:"]
    lines += [f"  {k}: {v}" for k, v in c["status_counts"].items()]
    timing = timing_summary(ops)
    if timing:
        lines += ["", "TIMING SUMMARY (average runtime):"]
        lines += [f"  {e.upper()}: {t['avg_ms']}ms (min: {t['min_ms']}ms, max: {t['max_ms']}ms, "
                  f"samples: {t['samples']})" for e, t in timing.items()]
    share = mac_line(mac_share(ops))
    if share:
        lines += ["", share]
    lines += ["", f"CRITICAL FAILURES (all executors error): {len(c['critical'])}"]
    lines += [f"  - {lid} (node: {node_index(ops[lid])})" for lid in c["critical"]]
    return lines


def timing_summary(ops: dict) -> dict:
    """avg/min/max runtime per executor over every timed result (3 decimals, as the reference)."""
    times: dict[str, list] = {}
    for op in ops.values():
        for e in EXECUTOR_ORDER:
            t = op.get("executors", {}).get(e, {}).get("timing")
            if t and "runtime_ms" in t:
                times.setdefault(e, []).append(t["runtime_ms"])
    return {e: {"avg_ms": round(sum(v) / len(v), 3), "min_ms": round(min(v), 3), "max_ms": round(max(v), 3),
                "samples": len(v)} for e, v in times.items()}


def tolerance_lines(report: dict) -> list[str]:
    lines = ["DEFAULT TOLERANCE:"]
    lines += [f"  {k}: {v}" for k, v in report.get("default_tolerance", {}).items()]
    return lines


def layer_lines(lid: str, op: dict) -> list[str]:
    """``view --layer``: the reference's layer block, plus our reason codes and MAC count."""
    lines = ["", f"LAYER: {lid}", RULE, "", f"Node Index: {node_index(op)}",
             f"MLIR Location: {op.get('mlir_location', 'N/A')}",
             f"Recommended Executor: {op.get('recommended_executor') or '-'}"]
    if op.get("mac_count") is not None:
        lines.append(f"MACs: {op['mac_count']:,}")
    for key, label in (("precision", "Precision"), ("duplicate_of", "Duplicate of"), ("skipped", "Skipped")):
        if key in op:
            lines.append(f"{label}: {op[key]}")
    if "tolerance_used" in op:
        lines.append(f"Tolerance (edited): {op['tolerance_used']}")
    lines += ["", "Executor Results:"]
    for e in EXECUTOR_ORDER:
        lines += _executor_lines(e, op.get("executors", {}).get(e))
    return lines


def _executor_lines(e: str, r: dict | None) -> list[str]:
    if r is None:
        return ["", f"  [{e.upper()}]: not tested"]
    t = r.get("timing")
    lines = ["", f"  [{e.upper()}]: {r.get('status')}" + (f" ({t['runtime_ms']}ms)" if t else "")]
    if "max_diff" in r:
        lines.append(f"    Max Diff: {r['max_diff']}")
    fr = r.get("failure_report")
    if fr:
        lines.append(f"    Type: {fr.get('type', 'N/A')}")
        if fr.get("reason_code"):
            code = fr["reason_code"]
            lines.append(f"    Reason: {code}" + (f" ({REASON_CODES[code]})" if code in REASON_CODES else ""))
        lines.append(f"    Summary: {fr.get('summary', 'N/A')}")
    if r.get("explained"):
        lines.append(f"    Explained: {r['explained']}")
    if "tolerance_used" in r:
        lines.append(f"    Tolerance: {r['tolerance_used']}")
    if t:
        lines.append(f"    Runtime: {t['runtime_ms']}ms")
        if t.get("runs", 1) > 1:
            lines.append(f"    Runs: {t['runs']}")
    return lines
