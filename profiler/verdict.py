"""A run's verdict: how it ended, or how close to OOM it ran — and why, in one sentence.

oom_during_capture | oom_startup | oom_runtime | failed | tight | ok | wasteful | unknown. Kept apart from the
arithmetic (`compare`, `ledger`): the verdict is a judgement over figures those modules computed.
"""

from __future__ import annotations

from profiler.measurement import Measurement

#: A worker with less than this free at its worst point is one allocation away from an OOM.
TIGHT_MIB = 1024.0
VERDICTS = ("oom_during_capture", "oom_startup", "oom_runtime", "failed", "tight", "ok", "wasteful", "unknown")


def run_verdict(m: Measurement, worst: float | None, used: float | None, end_startup: float | None) -> tuple[str, str]:
    """oom_during_capture | oom_startup | oom_runtime | failed | tight | ok | wasteful | unknown, and why."""
    f = m.failure
    if f is not None:
        if f.kind in ("oom_during_capture", "oom_startup", "oom_runtime"):
            where = f" in {f.phase}" if f.phase else ""
            tried = f", tried to allocate {f.tried_alloc_mib:.0f} MiB" if f.tried_alloc_mib else ""
            return f.kind, f"CUDA out of memory{where}{tried}"
        return "failed", f"{f.kind}" + (f" in {f.phase}" if f.phase else "") + (
            f": {f.message[:160]}" if f.message else ""
        )
    if m.memory_kind == "host":
        return "unknown", "host-memory measurement (CPU run): no GPU headroom to judge"
    if worst is None:
        return "unknown", "no free-memory reading after the KV pool (needs 'Memory pool end' or later avail mem)"
    if worst < TIGHT_MIB:
        return "tight", f"{worst:.0f} MiB free at the worst point (< {TIGHT_MIB:.0f} MiB)"
    if used is None:
        return "ok", f"{worst:.0f} MiB free at the worst point; non-KV use after the pool not measurable"
    if worst > 2 * max(used, 1.0):
        return "wasteful", f"{worst:.0f} MiB left unused vs {used:.0f} MiB used after the KV pool (> 2×)"
    return "ok", f"{worst:.0f} MiB free at the worst point, {used:.0f} MiB used after the KV pool"
