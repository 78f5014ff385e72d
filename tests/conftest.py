"""Suite-wide: at the end of the run, every skipped test is listed by reason, with the command
that makes it run (each skip reason names one), so a short run is never silently short.
Progress lines are off (``TORQ_PROGRESS=off``, inherited by subprocesses) unless a test turns
them on: whether a stage passes its 2 s mark depends on the host's load, and output that
depends on load makes assertions on stderr flaky. The whole-model quantization cache is off
(``TORQ_QUANTIZE_CACHE=off``) unless a test turns it on. ``benchmark_script`` imports a
script of benchmarks/ (scripts, not a package) for the tests of its functions."""
from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="session")
def benchmark_script():
    """``load("models/build.py")`` -> that script as a module (imported once per session)."""
    loaded: dict = {}

    def load(relpath: str):
        if relpath not in loaded:
            spec = importlib.util.spec_from_file_location("bench_" + Path(relpath).stem, BENCHMARKS / relpath)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            loaded[relpath] = mod
        return loaded[relpath]
    return load


@pytest.fixture(autouse=True)
def _no_progress_lines(monkeypatch):
    monkeypatch.setenv("TORQ_PROGRESS", "off")


@pytest.fixture(autouse=True)
def _no_quantization_cache(monkeypatch):
    """Whole-model quantizations are not cached across tests (``quantize.model_cache``): a test that
    patches a quantization pass must see it run; tests/quantize/test_model_cache.py turns it on."""
    monkeypatch.setenv("TORQ_QUANTIZE_CACHE", "off")


def pytest_terminal_summary(terminalreporter):
    reasons = Counter()
    for rep in terminalreporter.stats.get("skipped", []):
        longrepr = rep.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if not reasons:
        return
    terminalreporter.section(f"{sum(reasons.values())} tests skipped; to run them", sep="-", yellow=True)
    for reason, n in reasons.most_common():
        terminalreporter.line(f"{n:4d}  {reason}")
