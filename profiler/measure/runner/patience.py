"""How long the runner waits for a worker: readiness signals end a wait, scaled limits only guard against hangs.

Every wait ends on what the worker shows — its process exits, /health answers 200, a request completes, the
process group is gone — and a limit only bounds a worker that shows nothing. A limit is counted in
machine-normalised seconds: wall time divided by how slow this machine is at that moment, so a worker on a
busy 2-core machine gets the time it would need there instead of failing at the same wall-clock limit as on an
idle one. Slowness is the larger of the CPU load per core (the 1-minute load average, read at each tick) and
this machine's single-core speed against a reference core (measured once when the wait starts), capped at
×8, times MEMFRAC_TIMEOUT_SCALE (default 1; raise it for a slow or heavily shared machine). On GPU nodes
the load is low and the factor is 1: the scenario's limits apply as written.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from profiler.core.errors import MemfracError

SCALE_ENV = "MEMFRAC_TIMEOUT_SCALE"
# min of 3 × sum(range(200_000)) on one core of the 2-core AMD EPYC machine the project's CI runs on
REFERENCE_BENCH_S = 0.0025
MAX_SLOWNESS = 8.0


def env_scale(env: dict[str, str] | None = None) -> float:
    """MEMFRAC_TIMEOUT_SCALE as a number > 0 (1 when unset)."""
    raw = (os.environ if env is None else env).get(SCALE_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        v = float(raw)
    except ValueError:
        v = 0.0
    if not v > 0:
        raise MemfracError(f"{SCALE_ENV}={raw!r}: give a positive number (1 = the limits as written)")
    return v


def core_slowness() -> float:
    """This core's speed against the reference core (≥ 1: never shortens a limit)."""
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        sum(range(200_000))
        best = min(best, time.perf_counter() - t)
    return max(1.0, best / REFERENCE_BENCH_S)


def load_per_core() -> float:
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 0.0


@dataclass
class Patience:
    """A time limit of `limit_s` machine-normalised seconds (see the module docstring), started now."""

    limit_s: float
    what: str = "wait"
    scale: float = field(default_factory=env_scale)
    core: float = field(default_factory=core_slowness)
    started: float = field(default_factory=lambda: time.monotonic())
    used_s: float = 0.0  # machine-normalised seconds spent
    worst: float = 1.0  # the largest slowness seen
    _last: float = 0.0

    def __post_init__(self) -> None:
        self._last = self.started

    def slowness(self) -> float:
        return min(MAX_SLOWNESS, max(1.0, self.core, load_per_core()))

    def _advance(self) -> float:
        now = time.monotonic()
        slow = self.slowness()
        self.worst = max(self.worst, slow)
        self.used_s += (now - self._last) / slow
        self._last = now
        return slow

    @property
    def limit(self) -> float:
        return self.limit_s * self.scale

    def spent(self) -> bool:
        self._advance()
        return self.used_s >= self.limit

    def remaining_wall(self) -> float:
        """Wall seconds left if the machine stays as slow as now (for one blocking call's own timeout)."""
        slow = self._advance()
        return max(0.0, self.limit - self.used_s) * slow

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def describe(self) -> str:
        """What the limit was and how it was counted, for a timeout message."""
        self._advance()
        scale = f" × {SCALE_ENV}={self.scale:g}" if self.scale != 1 else ""
        return (
            f"{self.what}: {self.elapsed():.0f} s wall, limit {self.limit_s:.0f} s{scale} counted at this machine's "
            f"slowness, up to ×{self.worst:.1f} [load {load_per_core():.1f}/core, core ×{self.core:.1f}]"
        )

    def until(self, cond: Callable[[], bool], poll_s: float = 0.1) -> bool:
        """Wait for `cond()` (True: it came) or for the limit (False)."""
        while not cond():
            if self.spent():
                return False
            time.sleep(poll_s)
        return True
