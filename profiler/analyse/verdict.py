"""A run's verdict: how it ended, or how close to OOM it ran — and why, in one sentence.

oom_during_capture | oom_startup | oom_runtime | failed | incomplete | short | tight | ok | wasteful | unknown. Kept
apart from the arithmetic (`compare`, `ledger`): the verdict is a judgement over figures those modules
computed. The rules, in order:

1. A failure the text shows decides (its kind, phase and the OOM message's numbers go into the reason).
2. A log's startup state (`Measurement.startup`, `profiler.logs.state`) comes next: a KV budget of zero or
   less is `oom_startup`, an aborted capture `failed`, a startup the text does not show to its end
   `incomplete` — headroom is only judged on finished startups.
3. `short`: the worker as a whole needs more than the room its fraction leaves (free memory at the worst point
   below zero: an estimate — a derived variant's —, since a measured worker would have run out); a term over its
   own constant that the room (the 10 GiB floor's top-up included) covers is not this. `tight`: less than
   TIGHT_MIB free at the worst point. A need that was not measured (the unreached part of a reserve) moves the
   recommended fraction, never the verdict (profiler.analyse.compare).
4. `wasteful` only against what runtime needs: the measured runtime peak when there is one (probe load),
   else the heuristic's own activation reserve for this configuration — a startup log cannot show the
   runtime activation peak that the free memory is for. Free memory above twice that need is wasteful; the
   reason names the need and its basis, and the serving evidence a log shows (peak #running-req, peak
   token usage, KV retractions).
5. `ok` otherwise; `unknown` when there is no free-memory reading after the KV pool (or a CPU run).
"""

from __future__ import annotations

from profiler.core.measurement import Failure, Measurement

#: A worker with less than this free at its worst point is one allocation away from an OOM.
TIGHT_MIB = 1024.0
#: Free memory above this multiple of the runtime need is wasteful.
WASTE_FACTOR = 2.0
#: ... and above the need by at least this much (small GPUs: a few hundred MiB are not worth a verdict).
WASTE_MIN_SPARE_MIB = 2048.0
VERDICTS = (
    "oom_during_capture",
    "oom_startup",
    "oom_runtime",
    "failed",
    "incomplete",
    "short",
    "tight",
    "ok",
    "wasteful",
    "unknown",
)

Need = tuple[float, str]  # (MiB runtime needs, what that figure rests on)


def runtime_need(m: Measurement, res: object | None) -> Need | None:
    """What runtime needs above the end of startup: a measured runtime peak, else the reservation's
    activation term (None when neither is known)."""
    for r in m.ranks:
        p = r.phase("runtime")
        if p is not None and p.used_mib is not None:
            return p.used_mib, "measured runtime peak (probe)"
    if res is not None and hasattr(res, "mib") and getattr(res, "term_on", None):
        from profiler.model.heuristic import TERM_NAMES

        if res.term_on[TERM_NAMES.index("activation")]:  # type: ignore[attr-defined]
            return res.mib("activation"), f"the {res.rules} rules' activation reserve"  # type: ignore[attr-defined]
    return None


def run_verdict(
    m: Measurement, worst: float | None, used: float | None, end_startup: float | None, need: Need | None = None
) -> tuple[str, str]:
    """The verdict and why (see the module docstring for the rules)."""
    f = m.failure
    if f is not None:
        return _failure_verdict(f)
    if m.startup == "no_kv":
        return "oom_startup", m.startup_seen
    if m.startup == "aborted":
        return "failed", m.startup_seen
    if m.startup == "incomplete":
        last = f"; {worst / 1024:.2f} GiB free at the last reading" if worst is not None else ""
        return "incomplete", f"{m.startup_seen}{last}: no verdict on headroom before startup ends"
    if m.memory_kind == "host":
        return "unknown", "host-memory measurement (CPU run): no GPU headroom to judge"
    if worst is None:
        return "unknown", "no free-memory reading after the KV pool (needs 'Memory pool end' or later avail mem)"
    return headroom_verdict(worst, used, need, _serving(m))


def headroom_verdict(worst: float, used: float | None, need: Need | None, serving: str = "") -> tuple[str, str]:
    """short | tight | wasteful | ok for a finished startup with `worst` MiB free at its worst point (rules 3–5)."""
    if worst < 0:
        return "short", f"the worker needs {-worst:.0f} MiB more than its fraction leaves{serving}"
    if worst < TIGHT_MIB:
        return "tight", f"{worst:.0f} MiB free at the worst point (< {TIGHT_MIB:.0f} MiB){serving}"
    head = f"{worst / 1024:.2f} GiB free at the worst point"
    after_kv = f", {used / 1024:.2f} GiB used after the KV pool" if used is not None else ""
    if need is None:
        return "ok", f"{head}{after_kv}; runtime need unknown (no activation reserve or runtime peak), so not " \
                     f"judged wasteful{serving}"  # fmt: skip
    need_mib, basis = need
    vs = f"vs {need_mib / 1024:.2f} GiB runtime need ({basis})"
    if worst > WASTE_FACTOR * need_mib and worst - need_mib > WASTE_MIN_SPARE_MIB:
        return "wasteful", f"{head} {vs}: more than {WASTE_FACTOR:g}× left unused{after_kv}{serving}"
    return "ok", f"{head} {vs}{after_kv}{serving}"


def _failure_verdict(f: Failure) -> tuple[str, str]:
    if f.kind in ("oom_during_capture", "oom_startup", "oom_runtime"):
        where = f" in {f.phase}" if f.phase else ""
        bits = []
        if f.tried_alloc_mib:
            bits.append(f"tried to allocate {_size(f.tried_alloc_mib)}")
        if f.free_mib is not None:
            cap = f" of {_size(f.total_capacity_mib)}" if f.total_capacity_mib else ""
            bits.append(f"{_size(f.free_mib)} free{cap}")
        elif f.total_capacity_mib:
            bits.append(f"GPU total {_size(f.total_capacity_mib)}")
        if f.allocated_by_torch_mib is not None:
            bits.append(f"{_size(f.allocated_by_torch_mib)} allocated by torch")
        if f.private_pools_mib:
            bits.append(f"{_size(f.private_pools_mib)} in private pools (CUDA graphs)")
        if f.non_torch_mib is not None and f.non_torch_mib > 0:
            bits.append(f"{_size(f.non_torch_mib)} outside torch (NCCL, DeepEP, context)")
        return f.kind, f"CUDA out of memory{where}" + (": " + ", ".join(bits) if bits else "")
    where = f" in {f.phase}" if f.phase else ""
    return "failed", f"{f.kind}{where}" + (f": {f.message[:160]}" if f.message else "")


def _size(mib: float | None) -> str:
    if mib is None:
        return "?"
    return f"{mib / 1024:.2f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


def _serving(m: Measurement) -> str:
    """'; serving: peak 12 running requests, peak token usage 0.93, 3 KV retractions' (empty without traffic)."""
    s = m.serving
    if not s:
        return ""
    bits = []
    if s.get("batches"):
        if "peak_running_req" in s:
            bits.append(f"peak {s['peak_running_req']} running requests")
        if "peak_token_usage" in s:
            bits.append(f"peak token usage {s['peak_token_usage']:.2f}")
    if s.get("retractions"):
        bits.append(f"{s['retractions']} KV retractions (KV cache pool full)")
    return "; serving: " + ", ".join(bits) if bits else ""
