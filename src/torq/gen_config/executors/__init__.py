"""The three executors a layer can run on, behind one interface.

    runnable = executors.build(name, compiled, cache_dir=..., rounding="native")
    outputs, ms = runnable.run({"input": x})        # numpy in, numpy out, wall time in ms

``compiled`` is ``torq.compile(model)`` of the layer or segment: the NSS runs its torq_hl
program, CSS/HOST compile its linalg IR with IREE, so all three start from the same IR.
Failures raise ``ExecutorError`` with a stable ``reason_code`` (what ``view`` groups by).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import one_line

EXECUTOR_ORDER = ("nss", "css", "host")

#: reason_code -> what it means (shown by ``view``)
REASON_CODES = {
    "no_pattern": "the NSS has no torq_hl lowering for an op",
    "import_failed": "torch-mlir could not import or lower the layer to linalg",
    "iree_compile_failed": "IREE could not compile the layer's linalg IR",
    "runtime_failed": "the executor failed while running the layer",
    "numeric_mismatch": "outputs differ from ONNX Runtime beyond tolerance",
    "quantize_failed": "per-layer quantization failed",
    "reference_failed": "ONNX Runtime could not run the layer",
}


class ExecutorError(Exception):
    def __init__(self, reason_code: str, summary: str):
        super().__init__(summary)
        self.reason_code = reason_code
        self.summary = summary


@dataclass
class Runnable:
    """A compiled layer on one executor: ``run(inputs) -> (outputs, ms)``."""
    executor: str
    _run: object

    def run(self, inputs: dict):
        try:
            return self._run(inputs)
        except ExecutorError:
            raise
        except Exception as e:  # noqa: BLE001 - any run-time failure is this executor's result
            raise ExecutorError("runtime_failed", f"{self.executor} run failed: {one_line(e)}") from None


def build(name: str, compiled, *, cache_dir=None, rounding: str = "native") -> Runnable:
    from . import css, host, nss
    mod = {"nss": nss, "css": css, "host": host}[name]
    return mod.build(compiled, cache_dir=cache_dir, rounding=rounding)


def frontend(model, debug_ir=None, name=None):
    """``torq.compile`` of a layer/segment (shared by all executors); failures -> import_failed."""
    from ...compiled import compile as torq_compile
    from ...errors import HostProblem
    try:
        return torq_compile(model, debug_ir=debug_ir, name=name)
    except HostProblem:
        raise                                    # --debug-ir not writable: not the layer's fault
    except Exception as e:  # noqa: BLE001
        raise ExecutorError("import_failed", f"compile failed: {one_line(e)}") from None
