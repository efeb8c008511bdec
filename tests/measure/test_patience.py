"""Machine-normalised time limits (profiler/measure/runner/patience.py): the arithmetic, pinned with a fake clock."""

from __future__ import annotations

import pytest

from profiler.core.errors import MemfracError
from profiler.measure.runner import patience as pm
from profiler.measure.runner.patience import Patience, env_scale


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(pm.time, "monotonic", c)
    return c


def test_a_limit_counts_wall_time_divided_by_slowness(clock, monkeypatch):
    """Load 3 per core: 30 s of wall time are 10 machine-normalised seconds; a 20 s limit lasts 60 s of wall."""
    monkeypatch.setattr(pm, "load_per_core", lambda: 3.0)
    p = Patience(20, "startup", scale=1.0, core=1.0)
    clock.t += 30
    assert not p.spent() and p.used_s == pytest.approx(10.0)  # 30 / 3
    assert p.remaining_wall() == pytest.approx(30.0)  # (20 − 10) × 3
    clock.t += 29.9
    assert not p.spent()  # 10 + 29.9/3 = 19.97
    clock.t += 0.2
    assert p.spent()  # 20.03 ≥ 20


def test_an_idle_machine_gets_the_limit_as_written(clock, monkeypatch):
    """Load 0.5/core and a core faster than the reference: slowness stays 1 (a limit is never shortened)."""
    monkeypatch.setattr(pm, "load_per_core", lambda: 0.5)
    p = Patience(10, scale=1.0, core=1.0)
    clock.t += 9.99
    assert not p.spent()
    clock.t += 0.02
    assert p.spent()


def test_the_env_scale_and_the_slowness_cap(clock, monkeypatch):
    """MEMFRAC_TIMEOUT_SCALE=2 doubles the limit; load 50/core is capped at ×8: 10 s × 2 × 8 = 160 s of wall."""
    monkeypatch.setattr(pm, "load_per_core", lambda: 50.0)
    monkeypatch.setenv("MEMFRAC_TIMEOUT_SCALE", "2")
    p = Patience(10, "load", core=1.0)
    assert p.limit == 20.0
    clock.t += 159
    assert not p.spent()  # 159 / 8 = 19.9
    clock.t += 2
    assert p.spent()
    assert "limit 10 s × MEMFRAC_TIMEOUT_SCALE=2" in p.describe() and "up to ×8.0" in p.describe()


def test_a_slow_core_counts_even_when_the_machine_is_idle(clock, monkeypatch):
    monkeypatch.setattr(pm, "load_per_core", lambda: 0.0)
    p = Patience(10, scale=1.0, core=2.5)
    clock.t += 24
    assert not p.spent()  # 24 / 2.5 = 9.6
    clock.t += 1.1
    assert p.spent()


def test_env_scale_rejects_nonsense():
    assert env_scale({}) == 1.0 and env_scale({"MEMFRAC_TIMEOUT_SCALE": "1.5"}) == 1.5
    for bad in ("0", "-1", "fast"):
        with pytest.raises(MemfracError, match="MEMFRAC_TIMEOUT_SCALE"):
            env_scale({"MEMFRAC_TIMEOUT_SCALE": bad})


def test_until_ends_on_the_signal_not_the_clock(clock, monkeypatch):
    monkeypatch.setattr(pm, "load_per_core", lambda: 1.0)
    monkeypatch.setattr(pm.time, "sleep", lambda s: setattr(clock, "t", clock.t + s))
    seen = iter([False, False, True])
    p = Patience(100, scale=1.0, core=1.0)
    assert p.until(lambda: next(seen), poll_s=1.0) and p.elapsed() == pytest.approx(2.0)
    assert not Patience(3, scale=1.0, core=1.0).until(lambda: False, poll_s=1.0)
