"""The Program artefact: saved and loaded in one file, run in a fresh process without MLIR."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

import torq
from torq.errors import TorqError
from torq.program import FORMAT_VERSION, Program
from torq.runtime.nss import Simulator

SRC = Path(torq.__file__).parent


@pytest.fixture(scope="module")
def compiled():
    from qmodels import conv_model, quantize
    rng = np.random.default_rng(11)
    m = conv_model(rng, 3, 8, 3, 1, 1, [1, 1, 1, 1], 1, True, True, (8, 8))
    return torq.compile(quantize(m, {"x": [1, 3, 8, 8]}, "qdq", act="u8", per_channel=True))


def _inputs(program, seed=0):
    rng = np.random.default_rng(seed)
    return {p.name: rng.integers(0, 256, p.shape).astype(p.onnx_dtype) for p in program.inputs}


def test_program_describes_the_model(compiled):
    p = compiled.program
    assert [x.name for x in p.inputs] == compiled.input_names
    assert p.inputs[0].uint8 and p.inputs[0].dtype == "i8" and p.inputs[0].onnx_dtype == np.uint8
    from torq.graph.io_quant import io_quant_params
    q = io_quant_params(compiled.model)["inputs"]["x"]
    assert (p.inputs[0].scale, p.inputs[0].zero_point) == (q["scale"], q["zero_point"])
    assert 0 <= p.inputs[0].zero_point <= 255 and p.outputs[0].scale > 0
    conv = [s for s in p.steps if s.op == "torq_hl.conv2d"]
    assert len(conv) == 1 and conv[0].onnx_op == "Conv" and ":" in conv[0].location
    assert conv[0].shape == (1, 8, 8, 8) and conv[0].dtype == "i8"
    assert isinstance(conv[0].attrs["shift_factor"], int) and conv[0].attrs["ort_dq_scale"].dtype == np.float32
    w, sb = (p.constants[a] for a in conv[0].args[:2])
    assert w.shape == (8, 3, 3, 3) and sb.shape == (16,)


def test_save_load_round_trip(compiled, tmp_path):
    path = compiled.program.save(tmp_path / "m.torq")
    q = Program.load(path)
    p = compiled.program
    assert [(s.op, s.args, s.out, s.shape, s.dtype, s.location, s.onnx_op) for s in q.steps] == \
           [(s.op, s.args, s.out, s.shape, s.dtype, s.location, s.onnx_op) for s in p.steps]
    for a, b in zip(p.steps, q.steps):
        assert a.attrs.keys() == b.attrs.keys()
        for k in a.attrs:
            assert np.array_equal(np.asarray(a.attrs[k]), np.asarray(b.attrs[k])), k
    assert p.constants.keys() == q.constants.keys()
    assert all(np.array_equal(p.constants[k], q.constants[k]) and p.constants[k].dtype == q.constants[k].dtype
               for k in p.constants)
    x = _inputs(p)
    for r in ("native", "ort"):
        want = compiled.run(x, rounding=r)
        got = q.fetch(Simulator(q).run(q.feed(x), r))
        assert all(np.array_equal(want[k], got[k]) and want[k].dtype == got[k].dtype for k in want)


BLOCKER = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch_mlir", "onnxruntime", "onnx"):
            raise ImportError(f"blocked: {name}")
        return None
sys.meta_path.insert(0, _Block())
"""


def test_saved_program_runs_in_a_fresh_process_without_mlir(compiled, tmp_path):
    """Identical outputs from the loaded program in a process where torch_mlir, onnxruntime and
    onnx cannot be imported at all."""
    compiled.program.save(tmp_path / "m.torq")
    x = _inputs(compiled.program, seed=3)
    np.savez(tmp_path / "x.npz", **x)
    for r in ("native", "ort"):
        np.savez(tmp_path / f"want_{r}.npz", **compiled.run(x, rounding=r))
    script = BLOCKER + textwrap.dedent(f"""
        import numpy as np
        try:
            import torch_mlir  # noqa: F401
            raise SystemExit("the blocker does not block")
        except ImportError:
            pass
        from torq.program import Program
        from torq.runtime.nss import Simulator
        d = {str(tmp_path)!r}
        p = Program.load(d + "/m.torq")
        x = dict(np.load(d + "/x.npz"))
        sim = Simulator(p)
        for r in ("native", "ort"):
            got = p.fetch(sim.run(p.feed(x), r))
            want = dict(np.load(d + f"/want_{{r}}.npz"))
            assert got.keys() == want.keys()
            for k in want:
                assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), (r, k)
        import sys
        bad = [m for m in sys.modules if m.split(".")[0] in ("torch_mlir", "onnxruntime", "onnx")
               or m.startswith("torq.compiler")]
        assert not bad, bad
        print("OK")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env={"PYTHONPATH": str(SRC.parent), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and r.stdout.strip() == "OK", r.stdout + r.stderr


def test_runtime_imports_no_compiler_no_mlir_no_ort():
    script = textwrap.dedent("""
        import sys
        import torq.runtime, torq.runtime.nss, torq.runtime.kernels, torq.program, torq.numerics
        bad = [m for m in sys.modules if m.split(".")[0] in ("torch_mlir", "onnxruntime")
               or m.startswith("torq.compiler")]
        print(bad)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env={"PYTHONPATH": str(SRC.parent), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_wrong_version_is_a_one_line_error(compiled, tmp_path):
    path = compiled.program.save(tmp_path / "m.torq")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    manifest = json.loads(bytes(arrays["__manifest__"]).decode())
    manifest["version"] = FORMAT_VERSION + 1
    arrays["__manifest__"] = np.frombuffer(json.dumps(manifest).encode(), np.uint8)
    np.savez(tmp_path / "new.torq.npz", **arrays)
    with pytest.raises(TorqError, match=rf"new\.torq\.npz: program format version {FORMAT_VERSION + 1}, this torq "
                                        rf"reads version {FORMAT_VERSION}"):
        Program.load(tmp_path / "new.torq.npz")


@pytest.mark.parametrize("kind", ["garbage", "truncated", "empty", "plain npz", "missing"])
def test_corrupt_file_is_a_one_line_error(compiled, tmp_path, kind):
    path = tmp_path / "bad.torq"
    if kind == "garbage":
        path.write_bytes(b"\x00not a zip" * 10)
    elif kind == "truncated":
        good = compiled.program.save(tmp_path / "good.torq").read_bytes()
        path.write_bytes(good[: len(good) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "plain npz":
        with open(path, "wb") as f:
            np.savez(f, x=np.zeros(3))
    with pytest.raises(TorqError) as e:
        Program.load(path)
    msg = str(e.value)
    assert str(path) in msg and "\n" not in msg
    assert isinstance(e.value, TorqError) and not isinstance(e.value, zipfile.BadZipFile)


def test_save_is_atomic(compiled, tmp_path):
    compiled.program.save(tmp_path / "m.torq")
    assert [p.name for p in tmp_path.iterdir()] == ["m.torq"]


def test_compile_cli_emits_program(compiled, tmp_path):
    src = tmp_path / "q.onnx"
    import onnx
    onnx.save(compiled.model, src)
    out = tmp_path / "m.torq"
    r = subprocess.run([sys.executable, "-m", "torq.compile_cli", str(src), "--emit", "program", "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    p = Program.load(out)
    x = _inputs(p)
    want = compiled.run(x)
    got = p.fetch(Simulator(p).run(p.feed(x)))
    assert all(np.array_equal(want[k], got[k]) for k in want)
    r = subprocess.run([sys.executable, "-m", "torq.compile_cli", str(src), "--emit", "program"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "-o/--output" in r.stderr


@pytest.mark.parametrize("bad,why", [
    (lambda x: {**x, "x": x["x"].astype(np.int8)}, r"input 'x': expected uint8 of shape \[1, 3, 8, 8\], got int8"),
    (lambda x: {**x, "x": x["x"][:, :2]}, r"input 'x': expected uint8 of shape \[1, 3, 8, 8\], got uint8 of shape \[1, 2, 8, 8\]"),
    (lambda x: {}, r"missing input\(s\): x"),
    (lambda x: {**x, "y": x["x"]}, r"unknown input 'y'; the model takes: x"),
])
def test_run_checks_inputs_against_the_model(compiled, bad, why):
    with pytest.raises(TorqError, match=why):
        compiled.run(bad(_inputs(compiled.program)))
