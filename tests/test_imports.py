"""Imports follow the layers: every unit of ``src/torq`` (a top-level module, a package, and the
compiler's front end) says in its docstring what it may import (``May import: torq.x, ...``), and
no module imports a torq unit its face does not name. Some units also keep third-party
libraries out (the simulator runs without MLIR or ONNX Runtime; numerics is a leaf)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import torq

SRC = Path(torq.__file__).parent

#: Third-party modules a unit must never import (what it is independent of).
NEVER = {
    "numerics": ("onnx", "onnxruntime", "torch_mlir", "iree"),
    "isa": ("onnx", "onnxruntime", "torch_mlir", "iree"),
    "program": ("onnx", "onnxruntime", "torch_mlir", "iree"),
    "runtime": ("onnx", "onnxruntime", "torch_mlir", "iree"),
    "compiler.frontend": ("torch_mlir", "iree", "onnxruntime"),
}


def unit_of(module: str) -> str:
    """'torq.compiler.frontend.canonicalize' -> 'compiler.frontend'; 'torq.program' -> 'program';
    'torq' (the face) -> '__init__'."""
    parts = module.split(".")[1:]
    if parts[:2] == ["compiler", "frontend"]:
        return "compiler.frontend"
    return parts[0] if parts else "__init__"


def face(unit: str) -> Path:
    if unit == "__init__":
        return SRC / "__init__.py"
    path = SRC.joinpath(*unit.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def allowed(unit: str) -> set[str]:
    """The units named on the ``May import:`` line of the unit's face."""
    doc = ast.get_docstring(ast.parse(face(unit).read_text())) or ""
    line = next((ln for ln in doc.splitlines() if ln.startswith("May import:")), None)
    assert line is not None, f"{face(unit).relative_to(SRC.parent)}: no 'May import:' line in its docstring"
    return {unit_of(m.rstrip(".")) for m in re.findall(r"\btorq(?:\.[a-z_]+)+", line)}


def imports(path: Path, module: str) -> set[str]:
    """Absolute names of the modules ``path`` (module ``module``) imports, lazy ones included;
    ``from pkg import name`` counts as ``pkg.name`` when that is a module, else as ``pkg``."""
    pkg = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = pkg.rsplit(".", node.level - 1)[0] if node.level > 1 else pkg
            mod = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            out.update(f"{mod}.{a.name}" if _is_module(f"{mod}.{a.name}") else mod for a in node.names)
    return out


def _is_module(name: str) -> bool:
    path = SRC.parent.joinpath(*name.split("."))
    return name.startswith("torq.") and (path.is_dir() or path.with_suffix(".py").exists())


def violations(module: str, imported: set[str]) -> list[str]:
    unit = unit_of(module)
    ok = allowed(unit) | {unit}
    bad = [m for m in imported if m.startswith("torq") and (m == "torq" or unit_of(m) not in ok)
           and not (unit == "__init__" and m == "torq")]
    bad += [m for m in imported if m.split(".")[0] in NEVER.get(unit, ())]
    return sorted(f"{module}: {m}" for m in bad)


def modules():
    for p in sorted(SRC.rglob("*.py")):
        rel = p.relative_to(SRC.parent).with_suffix("")
        yield p, ".".join(rel.parts).removesuffix(".__init__")


UNITS = sorted({unit_of(m) for _, m in modules()})


@pytest.mark.parametrize("unit", UNITS)
def test_imports_follow_the_faces(unit):
    bad = [v for p, m in modules() if unit_of(m) == unit for v in violations(m, imports(p, m))]
    assert not bad


def test_the_scan_sees_a_back_edge(tmp_path):
    """Positive control: a compiler module importing the runtime or the quantizer (lazily, or by
    ``from .. import``), or the simulator importing ONNX Runtime, is reported."""
    f = tmp_path / "probe.py"
    f.write_text("from . import lowering\ndef f():\n    from ..runtime import nss\n    from .. import quantize\n")
    found = imports(f, "torq.compiler.probe")
    assert {"torq.runtime.nss", "torq.compiler.lowering", "torq.quantize"} <= found
    assert violations("torq.compiler.probe", found) == ["torq.compiler.probe: torq.quantize",
                                                        "torq.compiler.probe: torq.runtime.nss"]
    assert violations("torq.runtime.probe", {"onnxruntime"}) == ["torq.runtime.probe: onnxruntime"]
    assert violations("torq.compiler.frontend.probe", {"torq.compiler.lowering"}) == [
        "torq.compiler.frontend.probe: torq.compiler.lowering"]


def test_no_cycle_between_units():
    """The units' allowed imports form a DAG (so the layering has an order)."""
    graph = {u: allowed(u) - {u} for u in UNITS}
    state: dict[str, int] = {}

    def visit(u, path):
        if state.get(u) == 1:
            raise AssertionError("cycle: " + " -> ".join(path + [u]))
        if state.get(u) != 2:
            state[u] = 1
            for v in graph.get(u, ()):
                visit(v, path + [u])
            state[u] = 2
    for u in UNITS:
        visit(u, [])
