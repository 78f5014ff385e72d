"""Why an op stays off the NSS, told root cause first.

Every op left after lowering that is neither torq_hl nor data movement is an `Unsupported`: the
linalg op and its LINE:COL, the ONNX node (op type and name) it came from, and the reason the
closest rule gave (a pattern's `check` string). A Quantize/DequantizeLinear that stays, or a
further linalg op of a node already refused, is a *consequence* (it only feeds or follows an op
that is off the NSS); the report lists causes first, and `summary` names the first cause and
counts the rest.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import linalg_view as L

QDQ = ("QuantizeLinear", "DequantizeLinear")

# ONNX ops ORT runs in float between DQ and Q whose result is no function of one int8 value, a
# per-channel affine or an integer accumulation: no exact integer form. The NSS runs them as bf16
# islands (lowering.py) unless islands are off; then these texts say why they stay off the NSS.
NO_INTEGER_FORM = {
    "LayerNormalization": "LayerNorm divides by the square root of a per-position variance over the "
                          "channels (a float reduction of the activations): no exact integer form on the NSS",
    "Softmax": "ORT runs it as QLinearSoftmax: an exp lookup table summed along each row, every entry "
               "then divided by its row's sum in float32; the NSS has no divider, so no exact integer form",
    "LogSoftmax": "x - max - log(sum(exp(x - max))) along each row in float32: a float reduction of the "
                  "activations, no exact integer form on the NSS",
    "ReduceL2": "the square root of a float sum of squares: no exact integer form on the NSS",
}


@dataclass
class Unsupported:
    op: str                   # the linalg op left
    location: str             # its LINE:COL in the imported (torch_onnx) MLIR
    why: str
    onnx_op: str = ""         # the ONNX node it came from: op type ...
    node: str = ""            # ... and name (its first output when unnamed)
    consequence: bool = False  # stays because another op is off the NSS: a Q/DQ beside it, or a
    #                            second linalg op of an ONNX node whose first one is refused
    stated: bool = False      # a lowering rule said why (a pattern's check), not a default text

    def rank(self) -> tuple:
        """Sort key: root causes first, those a rule explained before default texts."""
        return (self.consequence, not self.stated)

    @property
    def reason(self) -> str:
        return f"{self.onnx_op}: {self.why}" if self.onnx_op else self.why

    def __str__(self):
        where = f"{self.onnx_op} '{self.node}'" if self.node else self.onnx_op
        return f"not supported on NSS: {self.op} at {self.location}: " + (f"{where}: {self.why}" if where else self.why)


@dataclass
class LoweringReport:
    lowered: dict = field(default_factory=dict)        # torq_hl op name -> count
    unsupported: list = field(default_factory=list)    # [Unsupported], causes first
    islands: dict = field(default_factory=dict)        # LINE:COL -> ONNX op lowered as a bf16 island

    def islands_line(self) -> str:
        """"2 ops in bf16 (no integer form): Softmax ×1, LayerNormalization ×1" ('' without islands)."""
        if not self.islands:
            return ""
        counts: dict = {}
        for op in self.islands.values():
            counts[op] = counts.get(op, 0) + 1
        return f"{len(self.islands)} op{'s' * (len(self.islands) > 1)} in bf16 (no integer form): " + \
            ", ".join(f"{k} ×{v}" for k, v in sorted(counts.items()))


def summary(unsupported: list) -> str:
    """The first root cause, then how many more causes and consequences there are."""
    if not unsupported:
        return ""
    ordered = sorted(unsupported, key=Unsupported.rank)
    causes = sum(1 for u in ordered if not u.consequence)
    more = [f"{causes - 1} more op(s) without a pattern"] if causes > 1 else []
    if len(ordered) > causes:
        more.append(f"{len(ordered) - causes} op(s) that follow from {'them' if causes > 1 else 'it'}")
    return str(ordered[0]) + (f" (and {', '.join(more)})" if more else "")


def collect(ops, ctx, runs_on_nss) -> LoweringReport:
    """The report of a lowered function body: torq_hl op counts, and the reason of each op
    ``runs_on_nss`` (the ISA's predicate) refuses."""
    rep = LoweringReport()
    for op in ops:
        name = op.name
        if name.startswith("torq_hl."):
            key = name.split(".", 1)[1]
            rep.lowered[key] = rep.lowered.get(key, 0) + 1
        elif not runs_on_nss(name):
            rep.unsupported.append(_unsupported(ctx, op))
    cause = {}      # per location: the op a rule explained, else the first one (the rest follow from it)
    for u in rep.unsupported:
        if not u.consequence and (u.location not in cause or (u.stated and not cause[u.location].stated)):
            cause[u.location] = u
    for u in rep.unsupported:
        u.consequence |= cause.get(u.location) is not u
    rep.unsupported.sort(key=Unsupported.rank)
    if ctx is not None and ctx.islands:
        off = {u.location for u in rep.unsupported}
        rep.islands = {loc: ctx.onnx_ops[loc] for op in ops if op.name.startswith("torq_hl.")
                       for loc in [L.location_key(op)] if loc in ctx.islands and loc not in off}
    return rep


def _unsupported(ctx, op) -> Unsupported:
    stated = ctx.reason(op) if ctx else None
    why = stated or _default_reason(op.name)
    onnx_op = ctx.onnx_op(op) if ctx else ""
    islands = getattr(ctx, "islands", False)   # a set: islands on; None: a bf16 model (no islands)
    if onnx_op in NO_INTEGER_FORM and islands is False:
        why = NO_INTEGER_FORM[onnx_op] + " (bf16 islands are off)"
    elif onnx_op in NO_INTEGER_FORM and islands is not None and L.location_key(op) in islands:
        why = f"bf16 island: {why}"           # the float rule's reason: the root cause
    elif onnx_op in NO_INTEGER_FORM and islands is not None:
        why = NO_INTEGER_FORM[onnx_op] + " (no bf16 island: it must read dequantized int8 and feed a QuantizeLinear)"
    elif ctx and onnx_op in QDQ:
        why = _constant_for(ctx, op) or why
    node = ctx.onnx_name(op) if ctx else ""
    return Unsupported(op.name, L.location_key(op), why, onnx_op, node, onnx_op in QDQ, bool(stated))


def _constant_for(ctx, op) -> str | None:
    """Why a Q/DQ of a constant stayed: it only feeds ops that are themselves off the NSS (e.g.
    LayerNorm's int32 bias), so the reason is theirs."""
    g = ctx.generic(op)
    if g is None or g.var_inputs:
        return None
    readers = sorted({ctx.onnx_op(u.owner) or u.owner.name for r in op.results for u in r.uses})
    if not readers:
        return None
    why = f"a constant (weight or bias) read only by {', '.join(readers)}, which runs off the NSS"
    return why + (f" ({NO_INTEGER_FORM[readers[0]]})" if len(readers) == 1 and readers[0] in NO_INTEGER_FORM else "")


def _default_reason(name: str) -> str:
    if name == "linalg.generic":
        return "no torq_hl pattern for this elementwise computation"
    return "no torq_hl pattern for this op"
