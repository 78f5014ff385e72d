"""fp32 graph clean-up before quantization: ONNX Runtime's *basic* (semantics-preserving) rewrites.

Exporters leave computed padding (TF "same": Shape → ConstantOfShape → Concat → Slice → Cast →
Pad), BatchNormalization, Identity and constant sub-graphs in the fp32 graph. Quantized as is,
each Pad gets a Q/DQ of its own and a quantized scalar pad value that the NPU lowering cannot
take. ORT's level-1 optimizer folds constants and fuses Pad/BatchNorm into the following Conv:
the result computes the same function (to fp32 rounding), so accuracy is unchanged and every
Conv quantizes with its padding in place. The input's batch dim stays as declared.

Three side effects of ORT's optimizer are undone: its constant sharing makes equal initializers
one (two zero biases, two Clip bounds), so each reader gets its own copy again (the quantizer
gives every Conv its own bias scale); it inlines function ops without a CPU kernel (``HardSwish``
becomes ``HardSigmoid`` → ``Mul``: the NPU has one table op for it, so the original op is put
back); and it declares every domain it knows (only the used ones are kept).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import onnx
from onnx import helper


def fold_fp32(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` after ORT's basic graph optimizations (constant folding, Pad/BN fusion)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="torq-fold-") as tmp:
        out = Path(tmp) / "folded.onnx"
        so.optimized_model_filepath = str(out)
        # ORT's own error types: recipe._step makes them one line naming the model and the step
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        folded = onnx.load(str(out))
    del folded.graph.value_info[:]       # re-inferred by the quantizer's pre-processing
    _restore_hardswish(model, folded)
    _unshare_initializers(folded)
    used = {n.domain for n in folded.graph.node} | {o.domain for o in model.opset_import}
    keep = [o for o in folded.opset_import if o.domain in used]
    del folded.opset_import[:]
    folded.opset_import.extend(keep)
    return folded


def _restore_hardswish(original: onnx.ModelProto, folded: onnx.ModelProto) -> None:
    """``HardSigmoid(x) → Mul(x, ·)`` that ORT inlined from a HardSwish node -> that HardSwish again."""
    names = {n.output[0]: n.name for n in original.graph.node if n.op_type == "HardSwish"}
    g = folded.graph
    producer = {o: n for n in g.node for o in n.output}
    readers: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    drop = set()
    for n in g.node:
        if n.op_type != "Mul" or n.output[0] not in names:
            continue
        hs = next((producer.get(i) for i in n.input if i.startswith("_inlfunc_HardSwish")), None)
        if hs is None or hs.op_type != "HardSigmoid" or readers.get(hs.output[0]) != 1 \
                or hs.input[0] not in n.input:
            continue
        drop.add(hs.output[0])
        new = helper.make_node("HardSwish", [hs.input[0]], [n.output[0]], name=names[n.output[0]])
        n.CopyFrom(new)
    kept = [n for n in g.node if n.output[0] not in drop]
    del g.node[:]
    g.node.extend(kept)


def _unshare_initializers(m: onnx.ModelProto) -> None:
    """Every initializer read by several node inputs -> one copy per extra reader (``<name>_<k>``)."""
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    taken = set(inits) | {o for n in g.node for o in n.output} | {v.name for v in g.input}
    seen: dict[str, int] = {}
    for n in g.node:
        for k, name in enumerate(n.input):
            if name not in inits:
                continue
            seen[name] = seen.get(name, 0) + 1
            if seen[name] == 1:
                continue
            new, i = f"{name}_{seen[name]}", seen[name]
            while new in taken:
                i += 1
                new = f"{name}_{i}"
            taken.add(new)
            t = onnx.TensorProto()
            t.CopyFrom(inits[name])
            t.name = new
            g.initializer.append(t)
            n.input[k] = new
