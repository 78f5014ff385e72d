"""Suite-wide: at the end of the run, every skipped test is listed by reason, with the command
that makes it run (each skip reason names one), so a short run is never silently short."""
from __future__ import annotations

from collections import Counter


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
