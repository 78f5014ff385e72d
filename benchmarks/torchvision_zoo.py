"""The torchvision zoo, whole, on the NSS: export → quantize → compile → verify, one table.

    python benchmarks/torchvision_zoo.py                          # every model × the three flag sets
    python benchmarks/torchvision_zoo.py --models resnet18,googlenet --flags qdq,qop
    make zoo

Needs the optional `zoo` extra (CPU torch + torchvision, export only; never a runtime dependency).
Models get seeded random weights with randomised BatchNorm statistics (their outputs mean nothing;
the point is coverage, exactness and compile speed), batch 1, opset 17, cached as
`build/zoo/<model>.onnx`. Each model × flag set runs in a child process (a crash or a timeout is a
row, not the end of the run) and the table lists: outcome, torq_hl ops lowered, max |Δ| in LSB per
rounding mode (`ort` must be 0), and the ONNX → torq_hl compile seconds.

`--per-layer` adds what `torq-gen-config discover --quantize` needs: every layer cut out alone
(`torq.graph.extract_layers`), quantized alone with the same flags (lone ops wrapped in Q/DQ,
as discover does), compiled and verified; the column reads `lowered/layers` (and how many of
the lowered ones are `ort` bit-exact), and any internal error is named. Results are cached per
layer by content in `build/zoo/per_layer/`, so a rerun only tests what changed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

MODELS = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large",
          "efficientnet_b0", "squeezenet1_1", "googlenet", "densenet121", "shufflenet_v2_x1_0",
          "convnext_tiny", "vit_b_16"]
FLAGS = {   # name -> torq.quantize keyword arguments
    "qdq": dict(quant_format="qdq", full_integer=True),
    "qdq-pc": dict(quant_format="qdq", per_channel=True, full_integer=True),
    "qop": dict(quant_format="qoperator"),
}
NUM_CALIB = 4
BUILD = Path(__file__).resolve().parent.parent / "build" / "zoo"


def _declare_torchvision_ops():
    """The registry's torchvision wheel is built against CUDA; its compiled ops cannot load on a
    CPU-only torch. Model definitions import fine once the two schemas its Python side registers
    fake kernels for exist (we never call them)."""
    import torch
    if hasattr(_declare_torchvision_ops, "lib"):
        return
    lib = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        try:
            lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        except RuntimeError:   # already there (a working torchvision build)
            pass
    _declare_torchvision_ops.lib = lib


def export(name: str, folder: Path = BUILD) -> Path:
    """`folder/<name>.onnx`: torchvision `name`, seeded random weights and BatchNorm statistics."""
    path = folder / f"{name}.onnx"
    if path.exists():
        return path
    import torch
    _declare_torchvision_ops()
    import torchvision
    torch.manual_seed(0)
    kwargs = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
    model = getattr(torchvision.models, name)(weights=None, **kwargs).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=g) * 1.5 + 0.5)
                m.weight.copy_(torch.rand(n, generator=g) * 1.5 + 0.5)
                m.bias.copy_(torch.randn(n, generator=g) * 0.1)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.onnx")
    torch.onnx.export(model, (torch.randn(1, 3, 224, 224, generator=g),), str(tmp), opset_version=17,
                      input_names=["input"], output_names=["logits"], dynamo=False)
    os.replace(tmp, path)
    return path


def check_layer(layer_model, flags: str) -> dict:
    """One layer alone: quantize (as discover does) → compile → verify; a dict (never raises).

    outcome: `exact` (ort bit-exact), `FAIL` (lowered, verify fails), `not supported` (a clean
    reason), `error` (a clean TorqError), `internal error` (anything else: a bug)."""
    import torq
    from torq.errors import TorqError
    from torq.verify import verify
    try:
        q = torq.quantize(layer_model, num_calib=NUM_CALIB, wrap_lone_ops=True, **FLAGS[flags])
        compiled = torq.compile(q)
        if compiled.report.unsupported:
            return {"outcome": "not supported", "detail": str(compiled.report.unsupported[0])}
        return {"outcome": "exact" if verify(compiled, seed=0).ok else "FAIL"}
    except TorqError as e:
        return {"outcome": "error", "detail": str(e).splitlines()[0]}
    except Exception as e:  # noqa: BLE001 - that is the finding: an internal error
        return {"outcome": "internal error", "detail": f"{type(e).__name__}: {str(e).splitlines()[:1]}"}


def per_layer(fp32: Path, flags: str, folder: Path = BUILD) -> dict:
    """Every layer of `fp32` alone (see `check_layer`), cached by the layer's content and flags."""
    import torq
    from torq.graph import extract_layers
    cache = folder / "per_layer"
    cache.mkdir(parents=True, exist_ok=True)
    counts, by_op, bad = Counter(), Counter(), []
    # a layer without inputs (an Identity sharing a weight, which torq.quantize folds away in
    # the whole model) computes nothing at run time: not a compute layer
    layers = [lay for lay in extract_layers(str(fp32)) if _has_inputs(lay.model)]
    code = _code_digest()
    for lay in layers:
        key = hashlib.sha256(f"{code}|{flags}|".encode() + lay.model.SerializeToString())
        path = cache / f"{key.hexdigest()[:32]}.json"
        try:
            r = json.loads(path.read_text())
        except (OSError, ValueError):
            r = check_layer(lay.model, flags)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(r))
            os.replace(tmp, path)
        counts[r["outcome"]] += 1
        if r["outcome"] != "exact":
            by_op[f"{lay.op_type} {r['outcome']}"] += 1
            bad.append(f"{lay.id}: {r.get('detail', r['outcome'])}")
    lowered = counts["exact"] + counts["FAIL"]
    return {"layers": len(layers), "lowered": lowered, "exact": counts["exact"],
            "internal": counts["internal error"], "by_op": dict(by_op), "examples": bad[:3]}


def _has_inputs(model) -> bool:
    inits = {t.name for t in model.graph.initializer}
    return any(v.name not in inits for v in model.graph.input)


def _code_digest() -> str:
    """sha256 of torq's sources: a cached per-layer result is only reused by the same code."""
    import torq
    h = hashlib.sha256()
    for f in sorted(Path(torq.__file__).parent.rglob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()


def run_one(name: str, flags: str, folder: Path = BUILD, layers: bool = False) -> dict:
    """Quantize + compile + verify one model with one flag set (+ `per_layer`); a dict row."""
    row = whole_model(name, flags, folder)
    if layers:
        try:
            row["per_layer"] = per_layer(export(name, folder), flags, folder)
        except Exception as e:  # noqa: BLE001 - e.g. layer extraction fails: a row, not a crash
            row["per_layer"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[:1]}"}
    return row


def whole_model(name: str, flags: str, folder: Path = BUILD) -> dict:
    """Quantize + compile + verify one model with one flag set; a dict row (never raises)."""
    import torq
    from torq.verify import verify
    from torq.errors import TorqError
    row = {"model": name, "flags": flags}
    try:
        fp32 = export(name, folder)
        qpath = folder / f"{name}.{flags}.onnx"
        t0 = time.perf_counter()
        if not qpath.exists():
            torq.quantize(str(fp32), str(qpath), num_calib=NUM_CALIB, **FLAGS[flags])
        row["quantize_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiled = torq.compile(str(qpath))
        row["compile_s"] = time.perf_counter() - t0
        row["timings"] = compiled.timings
        row["lowered"] = sum(compiled.report.lowered.values())
        unsupported = compiled.report.unsupported
        if unsupported:
            row["outcome"] = "not supported"
            by_op = Counter(u.reason.split(":", 1)[0] for u in unsupported)
            row["detail"] = ", ".join(f"{op}×{n}" for op, n in by_op.most_common()) + f"; e.g. {unsupported[0]}"
            return row
        res = verify(compiled, seed=0)
        # float outputs (QOperator: DequantizeLinear at the end): |Δ| back in LSB of that scale
        from torq.gen_config.compare import dq_output_scales
        lsb = dq_output_scales(compiled.model)
        in_lsb = [(o, o.max_lsb / lsb[o.name] if o.unit == "abs" and o.name in lsb else o.max_lsb)
                  for o in res.outputs]
        row["max_lsb"] = {m: max((v for o, v in in_lsb if o.mode == m), default=0) for m in res.modes}
        row["max_lsb_unit"] = "abs" if any(o.unit == "abs" and o.name not in lsb for o in res.outputs) else "LSB"
        row["outcome"] = "pass" if res.ok else "FAIL"
    except TorqError as e:
        row["outcome"], row["detail"] = "error", str(e).splitlines()[0]
    except Exception as e:  # noqa: BLE001 - that is the finding: an internal error
        row["outcome"], row["detail"] = "internal error", f"{type(e).__name__}: {str(e).splitlines()[:1]}"
        row["traceback"] = traceback.format_exc()
    return row


def _child(name: str, flags: str, folder: Path, timeout: float, layers: bool) -> dict:
    cmd = [sys.executable, __file__, "--one", name, flags, "--build", str(folder)] + ["--per-layer"] * layers
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"model": name, "flags": flags, "outcome": "timeout", "detail": f"> {timeout:g} s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"model": name, "flags": flags, "outcome": "internal error",
            "detail": f"child exited {p.returncode}: {(p.stderr.strip().splitlines() or [''])[-1][:200]}"}


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title="torchvision zoo on the NSS (224×224, batch 1, opset 17)")
    layers = any("per_layer" in r for r in rows)
    cols = ["model", "flags", "outcome", "lowered", "max |Δ| native", "max |Δ| ort", "compile s"]
    for col in cols + ["per-layer lowered (ort-exact)"] * layers + ["detail"]:
        # |Δ|: LSB for int8 outputs (qdq flag sets, --full-integer); absolute for float ones (qop)
        t.add_column(col)
    for r in rows:
        lsb = r.get("max_lsb", {})
        unit = " (float)" if r.get("max_lsb_unit") == "abs" else ""
        cells = [r["model"], r["flags"], r["outcome"], str(r.get("lowered", "")),
                 f"{lsb['native']:g}{unit}" if "native" in lsb else "", f"{lsb['ort']:g}{unit}" if "ort" in lsb else "",
                 f"{r['compile_s']:.1f}" if "compile_s" in r else ""]
        detail = r.get("detail", "")
        if layers:
            cells.append(per_layer_cell(r.get("per_layer")))
            pl = r.get("per_layer") or {}
            if pl.get("by_op"):
                detail = "; ".join(filter(None, [detail, "layers: " + ", ".join(
                    f"{k}×{n}" for k, n in sorted(pl["by_op"].items()))]))
        t.add_row(*cells, detail[:110])
    Console(width=220).print(t)


def per_layer_cell(pl: dict | None) -> str:
    """`lowered/layers (exact)` and the internal errors, if any."""
    if not pl:
        return ""
    if "error" in pl:
        return f"error: {pl['error'][:40]}"
    cell = f"{pl['lowered']}/{pl['layers']} ({pl['exact']})"
    return cell + (f", {pl['internal']} INTERNAL" if pl["internal"] else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated torchvision names")
    ap.add_argument("--flags", default=",".join(FLAGS), help=f"comma-separated of {', '.join(FLAGS)}")
    ap.add_argument("--build", type=Path, default=BUILD, help="cache folder (default build/zoo)")
    ap.add_argument("--per-layer", action="store_true",
                    help="also quantize, compile and verify every layer alone (as discover --quantize does)")
    ap.add_argument("--timeout", type=float, help="seconds per model × flag set (default 1200; 7200 with --per-layer)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "FLAGS"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(run_one(*a.one, folder=a.build, layers=a.per_layer), default=float))
        return 0
    models, flags = a.models.split(","), a.flags.split(",")
    bad = [f for f in flags if f not in FLAGS] + [m for m in models if m not in MODELS]
    if bad:
        ap.error(f"unknown model/flag set: {', '.join(bad)}")
    rows = []
    for m in models:
        try:
            export(m, a.build)     # once, in this process (the children then find it cached)
        except Exception as e:  # noqa: BLE001
            rows += [{"model": m, "flags": f, "outcome": "export failed", "detail": str(e)[:200]} for f in flags]
            continue
        for f in flags:
            rows.append(_child(m, f, a.build, a.timeout or (7200 if a.per_layer else 1200), a.per_layer))
            r = rows[-1]
            print(f"{m:20s} {f:7s} {r['outcome']:15s} {r.get('compile_s', 0):6.1f} s "
                  f"{per_layer_cell(r.get('per_layer'))} {r.get('detail', '')[:100]}", flush=True)
            if a.json:
                a.json.write_text(json.dumps(rows, indent=1, default=float))
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
