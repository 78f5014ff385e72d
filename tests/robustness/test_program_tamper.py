"""Program.load validates what it returns (audit 3: B14 programs, B23, B24).

Every tampering of the audit must end in a one-line TorqError naming the file, or (a harmless
byte) in the very same outputs. Each manifest edit is tried twice: as is (the checksum refuses
it) and re-sealed with a valid checksum (as a crafted file would be), where the structural
checks and the simulator's guard must still refuse it in one line.
"""
from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest

from torq import compile as torq_compile
from torq import program_file
from torq.errors import TorqError
from torq.program import Program
from torq.runtime.nss import Simulator


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The example CNN, quantized full-integer: a program of several steps."""
    from torq.examples import build_example_cnn
    from torq.quantize import quantize
    d = tmp_path_factory.mktemp("prog")
    build_example_cnn(d / "m.onnx")
    c = torq_compile(quantize(d / "m.onnx", full_integer=True, num_calib=2))
    assert len(c.program.steps) > 3
    path = c.program.save(d / "m.torq")
    x = {p.name: np.random.default_rng(0).integers(-128, 128, p.shape).astype(p.onnx_dtype) for p in c.program.inputs}
    return path, x, run(Program.load(path), x)


def run(p: Program, x):
    return p.fetch(Simulator(p).run(p.feed(x)))


def parts(path):
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    return json.loads(bytes(arrays.pop("__manifest__")).decode()), arrays


def write(path, manifest, arrays, reseal):
    if reseal:
        manifest["sha256"] = program_file._digest(manifest, arrays)
    np.savez(path, __manifest__=np.frombuffer(json.dumps(manifest).encode(), np.uint8), **arrays)
    return path.with_suffix(path.suffix + ".npz") if not str(path).endswith(".npz") else path


def outcome(path, x, ref):
    """'error' (one line, naming the file) or 'same'; anything else fails the test."""
    try:
        out = run(Program.load(path), x)
    except TorqError as e:
        msg = str(e)
        assert "\n" not in msg and str(path) in msg, msg
        return "error"
    assert out.keys() == ref.keys() and all(np.array_equal(out[k], ref[k]) and out[k].dtype == ref[k].dtype
                                            for k in ref), "silently different outputs"
    return "same"


def steps_of(m, op):
    return [s for s in m["steps"] if s["op"].endswith(op)]


def edit_conv(m, a, key, value):
    conv = steps_of(m, "conv2d")[0]
    if value is KeyError:
        conv["attrs"].pop(key)
    else:
        conv["attrs"][key] = value


EDITS = {
    "swap arrays": lambda m, a: a.update(a0=a["a1"], a1=a["a0"]) if a["a0"].shape == a["a1"].shape else
    a.update(a0=a["a0"][::-1].copy()),
    "weights float64": lambda m, a: a.update({k: v.astype(np.float64) for k, v in a.items() if v.ndim == 4}),
    "weights reshaped": lambda m, a: a.update({k: v.reshape(-1) for k, v in a.items() if v.ndim == 4}),
    "weights 0-d": lambda m, a: a.update({k: np.array(v.reshape(-1)[0]) for k, v in a.items() if v.ndim == 4}),
    "output dtype f32": lambda m, a: m["outputs"][0].update(dtype="f32"),
    "output slot moved": lambda m, a: m["outputs"][0].update(slot=m["steps"][0]["out"]),
    "slot out of range": lambda m, a: m["steps"][-1].update(args=[10**6]),
    "slot negative": lambda m, a: m["steps"][-1].update(args=[-1]),
    "slot uninitialised": lambda m, a: m["steps"][0].update(args=[m["steps"][-1]["out"]]),
    "steps reordered": lambda m, a: m["steps"].reverse(),
    "step removed": lambda m, a: m["steps"].pop(0),
    "pad length 1": lambda m, a: edit_conv(m, a, "pad", [1]),
    "stride 0": lambda m, a: edit_conv(m, a, "stride", [0, 0]),
    "shift 1e30": lambda m, a: edit_conv(m, a, "shift_factor", 10**30),
    "shift -5": lambda m, a: edit_conv(m, a, "shift_factor", -5),
    "zp x": lambda m, a: edit_conv(m, a, "input_zp", "x"),
    "attribute missing": lambda m, a: edit_conv(m, a, "shift_factor", KeyError),
    "n_slots 3": lambda m, a: m.update(n_slots=3),
    "n_slots -5": lambda m, a: m.update(n_slots=-5),
    "n_slots 1e10": lambda m, a: m.update(n_slots=10**10),
    "unknown op": lambda m, a: m["steps"][0].update(op="torq_hl.__class__"),
    "unknown dtype": lambda m, a: m["steps"][0].update(dtype="q7"),
    "array missing": lambda m, a: a.pop(sorted(a)[0]),
    "attrs a list": lambda m, a: m["steps"][0].update(attrs=[1]),
    "version": lambda m, a: m.update(version=99),
}


@pytest.mark.parametrize("reseal", [False, True], ids=["as-is", "resealed"])
@pytest.mark.parametrize("edit", sorted(EDITS))
def test_tampered_programs(saved, tmp_path, edit, reseal):
    path, x, ref = saved
    m, a = parts(path)
    EDITS[edit](m, a)
    out = write(tmp_path / "t.npz", m, a, reseal)
    if reseal and edit in VALID_WHEN_RESEALED:
        return           # a well-formed program with other weights: only a signature could tell
    result = outcome(out, x, ref)
    if not reseal or edit not in HARMLESS_WHEN_RESEALED:
        assert result == "error", edit


VALID_WHEN_RESEALED = {"swap arrays"}
HARMLESS_WHEN_RESEALED = {"weights float64"}     # the same integers: the same outputs


def test_deep_manifest_and_byte_flips(saved, tmp_path):
    path, x, ref = saved
    m, a = parts(path)
    deep = tmp_path / "deep.npz"
    np.savez(deep, __manifest__=np.frombuffer(("[" * 100000 + "]" * 100000).encode(), np.uint8), **a)
    assert outcome(deep, x, ref) == "error"
    data = path.read_bytes()
    rng = np.random.default_rng(3)
    seen = set()
    for i in range(40):
        flipped = bytearray(data)
        k = int(rng.integers(len(data)))
        flipped[k] ^= 1 << int(rng.integers(8))
        f = tmp_path / f"flip{i}.torq"
        f.write_bytes(bytes(flipped))
        seen.add(outcome(f, x, ref))
    assert "error" in seen


def test_a_zip_bomb_is_refused_before_it_inflates(tmp_path):
    """A 1.5 MB file declaring 1.5 GB of zeros (the audit's bomb) is refused from its directory."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("__manifest__.npy", b"x")
        with zf.open("a0.npy", "w", force_zip64=True) as f:
            header = io.BytesIO()
            np.lib.format.write_array_header_1_0(header, {"descr": "|i1", "fortran_order": False,
                                                          "shape": (1500 << 20,)})
            f.write(header.getvalue())
            chunk = bytes(1 << 20)
            for _ in range(1500):
                f.write(chunk)
    bomb = tmp_path / "bomb.torq"
    bomb.write_bytes(buf.getvalue())
    import resource
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(TorqError, match="MiB in a .* MiB file"):
        Program.load(bomb)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 << 10    # KiB: < 200 MiB
