"""Why a run ended badly, from three witnesses: the probe, the process exit, and the sglang log.

The probe knows the phase in flight (a `begin` with no `end`) and the exception a hooked phase raised;
the exit status tells a clean stop from a death; the log parser reads sglang's own messages (argparse
errors, CUDA OOM with its numbers, "Capture cuda graph failed", scheduler exceptions).
"""

from __future__ import annotations

from dataclasses import dataclass

from profiler.core.measurement import Failure, Measurement
from profiler.measure.probe.reader import ProbeRun

GRAPH_PHASES = ("prefill_graph", "decode_graph", "verify_graph", "draft_graph", "draft_extend_graph")
_OOM = ("out of memory", "outofmemoryerror", "cuda error: out of memory")


@dataclass(frozen=True, slots=True)
class Witnesses:
    ready: bool  # the worker answered /health with 200
    timed_out: bool  # startup or load did not finish in time, the worker still alive
    died: bool  # the worker exited on its own (before we stopped it)
    during_load: bool  # ...and it was serving our load at the time
    returncode: int | None
    log_tail: str = ""
    load_error: str | None = None  # every request of a burst failed while the worker stayed up
    timeout_detail: str | None = None  # which limit ran out, how it was counted, what the worker last showed
    role: str | None = None  # the worker's PD role (null | prefill | decode): which windows it must open
    served: bool = False  # some request of the load was answered: the serving window must have opened


NO_START = ("the probe wrote no start record (no probe-*.jsonl in the run's probe/ begins with one): the worker ran "
            "without memfrac's probe — its plugin was not found or not loaded — and nothing was measured")


def needed_windows(role: str | None, served: bool) -> tuple[tuple[str, ...], ...]:
    """The windows a worker of `role` opens in sglang 0.5.23, each as its alternatives: the baseline, weights and KV
    pool (model_runner.py / kv_cache_configurator.py); the capture of the graph family the role keeps
    (cuda_graph_setup.py capture_decode_graph — the verify graph when speculative — and capture_prefill_graph are
    called whether the family is enabled or not, and return early when it is not); init_disaggregation on a PD role
    (scheduler.py:689); run_batch once a request was answered. A hook that was applied but whose window never opened
    measured nothing: the run must not pass as if it had."""
    need: list[tuple[str, ...]] = [("baseline",), ("weights",), ("kv_pool",)]
    if role in ("decode", "null"):
        need.append(("decode_graph", "verify_graph"))
    if role in ("prefill", "null"):
        need.append(("prefill_graph",))
    if role in ("prefill", "decode"):
        need.append(("disaggregation_init",))
    if served:
        need.append(("runtime",))
    return tuple(need)


def missing_windows(probe: ProbeRun, role: str | None, served: bool) -> list[str]:
    """'rank: window' for every needed window a rank of the probe never opened (empty when there is no rank: the
    probe's own absence is reported elsewhere)."""
    out = []
    for r in probe.ranks:
        opened = {p.name for p in r.phases if p.role == "target"}
        out += [f"{r.label or 'rank'}: {' or '.join(alts)}" for alts in needed_windows(role, served)
                if not opened.intersection(alts)]  # fmt: skip
    return out


def _in_flight(probe: ProbeRun) -> str | None:
    for phase in probe.in_flight.values():
        return phase
    return None


def _phase_error(probe: ProbeRun) -> tuple[str | None, str | None]:
    """The first phase whose hook saw an exception, and that exception."""
    for r in probe.ranks:
        for p in r.phases:
            err = p.details.get("error")
            if err:
                return p.name, str(err)
    return None, None


def _bad_args_line(tail: str) -> str | None:
    for line in reversed(tail.splitlines()):
        s = line.strip()
        if ": error: " in s and ("usage:" in tail or "sglang" in s or "launch_server" in s):
            return s
    return None


def classify(w: Witnesses, probe: ProbeRun, from_log: Measurement | None) -> Failure | None:
    """None for a clean run; otherwise the kind, the phase in flight and the most specific message."""
    if probe.errors:
        return Failure("probe_error", message="; ".join(probe.errors)[:2000])
    if w.ready and not w.died and not w.timed_out:
        if w.load_error:
            return Failure("load_failed", phase="runtime", message=w.load_error[:2000])
        if not probe.starts:
            return Failure("probe_error", message=NO_START)
        missing = missing_windows(probe, w.role, w.served)
        if missing:
            why = f"the {w.role or 'worker'} role's needed windows never opened ({'; '.join(missing)}): nothing " \
                  "measured them"
            return Failure("probe_error", message=why[:2000])
        return None
    log_f = from_log.failure if from_log is not None else None
    phase_err, err = _phase_error(probe)
    phase = phase_err or _in_flight(probe) or (log_f.phase if log_f else None)
    tail_last = (w.log_tail.strip().splitlines() or [""])[-1]
    message = err or (log_f.message if log_f else "") or tail_last
    text = f"{err or ''} {log_f.message if log_f else ''}".lower()
    oom = any(k in text for k in _OOM) or (log_f is not None and log_f.kind.startswith("oom"))
    if w.timed_out and not w.died:
        where = f" in phase {phase}" if phase else ""
        detail = f" ({w.timeout_detail})" if w.timeout_detail else ""
        return Failure("timeout", phase=phase or ("runtime" if w.during_load else None),
                       message=f"no progress within the time limit{where}{detail}"[:2000])  # fmt: skip
    if not w.ready and not probe.ranks and w.returncode not in (None, 0):
        bad = _bad_args_line(w.log_tail)
        if bad:
            return Failure("bad_args", message=bad, exit_code=w.returncode)
    if oom:
        if w.during_load or phase == "runtime":
            kind = "oom_runtime"
        elif phase in GRAPH_PHASES:
            kind = "oom_during_capture"
        else:
            kind = "oom_startup"
        f = Failure(kind, phase=phase, message=str(message)[:2000], exit_code=w.returncode)
        if log_f is not None:  # keep the numbers of sglang's OOM message
            for k in ("tried_alloc_mib", "total_capacity_mib", "free_mib", "in_use_mib", "allocated_by_torch_mib",
                      "reserved_unallocated_mib", "private_pools_mib", "gpu_index", "capture_bs"):  # fmt: skip
                setattr(f, k, getattr(log_f, k))
        return f
    if phase in GRAPH_PHASES and not w.ready:
        return Failure("capture_failed", phase=phase, message=str(message)[:2000], exit_code=w.returncode)
    return Failure(
        "crash",
        phase=phase or ("runtime" if w.during_load else None),
        message=str(message)[:2000],
        exit_code=w.returncode,
    )
