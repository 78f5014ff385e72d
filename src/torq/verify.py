"""Prove a compiled model against ONNX Runtime: compile -> Program -> NSS vs ORT.

Per output |Δ| in LSB, and per rescaling op how the native NPU rounding differs from ORT's on
the very same inputs, and why (tie / near-tie / other). A bf16 island (an op with no integer
form, run in bf16 between the Q/DQ fallbacks) is judged where it meets the int8 ops: its int8
result against ORT's from ORT's inputs, within its tolerance (``numerics.island_beyond``); that
run hands ORT's island results on, so every int8 op is still held bit-exact (``ort``) to ORT.
May import: torq.reference, torq.runtime, torq.graph, torq.numerics.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import numerics, reference
from .graph.inputs import random_inputs
from .runtime.nss import Simulator


@dataclass
class OutputDiff:
    name: str
    mode: str
    size: int
    differ: int
    max_lsb: float          # integer outputs: LSB; float outputs: absolute difference
    unit: str = "LSB"

    @property
    def exact(self) -> bool:
        return self.differ == 0


def output_diff(name: str, mode: str, ours: np.ndarray, ref: np.ndarray) -> OutputDiff:
    if ours.shape != ref.shape:
        raise ValueError(f"output {name}: shape {ours.shape} != reference {ref.shape}")
    if np.issubdtype(ref.dtype, np.integer):
        d = np.abs(ours.astype(np.int64) - ref.astype(np.int64))
        return OutputDiff(name, mode, int(d.size), int((d > 0).sum()), float(d.max(initial=0)))
    # float outputs (models without full-integer I/O): bitwise equality, and the largest |Δ|
    ours32, ref32 = ours.astype(np.float32), ref.astype(np.float32)
    differ = int((ours32.view(np.int32) != ref32.view(np.int32)).sum())
    return OutputDiff(name, mode, int(ref.size), differ, float(np.abs(ours32 - ref32).max(initial=0)), "abs")


def sum_causes(op_diffs) -> dict:
    total = {"tie": 0, "near-tie": 0, "float": 0, "overflow": 0, "other": 0}
    for od in op_diffs:
        for k, v in od.causes.items():
            total[k] = total.get(k, 0) + v
    return total


ISLAND_TOL = numerics.BF16_ISLAND_TOL      # (why these values: numerics/bf16.py)


@dataclass
class IslandDiff:
    """A bf16 island's int8 result, computed from ORT's own int8 inputs, against ORT's result."""
    op: str
    node: str
    location: str
    mode: str
    size: int
    differ: int
    max_lsb: int
    beyond: int = 0                 # elements beyond the tolerance (numerics.island_beyond)

    @property
    def ok(self) -> bool:
        return self.beyond == 0

    def __str__(self):
        return (f"bf16 island {self.op} '{self.node}' at {self.location} ({self.mode}): {self.differ} of {self.size} "
                f"elements differ from ORT, max {self.max_lsb} LSB; {self.beyond} beyond the tolerance "
                f"({island_tolerance(self.mode)})")


def island_tolerance(mode: str) -> str:
    tol = f"≤{ISLAND_TOL[mode]} LSB"
    return tol + (f" or within {numerics.BF16_ISLAND_REL:g} of |a|+|b|" if mode == "native" else "")


@dataclass
class VerifyResult:
    outputs: list = field(default_factory=list)     # [OutputDiff]
    op_diffs: list = field(default_factory=list)    # [nss.OpDiff] per-op checks of every run (each mode)
    lowered: dict = field(default_factory=dict)
    modes: tuple = ()
    ort_kernels: dict = field(default_factory=dict)   # what ORT ran (its optimized graph)
    float_steps: int = 0                               # int16 ops ORT runs in float (numerics.int16)
    islands: list = field(default_factory=list)        # [IslandDiff] per island and mode
    handed_on: list = field(default_factory=list)      # [OutputDiff] with ORT's island results handed on
    islands_line: str = ""                             # "1 op in bf16 (no integer form): Softmax ×1"

    @property
    def ok(self) -> bool:
        """ort outputs bit-exact, and every rescaling op of every run executed its mode's formula
        exactly and differs from ORT's rounding by at most 1 LSB, for an explained reason.

        With int16 activations (``float_steps``) ORT accumulates in float32, which no integer
        machine reproduces bit for bit: the whole-model ort outputs are then reported, not
        required equal, and each op is held to the bounded contract of ``numerics.int16``.
        With bf16 islands the ort outputs required equal are those of the run with ORT's values at
        the island edges (``handed_on``), and every island must be within its tolerance."""
        ort_exact = self.float_steps > 0 or all(
            o.exact for o in (self.handed_on if self.islands else self.outputs) if o.mode == "ort")
        return ort_exact and all(od.explained for od in self.op_diffs) and all(i.ok for i in self.islands)


def verify(compiled, seed: int = 0, modes=("native", "ort"), inputs=None) -> VerifyResult:
    """Run NSS (each rounding mode) and ORT on the same random inputs and compare, whole model
    and op by op (the per-op checks judge the outputs the simulator executed; an int16 op writing
    a graph output is judged against ORT's own output there)."""
    inputs = inputs if inputs is not None else random_inputs(compiled.model, seed)
    ref = reference.run(compiled.model, inputs)
    program = compiled.program
    res = VerifyResult(lowered=dict(compiled.report.lowered), modes=tuple(modes),
                       ort_kernels=reference.kernels(compiled.model), float_steps=len(float_steps(program)),
                       islands_line=compiled.report.islands_line())
    sim = getattr(compiled, "simulator", None) or Simulator(program)
    feed = program.feed(inputs)
    ort_at = ort_judged(program, sim, ref)
    islands = [i for i in getattr(compiled, "islands", ()) if i.outputs]
    edge_ref = _island_edges(compiled.model, islands, inputs) if islands else {}
    for mode in modes:
        outs, diffs = sim.run(feed, mode, explain=True, ort_at=ort_at)
        res.op_diffs += diffs
        for name, o in program.fetch(outs).items():
            res.outputs.append(output_diff(name, mode, o, ref[name]))
        if islands:
            _judge_islands(res, sim, feed, mode, islands, edge_ref, ref)
    return res


def ort_judged(program, sim, ref: dict) -> dict:
    """{slot: ORT's own value}: the int16 ops writing a graph output that are judged against ORT's
    own output by the bounded contract (``Simulator.run(..., ort_at=)``); int8 ops keep the exact
    ort-mode formula (ORT may have run some of them unfused, in float). Only where that
    comparison is op-local: the op reads ORT's own inputs (graph inputs through data movement).
    Behind rescaling ops it reads the NSS's values, which may differ from ORT's by the admissible
    ±1 LSB of an int16 op upstream; ORT's output there says nothing about this op (one upstream
    LSB can move an int16 output by hundreds), so it is held to its formula. ``ref``: ORT's
    outputs by ONNX name."""
    local = _reads_graph_inputs(program, sim)
    wide_out = {st.out for st in float_steps(program) if all(local.get(a, False) for a in st.args)}
    return {p.slot: numerics.uint8_to_int8(ref[p.name]) if p.uint8 else ref[p.name]
            for p in program.outputs if p.name in ref and p.slot in wide_out}


def _reads_graph_inputs(program, sim) -> dict:
    """{slot: its value is a graph input or a constant moved by steps without a rounding check}:
    the same in the NSS and in ORT whatever the rounding."""
    local = {p.slot: True for p in program.inputs}
    local.update({s: True for s in program.constants})
    kernels = getattr(sim, "kernels", None) or [None] * len(program.steps)
    for st, k in zip(program.steps, kernels):
        local[st.out] = k is not None and getattr(k, "check", None) is None and \
            all(local.get(a, False) for a in st.args)
    return local


def _island_edges(model, islands, inputs) -> dict:
    """ORT's values of the int8 tensors the islands read and write ({ONNX name: int8 array}),
    exposed as extra graph outputs (integer tensors: ORT's fusions stay as they are)."""
    import onnx
    known = {o for n in model.graph.node for o in n.output}
    names = sorted({n for i in islands for _, n in i.inputs + i.outputs if n in known} - {o.name for o in model.graph.output})
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
    out = {**reference.run(m, inputs), **inputs}
    return {k: numerics.uint8_to_int8(v) if np.asarray(v).dtype == np.uint8 else v for k, v in out.items()}


def _judge_islands(res: VerifyResult, sim, feed, mode: str, islands, edge_ref: dict, ref: dict) -> None:
    """A run with ORT's int8 values written at every island edge, in and out: each island then
    computes from ORT's inputs, so its result against ORT's (``IslandDiff``) is its own bf16
    arithmetic alone; what the int8 ops compute before an island (its inputs) and after it (the
    graph outputs, from ORT's island results) is held to the usual contract (``handed_on``)."""
    edges = [(isl, slot, name, side) for isl in islands for side in ("inputs", "outputs")
             for slot, name in getattr(isl, side) if name in edge_ref]
    force = {slot: edge_ref[name] for _, slot, name, _ in edges}
    seen = {slot: None for _, slot, _, _ in edges}
    outs = sim.run(feed, mode, force=force, watch=seen)      # (its ops' checks: those of the first run)
    for name, o in sim.program.fetch(outs).items():
        res.handed_on.append(output_diff(name, mode, o, ref[name]))
    for isl, slot, name, side in edges:
        if seen.get(slot) is None:
            continue                                          # a graph input: ORT's own value
        if side == "inputs":
            res.handed_on.append(output_diff(f"{name} (read by {isl.onnx_op})", mode, seen[slot], edge_ref[name]))
            continue
        d = np.abs(seen[slot].astype(np.int64) - edge_ref[name].astype(np.int64))
        beyond = numerics.island_beyond(seen[slot], edge_ref[name], isl.zero_points.get(slot, 0), mode)
        res.islands.append(IslandDiff(isl.onnx_op, isl.node, isl.location, mode, int(d.size),
                                      int((d > 0).sum()), int(d.max(initial=0)), int(beyond.sum())))


# ops ORT runs in float when their activations are int16 -> which operands are activations
_ACTIVATIONS = {"torq_hl.conv2d": slice(-1, None), "torq_hl.depthwise_conv2d": slice(-1, None),
                "torq_hl.fully_connected": slice(-1, None), "torq_hl.avg_pool2d": slice(0, 1),
                "torq_hl.add": slice(0, None)}


def float_steps(program) -> list:
    """The program's rescaling steps that ORT runs in float32: int16 activations in or out
    (ORT has no 16-bit integer kernels; ``numerics.int16``)."""
    from .numerics import int16_involved
    dtypes = {p.slot: p.dtype for p in program.inputs}
    dtypes.update({s: str(np.asarray(v).dtype) for s, v in program.constants.items()})
    found = []
    for st in program.steps:
        ins = [dtypes.get(a, "") for a in st.args][_ACTIVATIONS.get(st.op, slice(0))]
        if st.op in _ACTIVATIONS and int16_involved(st.dtype, *ins):   # (not i16 weights w - w_zp)
            found.append(st)
        dtypes[st.out] = st.dtype
    return found


def print_report(res: VerifyResult, console=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    console = console or Console()
    console.print("lowered to torq_hl: " + ", ".join(f"{k}×{v}" for k, v in sorted(res.lowered.items())))
    if res.islands_line:
        console.print(res.islands_line)
    ran = {k: v for k, v in res.ort_kernels.items() if k not in ("Transpose", "Reshape", "Flatten")}
    console.print("ONNX Runtime ran: " + ", ".join(f"{k}×{v}" for k, v in sorted(ran.items())))
    unfused = [k for k in reference.FLOAT_COMPUTE if k in res.ort_kernels]
    if res.float_steps:
        console.print(f"[yellow]note[/]: {res.float_steps} ops have int16 activations, which ORT runs in float32: "
                      "its outputs there are a float rounding of the exact value, matched within the bound of "
                      "docs/a16w8.md op by op (causes 'float'), not bit for bit")
    elif unfused:
        console.print(f"[yellow]note[/]: ORT ran {', '.join(unfused)} in float (not fused into its integer "
                      "kernels): its output is not integer-exact, ±1 LSB near ties is expected there")
    t = Table(title="NSS simulator vs ONNX Runtime (whole model, random inputs)")
    for col in ("output", "rounding", "max |Δ|", "differing", "verdict"):
        t.add_column(col)
    for o in res.outputs:
        verdict = "bit-exact" if o.exact else ("±1 LSB" if o.unit == "LSB" and o.max_lsb <= 1 else "differs")
        t.add_row(escape(o.name), o.mode, f"{o.max_lsb:g} {o.unit}", f"{o.differ}/{o.size}", verdict)
    console.print(t)
    if res.islands and not all(o.exact for o in res.outputs if o.mode == "ort"):
        console.print("[yellow]note[/]: the outputs carry the bf16 islands' differences on; each island is judged "
                      "where it is made, and the int8 ops with ORT's island results handed on (below)")
    for d in res.islands:
        console.print(("" if d.ok else "[red]") + escape(str(d)) + ("" if d.ok else "[/]"))
    if res.islands:
        for mode in [m for m in res.modes if m == "ort"]:     # (native: ±1 LSB per op, as always)
            hand = [o for o in res.handed_on if o.mode == mode]
            bad = [o for o in hand if not o.exact]
            console.print(f"{mode} run with ORT's values at the island edges: {len(hand) - len(bad)} of {len(hand)} "
                          "outputs / island inputs bit-exact" +
                          "".join(f"; {escape(o.name)}: {o.differ}/{o.size} differ, max {o.max_lsb:g} {o.unit}" for o in bad))
    for mode in res.modes:
        _print_op_checks(console, mode, [od for od in res.op_diffs if od.mode == mode])
    console.print("[bold green]PASS[/]" if res.ok else "[bold red]FAIL[/]: ort rounding must be bit-exact, every "
                  "op must execute its formula exactly, native differences must be ≤1 LSB and explained"
                  + (f", and every bf16 island within its tolerance (ort {island_tolerance('ort')}; native "
                     f"{island_tolerance('native')})" if res.islands else ""))


def _print_op_checks(console, mode: str, ods: list) -> None:
    if not ods:
        return
    causes = sum_causes(ods)
    differing = [od for od in ods if od.differ or od.mismatches]
    wrong = sum(1 for od in ods if od.mismatches)
    console.print(f"{mode} run, op by op: {len(ods)} rescaling ops checked, {wrong} executed something other "
                  f"than their formula; native vs ort rounding on this run's inputs: "
                  f"{sum(1 for od in ods if od.differ)} ops differ; causes: tie (NTP vs RNE) {causes['tie']}, "
                  f"near-tie (multiplier quantisation) {causes['near-tie']}, "
                  + (f"int16 float bound {causes['float']}, int32 overflow {causes['overflow']}, "
                     if causes["float"] or causes["overflow"] else "") + f"other {causes['other']}")
    for od in differing:
        extra = f", [red]{od.mismatches} outputs differ from the {mode} formula[/]" if od.mismatches else ""
        console.print(f"  {od.op} at {od.location}: {od.differ}/{od.size} differ, max {od.max_lsb} LSB"
                      + "".join(f", {k} {v}" for k, v in od.causes.items() if v) + extra)
