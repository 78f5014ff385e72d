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
May import: torq.isa, torq.numerics, torq.errors, torq.fileio (never the compiler, MLIR or ONNX Runtime).
"""
from __future__ import annotations

import io
import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import numerics
from .errors import TorqError
from .isa import ELEMENT_TYPES

FORMAT = "torq-program"
FORMAT_VERSION = 1

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
    def save(self, path: str | os.PathLike) -> Path:
        """Write the program as one .npz file (temp file + rename: never half-written)."""
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
            "format": FORMAT, "version": FORMAT_VERSION, "n_slots": self.n_slots,
            "inputs": [_port_json(p) for p in self.inputs], "outputs": [_port_json(p) for p in self.outputs],
            "constants": {str(k): put(np.asarray(v)) for k, v in self.constants.items()},
            "steps": [{"op": s.op, "args": list(s.args), "out": s.out, "shape": list(s.shape), "dtype": s.dtype,
                       "location": s.location, "onnx_op": s.onnx_op,
                       "attrs": {k: put(v) for k, v in s.attrs.items()}} for s in self.steps]}
        buf = io.BytesIO()
        np.savez(buf, __manifest__=np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8), **arrays)
        from .fileio import atomic_write_bytes
        return atomic_write_bytes(path, buf.getvalue())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Program":
        """Read a program written by ``save``; a wrong version or a damaged file is a TorqError."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as z:
                manifest = json.loads(bytes(z["__manifest__"]).decode())
                arrays = {k: z[k] for k in z.files if k != "__manifest__"}
        except FileNotFoundError:
            raise TorqError(f"{path}: no such file") from None
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError, UnicodeDecodeError) as e:
            raise TorqError(f"{path}: not a torq program ({type(e).__name__})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise TorqError(f"{path}: not a torq program (no {FORMAT} manifest)")
        if manifest.get("version") != FORMAT_VERSION:
            raise TorqError(f"{path}: program format version {manifest.get('version')!r}, this torq reads "
                            f"version {FORMAT_VERSION}; recompile the model")
        try:
            return _from_manifest(manifest, arrays)
        except (KeyError, TypeError, ValueError) as e:
            raise TorqError(f"{path}: damaged torq program manifest ({type(e).__name__}: {e})") from None


def _port_json(p: Port) -> dict:
    return {"name": p.name, "slot": p.slot, "dtype": p.dtype, "shape": list(p.shape), "uint8": p.uint8,
            "scale": p.scale, "zero_point": p.zero_point}


def _from_manifest(m: dict, arrays: dict) -> Program:
    def get(v):
        if isinstance(v, dict) and "__array__" in v:
            return arrays[v["__array__"]]
        if isinstance(v, list):
            return [get(x) for x in v]
        return v

    def port(d):
        return Port(str(d["name"]), int(d["slot"]), str(d["dtype"]), tuple(d["shape"]), bool(d["uint8"]),
                    d["scale"], d["zero_point"])

    steps = [Step(str(s["op"]), [int(a) for a in s["args"]], int(s["out"]),
                  {k: get(v) for k, v in s["attrs"].items()}, tuple(s["shape"]), str(s["dtype"]),
                  str(s["location"]), s["onnx_op"]) for s in m["steps"]]
    return Program([port(p) for p in m["inputs"]], [port(p) for p in m["outputs"]], steps,
                   {int(k): get(v) for k, v in m["constants"].items()}, int(m["n_slots"]))
