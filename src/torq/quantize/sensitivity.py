"""Per-layer sensitivity to int8 activations, measured on calibration data only.

For each layer (``precision.layers``) the fp32 model is run with *only that layer's output*
fake-quantized to int8 (QuantizeLinear → DequantizeLinear with ONNX Runtime's own MinMax scale
and zero point from the calibration ranges); everything else stays fp32, and the weights do
not take part (they are int8 at every activation precision). The output is compared with the
fp32 model's on the same samples: mean KL divergence of the softmax (classifiers) and SQNR of
the raw outputs. A layer whose int8 output costs a lot of KL gains most from int16.

The quantized tensor is the layer's output after any single-consumer chain of Relu / Clip
(ORT folds those into the range of the layer's QuantizeLinear).

The fp32 values are computed once, the model run in pieces cut after each layer's tensor; each
variant then runs only the nodes its int8 tensor reaches, from the fp32 values at its cut
(``_Pieces``): the cost of a layer is the part of the model behind it.

The samples stream through in chunks (``memory_bound.samples_at_once``: one chunk's tensors in
memory, not every sample's), each layer's KL and SQNR kept as running sums (``_Error``); the
calibration ranges are the whole set's, reduced over the chunks first (``_ranges``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .calibration import probe_session
from .precision import layers, name_nodes


@dataclass(frozen=True)
class LayerSensitivity:
    name: str
    op_type: str
    tensor: str             # the activation quantized for this layer
    macs: int               # multiply-accumulates per sample (output elements for MAC-free ops)
    kl: float               # mean KL(fp32 || this layer's output in int8), nats
    sqnr_db: float          # output SQNR with this layer's output in int8

    def to_json(self) -> dict:
        return {"name": self.name, "op_type": self.op_type, "tensor": self.tensor, "macs": self.macs,
                "kl": self.kl, "sqnr_db": self.sqnr_db}


def samples_of(reader, limit: int | None = None) -> list[dict]:
    """The reader's samples (rewound first and after), at most ``limit``."""
    for name in ("rewind", "reset"):
        if callable(getattr(reader, name, None)):
            getattr(reader, name)()
            break
    out = []
    for s in iter(reader.get_next, None):
        out.append(s)
        if limit and len(out) >= limit:
            break
    for name in ("rewind", "reset"):
        if callable(getattr(reader, name, None)):
            getattr(reader, name)()
            break
    return out


def measure(fp32: onnx.ModelProto, samples: list[dict], progress=None) -> list[LayerSensitivity]:
    """Sensitivity of every layer of ``fp32`` (named nodes: ``precision.name_nodes``). The last
    result is kept for the same model and samples (recipes differing only in the int16 MAC cap
    measure it once)."""
    import hashlib
    digest = hashlib.sha256(fp32.SerializeToString())
    for sample in samples:
        for k in sorted(sample):
            digest.update(k.encode() + np.ascontiguousarray(sample[k]).tobytes())
    if _LAST.get("key") != digest.hexdigest():
        _LAST.clear()
        _LAST.update(key=digest.hexdigest(), result=_measure(fp32, samples, progress))
    return list(_LAST["result"])


_LAST: dict = {}


def _measure(fp32: onnx.ModelProto, samples: list[dict], progress=None, whole: bool = False,
             optimize: bool = True, at_once: int | None = None) -> list[LayerSensitivity]:
    """Each layer's output fake-quantized in turn. The fp32 values are computed once: the model is
    run in pieces, cut after each layer's tensor (``_Pieces``), and each variant runs only what
    its quantized tensor reaches, from the fp32 values at its cut (``whole``: the whole model per
    layer instead, as before). Without ORT's graph optimisations (``optimize=False``) both give the
    same bits; with them (the default, as before) they differ by the float32 rounding of ORT's fused
    vs unfused kernels at the cuts, which may flip an element's int8 rounding: on EfficientNet-Lite0
    every layer's KL within 0.45 % and the same ranking, 2.6-3.4x faster (tests/quantize/test_precision.py).
    ``at_once``: samples per chunk (``chunks``); the figures are the same for any chunking, up to
    float summation order (and ORT's one-row Gemm kernel for a chunk of one sample)."""
    model = onnx.shape_inference.infer_shapes(name_nodes(fp32))
    targets = _layer_tensors(model)
    outputs = [o.name for o in model.graph.output]
    parts = chunks(model, samples, at_once)
    ranges = _ranges(model, [t for _, t in targets], parts)
    macs = layer_macs(model)
    op = {n.name: n.op_type for n in model.graph.node}
    has_subgraphs = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                        for n in model.graph.node for a in n.attribute)
    errors = [_Error() for _ in targets]
    for c, part in enumerate(parts):
        part = batched(model, part)
        reference = _run(model, outputs, part, optimize)
        if whole or has_subgraphs:                  # (a subgraph's outer-scope reads: run it whole)
            variants = ((k, _run(_fake_quant(model, t, *ranges[t]), outputs, part, optimize))
                        for k, (_, t) in enumerate(targets))
        else:
            variants = _Pieces(model, part, reference, optimize).variants([t for _, t in targets], ranges)
        for i, (k, got) in enumerate(variants):
            if progress:
                progress(c * len(targets) + i, len(parts) * len(targets), targets[k][0])
            errors[k].add(reference, got)
    return [LayerSensitivity(name, op[name], tensor, int(macs.get(name, 0)), *errors[k].result())
            for k, (name, tensor) in enumerate(targets)]


def chunks(model: onnx.ModelProto, samples: list[dict], at_once: int | None = None) -> list[list[dict]]:
    """The samples in the fewest chunks of at most ``at_once`` (default: as many as memory allows,
    ``memory_bound.samples_at_once``), evened out (61 at 6: six of 6, five of 5; not a last chunk
    of one, whose Gemm ORT computes with another kernel). Batch a chunk (``batched``) only when
    it is run: a batch is a copy of its samples' inputs."""
    from .memory_bound import samples_at_once
    n = len(samples)
    parts = -(-n // (at_once or samples_at_once(model, n))) if n else 1
    cuts = [n * k // parts for k in range(parts + 1)]
    return [samples[a:b] for a, b in zip(cuts, cuts[1:])]


class _Pieces:
    """The fp32 model run in pieces along its (topological) node order: the tensors crossing a
    cut are kept (per sample batch) and the next piece starts from them, so the model's fp32
    values are computed once; a variant (one tensor fake-quantized) runs only the nodes after its
    cut that the tensor reaches, plus the later nodes those read, from the values at the cut."""

    def __init__(self, model: onnx.ModelProto, samples: list[dict], reference: list, optimize: bool = True):
        g = model.graph
        self.model, self.samples, self.reference, self.optimize = model, samples, reference, optimize
        self.nodes = list(g.node)
        self.inits = {t.name for t in g.initializer}
        self.outputs = [o.name for o in g.output]
        self.producer = {o: k for k, n in enumerate(self.nodes) for o in n.output if o}
        self.readers: dict[str, list[int]] = {}
        for k, n in enumerate(self.nodes):
            for i in n.input:
                if i and i not in self.inits:
                    self.readers.setdefault(i, []).append(k)
        self.last_read = {t: max(ks) for t, ks in self.readers.items()}
        self.live: dict[str, list] = {}          # tensor -> its fp32 value per sample batch
        self.done = -1                           # nodes [0, done] have run

    def variants(self, tensors: list[str], ranges: dict):
        """(index into ``tensors``, outputs per sample batch) with that tensor in int8, in cut order."""
        for k in sorted(range(len(tensors)), key=lambda k: self.producer[tensors[k]]):
            t = tensors[k]
            self._advance(self.producer[t], keep=t)
            yield k, self._variant(t, *ranges[t])

    def _value(self, name: str, b: int):
        return self.samples[b][name] if name not in self.producer else self.live[name][b]

    def _advance(self, cut: int, keep: str) -> None:
        """Run nodes (done, cut]; keep what nodes after ``cut`` read, and ``keep``."""
        piece = list(range(self.done + 1, cut + 1))
        made = {o for k in piece for o in self.nodes[k].output if o}
        wanted = sorted(o for o in made if self.last_read.get(o, -1) > cut or o == keep)
        if wanted:
            got = self._run_nodes(piece, wanted, {})
            for o, vals in zip(wanted, zip(*got)):
                self.live[o] = list(vals)
        self.live = {t: v for t, v in self.live.items() if self.last_read.get(t, -1) > cut or t == keep}
        self.done = cut

    def _variant(self, tensor: str, lo: float, hi: float) -> list:
        cut = self.producer[tensor]
        reach, todo = set(), [tensor]            # nodes the quantized tensor reaches
        while todo:
            for k in self.readers.get(todo.pop(), []):
                if k not in reach:
                    reach.add(k)
                    todo.extend(o for o in self.nodes[k].output if o)
        need, todo = set(reach), [i for k in reach for i in self.nodes[k].input]
        while todo:                               # + the later nodes those read
            p = self.producer.get(todo.pop())
            if p is not None and p > cut and p not in need:
                need.add(p)
                todo.extend(self.nodes[p].input)
        changed = [o for o in self.outputs if o in {x for k in reach for x in self.nodes[k].output}]
        dq = f"{tensor}__sens_dq"
        fetch = changed + ([dq] if tensor in self.outputs else [])
        got = self._run_nodes(sorted(need), fetch, {tensor: (lo, hi, dq)}) if fetch else \
            [[] for _ in self.samples]
        out = []
        for b, vals in enumerate(got):
            mine = dict(zip(fetch, vals))
            if tensor in self.outputs:
                mine[tensor] = mine.pop(dq)
            out.append([mine[o] if o in mine else self.reference[b][j] for j, o in enumerate(self.outputs)])
        return out

    def _run_nodes(self, ks: list[int], fetch: list[str], quantize: dict) -> list:
        """Nodes ``ks`` as a model fed the values they read, ``fetch`` per sample batch; ``quantize``:
        {tensor: (lo, hi, dq name)} read through int8 QuantizeLinear -> DequantizeLinear."""
        nodes = []
        for k in ks:
            n = onnx.NodeProto()
            n.CopyFrom(self.nodes[k])
            for j, i in enumerate(n.input):
                if i in quantize:
                    n.input[j] = quantize[i][2]
            nodes.append(n)
        made = {o for n in nodes for o in n.output if o}
        feeds = sorted({i for k in ks for i in self.nodes[k].input
                        if i and i not in self.inits and i not in made} | set(quantize))
        extra, inits = [], set()
        for t, (lo, hi, dq) in quantize.items():
            scale, zp = int8_qparams(lo, hi)
            s_name, z_name, q_name = (f"{t}__sens_{x}" for x in ("scale", "zp", "q"))
            extra += [numpy_helper.from_array(np.array(scale, np.float32), s_name),
                      numpy_helper.from_array(np.array(zp, np.int8), z_name)]
            nodes[:0] = [helper.make_node("QuantizeLinear", [t, s_name, z_name], [q_name]),
                         helper.make_node("DequantizeLinear", [q_name, s_name, z_name], [dq])]
        used = {i for n in nodes for i in n.input}
        first = [self._value(f, 0) for f in feeds]
        same = [all(np.shape(self._value(f, b)) == np.shape(v) for b in range(len(self.samples)))
                for f, v in zip(feeds, first)]
        ins = [helper.make_tensor_value_info(f, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype),
                                             np.shape(v) if ok else [f"{f}_d{j}" for j in range(np.ndim(v))])
               for f, v, ok in zip(feeds, first, same)]
        graph = helper.make_graph(nodes, "piece", ins, [helper.make_empty_tensor_value_info(o) for o in fetch],
                                  initializer=[t for t in self.model.graph.initializer if t.name in used] + extra)
        m = helper.make_model(graph, opset_imports=self.model.opset_import, ir_version=self.model.ir_version)
        m.functions.extend(self.model.functions)
        return _run(m, fetch, [{f: self._value(f, b) for f in feeds} for b in range(len(self.samples))], self.optimize)


def batched(model: onnx.ModelProto, samples: list[dict]) -> list[dict]:
    """The samples as one batch when every input has a dynamic first dim and the samples stack
    (one ORT run instead of one per sample), else as they are."""
    dims = [v.type.tensor_type.shape.dim for v in model.graph.input
            if v.name not in {t.name for t in model.graph.initializer}]
    if len(samples) < 2 or not all(d and not d[0].HasField("dim_value") for d in dims):
        return samples
    try:
        return [{k: np.concatenate([s[k] for s in samples]) for k in samples[0]}]
    except ValueError:
        return samples


def _layer_tensors(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(layer, the float tensor its int8 quantization applies to) for every layer with a float output."""
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    floats = {v.name for v in [*model.graph.value_info, *model.graph.output]
              if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    wanted = set(layers(model))
    out = []
    for n in model.graph.node:
        if n.name not in wanted or not n.output or n.output[0] not in floats:
            continue
        t = n.output[0]
        while len(consumers.get(t, [])) == 1 and consumers[t][0].op_type in ("Relu", "Clip"):
            t = consumers[t][0].output[0]
        out.append((n.name, t))
    return out


def _ranges(model, tensors, parts) -> dict:
    """tensor -> (min, max) over every sample, the chunks of samples (``chunks``) in turn (the
    model run as written, each tensor reduced to its min and max in the graph: a chunk's tensors
    are not all fetched at once)."""
    sess = probe_session(_with_extrema(model, tensors))
    names = [f"{t}__sens_{x}" for t in tensors for x in ("min", "max")]
    lo = {t: np.inf for t in tensors}
    hi = {t: -np.inf for t in tensors}
    for part in parts:
        for s in batched(model, part):
            got = iter(sess.run(names, s))
            for t in tensors:
                lo[t] = min(lo[t], float(next(got)))
                hi[t] = max(hi[t], float(next(got)))
    return {t: (lo[t], hi[t]) for t in tensors}


def _with_extrema(model: onnx.ModelProto, tensors) -> onnx.ModelProto:
    """``model`` with each of ``tensors``' min and max (ReduceMin / ReduceMax over every axis) as outputs."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in tensors:
        for op, x in (("ReduceMin", "min"), ("ReduceMax", "max")):
            m.graph.node.append(helper.make_node(op, [t], [f"{t}__sens_{x}"], keepdims=0))
            m.graph.output.append(helper.make_tensor_value_info(f"{t}__sens_{x}", onnx.TensorProto.FLOAT, []))
    return m


def _run(model, outputs, samples, optimize: bool = True) -> list:
    """The outputs per sample batch, ORT with its graph optimisations unless ``optimize`` is off
    (the reference and every variant alike: float reassociation there is ~1e-4 of the logits, the
    int8 effect ~1e-1)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return [sess.run(outputs, s) for s in samples]


def int8_qparams(lo: float, hi: float) -> tuple[np.float32, np.int8]:
    """ONNX Runtime's MinMax activation parameters for int8 (asymmetric, range holding 0)."""
    from onnxruntime.quantization.quant_utils import compute_scale_zp
    zp, scale = compute_scale_zp(np.array(min(lo, 0.0), np.float32), np.array(max(hi, 0.0), np.float32),
                                 np.array(-128, np.int8), np.array(127, np.int8), symmetric=False)
    return np.float32(scale), np.int8(zp)


def _fake_quant(model: onnx.ModelProto, tensor: str, lo: float, hi: float) -> onnx.ModelProto:
    """``model`` with ``tensor`` replaced, for all its readers, by Q → DQ int8 of it."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    scale, zp = int8_qparams(lo, hi)
    s_name, z_name, q_name, dq_name = (f"{tensor}__sens_{k}" for k in ("scale", "zp", "q", "dq"))
    m.graph.initializer.extend([numpy_helper.from_array(np.array(scale, np.float32), s_name),
                                numpy_helper.from_array(np.array(zp, np.int8), z_name)])
    for n in m.graph.node:
        for k, i in enumerate(n.input):
            if i == tensor:
                n.input[k] = dq_name
    for o in m.graph.output:
        if o.name == tensor:         # a graph output itself: quantize it in place of its producer
            return _fake_quant_output(m, tensor, s_name, z_name, q_name, dq_name)
    at = next(k for k, n in enumerate(m.graph.node) if tensor in n.output) + 1
    m.graph.node.insert(at, helper.make_node("DequantizeLinear", [q_name, s_name, z_name], [dq_name]))
    m.graph.node.insert(at, helper.make_node("QuantizeLinear", [tensor, s_name, z_name], [q_name]))
    return m


def _fake_quant_output(m, tensor, s_name, z_name, q_name, dq_name):
    """``tensor`` is a graph output: its producer writes ``<tensor>__sens_src``, and Q -> DQ right
    after it writes ``tensor``, the graph output and what every reader reads."""
    src = f"{tensor}__sens_src"
    at = len(m.graph.node)
    for k, n in enumerate(m.graph.node):
        for j, o in enumerate(n.output):
            if o == tensor:
                n.output[j] = src
                at = k + 1
        for j, i in enumerate(n.input):
            if i == dq_name:
                n.input[j] = tensor
    m.graph.node.insert(at, helper.make_node("DequantizeLinear", [q_name, s_name, z_name], [tensor]))
    m.graph.node.insert(at, helper.make_node("QuantizeLinear", [src, s_name, z_name], [q_name]))
    return m


class _Error:
    """A layer's running sums over the chunks: KL summed over the rows of the first output (the
    mean over every row of every sample at the end), and the SQNR's signal and noise energies
    over all outputs."""

    def __init__(self):
        self.kl, self.rows, self.signal, self.noise = 0.0, 0, 0.0, 0.0

    def add(self, reference, got) -> None:
        """One chunk: ``reference`` / ``got`` the outputs per sample batch."""
        for ref, out in zip(reference, got):
            for r, o in zip(ref, out):
                r64, o64 = np.asarray(r, np.float64), np.asarray(o, np.float64)
                self.signal += float(np.sum(r64 ** 2))
                self.noise += float(np.sum((r64 - o64) ** 2))
            r, o = (np.asarray(v[0], np.float64).reshape(-1, np.shape(v[0])[-1]) for v in (ref, out))
            self.kl += float(np.sum(softmax_kl_rows(r, o)))
            self.rows += len(r)

    def result(self) -> tuple[float, float]:
        """(mean softmax KL over every row, SQNR dB over all outputs)."""
        sqnr = 10 * np.log10(self.signal / self.noise) if self.noise > 0 else float("inf")
        return self.kl / self.rows, float(sqnr)


def softmax_kl(ref_logits: np.ndarray, logits: np.ndarray) -> float:
    """Mean over rows of KL(softmax(ref) || softmax(other)), nats."""
    return float(np.mean(softmax_kl_rows(ref_logits, logits)))


def softmax_kl_rows(ref_logits: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """KL(softmax(ref) || softmax(other)) of each row, nats."""
    def log_softmax(z):
        z = z - z.max(axis=-1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    lp, lq = log_softmax(ref_logits), log_softmax(logits)
    return np.sum(np.exp(lp) * (lp - lq), axis=-1)


def layer_macs(model: onnx.ModelProto) -> dict[str, int]:
    """Multiply-accumulates per sample of each node (output elements for MAC-free layers);
    ``model`` with inferred shapes."""
    shapes = {v.name: [d.dim_value or 1 for d in v.type.tensor_type.shape.dim]
              for v in [*model.graph.value_info, *model.graph.input, *model.graph.output]}
    shapes.update({t.name: list(t.dims) for t in model.graph.initializer})
    out = {}
    for n in model.graph.node:
        y = shapes.get(n.output[0]) if n.output else None
        if not y:
            continue
        elems = int(np.prod(y[1:])) if len(y) > 1 else int(np.prod(y))
        if n.op_type in ("Conv", "ConvTranspose") and len(n.input) > 1 and n.input[1] in shapes:
            w = shapes[n.input[1]]
            out[n.name] = elems * int(np.prod(w[1:]))
        elif n.op_type in ("Gemm", "MatMul") and len(n.input) > 1 and n.input[1] in shapes:
            w = shapes[n.input[1]]
            trans_b = any(a.name == "transB" and a.i for a in n.attribute)
            k = w[-1] if (n.op_type == "Gemm" and trans_b) else w[-2] if len(w) > 1 else w[0]
            out[n.name] = elems * int(k)
        else:
            out[n.name] = elems
    return out


def precision_summary(fp32: onnx.ModelProto, qmodel: onnx.ModelProto) -> dict:
    """What a quantized model holds, per precision: its int16 layers and the share of MACs each
    precision carries (``precision.mac_share``), plus the auto-precision report stamped on it, if
    any. (``fp32``: kept for callers; the count reads the quantized graph itself.)"""
    from .precision import mac_share, precision_of, stamped
    prec = precision_of(qmodel)
    out = {"int16_layers": sorted(n for n, p in prec.items() if p == "int16"),
           "mac_share": {k: round(v, 6) for k, v in mac_share(qmodel).items()}}
    report = stamped(qmodel)
    if report is not None:
        out["auto"] = report
    return out
