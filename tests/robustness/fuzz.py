"""A seeded mutation fuzzer for the CLIs: hostile models in, only success or one clean line out.

`mutate(model, rng)` changes one thing a hostile or careless user could (an attribute value, a dim,
the opset, an initializer's dtype or values, a name with a newline, an external-data path, a
dropped input, ...) and says what. `run_cli(main, argv, workdir)` runs a CLI's `main` in a forked
child (the test process has already imported torq, ORT and torch-mlir, so each run is cheap) with an
address-space cap and a timeout. `judge(...)` lists everything wrong with the outcome: a signal,
a timeout, a traceback, an internal error, more than one stderr line, a leftover file.
"""
from __future__ import annotations

import io
import os
import re
import resource
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from qmodels import model, quantize

MEMORY_CAP = 4 << 30
TIMEOUT_S = 60
EXTREMES = [0, -1, -2, 1, 2, 3, 5, 64, 2**31, -2**31, 2**63 - 1, -2**63]


def seeds() -> dict[str, tuple[onnx.ModelProto, dict]]:
    """name -> (fp32 model, input shapes): small graphs covering conv/pool/flatten/gemm/add/softmax."""
    rng = np.random.default_rng(0)
    cnn = model([helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                  name="conv1"),
                 helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
                 helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
                 helper.make_node("Flatten", ["p1"], ["f"], axis=1, name="flat"),
                 helper.make_node("Gemm", ["f", "w2", "b2"], ["y"], transB=1, name="fc")],
                [("x", [1, 3, 8, 8])], ["y"],
                {"w1": rng.normal(0, 0.3, (4, 3, 3, 3)), "b1": rng.normal(0, 0.1, 4),
                 "w2": rng.normal(0, 0.2, (5, 64)), "b2": rng.normal(0, 0.1, 5)})
    dw = model([helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=4,
                                 name="dw"),
                helper.make_node("Add", ["c1", "x"], ["a"], name="add"),
                helper.make_node("GlobalAveragePool", ["a"], ["g"], name="gap"),
                helper.make_node("Reshape", ["g", "shape"], ["r"], name="reshape"),
                helper.make_node("Softmax", ["r"], ["y"], axis=-1, name="softmax")],
               [("x", [1, 4, 6, 6])], ["y"],
               {"w1": rng.normal(0, 0.3, (4, 1, 3, 3)), "shape": np.array([1, 4])})
    dw.graph.initializer[-1].CopyFrom(onnx.numpy_helper.from_array(np.array([1, 4], np.int64), "shape"))
    return {"cnn": (cnn, {"x": [1, 3, 8, 8]}), "dw": (dw, {"x": [1, 4, 6, 6]})}


def int8_seeds() -> dict[str, onnx.ModelProto]:
    out = {}
    for name, (m, shapes) in seeds().items():
        out[f"{name}.qdq"] = quantize(m, shapes)
        out[f"{name}.pc"] = quantize(m, shapes, per_channel=True)
        out[f"{name}.qop"] = quantize(m, shapes, fmt="qoperator")
    return out


# ----------------------------------------------------------------------------- mutations

def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _set_attr(node, name, value):
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, value))


def _attribute(m, rng):
    node = _pick(rng, list(m.graph.node))
    ints = [a for a in node.attribute if a.type in (onnx.AttributeProto.INT, onnx.AttributeProto.INTS)]
    if not ints or rng.random() < 0.3:
        name = _pick(rng, ["group", "axis", "kernel_shape", "strides", "pads", "dilations", "transB"])
        value = int(_pick(rng, EXTREMES))
        _set_attr(node, name, [value] * int(rng.integers(1, 5)) if name in ("kernel_shape", "strides", "pads",
                                                                          "dilations") else value)
        return f"node {node.name!r} ({node.op_type}): add {name}={value}"
    a = _pick(rng, ints)
    value = int(_pick(rng, EXTREMES))
    if a.type == onnx.AttributeProto.INT:
        a.i = value
    elif a.ints and rng.random() < 0.7:
        a.ints[int(rng.integers(len(a.ints)))] = value
    else:
        a.ints.append(value)
    return f"node {node.name!r} ({node.op_type}): {a.name} -> {value}"


def _dims(m, rng):
    values = list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info)
    v = _pick(rng, values)
    dims = v.type.tensor_type.shape.dim
    if not dims:
        return _opset(m, rng)
    d = dims[int(rng.integers(len(dims)))]
    value = int(_pick(rng, [0, -1, 2, 3, 7, 2**20, 2**31, -2**63]))
    d.dim_value = value
    return f"value {v.name!r}: a dim -> {value}"


def _opset(m, rng):
    version = int(_pick(rng, [1, 6, 7, 9, 10, 11, 13, 21, 22, 30, 1000]))
    m.opset_import[0].version = version
    return f"opset -> {version}"


def _initializer(m, rng):
    t = _pick(rng, list(m.graph.initializer))
    kind = _pick(rng, ["dtype", "values", "dims", "truncate"])
    if kind == "dtype":
        t.data_type = int(_pick(rng, [TensorProto.INT8, TensorProto.UINT8, TensorProto.INT32, TensorProto.FLOAT,
                                      TensorProto.FLOAT16, TensorProto.INT64, TensorProto.DOUBLE]))
    elif kind == "values":
        arr = onnx.numpy_helper.to_array(t).copy()
        if arr.size:
            flat = arr.reshape(-1)
            info = np.finfo(arr.dtype) if arr.dtype.kind == "f" else np.iinfo(arr.dtype)
            flat[int(rng.integers(flat.size))] = _pick(rng, [info.max, info.min, 0] +
                                                       ([np.nan, np.inf] if arr.dtype.kind == "f" else []))
            t.CopyFrom(onnx.numpy_helper.from_array(arr, t.name))
    elif kind == "dims" and t.dims:
        t.dims[int(rng.integers(len(t.dims)))] = int(_pick(rng, [0, 1, 2, 2**31]))
    elif t.HasField("raw_data") and t.raw_data:
        t.raw_data = t.raw_data[: len(t.raw_data) // 2]
    return f"initializer {t.name!r}: {kind}"


def _newline_name(m, rng):
    node = _pick(rng, list(m.graph.node))
    node.name = f"{node.name}\nline2"
    if rng.random() < 0.5 and node.output:
        old, new = node.output[0], node.output[0] + "\n\x1b[31m"
        for n in m.graph.node:
            for i, x in enumerate(n.input):
                if x == old:
                    n.input[i] = new
        node.output[0] = new
        for v in list(m.graph.output) + list(m.graph.value_info):
            if v.name == old:
                v.name = new
    return f"node {node.name!r}: newline in names"


def _external(m, rng):
    t = _pick(rng, list(m.graph.initializer))
    loc = _pick(rng, ["../../etc/passwd", "/etc/passwd", "missing.bin", "weights\n.bin", ""])
    t.ClearField("raw_data")
    del t.float_data[:], t.int32_data[:], t.int64_data[:]
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    t.external_data.add(key="location", value=loc)
    return f"initializer {t.name!r}: external data at {loc!r}"


def _drop_input(m, rng):
    node = _pick(rng, [n for n in m.graph.node if n.input])
    i = int(rng.integers(len(node.input)))
    node.input[i] = "" if rng.random() < 0.5 else "no_such_tensor"
    return f"node {node.name!r} ({node.op_type}): input {i} -> {node.input[i]!r}"


def _qdq_param(m, rng):
    qs = [n for n in m.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear", "QLinearConv")]
    if not qs:
        return _initializer(m, rng)
    n = _pick(rng, qs)
    inits = {t.name: t for t in m.graph.initializer}
    params = [x for x in n.input[1:] if x in inits]
    if not params:
        return _attribute(m, rng)
    t = inits[_pick(rng, params)]
    arr = onnx.numpy_helper.to_array(t).copy()
    if arr.dtype.kind == "f":
        arr[...] = _pick(rng, [0.0, -1.0, np.inf, 1e-45, 1e38])
    else:
        info = np.iinfo(arr.dtype)
        arr[...] = _pick(rng, [info.min, info.max])
    t.CopyFrom(onnx.numpy_helper.from_array(arr, t.name))
    return f"node {n.name!r} ({n.op_type}): {t.name} -> {arr.reshape(-1)[:1]}"


MUTATIONS = [_attribute, _attribute, _attribute, _dims, _opset, _initializer, _newline_name, _external,
             _drop_input, _qdq_param]


def mutate(m: onnx.ModelProto, rng: np.random.Generator) -> tuple[onnx.ModelProto, str]:
    c = onnx.ModelProto()
    c.CopyFrom(m)
    what = _pick(rng, MUTATIONS)(c, rng)
    return c, what


# ----------------------------------------------------------------------------- running and judging

@dataclass
class Outcome:
    code: int | None           # exit status; None when killed by a signal
    signal: int | None
    stdout: str
    stderr: str
    leftovers: list[str]


def run_cli(main, argv: list[str], workdir: Path, keep: set[str]) -> Outcome:
    """`main(argv)` in a forked child, memory-capped, with a timeout; files left in workdir listed."""
    tmp = workdir / "tmp"
    tmp.mkdir()
    out, err = workdir / ".stdout", workdir / ".stderr"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(main, argv, tmp, out, err)
    _, status = os.waitpid(pid, 0)
    left = sorted(p.name for p in workdir.iterdir() if p.name not in keep | {"tmp", ".stdout", ".stderr"})
    left += sorted(f"tmp/{p.name}" for p in tmp.iterdir())
    outcome = Outcome(os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                      os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                      out.read_text(errors="replace"), err.read_text(errors="replace"), left)
    for p in (out, err):
        p.unlink()
    tmp.rmdir() if not any(tmp.iterdir()) else None
    return outcome


def _child(main, argv, tmp: Path, out: Path, err: Path) -> None:
    code = 70
    try:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
        signal.alarm(TIMEOUT_S)
        tempfile.tempdir = str(tmp)
        os.environ["TMPDIR"] = str(tmp)
        for fd, path in ((1, out), (2, err)):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(f, fd)
            os.close(f)
        sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), write_through=True)
        sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), write_through=True)
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # what the interpreter would do: traceback, exit 1
            import traceback
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code if isinstance(code, int) else 1)


_PROGRESS = re.compile(r"^\[\d\d:\d\d:\d\d\] ")     # torq.progress's plain lines in logs and pipes


def judge(outcome: Outcome, prog: str) -> list[str]:
    """Everything wrong with one run ([] = success or a clean one-line error)."""
    problems = []
    if outcome.signal is not None:
        problems.append(f"killed by {signal.Signals(outcome.signal).name}"
                        + (" (timeout)" if outcome.signal == signal.SIGALRM else ""))
    lines = [ln for ln in outcome.stderr.splitlines() if not _PROGRESS.match(ln)]   # (progress is not an error)
    if "Traceback" in outcome.stderr:
        problems.append("traceback")
    if "internal error" in outcome.stderr:
        problems.append("internal error")
    if outcome.code == 2 and (len(lines) != 1 or not lines[0].startswith(f"{prog}: error: ")):
        problems.append(f"{len(lines)} stderr lines")
    if outcome.code not in (0, 2, None):
        problems.append(f"exit {outcome.code}")
    if outcome.code == 2 and outcome.leftovers:
        problems.append(f"leftover files {outcome.leftovers}")
    elif outcome.leftovers and any(p.startswith("tmp/") for p in outcome.leftovers):
        problems.append(f"leftover temp files {outcome.leftovers}")
    return problems
