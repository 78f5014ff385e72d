"""Discover's per-layer verdicts against the whole-model compile.

Each layer discover tests is cut from the graph the whole-model compile sees and quantized with
the same recipe, so its NSS verdict should be the whole model's for that op: the layers discover
puts off the NSS are exactly the ops the whole-model compile refuses. A layer ORT fused into
another op (its ``mlir_location`` is an op type, not ``LINE:COL``) is no op of the whole model —
``run`` runs it inside the op it joined — and is not compared; nor are folded constants and
``--skip-ops`` layers.
"""
from __future__ import annotations

__all__ = ["whole_model_refusals", "disagreements"]


def whole_model_refusals(lowering_report) -> dict[str, object]:
    """``LINE:COL`` -> ``Unsupported`` of every root cause a whole-model compile refused
    (``torq.compile(q).report``)."""
    return {u.location: u for u in lowering_report.unsupported if not u.consequence}


def _compared(op: dict) -> bool:
    loc = str(op.get("mlir_location") or "")
    return ":" in loc and not op.get("skipped")


def disagreements(report: dict, refused) -> list[str]:
    """Layer ids of ``report`` (discover's) judged apart from the whole model: ``-id`` put off the
    NSS by discover but lowered whole, ``+id`` kept on the NSS by discover but refused whole."""
    off = {lid for lid, op in report["ops"].items() if _compared(op) and op.get("recommended_executor") != "nss"}
    whole = {lid for lid, op in report["ops"].items() if _compared(op) and op.get("mlir_location") in refused}
    return sorted(f"-{lid}" for lid in off - whole) + sorted(f"+{lid}" for lid in whole - off)
