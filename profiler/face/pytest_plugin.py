"""A pytest plugin equivalent to `memfrac gate`: `pytest --memfrac-results DIR [--memfrac-baseline FILE]`.

Each gate check becomes a test item (scenario · check), so a hardware CI that already runs pytest gets
one pass/fail per scenario and term in its usual report. Without --memfrac-results it does nothing.
"""

from __future__ import annotations

from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("memfrac", "memfrac gate")
    g.addoption("--memfrac-results", metavar="DIR", help="gate a memfrac results directory")
    g.addoption("--memfrac-baseline", metavar="FILE", help="baseline to check regressions against")
    g.addoption("--memfrac-max-regression", default="5%", metavar="PCT", help="allowed growth per term (default 5%%)")


class GateItem(pytest.Item):
    def __init__(self, *, check: Any, **kw: Any) -> None:
        super().__init__(**kw)
        self.check = check

    def runtest(self) -> None:
        if self.check.skipped:
            pytest.skip(self.check.message)
        if not self.check.passed:
            raise GateFailure(self.check.message)

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:
        if isinstance(excinfo.value, GateFailure):
            return f"{self.check.scenario} · {self.check.name}: {excinfo.value}"
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[str, int, str]:
        return self.config.getoption("--memfrac-results"), 0, f"{self.check.scenario} · {self.check.name}"


class GateFailure(Exception):
    pass


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    results = config.getoption("--memfrac-results")
    if not results:
        return
    from profiler.face.gate import gate, parse_pct

    checks = gate(
        results, config.getoption("--memfrac-baseline"), parse_pct(config.getoption("--memfrac-max-regression"))
    )
    for c in checks:
        items.append(GateItem.from_parent(session, name=f"{c.scenario}::{c.name}", check=c))
