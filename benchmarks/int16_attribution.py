"""Where the NSS and ONNX Runtime part ways in a model with int16 layers (docs/a16w8.md).

    python benchmarks/int16_attribution.py [--only effnet|lite1|lite2] [--recipe mixed] [--ops N] [--limit N]

ORT runs every int16 op as DequantizeLinear -> float32 op -> QuantizeLinear; the NSS computes it
in integers. On the *tuning* half of the ImageNet sample (the report half is never read), with the
row's model quantized by the recipe as accuracy.py does:

  ops      the first --ops images: every rescaling op fed ORT's own inputs (ORT's value forced at
           each one, ``Simulator.run(force=, watch=)``): how many outputs of each int16 op differ
           from ORT's, per image, for the writers (int16 out) and the readers (int16 in, int8 out),
           in the native and the ort rounding mode.
  sources  --limit images: a hybrid run -- the NSS program step by step, the chosen int16 ops
           computed by ORT itself (each op's ONNX subgraph DQ -> op -> Q on the hybrid's values),
           every other op exact -- against the NSS and against ORT: top-1 agreement and differing
           logits per image. "all" must reproduce ORT bit for bit (the check of the hybrid);
           "writers" / "readers" leave only that part of ORT's float arithmetic.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks" / "models"))


def q_outputs(q, program, sim, operator_locations, rescaling: bool = True) -> dict[int, str]:
    """{step index: the ONNX tensor (a QuantizeLinear output) that step writes}: the rescaling
    steps, or (``rescaling=False``) every step, data movement included."""
    from torq.compiler.pipeline import front_end
    imported, *_ = front_end(q)
    nodes = [n for n in imported.graph.node if n.op_type != "Constant"]
    by_loc = dict(zip([loc for _, loc in operator_locations], nodes))
    readers: dict[str, list] = {}
    for n in imported.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    found = {}
    for i, (st, k) in enumerate(zip(program.steps, sim.kernels)):
        n = by_loc.get(st.location)
        if (rescaling and k.check is None) or n is None:
            continue
        for _ in range(4):                 # Conv [-> Relu/Clip] -> QuantizeLinear
            if n.op_type == "QuantizeLinear" or len(readers.get(n.output[0], [])) != 1:
                break
            n = readers[n.output[0]][0]
        if n.op_type == "QuantizeLinear":
            found[i] = n.output[0]
    return found


def subgraph_session(q, tensor: str):
    """(ORT session, its activation inputs) of the ops between ``tensor`` and the
    DequantizeLinear nodes feeding them."""
    import onnx

    from torq import reference
    producer = {o: n for n in q.graph.node for o in n.output}
    inits = {t.name for t in q.graph.initializer}
    srcs, todo, seen = set(), [producer[tensor]], set()
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        for i in n.input:
            if i and i not in inits:
                (srcs.add(i) if n.op_type == "DequantizeLinear" or i not in producer else todo.append(producer[i]))
    sub = onnx.utils.Extractor(q).extract_model(sorted(srcs), [tensor])
    types = {v.name: onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type) for v in sub.graph.input}
    return reference.session(sub), types


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="lite1", choices=["effnet", "lite1", "lite2"])
    ap.add_argument("--recipe", default="mixed")
    ap.add_argument("--ops", type=int, default=3, help="images for the per-op counts (default 3)")
    ap.add_argument("--limit", type=int, default=250, help="images for the hybrid runs (default: the half)")
    args = ap.parse_args()
    import onnxruntime as ort
    ort.set_default_logger_severity(3)
    from build import build

    from torq import reference
    from torq.compiled import compile as torq_compile
    from torq.data.datasets import load_dataset
    from torq.evaluate import EvalOptions
    from torq.evaluate.engines import quantize_input
    from torq.evaluate.run import prepare, split
    from torq.graph.io_quant import io_quant_params
    from torq.quantize.recipe_flags import load_recipe
    from torq.runtime.kernels.blas import single_thread_run
    from torq.verify import float_steps

    entry = build(only=[args.only])[args.only]
    recipe = load_recipe(args.recipe).replace(preprocess=entry["preprocess"], calibration_data=entry["calibration"])
    opts = EvalOptions(recipe=recipe, half="tune", limit=max(args.ops, args.limit))
    data, calib = split(load_dataset(entry["dataset"]), opts)
    _, q, name, shape, _, _ = prepare(entry["model"], data, calib, opts)
    c = torq_compile(q)
    program, sim = c.program, c.simulator
    tensor_of = q_outputs(q, program, sim, c.operator_locations)
    wide = {id(s) for s in float_steps(program)}
    writers = [i for i in tensor_of if id(program.steps[i]) in wide and program.steps[i].dtype == "i16"]
    readers = [i for i in tensor_of if id(program.steps[i]) in wide and program.steps[i].dtype != "i16"]
    print(f"{args.only} ({args.recipe}): {len(writers)} int16 writers, {len(readers)} int16 -> int8 readers, "
          f"{len(tensor_of)} of {sum(k.check is not None for k in sim.kernels)} rescaling ops mapped to ORT tensors")
    exposed = q.__class__()
    exposed.CopyFrom(q)
    known = {o.name for o in q.graph.output}
    import onnx
    exposed.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in set(tensor_of.values()) - known)
    sess = reference.session(exposed)
    qin = io_quant_params(q)["inputs"][name]
    out_name = program.outputs[0].name

    def image(i):
        x = opts.preprocess.batch([data.load(i)], shape, name)
        return quantize_input(x, qin["scale"], qin["zero_point"], qin.get("dtype", "int8"))

    counts = {(kind, mode): 0 for kind in ("writers", "readers") for mode in ("native", "ort")}
    sizes = {"writers": 0, "readers": 0}
    for i in range(min(args.ops, len(data))):
        xq = image(i)
        ref = reference.run(exposed, {name: xq}, sess=sess)
        force = {program.steps[s].out: np.asarray(ref[t]) for s, t in tensor_of.items()}
        for mode in ("native", "ort"):
            seen = {program.steps[s].out: None for s in writers + readers}
            sim.run(program.feed({name: xq}), mode, force=force, watch=seen)
            for kind, steps in (("writers", writers), ("readers", readers)):
                for s in steps:
                    got = seen[program.steps[s].out]
                    counts[kind, mode] += int(np.count_nonzero(got != force[program.steps[s].out].reshape(got.shape)))
                    sizes[kind] += got.size if mode == "native" else 0
    n_ops = min(args.ops, len(data))
    for kind in ("writers", "readers") if n_ops else ():
        print(f"ops: {kind}, each fed ORT's inputs: " + ", ".join(
            f"{mode} {counts[kind, mode] / n_ops:.1f} differing outputs per image "
            f"({counts[kind, mode] / max(sizes[kind], 1):.1e})" for mode in ("native", "ort")))

    subs = {s: subgraph_session(q, tensor_of[s]) for s in writers + readers}
    slot_of = {t: program.steps[s].out for s, t in q_outputs(q, program, sim, c.operator_locations, False).items()}
    chosen = {"all": set(writers + readers), "writers": set(writers), "readers": set(readers)}
    tally = {k: [0, 0, 0, 0] for k in chosen}      # agree with ORT, agree with NSS, logits vs ORT, vs NSS
    n = min(args.limit, len(data))
    nss_ort, full = 0, reference.session(q)
    for i in range(n):
        xq = image(i)
        ort_out = np.asarray(reference.run(q, {name: xq}, sess=full)[out_name]).reshape(-1)
        nss_out = np.asarray(sim.run(program.feed({name: xq}), "native")[0]).reshape(-1)
        nss_ort += int(ort_out.argmax() == nss_out.argmax())
        for key, steps in chosen.items():
            hyb = hybrid(program, sim, program.feed({name: xq}), steps, subs, slot_of, name, xq, single_thread_run)
            t = tally[key]
            t[0] += int(hyb.argmax() == ort_out.argmax())
            t[1] += int(hyb.argmax() == nss_out.argmax())
            t[2] += int(np.count_nonzero(hyb != ort_out))
            t[3] += int(np.count_nonzero(hyb != nss_out))
    print(f"sources: NSS vs ORT top-1 agree {nss_ort}/{n}")
    for key, t in tally.items():
        print(f"sources: ORT's arithmetic on {key:8s} (the rest exact): top-1 agrees with ORT {t[0]}/{n}, "
              f"with the NSS {t[1]}/{n}; differing logits per image vs ORT {t[2] / n:.1f}, vs NSS {t[3] / n:.1f}")


def hybrid(program, sim, feed, steps, subs, slot_of, name, xq, single_thread_run) -> np.ndarray:
    """The program's output with the ``steps`` computed by ORT's subgraphs on the hybrid's own
    values (``Simulator._step`` runs one step: this is a measurement, not an executor)."""
    env = [None] * program.n_slots
    for port, v in zip(program.inputs, feed):
        env[port.slot] = v
    for s, v in program.constants.items():
        env[s] = v
    with single_thread_run():
        for i in range(len(sim.kernels)):
            _, out = sim._step(i, env, "native")
            if i in steps:
                sess, types = subs[i]
                got = sess.run(None, {t: np.asarray(xq if t == name else env[slot_of[t]]).astype(dt)
                                      for t, dt in types.items()})[0]
                env[program.steps[i].out] = np.asarray(got).reshape(np.shape(out)).astype(np.asarray(out).dtype)
    return np.asarray(env[program.outputs[0].slot]).reshape(-1)


if __name__ == "__main__":
    main()
