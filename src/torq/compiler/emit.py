"""Emit a verified torq_hl module as a `torq.program.Program` (the compiler's last step).

Every op of the function body becomes a `Step` reading operand slots: torq_hl ops keep their
attributes (decoded with `torq_hl.op_attrs`), data-movement ops get theirs as plain ints
(pad widths and value, permutation, slice offsets, ...), `arith.constant`s become program
constants. Anything else is refused here, with the lowering's reason:
"not supported on NSS: <op> at LINE:COL: <reason>".
"""
from __future__ import annotations

import numpy as np

from .. import isa
from ..errors import TorqError
from ..program import Port, Program, Step
from . import linalg_view as L
from . import torq_hl
from .lowering import Unsupported, func_ops


def emit_program(module, unsupported: list[Unsupported] = (), onnx_ops: dict | None = None,
                 input_names=(), output_names=(), uint8_inputs=(), uint8_outputs=(), io_quant=None,
                 recorded: dict | None = None) -> Program:
    """The Program of `module` (torq_hl + data movement only). `onnx_ops`: "LINE:COL" -> ONNX op;
    `io_quant`: {"inputs"|"outputs": {name: {"scale", "zero_point"}}} of integer graph I/O;
    `recorded`: the torq_hl attribute values kept while lowering (`torq_hl.recording`)."""
    program = _Emitter(module, unsupported, onnx_ops or {}, recorded).program(
        list(input_names), list(output_names), set(uint8_inputs), set(uint8_outputs))
    io_quant = io_quant or {}
    for ports, key in ((program.inputs, "inputs"), (program.outputs, "outputs")):
        for p in ports:
            q = io_quant.get(key, {}).get(p.name)
            if q is not None:
                p.scale, p.zero_point = q["scale"], q["zero_point"]
    return program


class _Emitter:
    def __init__(self, module, unsupported, onnx_ops, recorded=None):
        self.module, self.onnx_ops, self.recorded = module, onnx_ops, recorded
        self.reasons = {(u.op, u.location): u for u in unsupported}
        self.slots: dict = {}
        self.folder = L.Folder()

    def _key(self, value):
        op = L.producer(value)
        return ("arg", value.arg_number) if op is None else (L.id_of(op), value.result_number)

    def _new(self, value) -> int:
        self.slots[self._key(value)] = len(self.slots)
        return self.slots[self._key(value)]

    def program(self, input_names, output_names, u8_in, u8_out) -> Program:
        ops = func_ops(self.module)
        func = [o for o in self.module.body.operations if o.operation.name == "func.func"][0]
        args = list(func.regions[0].blocks[0].arguments)
        names = input_names or [f"input{i}" for i in range(len(args))]
        inputs = [Port(n, self._new(a), L.element_type(a), L.shape_of(a), n in u8_in) for n, a in zip(names, args)]
        steps, consts, bad, outputs = [], {}, [], []
        for op in ops:
            name = op.name
            if name == "func.return":
                outs = list(op.operands)
                names = output_names or [f"output{i}" for i in range(len(outs))]
                outputs = [Port(n, self.slots[self._key(v)], L.element_type(v), L.shape_of(v), n in u8_out)
                           for n, v in zip(names, outs)]
                continue
            if not isa.runs_on_nss(name):
                loc = L.location_key(op)
                bad.append(self.reasons.get((name, loc)) or Unsupported(name, loc, "no torq_hl lowering"))
                for r in op.results:
                    self._new(r)
                continue
            if name == "tensor.empty":
                self._new(op.results[0])
                continue
            if name == "arith.constant":
                consts[self._new(op.results[0])] = self.folder.value(op.results[0])
                continue
            steps.append(self._step(op))
        if bad:
            raise TorqError(str(bad[0]) + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))
        return Program(inputs, outputs, steps, consts, len(self.slots))

    def _step(self, op) -> Step:
        name, res = op.name, op.results[0]
        if name.startswith("torq_hl."):
            operands, attrs = list(op.operands)[1:], torq_hl.op_attrs(op, self.recorded)   # operand 0: init
        else:
            operands, attrs = self._data_movement(op)
        args = [self.slots[self._key(v)] for v in operands]
        loc = L.location_key(op)
        return Step(name, args, self._new(res), attrs, L.shape_of(res), L.element_type(res), loc,
                    self.onnx_ops.get(loc))

    def _data_movement(self, op):
        """(operands, attrs) of a data-movement step; ``isa.DATA_MOVEMENT`` names the attrs."""
        name, loc = op.name, L.location_key(op)
        read = _MOVEMENT.get(name)
        if read is None:
            raise TorqError(f"not supported on NSS: {name} at {loc}: no simulator kernel")
        return read(self, op, loc)


def _pad(em, op, loc):
    yielded = list(op.regions[0].blocks[0].operations)[-1].operands[0]
    value = em.folder.value(yielded)
    if value is None:
        raise TorqError(f"not supported on NSS: tensor.pad at {loc}: non-constant padding")
    return [op.operands[0]], {"low": L.attr_ints(op, "static_low"), "high": L.attr_ints(op, "static_high"),
                              "value": np.asarray(value).item()}


def _static_slice(op, loc, n_operands):
    if len(op.operands) > n_operands:
        raise TorqError(f"not supported on NSS: {op.name} at {loc}: dynamic slice")
    return list(op.operands), {k: L.attr_ints(op, "static_" + k) for k in ("offsets", "sizes", "strides")}


def _ints(attr):
    return lambda em, op, loc: ([op.operands[0]], {attr: L.attr_ints(op, attr)})


def _plain(em, op, loc):
    return [op.operands[0]], {}


#: How each data-movement op of ``isa.DATA_MOVEMENT`` becomes a step: (operands, attrs).
_MOVEMENT = {
    "tensor.pad": _pad,
    "tensor.collapse_shape": _plain, "tensor.expand_shape": _plain, "tensor.reshape": _plain,
    "tensor.cast": _plain, "linalg.fill": _plain,
    "linalg.transpose": _ints("permutation"),
    "linalg.broadcast": _ints("dimensions"),
    "tensor.extract_slice": lambda em, op, loc: _static_slice(op, loc, 1),
    "tensor.insert_slice": lambda em, op, loc: _static_slice(op, loc, 2),     # (source, dest)
    "tensor.concat": lambda em, op, loc: (list(op.operands), {"dim": int(op.attributes["dim"].value)}),
}
