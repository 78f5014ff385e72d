"""One NSS op set: the lowering report, the Program emitter and the simulator all run exactly
``torq.isa.DATA_MOVEMENT`` (a drift, e.g. an op the report accepts but nothing emits, fails here),
and every op of it goes MLIR -> Program step -> simulator kernel with numpy's result."""
from __future__ import annotations

import numpy as np

from torq import isa
from torq.compiler import emit, importer
from torq.runtime import movement
from torq.runtime.nss import Simulator


def disagreements(**sets) -> dict:
    """name -> ops it has that the others lack, or lacks that they have (empty: they agree)."""
    union = set().union(*sets.values())
    return {k: sorted(union ^ set(v)) for k, v in sets.items() if set(v) != union}


def test_emitter_and_simulator_run_the_isa_op_set():
    assert disagreements(isa=isa.DATA_MOVEMENT, emitter=emit._MOVEMENT, simulator=movement.DATA_MOVEMENT) == {}


def test_a_drift_is_seen():
    """Positive control: the tensor.insert_slice drift this test was written for."""
    report = {*isa.DATA_MOVEMENT}
    emitted = {k for k in emit._MOVEMENT if k != "tensor.insert_slice"}
    assert disagreements(report=report, emitter=emitted) == {"emitter": ["tensor.insert_slice"]}


def test_lowering_report_accepts_exactly_the_isa():
    for op in isa.DATA_MOVEMENT:
        assert isa.runs_on_nss(op)
    assert isa.runs_on_nss("torq_hl.conv2d") and isa.runs_on_nss("arith.constant")
    assert not isa.runs_on_nss("linalg.generic") and not isa.runs_on_nss("tensor.gather")


MLIR = """module {
  func.func @f(%arg0: tensor<1x2x3x4xi8>) -> (tensor<1x2x5x7xi8>, tensor<1x2x3x4xi8>, tensor<2x12xi8>,
      tensor<1x2x3x4xi8>, tensor<1x3x4x2xi8>, tensor<2x5x12xi8>, tensor<1x3x2xi8>, tensor<4x3x3xi8>,
      tensor<1x4x3x4xi8>) {
    %c7 = arith.constant 7 : i8
    %m = arith.constant -128 : i8
    %p = tensor.pad %arg0 low[0, 0, 1, 1] high[0, 0, 1, 2] {
    ^bb0(%i: index, %j: index, %k: index, %l: index):
      tensor.yield %m : i8
    } : tensor<1x2x3x4xi8> to tensor<1x2x5x7xi8>
    %cs = tensor.collapse_shape %arg0 [[0, 1], [2], [3]] : tensor<1x2x3x4xi8> into tensor<2x3x4xi8>
    %es = tensor.expand_shape %cs [[0, 1], [2], [3]] output_shape [1, 2, 3, 4] : tensor<2x3x4xi8> into tensor<1x2x3x4xi8>
    %shape = arith.constant dense<[2, 12]> : tensor<2xi64>
    %rs = tensor.reshape %arg0(%shape) : (tensor<1x2x3x4xi8>, tensor<2xi64>) -> tensor<2x12xi8>
    %ca = tensor.cast %arg0 : tensor<1x2x3x4xi8> to tensor<1x2x3x4xi8>
    %e1 = tensor.empty() : tensor<1x3x4x2xi8>
    %t = linalg.transpose ins(%arg0 : tensor<1x2x3x4xi8>) outs(%e1 : tensor<1x3x4x2xi8>) permutation = [0, 2, 3, 1]
    %e2 = tensor.empty() : tensor<2x5x12xi8>
    %b = linalg.broadcast ins(%rs : tensor<2x12xi8>) outs(%e2 : tensor<2x5x12xi8>) dimensions = [1]
    %x = tensor.extract_slice %arg0[0, 1, 0, 1] [1, 1, 3, 2] [1, 1, 1, 2] : tensor<1x2x3x4xi8> to tensor<1x3x2xi8>
    %e3 = tensor.empty() : tensor<4x3x3xi8>
    %f = linalg.fill ins(%c7 : i8) outs(%e3 : tensor<4x3x3xi8>) -> tensor<4x3x3xi8>
    %y = tensor.insert_slice %x into %f[1, 0, 1] [1, 3, 2] [2, 1, 1] : tensor<1x3x2xi8> into tensor<4x3x3xi8>
    %cc = tensor.concat dim(1) %arg0, %es : (tensor<1x2x3x4xi8>, tensor<1x2x3x4xi8>) -> tensor<1x4x3x4xi8>
    return %p, %es, %rs, %ca, %t, %b, %x, %y, %cc : tensor<1x2x5x7xi8>, tensor<1x2x3x4xi8>, tensor<2x12xi8>,
      tensor<1x2x3x4xi8>, tensor<1x3x4x2xi8>, tensor<2x5x12xi8>, tensor<1x3x2xi8>, tensor<4x3x3xi8>,
      tensor<1x4x3x4xi8>
  }
}"""


def _expected(x):
    y = np.full((4, 3, 3), 7, np.int8)
    y[1, 0:3, 1:3] = x[0, 1, :, 1::2]
    return [np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 2)], constant_values=-128), x, x.reshape(2, 12), x,
            x.transpose(0, 2, 3, 1), np.broadcast_to(x.reshape(2, 1, 12), (2, 5, 12)), x[:, 1, :, 1::2], y,
            np.concatenate([x, x], axis=1)]


def test_every_data_movement_op_runs_from_mlir_to_the_simulator():
    module = importer.parse(MLIR)
    with module.context:
        program = emit.emit_program(module)
    assert {st.op for st in program.steps} == set(isa.DATA_MOVEMENT)
    x = np.arange(24, dtype=np.int8).reshape(1, 2, 3, 4) - 12
    outs = Simulator(program).run([x])
    for got, want in zip(outs, _expected(x), strict=True):
        np.testing.assert_array_equal(got, want)

