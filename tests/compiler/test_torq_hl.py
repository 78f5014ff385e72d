"""The torq_hl dialect is registered with IRDL: lowered modules verify, malformed ops do not."""
from __future__ import annotations

import pytest

from torq.compiler import importer, torq_hl
from torq.errors import TorqError

OP = '''func.func @f(%x: tensor<1x2x4x4xi8>) -> tensor<1x2x4x4xi8> {{
  %init = tensor.empty() : tensor<1x2x4x4xi8>
  %0 = "torq_hl.maxpool2d"(%init, %x) {{{attrs}}} : (tensor<1x2x4x4xi8>, tensor<1x2x4x4xi8>) -> tensor<1x2x4x4xi8>
  return %0 : tensor<1x2x4x4xi8>
}}'''
GOOD = "kernel = array<i64: 1, 1>, stride = array<i64: 1, 1>, pad = array<i64: 0, 0, 0, 0>, dilation = array<i64: 1, 1>"


def test_well_formed_op_verifies():
    m = importer.parse(OP.format(attrs=GOOD))
    m.operation.verify()
    with m.context:
        op = list(m.body.operations[0].regions[0].blocks[0].operations)[1].operation
        assert torq_hl.op_attrs(op)["kernel"].tolist() == [1, 1]


@pytest.mark.parametrize("attrs,why", [
    (GOOD.replace("kernel = array<i64: 1, 1>, ", ""), "kernel"),            # missing attribute
    (GOOD.replace("array<i64: 1, 1>, stride", '"big", stride'), "dense_array"),  # wrong attribute kind
])
def test_malformed_op_is_rejected(attrs, why):
    with pytest.raises(TorqError, match=why):
        importer.parse(OP.format(attrs=attrs))


def test_every_op_has_an_irdl_definition():
    text = torq_hl.irdl_text()
    for name, (operands, attrs) in torq_hl.OPS.items():
        assert f"irdl.operation @{name} " in text
        for a in attrs:
            assert f'"{a}"' in text
