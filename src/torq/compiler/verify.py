"""Prove a compiled model against ONNX Runtime: per output |Δ| in LSB, per op why native differs."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..runtime import compare, reference


@dataclass
class VerifyResult:
    outputs: list = field(default_factory=list)     # [compare.OutputDiff]
    op_diffs: list = field(default_factory=list)    # [nss.OpDiff] native vs ort on identical inputs
    lowered: dict = field(default_factory=dict)
    modes: tuple = ()
    ort_kernels: dict = field(default_factory=dict)   # what ORT ran (its optimized graph)

    @property
    def ok(self) -> bool:
        ort_exact = all(o.exact for o in self.outputs if o.mode == "ort")
        native_ok = all(od.explained for od in self.op_diffs)
        return ort_exact and native_ok


def verify(compiled, seed: int = 0, modes=("native", "ort"), inputs=None) -> VerifyResult:
    """Run NSS (each rounding mode) and ORT on the same random inputs and compare."""
    inputs = inputs if inputs is not None else reference.random_inputs(compiled.model, seed)
    ref = reference.run(compiled.model, inputs)
    res = VerifyResult(lowered=dict(compiled.report.lowered), modes=tuple(modes),
                       ort_kernels=reference.kernels(compiled.model))
    feed = compiled.feed(inputs)
    for mode in modes:
        if mode == "ort":
            outs, res.op_diffs = compiled.program.run(feed, "ort", explain=True)
        else:
            outs = compiled.program.run(feed, mode)
        for name, o in compiled.fetch(outs).items():
            res.outputs.append(compare.output_diff(name, mode, o, ref[name]))
    return res


def print_report(res: VerifyResult, console=None) -> None:
    from rich.console import Console
    from rich.table import Table
    console = console or Console()
    console.print("lowered to torq_hl: " + ", ".join(f"{k}×{v}" for k, v in sorted(res.lowered.items())))
    ran = {k: v for k, v in res.ort_kernels.items() if k not in ("Transpose", "Reshape", "Flatten")}
    console.print("ONNX Runtime ran: " + ", ".join(f"{k}×{v}" for k, v in sorted(ran.items())))
    unfused = [k for k in reference.FLOAT_COMPUTE if k in res.ort_kernels]
    if unfused:
        console.print(f"[yellow]note[/]: ORT ran {', '.join(unfused)} in float (not fused into its integer "
                      "kernels): its output is not integer-exact, ±1 LSB near ties is expected there")
    t = Table(title="NSS simulator vs ONNX Runtime (whole model, random inputs)")
    for col in ("output", "rounding", "max |Δ|", "differing", "verdict"):
        t.add_column(col)
    for o in res.outputs:
        verdict = "bit-exact" if o.exact else ("±1 LSB" if o.unit == "LSB" and o.max_lsb <= 1 else "differs")
        t.add_row(o.name, o.mode, f"{o.max_lsb:g} {o.unit}", f"{o.differ}/{o.size}", verdict)
    console.print(t)
    if res.op_diffs:
        causes = compare.sum_causes(res.op_diffs)
        differing = [od for od in res.op_diffs if od.differ]
        console.print(f"native vs ort rounding, op by op on identical inputs: {len(differing)} of "
                      f"{len(res.op_diffs)} rescaling ops differ; causes: tie (NTP vs RNE) {causes['tie']}, "
                      f"near-tie (multiplier quantisation) {causes['near-tie']}, other {causes['other']}")
        for od in differing:
            console.print(f"  {od.op} at {od.location}: {od.differ}/{od.size} differ, max {od.max_lsb} LSB, "
                          + ", ".join(f"{k} {v}" for k, v in od.causes.items() if v))
    console.print("[bold green]PASS[/]" if res.ok else "[bold red]FAIL[/]: ort rounding must be bit-exact and "
                  "native differences ≤1 LSB and explained")
