"""Set a `Measurement` against what sglang reserved, term by term and as a whole.

Runtime semantics first: sglang sizes the KV pool as `free_at_start × mfs − weights`, where free_at_start is
the free memory after NCCL init (not the capacity). So the non-static memory a worker really has is
`free_at_start × (1 − mfs)`, and what it used of it is the free memory right after the KV pool minus the
lowest free memory seen afterwards (graph capture, buffers, serving). The difference is the headroom — the
OOM margin — and, when it is large, KV cache the fleet paid for and never used.

Per term, what each reservation covers is matched to the phase that spends it:

| term | measured as |
|---|---|
| activation | runtime peak above the post-startup baseline (probe load) |
| decode_graph (+ dp_padding when attn-DP) | decode capture Δ (DeepEP creation inside excluded), per-bs ladder |
| prefill_graph (+ prefill_bcg_deepep) | prefill capture Δ (DeepEP excluded) |
| deepep_a2a | DeepEP buffer creation Δ (driver: NVL + NVSHMEM heap + workspace), analytic size beside it |
| constant | attention backends + eager runner + finalize + disaggregation init Δ |
| parallel | non-torch growth after the KV pool (driver Δ − torch reserved Δ), DeepEP excluded |
| floor_topup | the part of the floor that the other terms' overflow consumed |

Logs show only some of these (graph capture, headroom); the rest are `unobservable`, said per term.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from profiler.errors import MemfracError
from profiler.heuristic import Reservation
from profiler.heuristic.record import TERM_NAMES
from profiler.measurement import Measurement, Phase, Rank
from profiler.verdict import TIGHT_MIB, run_verdict
from profiler.verdict import runtime_need as verdict_need

#: Default safety margin added to what was used when recommending a fraction.
DEFAULT_MARGIN_MIB = 1024.0
TERM_VERDICTS = ("under", "fits", "over", "unobservable", "off")
_GRAPHS = ("prefill_graph", "decode_graph", "verify_graph", "draft_graph", "draft_extend_graph")
_CONSTANT_PHASES = ("attention_backends", "eager_runner", "finalize", "disaggregation_init")


@dataclass(frozen=True, slots=True)
class TermComparison:
    """One reservation term against what was measured for it."""

    term: str  # a TERM_NAMES entry, or two joined by "+" when only their sum is observable
    reserved_mib: float
    measured_mib: float | None
    verdict: str  # under | fits | over | unobservable | off
    observed_from: str
    note: str = ""

    @property
    def slack_mib(self) -> float | None:
        return None if self.measured_mib is None else self.reserved_mib - self.measured_mib


@dataclass(frozen=True, slots=True)
class Comparison:
    """A measurement against its reservation: terms, totals, verdict, recommendation."""

    measurement_id: str
    scenario: str | None
    source: str  # probe | log
    memory_kind: str  # gpu | host
    rules: str | None
    mfs: float | None
    mfs_origin: str
    heuristic_fraction: float | None
    gpu_total_mib: float | None
    free_at_start_mib: float | None  # sglang's pre_model_load_memory (or the first avail mem)
    slack_mib: float | None  # free_at_start × (1 − mfs): what non-KV memory really has at runtime
    reserved_terms_mib: float | None  # the heuristic's terms (on capacity, before runtime semantics)
    weights_mib: float | None
    kv_pool_mib: float | None
    kv_tokens: int | None
    kv_bytes_per_token: float | None
    used_after_kv_mib: float | None  # free after the KV pool − the lowest free after it
    headroom_startup_mib: float | None  # free at the end of startup
    headroom_mib: float | None  # free at the worst point seen (startup or serving): the OOM margin
    wasted_kv_tokens: int | None  # what the unused headroom would hold as KV cache
    recommended_mfs: float | None
    margin_mib: float
    verdict: str
    reason: str
    terms: tuple[TermComparison, ...] = ()
    ladder: tuple[tuple[int, float], ...] = ()  # decode graph: (bs, cumulative MiB) from one start
    deepep_analytic_mib: float | None = None
    failure_kind: str | None = None
    observable: tuple[str, ...] = field(default=())

    def term(self, name: str) -> TermComparison:
        for t in self.terms:
            if t.term == name:
                return t
        raise KeyError(name)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["terms"] = [asdict(t) | {"slack_mib": t.slack_mib} for t in self.terms]
        return d


# ---------------------------------------------------------------------------------------------------
# Reading the measurement
# ---------------------------------------------------------------------------------------------------


def _phase(r: Rank | None, name: str) -> Phase | None:
    return None if r is None else r.phase(name)


def _free(p: Phase | None, which: str) -> float | None:
    s = None if p is None else getattr(p, which)
    return None if s is None else s.free_mib


def _torch_delta(p: Phase) -> float | None:
    b, a = p.before, p.after
    if b is None or a is None or b.torch_reserved_mib is None or a.torch_reserved_mib is None:
        return None
    return a.torch_reserved_mib - b.torch_reserved_mib


def _nested_deepep(r: Rank, parent: str) -> float:
    """MiB of a DeepEP buffer created inside `parent` (it is charged to deepep_a2a, not to the graph)."""
    for p in r.phases:
        if p.name == "deepep_buffer" and p.details.get("parent") == parent and p.used_mib:
            return p.used_mib
    return 0.0


def free_at_start(r: Rank | None) -> float | None:
    """sglang's pre_model_load_memory: the probe reads it, a log shows it as the first avail mem."""
    b = _phase(r, "baseline")
    if b is not None and isinstance(b.details.get("pre_model_load_mib"), int | float):
        return float(b.details["pre_model_load_mib"])
    return _free(_phase(r, "weights"), "before")


_STARTUP_PRE_KV = ("init_parallel", "baseline", "weights", "kv_pool")


def _after_kv_free(r: Rank | None) -> float | None:
    """Free memory right after the KV pool ("Memory pool end"), else before the first later phase."""
    kv = _free(_phase(r, "kv_pool"), "after")
    if kv is not None or r is None:
        return kv
    for p in r.phases:
        if p.name not in _STARTUP_PRE_KV and p.name != "ready":
            v = _free(p, "before")
            if v is not None:
                return v
    return None


def _worst_free(r: Rank | None) -> tuple[float | None, float | None]:
    """(free at the end of startup, lowest free after the KV pool, serving included)."""
    if r is None:
        return None, None
    frees: list[float] = []
    end_startup: float | None = None
    for p in r.phases:
        if p.name in _STARTUP_PRE_KV:
            continue
        vals = [x for x in (_free(p, "before"), _free(p, "after"), _free(p, "peak")) if x is not None]
        vals += [lp.free_mib for lp in p.ladder if lp.free_mib is not None]
        if p.name == "ready":
            avail = p.details.get("available_gpu_mem_mib")
            if isinstance(avail, int | float):
                vals.append(float(avail))
        if p.name != "runtime" and vals:
            end_startup = min(vals) if p.name == "ready" else (_free(p, "after") or min(vals))
        frees += vals
    if not frees:
        return None, None
    return end_startup, min(frees)


def rank_figures(r: Rank | None) -> dict[str, Any]:
    """Weights, KV pool, graph capture and headroom of one rank (MiB; None where it does not say)."""
    w, kv = _phase(r, "weights"), _phase(r, "kv_pool")
    kv_mib = None
    if kv is not None:
        kv_mib = ((kv.details.get("k_mib") or 0) + (kv.details.get("v_mib") or 0)) or kv.details.get("kv_mib")
    graphs = [p.used_mib for p in (r.phases if r else []) if p.name in _GRAPHS and p.used_mib is not None]
    return {
        "weights_mib": w.used_mib if w else None,
        "kv_mib": kv_mib,
        "kv_tokens": kv.details.get("kv_tokens") if kv else None,
        "graph_mib": sum(graphs) if graphs else None,
        "headroom_mib": _worst_free(r)[1],
    }


def worst_rank(m: Measurement) -> Rank | None:
    """The rank closest to OOM (lowest free memory after its KV pool); the primary one when none says."""
    best: tuple[float, Rank] | None = None
    for r in m.ranks:
        _, w = _worst_free(r)
        if w is not None and (best is None or w < best[0]):
            best = (w, r)
    return best[1] if best else m.primary


def kv_bytes_per_token(r: Rank | None) -> float | None:
    """Exact, from the KV pool the worker allocated: (K + V) bytes / tokens."""
    p = _phase(r, "kv_pool")
    if p is None:
        return None
    d = p.details
    tokens = d.get("kv_tokens")
    size = (d.get("k_mib") or 0) + (d.get("v_mib") or 0) or d.get("kv_mib")
    if not tokens or not size:
        return None
    return size * 2**20 / tokens


# ---------------------------------------------------------------------------------------------------
# Terms
# ---------------------------------------------------------------------------------------------------


def _verdict(reserved: float, measured: float | None, resolution: float) -> str:
    if measured is None:
        return "unobservable"
    if measured > reserved + resolution:
        return "under"
    if reserved - measured > max(512.0, 0.5 * reserved):
        return "over"
    return "fits"


def _term_rows(
    m: Measurement, res: Reservation, r: Rank | None, resolution: float, used_total: float | None
) -> list[TermComparison]:
    mib = dict(zip(TERM_NAMES, res.term_mib, strict=True))
    on = dict(zip(TERM_NAMES, res.term_on, strict=True))
    rows: list[TermComparison] = []
    host = m.memory_kind == "host"

    def add(name: str, reserved: float, measured: float | None, src: str, note: str = "") -> None:
        is_on = any(on.get(n) for n in name.split("+"))
        if not is_on and not measured:
            rows.append(TermComparison(name, reserved, measured, "off", src, note or "term not applied"))
            return
        v = "unobservable" if host and measured is not None else _verdict(reserved, measured, resolution)
        if host and measured is not None:
            note = (note + "; " if note else "") + "host RSS of a CPU run: not comparable with GPU reserves"
        rows.append(TermComparison(name, reserved, measured, v, src, note))

    runtime = _phase(r, "runtime")
    add(
        "activation",
        mib["activation"],
        runtime.used_mib if runtime else None,
        "runtime peak above the post-startup baseline" if runtime else "no serving load observed",
    )

    for phase, extra, why in (
        ("decode_graph", "dp_padding", "padding not separable"),
        ("prefill_graph", "prefill_bcg_deepep", "DeepEP first touch not separable"),
    ):
        p = _phase(r, phase)
        meas = None if p is None or p.used_mib is None else p.used_mib - _nested_deepep(r, phase)  # type: ignore[arg-type]
        kind = phase.split("_")[0]
        if p is None:
            src = f"no {kind} capture seen"
        elif meas is None:
            src = f"{kind} capture seen, without memory numbers"
        else:
            src = f"{kind} capture Δ"
        if on[extra]:  # only their sum is observable
            add(f"{phase}+{extra}", mib[phase] + mib[extra], meas, f"{src} ({why})")
        else:
            add(phase, mib[phase], meas, src)

    de = _phase(r, "deepep_buffer")
    add(
        "deepep_a2a",
        mib["deepep_a2a"],
        de.used_mib if de else None,
        "DeepEP buffer creation Δ (driver)" if de else "no DeepEP buffer creation seen",
    )

    const_phases = [p for p in (r.phases if r else []) if p.name in _CONSTANT_PHASES and p.used_mib is not None]
    add(
        "constant",
        mib["constant"],
        sum(p.used_mib for p in const_phases) if const_phases else None,  # type: ignore[misc]
        "attention backends + eager runner + finalize + disaggregation init Δ",
    )

    nontorch = _non_torch_after_kv(r) if m.source == "probe" and not host else None
    add("parallel", mib["parallel"], nontorch, "non-torch growth after the KV pool, DeepEP excluded")

    floor = mib["floor_topup"]
    if on["floor_topup"]:
        others = res.reserved_mib - floor
        consumed = None if used_total is None else max(0.0, min(floor, used_total - others))
        rows.append(
            TermComparison(
                "floor_topup",
                floor,
                consumed,
                "unobservable" if consumed is None else ("fits" if consumed > 0.5 * floor else "over"),
                "what the other terms' overflow used of the floor",
                "the floor lifts the terms to 10 GiB",
            )
        )
    else:
        rows.append(TermComparison("floor_topup", 0.0, None, "off", "", "no floor top-up"))
    for name in ("speculative", "xpu", "vlm_scaling"):
        if on[name]:
            rows.append(TermComparison(name, mib[name], None, "unobservable", "", "no phase spends this term alone"))
    return rows


def _non_torch_after_kv(r: Rank | None) -> float | None:
    if r is None:
        return None
    total, seen_kv, any_ = 0.0, False, False
    for p in r.phases:
        if p.name == "kv_pool":
            seen_kv = True
            continue
        if not seen_kv or p.name in ("deepep_buffer", "runtime", "ready") or p.details.get("parent"):
            continue
        td = _torch_delta(p)
        if td is None or p.used_mib is None:
            continue
        total += p.used_mib - td
        any_ = True
    return total if any_ else None


# ---------------------------------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------------------------------


def compare(
    m: Measurement,
    res: Reservation | None,
    *,
    margin_mib: float = DEFAULT_MARGIN_MIB,
    deepep_analytic_mib: float | None = None,
) -> Comparison:
    """Compare one measurement with the reservation of its configuration (None when it cannot be modelled).

    Ranks differ (the first one often holds extra buffers): the rank closest to OOM is the one judged.
    """
    r = worst_rank(m)
    mfs = res.mem_fraction_static if res is not None else _mfs_from_args(m)
    start = free_at_start(r)
    slack = None if start is None or mfs is None else start * (1 - mfs)
    after_kv = _after_kv_free(r)
    end_startup, worst = _worst_free(r)
    used = None if after_kv is None or worst is None else after_kv - worst
    weights = _phase(r, "weights")
    kvp = _phase(r, "kv_pool")
    kv_mib = None
    if kvp is not None:
        d = kvp.details
        kv_mib = ((d.get("k_mib") or 0) + (d.get("v_mib") or 0)) or d.get("kv_mib")
    bpt = kv_bytes_per_token(r)
    resolution = max((p.resolution_mib or 0.0) for p in r.phases) if r and r.phases else 0.0
    rows = _term_rows(m, res, r, resolution, used) if res is not None else []
    wasted = None
    if worst is not None and bpt and worst > margin_mib:
        wasted = int((worst - margin_mib) * 2**20 // bpt)
    rec = None
    runtime = _phase(r, "runtime")
    runtime_need = runtime.used_mib if runtime is not None and runtime.used_mib is not None else None
    if runtime_need is None and res is not None:
        runtime_need = res.mib("activation")  # not observed: keep what the heuristic reserves for it
    if used is not None and start and runtime_need is not None:
        need = used + (0.0 if runtime is not None else runtime_need) + margin_mib
        rec = math.floor((1 - need / start) * 1000) / 1000
    verdict, reason = run_verdict(m, worst, used, end_startup, verdict_need(m, res))
    return Comparison(
        measurement_id=m.id,
        scenario=m.scenario,
        source=m.source,
        memory_kind=m.memory_kind,
        rules=res.rules if res is not None else None,
        mfs=mfs,
        mfs_origin=m.mfs_origin,
        # with the GPU size unknown the rules fall back to a constant: that is no heuristic answer
        heuristic_fraction=res.heuristic_fraction if res is not None and "gpu_mem_unknown" not in res.flags else None,
        gpu_total_mib=m.identity.gpu_total_mib,
        free_at_start_mib=start,
        slack_mib=slack,
        reserved_terms_mib=res.reserved_mib if res is not None else None,
        weights_mib=weights.used_mib if weights else None,
        kv_pool_mib=kv_mib,
        kv_tokens=kvp.details.get("kv_tokens") if kvp else None,
        kv_bytes_per_token=bpt,
        used_after_kv_mib=used,
        headroom_startup_mib=end_startup,
        headroom_mib=worst,
        wasted_kv_tokens=wasted,
        recommended_mfs=rec,
        margin_mib=margin_mib,
        verdict=verdict,
        reason=reason,
        terms=tuple(rows),
        ladder=_ladder(r),
        deepep_analytic_mib=deepep_analytic_mib,
        failure_kind=m.failure.kind if m.failure else None,
        observable=tuple(t.term for t in rows if t.verdict not in ("unobservable", "off")),
    )


def _mfs_from_args(m: Measurement) -> float | None:
    v = m.args.get("mem_fraction_static")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _ladder(r: Rank | None) -> tuple[tuple[int, float], ...]:
    """(bs, MiB used by the capture so far) right after each size; probe ladders only (a log's tqdm rung is
    printed before its size is captured, so it cannot be attributed to that size)."""
    p = _phase(r, "decode_graph")
    if p is None or p.source != "probe":
        return ()
    return tuple(sorted((lp.bs, lp.used_mib) for lp in p.ladder if lp.used_mib is not None and lp.bs is not None))


def reservation_for(m: Measurement, scenario: Any = None) -> tuple[Reservation | None, list[str]]:
    """The reservation sglang made for the run, and notes on how it was reconstructed.

    A `memfrac run` has its scenario and the release it ran. A log is judged with the rules of the release
    that wrote it, or with every rule set its release range allows (`profiler.logs.reserve`: the one
    returned here is named in the notes, the others in `log_reservation`); never silently with the newest.
    """
    from profiler.heuristic import DEFAULT_RULES, inputs_from_scenario, reserve, rules_for

    notes: list[str] = []
    if scenario is None:
        from profiler.logs.reserve import log_reservation

        lr = log_reservation(m)
        notes.append(f"rules: {lr.rules} — {lr.rules_why}")
        notes.extend(lr.notes)
        return lr.headline, notes
    version = m.identity.sglang_version
    if version:
        try:
            return reserve(inputs_from_scenario(scenario), rules_for(version)), notes
        except MemfracError as e:
            notes.append(f"heuristic terms not computed: {e}")
            return None, notes
    notes.append(f"sglang release of this run not recorded: terms computed with the {DEFAULT_RULES.name} rules "
                 "(the newest modelled)")  # fmt: skip
    return reserve(inputs_from_scenario(scenario), DEFAULT_RULES), notes


def ladder_graph_estimate(ladder: tuple[tuple[int, float], ...], max_bs: int) -> float | None:
    """Decode-graph memory of a ladder capped at `max_bs`, from a larger ladder captured in one start.

    sglang captures largest first into one pool: the first (largest) capture holds the pool's peak, each
    later one adds its own increment. A capped ladder's top is smaller: its pool peak is taken as the
    measured top increment scaled by max_bs / top (an estimate, said so wherever it is used), plus the
    measured increments of every size below it.
    """
    if not ladder:
        return None
    pts = sorted(ladder, reverse=True)  # largest bs first, cumulative used
    top_bs, top_used = pts[0]
    if max_bs >= top_bs:
        return pts[-1][1] if max_bs == top_bs else None
    incs = [(bs, used - (pts[i - 1][1] if i else 0.0)) for i, (bs, used) in enumerate(pts)]
    below = sum(inc for bs, inc in incs if bs < max_bs)
    return top_used * max_bs / top_bs + below


def derive_variant(c: Comparison, res: Reservation, name: str, max_bs: int) -> Comparison:
    """The comparison for a scenario measured through another start's ladder (it differs only in max_bs).

    The KV pool absorbs the difference in fraction: free after the pool moves by the slack difference, and
    the graph memory by the ladder estimate; everything else the start measured is shared.
    """
    graph_launch = c.ladder[-1][1] if c.ladder else None
    est = ladder_graph_estimate(c.ladder, max_bs)
    slack = None if c.free_at_start_mib is None else c.free_at_start_mib * (1 - res.mem_fraction_static)
    used = headroom = None
    if est is not None and graph_launch is not None and c.used_after_kv_mib is not None:
        used = c.used_after_kv_mib - graph_launch + est
        if c.headroom_mib is not None and slack is not None and c.slack_mib is not None:
            headroom = c.headroom_mib + (slack - c.slack_mib) - (est - graph_launch)
    terms = []
    mib = dict(zip(TERM_NAMES, res.term_mib, strict=True))
    for t in c.terms:
        if t.term.startswith("decode_graph"):
            reserved = mib["decode_graph"] + (mib["dp_padding"] if "+" in t.term else 0.0)
            v = "unobservable" if est is None else _verdict(reserved, est, 0.0)
            terms.append(
                TermComparison(
                    t.term,
                    reserved,
                    est,
                    v,
                    f"estimated from the max_bs {c.ladder[0][0] if c.ladder else '?'}"
                    f"…{c.ladder[-1][0] if c.ladder else '?'} ladder of run {c.measurement_id}",
                )
            )
        else:
            name_ = t.term.split("+")[0]
            reserved = sum(mib.get(n, 0.0) for n in t.term.split("+")) if name_ in mib else t.reserved_mib
            terms.append(
                TermComparison(
                    t.term,
                    reserved,
                    t.measured_mib,
                    _verdict(reserved, t.measured_mib, 0.0) if t.verdict not in ("unobservable", "off") else t.verdict,
                    t.observed_from,
                    t.note,
                )
            )
    rec = None
    if used is not None and c.free_at_start_mib:
        rec = math.floor((1 - (used + c.margin_mib) / c.free_at_start_mib) * 1000) / 1000
    verdict, reason = c.verdict, c.reason
    if c.failure_kind is None and headroom is not None and used is not None:
        if headroom < TIGHT_MIB:
            verdict, reason = "tight", f"{headroom:.0f} MiB free at the worst point (estimated)"
        elif headroom > 2 * max(used, 1.0):
            verdict, reason = (
                "wasteful",
                f"{headroom:.0f} MiB unused vs {used:.0f} MiB used after the KV pool (estimated)",
            )
        else:
            verdict, reason = "ok", f"{headroom:.0f} MiB free at the worst point (estimated)"
    return replace(
        c,
        measurement_id=f"{c.measurement_id}>{name}",
        scenario=name,
        mfs=res.mem_fraction_static,
        heuristic_fraction=res.heuristic_fraction,
        slack_mib=slack,
        reserved_terms_mib=res.reserved_mib,
        used_after_kv_mib=used,
        headroom_mib=headroom,
        headroom_startup_mib=None,
        recommended_mfs=rec,
        verdict=verdict,
        reason=reason + f" [derived from run {c.measurement_id}]",
        terms=tuple(terms),
        ladder=tuple(p for p in c.ladder if p[0] <= max_bs),
        wasted_kv_tokens=(
            int((headroom - c.margin_mib) * 2**20 // c.kv_bytes_per_token)
            if headroom is not None and c.kv_bytes_per_token and headroom > c.margin_mib
            else None
        ),
    )
