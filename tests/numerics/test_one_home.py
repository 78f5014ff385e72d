"""torq.numerics is the one home of every numeric fact, and what the tests hold is what ships."""
from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

import torq
from torq import numerics as nx

SRC = Path(torq.__file__).parent
F32 = np.float32


def _public_functions():
    for mod in (nx.native, nx.ort, nx.bf16, nx.explain, nx.int16, nx.loops):
        tree = ast.parse(Path(mod.__file__).read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                yield mod.__name__, node.name


def _used_names(tree: ast.AST) -> set[str]:
    """Names a module uses in code (not in docstrings or comments): x, mod.x, from m import x."""
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            used.update(a.name for a in node.names)
    return used


def test_every_public_numerics_function_has_a_caller_in_src():
    """A public function only the tests call is a sibling of what ships: drift waiting to happen."""
    used = set()
    for p in SRC.rglob("*.py"):
        if p.parent.name != "numerics" or p.name != "__init__.py":
            used |= _used_names(ast.parse(p.read_text()))
    orphans = [f"{mod}.{name}" for mod, name in _public_functions() if name not in used]
    assert not orphans, f"no caller in src/: {orphans}"


def test_the_caller_check_sees_an_orphan():
    """The check above can fail: a name that is only defined and documented is not used."""
    tree = ast.parse('def lonely(x):\n    """lonely(x) is documented, never called."""\n    return x\n'
                     'def other():\n    return 1\n')
    assert "lonely" not in _used_names(tree) and "other" not in _used_names(tree)
    assert "lonely" in _used_names(ast.parse("from m import lonely"))


def test_every_public_name_is_exported():
    for mod, name in _public_functions():
        if not mod.endswith("loops"):
            assert name in nx.__all__, f"{mod}.{name} missing from torq.numerics.__all__"


def _exact_multiplier(xs, ws, ys, shift):
    return nx.llround(math.ldexp(float(xs) * float(ws) / float(ys), shift))


def test_conv_rescale_takes_the_float32_dq_scale():
    """The reference compiler divides the DQ scale of the i32 conv result (the float32 product
    fl32(xs*ws) of the QDQ graph) by the output scale, in double. On these scales the exact
    product xs*ws would give another multiplier; conv_rescale must give the fl32 one."""
    rng = np.random.default_rng(1)
    seen_different = 0
    for _ in range(200):
        xs, ws, ys = (F32(10 ** rng.uniform(-3, 0)) for _ in range(3))
        (m,), shift = nx.conv_rescale(nx.dq_scale(xs, ws), ys)
        s32 = F32(F32(xs * ws) / ys)
        if nx.exact_dyadic(s32):       # ORT's float32 scale is exact there: the NPU takes it
            assert m == nx.llround(math.ldexp(float(s32), shift))
            continue
        want = nx.llround(math.ldexp(float(F32(xs * ws)) / float(ys), shift))
        assert m == want
        seen_different += m != _exact_multiplier(xs, ws, ys, shift)
    assert seen_different > 100          # the two recipes really differ: the test decides


def test_compiled_conv_multipliers_are_conv_rescale_of_the_model_scales():
    """What the compiler stores in scale_bias is conv_rescale(dq_scale(xs, ws), ys) of the
    quantized model's own initializers (per-channel weights)."""
    from qmodels import conv_model, quantize
    from torq.compiler import importer, torq_hl
    from torq.compiler.lowering import func_ops
    rng = np.random.default_rng(5)
    q = quantize(conv_model(rng, 3, 6, 3, 1, 1, [1, 1, 1, 1], 1, True, False, (6, 6)),
                 {"x": [1, 3, 6, 6]}, "qdq", per_channel=True)
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    conv = next(n for n in q.graph.node if n.op_type == "Conv")
    dq = {n.output[0]: n for n in q.graph.node if n.op_type == "DequantizeLinear"}
    xs, ws = (inits[dq[conv.input[i]].input[1]] for i in (0, 1))
    consumer = next(n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == conv.output[0])
    ys = inits[consumer.input[1]]
    mults, shift = nx.conv_rescale(nx.dq_scale(xs, ws), ys)
    module = importer.parse(torq.compile(q).ir("torq_hl"))
    with module.context:
        (op,) = [o for o in func_ops(module) if o.name == "torq_hl.conv2d"]
        sb = np.array(op.operands[2].owner.attributes["value"]).astype(np.int64)
        assert torq_hl.op_attrs(op)["shift_factor"] == shift
    assert sb[1::2].tolist() == mults.tolist()
    assert isinstance(q, onnx.ModelProto)
