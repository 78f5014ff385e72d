"""A compiled model as plain data: the artefact between the compiler and the runtime.

The compiler lowers ONNX to a verified ``torq_hl`` module and emits it as a ``Program``: ops in
order, each reading operand *slots* and writing one, with its attributes as ints / strings /
numpy arrays, the result type the IR declared, the ``LINE:COL`` location in the imported MLIR
and the ONNX op it came from; constants as numpy arrays; the graph inputs and outputs with
names, dtypes, shapes and whether they are uint8 shifted to int8 at the boundary. The runtime
executes it with ``torq.numerics`` only (no MLIR, no ONNX Runtime), so a saved program runs
anywhere numpy does.

``Program.save(path)`` writes one ``.npz`` file: every array under its own key plus a JSON
manifest (``__manifest__``) holding the rest; ``Program.load(path)`` reads it back. The manifest
carries ``FORMAT_VERSION``; another version, or a file that is not a program, is a one-line
TorqError naming the file.
May import: torq.isa, torq.numerics, torq.program_file, torq.errors, torq.fileio (never the compiler, MLIR or ONNX Runtime).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import numerics, program_file
from .errors import TorqError
from .isa import ELEMENT_TYPES

FORMAT_VERSION = program_file.FORMAT_VERSION


def np_dtype(elem: str):
    """numpy dtype of an MLIR element type name ("i8", "bf16", ...)."""
    try:
        return np.dtype(ELEMENT_TYPES[elem])
    except KeyError:
        raise TorqError(f"element type {elem!r} is not supported by the runtime") from None


@dataclass
class Step:
    """One op: ``slots[out] = op(slots[args...], **attrs)``."""
    op: str                              # "torq_hl.conv2d", "tensor.pad", ...
    args: list[int]
    out: int
    attrs: dict                          # name -> int | float | str | list | np.ndarray
    shape: tuple                         # result shape the IR declared
    dtype: str                           # result element type the IR declared ("i8", "bf16", ...)
    location: str = "?"                  # LINE:COL in the torch_onnx MLIR
    onnx_op: str | None = None           # the ONNX op type at that location


@dataclass
class Port:
    """A graph input or output."""
    name: str
    slot: int
    dtype: str                           # element type inside the program ("i8" for shifted uint8)
    shape: tuple
    uint8: bool = False                  # the ONNX model has uint8 here (shifted by numerics.UINT8_SHIFT)
    scale: float | None = None           # quantization of an integer graph I/O (full-integer models),
    zero_point: int | None = None        # in the ONNX model's own dtype (uint8 zero points unshifted)

    @property
    def onnx_dtype(self) -> np.dtype:
        """What the caller feeds / receives."""
        return np.dtype(np.uint8) if self.uint8 else np_dtype(self.dtype)


@dataclass
class Program:
    inputs: list[Port]
    outputs: list[Port]
    steps: list[Step]
    constants: dict[int, np.ndarray] = field(default_factory=dict)
    n_slots: int = 0
    source: str | None = field(default=None, compare=False)   # the file it was loaded from
    cache_key: str | None = field(default=None, compare=False)  # the cache key it was saved under

    # -- graph I/O
    def feed(self, inputs: dict) -> list[np.ndarray]:
        """The inputs in program order, each checked against the model (name, dtype, shape) with a
        one-line TorqError naming it; uint8 inputs shifted to the int8 the program computes with,
        float32 values of a bf16 input rounded to bf16 (nearest even)."""
        if not isinstance(inputs, dict):
            raise TorqError(f"inputs must be a dict of input name -> array, not {type(inputs).__name__}")
        names = [p.name for p in self.inputs]
        unknown = [n for n in inputs if n not in names]
        if unknown:
            raise TorqError(f"unknown input {unknown[0]!r}; the model takes: {', '.join(names)}")
        missing = [n for n in names if n not in inputs]
        if missing:
            raise TorqError(f"missing input(s): {', '.join(missing)}")
        out = []
        for p in self.inputs:
            x = np.asarray(inputs[p.name])
            if x.dtype != p.onnx_dtype or tuple(x.shape) != tuple(p.shape):
                raise TorqError(f"input {p.name!r}: expected {p.onnx_dtype} of shape {list(p.shape)}, "
                                f"got {x.dtype} of shape {list(x.shape)}")
            out.append(numerics.uint8_to_int8(x) if p.uint8 else numerics.to_bf16(x) if p.dtype == "bf16" else x)
        return out

    def fetch(self, outs: list) -> dict[str, np.ndarray]:
        """Program outputs by name, uint8 outputs shifted back."""
        return {p.name: numerics.int8_to_uint8(o) if p.uint8 else o for p, o in zip(self.outputs, outs)}

    # -- serialisation
    def save(self, path: str | os.PathLike, cache_key: str | None = None) -> Path:
        """Write the program as one .npz file (temp file + rename: never half-written).
        ``cache_key``: what a cache files it under (checked on load, so a moved file is refused)."""
        arrays: dict[str, np.ndarray] = {}

        def put(v):
            if isinstance(v, np.ndarray):
                key = f"a{len(arrays)}"
                arrays[key] = v
                return {"__array__": key}
            if isinstance(v, (np.integer,)):
                return int(v)
            if isinstance(v, (np.floating,)):
                return float(v)
            if isinstance(v, (list, tuple)):
                return [put(x) for x in v]
            return v

        manifest = {
            "cache_key": cache_key, "n_slots": self.n_slots,
            "inputs": [_port_json(p) for p in self.inputs], "outputs": [_port_json(p) for p in self.outputs],
            "constants": {str(k): put(np.asarray(v)) for k, v in self.constants.items()},
            "steps": [{"op": s.op, "args": list(s.args), "out": s.out, "shape": list(s.shape), "dtype": s.dtype,
                       "location": s.location, "onnx_op": s.onnx_op,
                       "attrs": {k: put(v) for k, v in s.attrs.items()}} for s in self.steps]}
        from .fileio import atomic_write_bytes
        return atomic_write_bytes(path, program_file.to_bytes(manifest, arrays))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Program":
        """Read a program written by ``save``, checked whole (``program_file``): a wrong version,
        a damaged or tampered file is a one-line TorqError naming it."""
        path = Path(path)
        manifest, arrays = program_file.read(path)
        try:
            program = _from_manifest(manifest, arrays)
            check_dataflow(program)
        except program_file.Damaged as e:
            raise TorqError(f"{path}: damaged torq program ({e}); recompile the model") from None
        program.source = str(path)
        program.cache_key = manifest.get("cache_key")
        return program


def _port_json(p: Port) -> dict:
    return {"name": p.name, "slot": p.slot, "dtype": p.dtype, "shape": list(p.shape), "uint8": p.uint8,
            "scale": p.scale, "zero_point": p.zero_point}


def _from_manifest(m: dict, arrays: dict) -> Program:
    F = program_file
    if not all(isinstance(m.get(k), t) for k, t in (("inputs", list), ("outputs", list), ("steps", list),
                                                  ("constants", dict))):
        raise F.Damaged("the manifest lacks inputs, outputs, steps or constants")
    values = len(m["inputs"]) + len(m["constants"]) + len(m["steps"])
    n_slots = F.integer(m.get("n_slots"), "n_slots", 0, 4 * values + 64)   # (a list of that length is made)

    def slot(v, what):
        return F.integer(v, what, 0, max(0, n_slots - 1))

    def port(d, what):
        if not isinstance(d, dict):
            raise F.Damaged(f"{what} is not an object")
        scale, zp = d.get("scale"), d.get("zero_point")
        if scale is not None and (not isinstance(scale, (int, float)) or isinstance(scale, bool)
                                  or not np.isfinite(scale)):
            raise F.Damaged(f"{what}.scale is {scale!r}")
        if zp is not None:
            F.integer(zp, f"{what}.zero_point", -2**31, 2**31 - 1)
        dtype = F.text(d.get("dtype"), f"{what}.dtype")
        _known(dtype, what)
        return Port(F.text(d.get("name"), f"{what}.name"), slot(d.get("slot"), f"{what}.slot"), dtype,
                    F.shape(d.get("shape"), f"{what}.shape"), d.get("uint8") is True, scale, zp)

    steps = []
    for i, s in enumerate(m["steps"]):
        what = f"step {i}"
        if not isinstance(s, dict) or not isinstance(s.get("attrs"), dict) or not isinstance(s.get("args"), list):
            raise F.Damaged(f"{what} is not an object with args and attrs")
        dtype = F.text(s.get("dtype"), f"{what}.dtype")
        _known(dtype, what)
        steps.append(Step(F.text(s.get("op"), f"{what}.op"), [slot(a, f"{what}.args") for a in s["args"]],
                          slot(s.get("out"), f"{what}.out"),
                          {str(k): F.value(v, arrays, f"{what}.attrs[{k!r}]") for k, v in s["attrs"].items()},
                          F.shape(s.get("shape"), f"{what}.shape"), dtype,
                          F.text(s.get("location"), f"{what}.location"),
                          F.text(s.get("onnx_op"), f"{what}.onnx_op", optional=True)))
    constants = {}
    for k, v in m["constants"].items():
        c = F.value(v, arrays, f"constant {k}")
        if not isinstance(c, np.ndarray) or not k.isdecimal():
            raise F.Damaged(f"constant {k!r} is not an array in a slot")
        constants[slot(int(k), f"constant {k}")] = c
    return Program([port(p, f"input {i}") for i, p in enumerate(m["inputs"])],
                   [port(p, f"output {i}") for i, p in enumerate(m["outputs"])], steps, constants, n_slots)


def _known(dtype: str, what: str) -> None:
    if dtype not in ELEMENT_TYPES:
        raise program_file.Damaged(f"{what} has the unknown element type {dtype!r}")


def check_dataflow(p: Program) -> None:
    """Every slot written once before it is read; every output port typed as what it points at."""
    F = program_file
    types: dict[int, tuple] = {}
    for port in p.inputs:
        types[port.slot] = (np_dtype(port.dtype), tuple(port.shape))
    for k, c in p.constants.items():
        if k in types:
            raise F.Damaged(f"slot {k} is written twice")
        types[k] = (c.dtype, tuple(c.shape))
    for i, st in enumerate(p.steps):
        missing = [a for a in st.args if a not in types]
        if missing:
            raise F.Damaged(f"step {i} ({st.op} at {st.location}) reads slot {missing[0]} before it is written")
        if st.out in types:
            raise F.Damaged(f"step {i} ({st.op} at {st.location}) writes slot {st.out} a second time")
        types[st.out] = (np_dtype(st.dtype), tuple(st.shape))
    for port in p.outputs:
        have = types.get(port.slot)
        if have is None or have != (np_dtype(port.dtype), tuple(port.shape)):
            raise F.Damaged(f"output {port.name!r} is declared {port.dtype} {list(port.shape)} but slot "
                            f"{port.slot} holds {'nothing' if have is None else f'{have[0]} {list(have[1])}'}")
