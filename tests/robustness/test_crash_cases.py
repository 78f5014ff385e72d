"""The models that used to kill torch-mlir natively: one-line errors naming the node, exit 2.

Through the real `torq-compile` (a subprocess capped at 2 GiB of address space), and through the
importer with validation bypassed, where the forked child's crash itself must become the message."""
from __future__ import annotations

import os
import resource
import subprocess
import sys

import onnx
import pytest

from robustness.mutants import crash_cases, qconv
from torq.compiler import importer, isolation
from torq.compiler.isolation import NativeCrash
from torq.errors import TorqError

CASES = crash_cases()
TWO_GIB = 2 << 30


def _cap_memory():
    resource.setrlimit(resource.RLIMIT_AS, (TWO_GIB, TWO_GIB))


def one_error_line(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_cli_refuses_with_one_line(case, tmp_path):
    m, node = CASES[case]
    path = tmp_path / f"{case}.onnx"
    onnx.save(m, path)
    r = subprocess.run([sys.executable, "-m", "torq.compile_cli", str(path), "-o", str(tmp_path / "out.mlir")],
                       capture_output=True, text=True, timeout=120, preexec_fn=_cap_memory)
    assert r.returncode == 2, r.stderr
    line = one_error_line(r)
    assert line.startswith(f"torq-compile: error: {path}: ") and node in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]     # nothing half-written


@pytest.mark.parametrize("case, signal_name", [("conv_group_0", "SIGFPE"), ("conv_group_-1", "SIGSEGV"),
                                               ("flatten_axis_min_int64", "SIGABRT")])
def test_native_crash_names_signal_and_node(case, signal_name):
    """Validation bypassed: torch-mlir really crashes, in the child; the parent says where."""
    m, node = CASES[case]
    with pytest.raises(NativeCrash) as e:
        importer.import_onnx(m)
    msg = str(e.value)
    assert msg.startswith(f"torch-mlir crashed ({signal_name}) while lowering node {node}"), msg
    assert "\n" not in msg
    assert "\n" not in msg and "Fatal Python error" not in msg


def _print_and_abort(model):
    os.write(2, b"LLVM ERROR: what the native code said before dying\n")
    os.abort()


def test_child_diagnostics_are_kept_and_quoted():
    """Whatever the child wrote to stderr survives it: the best line in the message, all of it attached."""
    with pytest.raises(NativeCrash) as e:
        isolation.run_isolated(_print_and_abort, qconv())
    assert str(e.value).startswith("torch-mlir crashed (SIGABRT) while lowering node ")
    assert str(e.value).endswith(": LLVM ERROR: what the native code said before dying")
    assert "what the native code said" in e.value.diagnostics


def test_memory_cap_becomes_an_error(tmp_path):
    """A child that outgrows its address-space budget is a one-line error, not an abort."""
    import os
    path = tmp_path / "conv.onnx"
    onnx.save(qconv(), path)
    r = subprocess.run([sys.executable, "-m", "torq.compile_cli", str(path)], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "TORQ_COMPILE_MEM_MB": "1"})
    assert r.returncode == 2 and r.stdout == ""
    line = one_error_line(r)     # MemoryError / bad_alloc, or a native crash no node causes alone
    assert line.startswith("torq-compile: error: torch-mlir ") and "out of memory" in line and \
        "MiB" in line and "TORQ_COMPILE_MEM_MB" in line, line


def test_isolated_import_matches_in_process(monkeypatch):
    """Stages and locations are identical whether or not the child did the work."""
    from torq.compiler import compile as compile_model
    isolated = compile_model(qconv())
    monkeypatch.setenv("TORQ_ISOLATE", "0")
    direct = compile_model(qconv())
    assert isolated.stages == direct.stages
    assert isolated.operator_locations == direct.operator_locations
    steps = [(s.op, s.location, s.onnx_op) for s in isolated.program.steps]   # locations survive the child
    assert steps == [(s.op, s.location, s.onnx_op) for s in direct.program.steps]
    assert all(loc != "?" for op, loc, _ in steps if op.startswith("torq_hl."))


def test_torq_error_in_child_is_reraised():
    m = qconv()
    m.graph.node[0].op_type = "NoSuchOp"      # torch-mlir cannot legalize what it feeds
    with pytest.raises(TorqError, match="torch-to-linalg lowering failed: line 10:10: failed to legalize") as e:
        importer.import_onnx(m)
    assert not isinstance(e.value, NativeCrash)
