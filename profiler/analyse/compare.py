"""Set a `Measurement` against what sglang reserved, term by term and as a whole.

Runtime semantics first: sglang sizes the KV pool as `free_at_start × mfs − weights`, where free_at_start is
the free memory after NCCL init (not the capacity). So the non-static memory a worker really has is
`free_at_start × (1 − mfs)`, and what it used of it is the free memory right after the KV pool minus the
lowest free memory seen afterwards (graph capture, buffers, serving). The difference is the headroom — the
OOM margin — and, when it is large, KV cache the fleet paid for and never used.

Per term, what each reservation covers is matched to the ledger line that spends it (`profiler.analyse.ledger`: every
window charged once, nested windows subtracted from their parents):

| term | measured as |
|---|---|
| activation | serving peak above its baseline (taken before the warm-up request) + the prefill graph's torch pool |
| prefill_graph | the prefill capture's non-torch growth — all sglang's term counts (memory_hook.py:385) |
| decode_graph | the decode capture's torch growth (beyond a shared prefill pool) |
| dp_padding, prefill_bcg_deepep | not separable from their graph: summed with it |
| deepep_a2a | DeepEP buffer creation window (driver: NVL + NVSHMEM heap + workspace), analytic size beside it |
| constant | attention backends + eager runner + finalize + disaggregation init (torch part on a GPU) |
| parallel | non-torch growth of the windows after the KV pool (driver Δ − torch reserved Δ), probe on a GPU |
| speculative | every window of a draft model but its weights and KV pool (sglang ≥ 0.5.14 reserves 0 for it) |
| floor_topup | the part of the floor that the other terms' overflow consumed |

Activation is "not_reached" when the load never ran the forward its reserve is for (profiler.analyse.load). Logs
show only some of these (graph capture, headroom); the rest are `unobservable`, said per term.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from profiler.analyse.ledger import Attribution, Ledger, attribute, ledger_of
from profiler.analyse.load import Reach, load_note, reaches
from profiler.analyse.verdict import Need, headroom_verdict, run_verdict
from profiler.analyse.verdict import runtime_need as verdict_need
from profiler.core.errors import MemfracError
from profiler.core.measurement import Measurement, Phase, Rank
from profiler.model.heuristic import Reservation
from profiler.model.heuristic.record import TERM_NAMES
from profiler.model.kv_sizing import KvSizingInputs, check_replay, largest_fraction, size_at

#: Default safety margin added to what was used when recommending a fraction.
DEFAULT_MARGIN_MIB = 1024.0
TERM_VERDICTS = ("under", "fits", "over", "not_reached", "unobservable", "off")
_GRAPHS = ("prefill_graph", "decode_graph", "verify_graph", "draft_graph", "draft_extend_graph")


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
    wasted_kv_tokens: int | None  # what kv_unused_mib would hold as KV cache
    recommended_mfs: float | None
    margin_mib: float
    verdict: str
    reason: str
    terms: tuple[TermComparison, ...] = ()
    ladder: tuple[tuple[int, float], ...] = ()  # decode graph: (bs, cumulative MiB) from one start
    deepep_analytic_mib: float | None = None
    failure_kind: str | None = None
    observable: tuple[str, ...] = field(default=())
    ledger: Ledger | None = None  # the judged (worst) rank's books at its worst point
    ledgers: tuple[Ledger, ...] = ()  # every rank's
    kv_unused_mib: float | None = None  # headroom beyond the margin and what runtime still needs (`spare`)
    kv_draft_mib: float | None = None  # the speculative draft's KV pool (inside kv_pool_mib and its bytes per token)
    kv_upper_bound_mib: float | None = None  # post-capture KV sizing: the VA upper bound configure reserved …
    kv_upper_bound_tokens: int | None = None  # … and its tokens (kv_pool_mib / kv_tokens are the final pool)
    rule_sets: tuple[str, ...] = ()  # every rule set `rules` names, in release order (the label is for display)
    mfs_reconstructed: float | None = None  # memfrac's reconstruction of sglang's fraction for the scenario
    mfs_source: str = ""  # where `mfs` comes from: the worker, sglang's resolver, the log, the model, the run's args
    mfs_finding: str = ""  # the worker's fraction (/server_info) differs from the reconstruction: why it matters
    judged_rank: int | None = None  # index into Measurement.ranks of the rank judged (closest to OOM)
    request_pools_mib: float | None = None  # req_to_token + allocator index, built out of the slack (read)
    room_mib: float | None = None  # slack − request pools: what the fraction really leaves the worker
    need_mib: float | None = None  # what the worker measured it needs of that room: used after the KV pool
    pending_mib: float | None = None  # runtime need beyond the worst point seen (an unreached reserve)
    load: tuple[str, ...] = ()  # per worst case: what the load reached of it (profiler.analyse.load)
    load_reached: bool | None = None  # every worst case of the role reached (None: no batch record)
    recommended_basis: str = ""  # how recommended_mfs was reached (replay, partial load, or why it is withheld)
    free_at_start_how: str = ""  # where free_at_start_mib comes from (`run_free_at_start`: its own, or another rank's)

    def term(self, name: str) -> TermComparison:
        for t in self.terms:
            if t.term == name:
                return t
        raise KeyError(name)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["terms"] = [asdict(t) | {"slack_mib": t.slack_mib} for t in self.terms]
        d["ledger"] = None if self.ledger is None else self.ledger.as_dict()
        d["ledgers"] = [x.as_dict() for x in self.ledgers]
        return d


# ---------------------------------------------------------------------------------------------------
# Reading the measurement
# ---------------------------------------------------------------------------------------------------


def _phase(r: Rank | None, name: str) -> Phase | None:
    return None if r is None else r.phase(name)


def free_at_start(r: Rank | None) -> float | None:
    """The rank's free memory at start, by the one rule (`profiler.core.measurement.free_at_start`)."""
    return None if r is None else r.free_at_start().mib


@dataclass(frozen=True, slots=True)
class JudgedRank:
    """The rank judged — the one closest to OOM (lowest free memory at its worst point), else the primary one —
    with every rank's attribution, each computed once (`judge_ranks`) and reused for the verdict, the figures
    and the books shown."""

    rank: Rank | None
    attribution: Attribution | None
    index: int | None  # position in Measurement.ranks (labels may repeat: identity is the position)
    attributions: tuple[Attribution, ...] = ()  # one per Measurement.ranks entry


def judge_ranks(m: Measurement) -> JudgedRank:
    """Attribute every rank once; pick the judged one (ties: the first in Measurement.ranks order)."""
    atts = tuple(attribute(rk, m.memory_kind) for rk in m.ranks)
    cands = [(a.worst_free_mib, i) for i, a in enumerate(atts) if a.worst_free_mib is not None]
    if cands:
        i = min(cands)[1]
        return JudgedRank(m.ranks[i], atts[i], i, atts)
    p = m.primary
    i = next((j for j, rk in enumerate(m.ranks) if rk is p), None)
    return JudgedRank(p, None if i is None else atts[i], i, atts)


#: How `run_free_at_start` labels a start read on another rank than the judged one (and how readers recognise it).
OTHER_RANK_START = "estimated from rank"


def other_rank_start(how: str) -> bool:
    """Whether a run's free at start (its `free_at_start_how`) is another rank's reading."""
    return how.startswith(OTHER_RANK_START)


def run_free_at_start(m: Measurement, j: JudgedRank) -> tuple[float | None, str]:
    """The run's free memory at start and where it comes from: the judged rank's own reading (`free_at_start`);
    where that rank printed none (a log interleaves ranks and often shows one rank's 'Load weight begin' only),
    another rank's of the same run — same GPU type, same launch — the smallest of them, as sglang sizes every rank
    from the smallest (pre_model_load_memory, the minimum over ranks: bootstrap.py:207-212). That is an estimate for
    the judged rank and labelled so: "estimated from rank TP1: the judged rank TP0 printed none (…)"."""
    r = j.rank
    if r is None:
        return None, "unknown: no rank"
    own = r.free_at_start()
    if own.mib is not None:
        return own.mib, f"{own.how}: {own.what}"
    if m.memory_kind != "gpu":
        return None, f"unknown: {own.what}"
    labels = [rk.label for rk in m.ranks]
    others = [(f.mib, i, f) for i, rk in enumerate(m.ranks)
              if i != j.index and (f := rk.free_at_start()).mib is not None]  # fmt: skip
    if not others:
        return None, "unknown: no rank printed a reading before the weights"
    mib, i, f = min(others, key=lambda o: (o[0] or 0.0, o[1]))
    of = f"the smallest of {len(others)} ranks' readings, " if len(others) > 1 else ""
    return mib, (f"{OTHER_RANK_START} {_label(m.ranks[i], labels)}: the judged rank {_label(r, labels)} printed none "
                 f"({of}{f.how}: {f.what})")  # fmt: skip


def _attribution(m: Measurement, r: Rank | None) -> Attribution | None:
    return None if r is None else attribute(r, m.memory_kind)


def rank_figures(r: Rank | None, memory_kind: str = "gpu", att: Attribution | None = None) -> dict[str, Any]:
    """Weights, KV pool, graph capture and headroom of one rank (MiB; None where it does not say)."""
    w = _phase(r, "weights")
    kv = kv_figures(r)
    if att is None and r is not None:
        att = attribute(r, memory_kind)
    graphs = [p.used_mib for p in (r.phases if r else []) if p.name in _GRAPHS and p.used_mib is not None]
    return {
        "weights_mib": w.used_mib if w else None,
        "kv_mib": kv.target_mib,
        "kv_tokens": kv.tokens,
        "graph_mib": sum(graphs) if graphs else None,
        "headroom_mib": None if att is None else att.worst_free_mib,
    }


def _kv_mib(kv: Phase | None) -> float | None:
    if kv is None:
        return None
    d = kv.details
    return ((d.get("k_mib") or 0) + (d.get("v_mib") or 0)) or d.get("kv_mib")


@dataclass(frozen=True, slots=True)
class KvFigures:
    """The KV pools a rank ended its startup with (MiB, tokens)."""

    target_mib: float | None  # the target's pool: the post-capture resize's final span when there was one
    tokens: int | None
    draft_mib: float | None = None  # the speculative draft's pool (same tokens: it takes the target's config)
    upper_bound_mib: float | None = None  # post-capture: what configure reserved as virtual address space
    upper_bound_tokens: int | None = None

    @property
    def total_mib(self) -> float | None:
        return None if self.target_mib is None else self.target_mib + (self.draft_mib or 0.0)

    @property
    def bytes_per_token(self) -> float | None:
        """(target + draft) bytes / tokens: a KV token costs a slot in every pool (pool_configurator.py:259-300:
        sglang sizes the target's budget with the draft's bytes per token included)."""
        t = self.total_mib
        return None if not t or not self.tokens else t * 2**20 / self.tokens


def kv_figures(r: Rank | None) -> KvFigures:
    """The target pool (from `post_capture_resize` when the pool was sized after capture: configure reserved
    only its VA upper bound, memory_pool.py:2217-2220, and `post_capture_resize_kv_pool` backs the final span,
    model_runner.py:1061, kv_pool_runtime.py:151), the draft's pool, and the upper bound apart."""
    kv = _phase(r, "kv_pool")
    if kv is None:
        return KvFigures(None, None)
    tokens = kv.details.get("kv_tokens")
    target = _kv_mib(kv)
    upper = upper_tokens = None
    rz = _phase(r, "post_capture_resize")
    draft = None if r is None else _kv_mib(r.phase("kv_pool", role="draft"))
    if rz is not None and isinstance(rz.details.get("kv_mib"), int | float):
        upper, upper_tokens = target, tokens
        target, tokens = float(rz.details["kv_mib"]), rz.details.get("kv_tokens", tokens)
        if isinstance(rz.details.get("draft_kv_mib"), int | float):
            draft = float(rz.details["draft_kv_mib"])
    elif kv.details.get("post_capture_active"):
        upper, upper_tokens = target, tokens  # never resized (the run ended first): no final pool
        target, tokens = None, None
    return KvFigures(target, tokens, draft, upper, upper_tokens)


def worst_rank(m: Measurement) -> Rank | None:
    """The rank closest to OOM (lowest free memory at its worst point); the primary one when none says."""
    return judge_ranks(m).rank


def kv_bytes_per_token(r: Rank | None) -> float | None:
    """Exact, from the KV pools the worker allocated: (target + draft K + V) bytes / tokens."""
    return kv_figures(r).bytes_per_token


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
    m: Measurement, res: Reservation, att: Attribution | None, resolution: float, used_total: float | None,
    unreached: str = "",
) -> list[TermComparison]:
    mib = dict(zip(TERM_NAMES, res.term_mib, strict=True))
    on = dict(zip(TERM_NAMES, res.term_on, strict=True))
    rows: list[TermComparison] = []
    host = m.memory_kind == "host"

    def measured(line: str, peak: bool = False) -> float | None:
        return None if att is None else att.total(line, peak=peak)

    def source(line: str, fallback: str) -> str:
        cs = [] if att is None else att.charged(line)
        return "; ".join(dict.fromkeys(c.source for c in cs)) if cs else fallback

    formula = getattr(res.rule_set, "formula", "terms")

    def add(names: tuple[str, ...], value: float | None, src: str, note: str = "") -> None:
        name = "+".join(names)
        reserved = sum(mib[n] for n in names)
        if not any(on[n] for n in names) and (not value or formula != "terms"):
            why = (f"not a term of the {res.rule_set.name} rule (a {formula} formula): the reserve is judged as a "
                   "whole" if formula != "terms" else "term not applied")  # fmt: skip
            rows.append(TermComparison(name, reserved, value, "off", src, note or why))
            return
        v = "unobservable" if host and value is not None else _verdict(reserved, value, resolution)
        if host and value is not None:
            note = (note + "; " if note else "") + "host RSS of a CPU run: not comparable with GPU reserves"
        rows.append(TermComparison(name, reserved, value, v, src, note))

    act = measured("activation")
    add(("activation",), act, source("activation", "no serving load observed"))
    if unreached and act is not None and not host and rows[-1].verdict in ("under", "fits", "over"):
        rows[-1] = replace(rows[-1], verdict="not_reached",
                           note=f"the load did not reach the forward this reserve is for: {unreached}")  # fmt: skip

    # Each family on its own row, by sglang's meaning of its term (memory_hook.py:364-389): the prefill term counts
    # only the graph's non-torch memory — its torch pool, which the decode graphs reuse ("later backends reuse the
    # same handle", runner_utils/pool.py), is activation memory; the decode term covers the growth beyond it.
    dec, pre = measured("decode_graph"), measured("prefill_graph")
    pre_note = ""
    if pre is not None and m.source == "log":
        pre_note = (f"the log's capture window ({pre:,.0f} MiB) holds the graph's torch pool, activation memory "
                    "by sglang's meaning (memory_hook.py:385); the non-torch part the term counts is not printed")
        pre = None
    dec_names = ("decode_graph", "dp_padding") if on["dp_padding"] else ("decode_graph",)
    pre_names = ("prefill_graph", "prefill_bcg_deepep") if on["prefill_bcg_deepep"] else ("prefill_graph",)
    add(dec_names, dec, source("decode_graph", "no decode capture seen"),
        "padding not separable" if on["dp_padding"] else "")  # fmt: skip
    add(pre_names, pre, source("prefill_graph", "no prefill capture seen"),
        "; ".join(x for x in ("DeepEP first touch not separable" if on["prefill_bcg_deepep"] else "", pre_note) if x))

    add(("deepep_a2a",), measured("deepep_a2a"), source("deepep_a2a", "no DeepEP buffer creation seen"))
    add(("constant",), measured("constant"),
        source("constant", "attention backends + eager runner + finalize + disaggregation init"))  # fmt: skip
    par = measured("parallel") if m.source == "probe" and not host else None
    add(("parallel",), par, source("parallel", "non-torch growth after the KV pool: only the probe on a GPU sees it"))
    spec = measured("speculative")
    if on["speculative"] or spec is not None:
        why = "" if on["speculative"] else "sglang reserves nothing for the draft model's graphs and buffers"
        add(("speculative",), spec, source("speculative", "draft model windows"), why)

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
    for name in TERM_NAMES[TERM_NAMES.index("xpu") :]:  # xpu, vlm_scaling, and the pre-0.5.3 formulas' parts
        if on[name]:
            rows.append(TermComparison(name, mib[name], None, "unobservable", "", "no phase spends this term alone"))
    return rows


# ---------------------------------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------------------------------


#: Run verdicts of a finished startup whose headroom was judged: only they say how much KV was left unused.
JUDGED_VERDICTS = ("short", "tight", "ok", "wasteful")


@dataclass(frozen=True, slots=True)
class Spare:
    """What a judged run left unused and the fraction that would have used it (None: not judged, or what
    runtime still needs is unknown — a failed, cut or unread startup shows no such thing)."""

    kv_unused_mib: float | None  # max(0, worst − pending runtime need − margin)
    wasted_kv_tokens: int | None  # kv_unused_mib as KV tokens (exact bytes per token of the pool)
    recommended_mfs: float | None  # the largest fraction whose headroom keeps the margin (see `spare`); None ≤ 0
    basis: str = ""  # how recommended_mfs was reached, or why there is none


def spare(
    verdict: str,
    worst: float | None,
    used: float | None,
    start: float | None,
    pending: float | None,
    margin_mib: float,
    bpt: float | None,
    sizing: KvSizingInputs | None = None,
    why_not_replayed: str = "",
) -> Spare:
    """What a judged run left unused, and the fraction to recommend.

    `pending` is what runtime still needs beyond the worst point seen: nothing when the load reached every worst
    case (the worst point holds its peak), the unreached part of the activation reserve otherwise, the reserve
    itself for a startup-only source; None (unknown) gives no recommendation. A startup log's free memory is what
    the activations are for: counting it as unused KV would call the activation reserve waste.

    With `sizing` (the worker's own sizes, profiler.model.kv_sizing) the fraction is sglang's sizing replayed:
    the largest f on the 0.001 grid where worst − pending − Δpool(f) − Δrequest pools(f) ≥ margin — a higher
    fraction buys tokens, which admit more requests, whose req_to_token rows come out of the slack
    (kv_cache_configurator.py:478-482); the need measured is kept as it was measured. Without it,
    1 − (used + pending + margin) / free at start, which assumes the slack is the worker's whole — the basis says so."""
    if verdict not in JUDGED_VERDICTS or pending is None:
        why = "not judged" if verdict not in JUDGED_VERDICTS else "what runtime still needs is unknown"
        return Spare(None, None, None, f"none: {why}")
    unused = None if worst is None else max(0.0, worst - pending - margin_mib)
    wasted = None if unused is None or not bpt else int(unused * 2**20 // bpt)
    if sizing is not None and worst is not None:
        at = size_at(sizing, sizing.mfs)

        def headroom(f: float) -> float:
            z = size_at(sizing, f)
            extra = z.pool_mib - at.pool_mib + z.slack_pools_mib - at.slack_pools_mib
            return worst - pending - extra

        rec = largest_fraction(lambda f: headroom(f) >= margin_mib, 0.001)
        if rec is None:
            return Spare(unused, wasted, None, "none: no fraction leaves the margin (sglang's sizing replayed)")
        z = size_at(sizing, rec)
        basis = (f"sglang's sizing replayed at {rec:.3f}: {z.tokens:,} tokens admit {z.requests:,} requests, "
                 f"req_to_token + allocator {z.slack_pools_mib:,.0f} MiB out of the slack (at {sizing.mfs:.3f}: "
                 f"{at.slack_pools_mib:,.0f}); headroom {headroom(rec):,.0f} MiB ≥ margin {margin_mib:,.0f}")
        return Spare(unused, wasted, rec, basis)
    rec = None if used is None or not start else math.floor((1 - (used + pending + margin_mib) / start) * 1000) / 1000
    basis = (f"1 − (used {used:,.0f} + pending {pending:,.0f} + margin {margin_mib:,.0f}) / free at start {start:,.0f}"
             if used is not None and start else "none: no reading after the KV pool")  # fmt: skip
    if why_not_replayed and rec is not None:
        basis += f" — the request pools' growth with the fraction not replayed ({why_not_replayed})"
    ok = rec is not None and rec > 0
    return Spare(unused, wasted, rec if ok else None, basis if ok or rec is None else "none: ≤ 0")


def sizing_inputs(m: Measurement, r: Rank | None, mfs: float | None) -> tuple[KvSizingInputs | None, str]:
    """The worker's own sizes the replay rests on (its kv_pool record), or why there are none."""
    if r is None or mfs is None:
        return None, "no fraction" if mfs is None else "no rank"
    kv = r.phase("kv_pool")
    if kv is None:
        return None, "no KV pool record"
    d = kv.details
    if d.get("post_capture_active"):
        return None, "post-capture KV sizing: the pool is sized after capture, not from the fraction"
    need = ("budget_mib", "kv_tokens", "context_len", "max_running_requests", "req_to_token_rows",
            "req_to_token_cols")  # fmt: skip
    missing = [k for k in need if not isinstance(d.get(k), int | float) or isinstance(d.get(k), bool)]
    f = r.free_at_start()
    kvf = kv_figures(r)
    if missing or f.mib is None or not kvf.total_mib or not kvf.tokens:
        what = ", ".join(missing) or "free at start / the pool's size"
        return None, f"the {kv.source} record lacks {what}"

    def cli(key: str) -> int | None:
        v = m.args.get(key)
        return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    x = KvSizingInputs(
        mfs=mfs, pre_model_load_mib=f.mib, budget_mib=float(d["budget_mib"]), tokens=int(kvf.tokens),
        pool_mib=float(kvf.total_mib), context_len=int(d["context_len"]), requests=int(d["max_running_requests"]),
        req_rows=int(d["req_to_token_rows"]), req_cols=int(d["req_to_token_cols"]),
        allocator_mib=float(d.get("allocator_mib") or 0.0), page_size=int(d.get("page_size") or 1),
        max_total_tokens=cli("max_total_tokens"), max_running_requests=cli("max_running_requests"),
        attn_dp_size=m.identity.attn_dp or 1,
    )  # fmt: skip
    bad = check_replay(x)
    return (None, f"the replay at the worker's own fraction does not give it back: {bad}") if bad else (x, "")


def _admission_note(x: KvSizingInputs, rs: tuple[Reach, ...], rec: float | None) -> str:
    """The recommendation keeps the need the load measured. A decode load that ran every request the pool held at
    once measured it at that count; at a higher fraction the pool admits (and holds) more at once, and the eager
    decode's activations grow with them (logits per request, layers/logits_processor.py): say by how much the count
    grows, so a reader can weigh it — memfrac does not scale a measurement it did not make."""
    dec = next((z for z in rs if z.kind == "decode" and z.reached and z.target), None)
    if dec is None or rec is None or rec <= x.mfs:
        return ""
    at, z = size_at(x, x.mfs), size_at(x, rec)
    by_pool = dec.target < at.requests
    more = dec.target * z.tokens / at.tokens if by_pool else z.requests
    if more <= dec.target:
        return ""
    return (f"the activation was measured at {dec.target:,} requests at once; at {rec:.3f} the pool "
            f"{'holds' if by_pool else 'admits'} ~{more:,.0f} ({more / dec.target - 1:+.1%}): not scaled")


@dataclass(frozen=True, slots=True)
class LogJudging:
    """How a log run is judged (`profiler.ingest.judge`): its own fraction (None when the log supports none),
    the rule set(s) it was judged with (a range of candidates for a log), and what runtime needs (the largest
    activation reserve over the candidates, or a measured peak)."""

    mfs: float | None
    rules: str
    need: Need | None
    rule_sets: tuple[str, ...] = ()  # the candidates `rules` labels, in release order


def compare(
    m: Measurement,
    res: Reservation | None,
    *,
    margin_mib: float = DEFAULT_MARGIN_MIB,
    deepep_analytic_mib: float | None = None,
    judging: LogJudging | None = None,
    resolved_mfs: float | None = None,
) -> Comparison:
    """Compare one measurement with the reservation of its configuration (None when it cannot be modelled).
    `judging`: a log run's own fraction, rule-set label and runtime need (`memfrac ingest`); the verdict is
    decided here, once, with them. `resolved_mfs`: sglang's own resolver's fraction for the run's scenario
    (profiler.engine.fraction; the plan's): the fraction judged with when the worker did not report its own.

    Ranks differ (the first one often holds extra buffers): the rank closest to OOM is the one judged.
    """
    j = judge_ranks(m)
    r, att = j.rank, j.attribution
    recon = res.mem_fraction_static if res is not None else None
    worker = _mfs_from_args(m) if m.source == "probe" and m.args_source == "server_info" else None
    if worker is not None:
        mfs, mfs_source = worker, "the worker (/server_info)"
    elif resolved_mfs is not None:
        mfs, mfs_source = resolved_mfs, "sglang's resolver on the scenario"
    elif recon is not None:
        mfs, mfs_source = recon, f"the model (sglang {res.rules} rules)"  # type: ignore[union-attr]
    else:
        mfs, mfs_source = _mfs_from_args(m), "the run's arguments"
    finding = ""
    if worker is not None and recon is not None and abs(worker - recon) > 5e-4:
        finding = (f"sglang used mem_fraction_static {worker:.3f} (/server_info) where memfrac reconstructs "
                   f"{recon:.3f} for the scenario: the scenario's GPU, model or flags differ from the worker's; "
                   f"judged with the worker's {worker:.3f}")  # fmt: skip
    elif worker is None and resolved_mfs is not None and recon is not None and abs(resolved_mfs - recon) > 5e-4:
        finding = (f"sglang's resolver gives the scenario mem_fraction_static {resolved_mfs:.3f} where the model says "
                   f"{recon:.3f} (a flag the model does not interpret); judged with sglang's {resolved_mfs:.3f}")
    if judging is not None:
        mfs, mfs_source = judging.mfs, "the log"  # the log's own fraction (printed, implied or computed)
    start, start_how = run_free_at_start(m, j)
    slack = None if start is None or mfs is None else start * (1 - mfs)
    after_kv = None if att is None else att.after_kv_free_mib
    unread = [] if att is None else att.unread_after  # windows after the last reading printed no memory
    worst = None if att is None or unread else att.worst_free_mib
    end_startup = None if att is None or unread else att.end_of_startup_free_mib
    # used after KV: KV memory committed after the target's pool window (the draft's pool, a post-capture
    # resize) is KV, not what the fraction's slack paid for (`Attribution.kv_later_mib`)
    used = None if after_kv is None or worst is None else after_kv - att.kv_later_mib - worst  # type: ignore[union-attr]
    weights = _phase(r, "weights")
    kv = kv_figures(r)
    bpt = kv.bytes_per_token
    resolution = max((p.resolution_mib or 0.0) for p in r.phases) if r and r.phases else 0.0
    rs = reaches(m, r, m.identity.mode) if m.source == "probe" and m.memory_kind == "gpu" else ()
    unreached = load_note(rs)
    rows = _term_rows(m, res, att, resolution, used, unreached) if res is not None else []
    served_act = _served_activation(att)
    act_reserve = res.mib("activation") if res is not None and _on(res, "activation") else None
    if judging is not None:
        need = judging.need
        pending = 0.0 if served_act is not None else need[0] if need is not None else None
    elif served_act is not None and not unreached:
        need, pending = (served_act, "measured runtime peak (probe)"), 0.0
    elif served_act is not None:  # a partial load: the reserve stands for the forward it never ran
        full = max(served_act, act_reserve) if act_reserve is not None else None
        need = None if full is None else (full, f"the activation reserve — the load did not reach its worst case "
                                                f"({unreached})")  # fmt: skip
        pending = None if full is None else full - served_act
    else:
        need = verdict_need(m, res)
        pending = need[0] if need is not None else None
    verdict, reason = run_verdict(m, worst, used, end_startup, need)
    x, why_not = sizing_inputs(m, r, mfs) if m.source == "probe" and m.memory_kind == "gpu" else (None, "")
    s = spare(verdict, worst, used, start, pending, margin_mib, bpt, x, why_not_replayed=why_not)
    basis = s.basis
    if x is not None and (note := _admission_note(x, rs, s.recommended_mfs)):
        basis += f"; {note}"
    if unreached and s.recommended_mfs is not None:
        basis += f"; rests on a partial load: {unreached} — the activation reserve stands in for the rest"
    if other_rank_start(start_how) and s.recommended_mfs is not None:
        basis += f"; free at start {start_how}"
    pools = _request_pools(r)
    if unread and verdict == "unknown" and att is not None and att.worst_free_mib is not None:
        reason = (f"headroom unknown: {', '.join(unread)} ran after the last free-memory reading "
                  f"({att.worst_free_mib / 1024:.2f} GiB free) and printed no memory")  # fmt: skip
    if finding:
        reason += f"; {finding}"
    labels = [rk.label for rk in m.ranks]
    books = [(i, ledger_of(a, _label(rk, labels))) for i, (rk, a) in enumerate(zip(m.ranks, j.attributions,
                                                                                   strict=True))
             if a.opening_mib is not None or a.charges]  # fmt: skip
    ledgers = tuple(x for _, x in books)
    judged_ledger = next((x for i, x in books if i == j.index), None)
    return Comparison(
        measurement_id=m.id,
        scenario=m.scenario,
        source=m.source,
        memory_kind=m.memory_kind,
        rules=judging.rules if judging is not None else res.rules if res is not None else None,
        rule_sets=judging.rule_sets if judging is not None else (res.rules,) if res is not None else (),
        mfs=mfs,
        mfs_origin=m.mfs_origin,
        # with the GPU size unknown the rules fall back to a constant: that is no heuristic answer
        heuristic_fraction=res.heuristic_fraction if res is not None and "gpu_mem_unknown" not in res.flags else None,
        gpu_total_mib=m.identity.gpu_total_mib,
        free_at_start_mib=start,
        free_at_start_how=start_how,
        slack_mib=slack,
        reserved_terms_mib=res.reserved_mib if res is not None else None,
        weights_mib=weights.used_mib if weights else None,
        kv_pool_mib=kv.total_mib,
        kv_tokens=kv.tokens,
        kv_bytes_per_token=bpt,
        used_after_kv_mib=used,
        headroom_startup_mib=end_startup,
        headroom_mib=worst,
        wasted_kv_tokens=s.wasted_kv_tokens,
        # a log run without a fraction of its own: no recommended one (it would rest on a fraction the log lacks)
        recommended_mfs=None if judging is not None and judging.mfs is None else s.recommended_mfs,
        margin_mib=margin_mib,
        verdict=verdict,
        reason=reason,
        terms=tuple(rows),
        ladder=_ladder(r),
        deepep_analytic_mib=deepep_analytic_mib,
        failure_kind=m.failure.kind if m.failure else None,
        observable=tuple(t.term for t in rows if t.verdict not in ("unobservable", "off")),
        ledger=judged_ledger,
        ledgers=ledgers,
        kv_unused_mib=s.kv_unused_mib,
        kv_draft_mib=kv.draft_mib,
        kv_upper_bound_mib=kv.upper_bound_mib,
        kv_upper_bound_tokens=kv.upper_bound_tokens,
        mfs_reconstructed=recon,
        mfs_source=mfs_source if mfs is not None else "",
        mfs_finding=finding,
        judged_rank=j.index,
        request_pools_mib=pools,
        # post-capture sizing sizes the pool after capture, not from the fraction: the slack is no room there
        room_mib=None if slack is None or kv.upper_bound_mib is not None else slack - (pools or 0.0),
        need_mib=used,
        pending_mib=pending,
        load=tuple(z.describe() for z in rs),
        load_reached=None if not rs or any(z.reached is None for z in rs) else all(z.reached for z in rs),
        recommended_basis=basis,
    )


def _on(res: Reservation, term: str) -> bool:
    return bool(dict(zip(TERM_NAMES, res.term_on, strict=True))[term])


def _served_activation(att: Attribution | None) -> float | None:
    """The activation the serving load itself drew (the runtime window's charge; the prefill graph's pool, also
    activation memory, is startup's and already inside the worst point either way). None: no serving measured."""
    cs = [] if att is None else [c for c in att.charged("activation") if c.window.startswith("runtime")]
    return sum(c.mib for c in cs) if cs else None


def _request_pools(r: Rank | None) -> float | None:
    kv = _phase(r, "kv_pool")
    v = kv.details.get("request_pools_mib") if kv is not None else None
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _label(rk: Rank, labels: list[str]) -> str:
    """A rank's label, with its pid where another rank carries the same one (probe records made before the
    replica's DP rank was read: every plain-DP replica said TP0)."""
    return f"{rk.label} (pid {rk.pid})" if labels.count(rk.label) > 1 and rk.pid is not None else rk.label


def _mfs_from_args(m: Measurement) -> float | None:
    v = m.args.get("mem_fraction_static")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _ladder(r: Rank | None) -> tuple[tuple[int, float], ...]:
    """(bs, MiB used by the capture so far) right after each size, IN CAPTURE ORDER — largest bs first
    (`reversed(self.capture_bs)`, decode_cuda_graph_runner.py), so the cumulative MiB falls with bs and the
    last rung holds the whole capture. Probe ladders only (a log's tqdm rung is printed before its size is
    captured, so it cannot be attributed to that size)."""
    p = _phase(r, "decode_graph") or _phase(r, "verify_graph")  # speculative: the target's verify graph
    if p is None or p.source != "probe":
        return ()
    return tuple((lp.bs, lp.used_mib) for lp in p.ladder if lp.used_mib is not None and lp.bs is not None)


def reservation_for(m: Measurement, scenario: Any = None) -> tuple[Reservation | None, list[str]]:
    """The reservation sglang made for the run, and notes on how it was reconstructed.

    A `memfrac run` has its scenario and the release it ran. A log is judged with the rules of the release
    that wrote it, or with every rule set its release range allows (`profiler.logs.reserve`: the one
    returned here is named in the notes, the others in `log_reservation`); never silently with the newest.
    """
    from profiler.model.heuristic import DEFAULT_RULES, inputs_from_scenario, reserve, rules_for

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
    graph_launch = c.ladder[-1][1] if c.ladder else None  # capture order: the last rung holds the whole capture
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
        parts = t.term.split("+")
        if "decode_graph" in parts:
            reserved = sum(mib[n] for n in parts)
            value = est
            if est is not None and any(n.startswith("prefill") for n in parts):  # judged jointly with prefill
                value = None if t.measured_mib is None or graph_launch is None else t.measured_mib - graph_launch + est
            v = "unobservable" if value is None else _verdict(reserved, value, 0.0)
            terms.append(
                TermComparison(
                    t.term,
                    reserved,
                    value,
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
    verdict, reason = c.verdict, c.reason
    act = next((t for t in c.terms if t.term == "activation"), None)
    served = act is not None and act.measured_mib is not None and act.verdict != "not_reached"
    act_on = dict(zip(TERM_NAMES, res.term_on, strict=True))["activation"]
    need = (
        (act.measured_mib, "measured runtime peak (probe), of the run it is derived from")
        if served
        else (mib["activation"], f"the {res.rules} rules' activation reserve")
        if act_on
        else None
    )
    pending = c.pending_mib if c.pending_mib is not None else 0.0 if served else need[0] if need is not None else None
    if c.failure_kind is None and headroom is not None and used is not None and c.memory_kind == "gpu":
        verdict, reason = headroom_verdict(headroom, used, need)
        reason += " (estimated)"
    s = spare(verdict, headroom, used, c.free_at_start_mib, pending, c.margin_mib, c.kv_bytes_per_token,
              why_not_replayed="a variant read from another start's ladder")  # fmt: skip
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
        recommended_mfs=s.recommended_mfs,
        verdict=verdict,
        reason=reason + f" [derived from run {c.measurement_id}]",
        terms=tuple(terms),
        ladder=tuple(p for p in c.ladder if p[0] <= max_bs),
        ledger=None,  # a derived variant was not started: it has no books of its own
        ledgers=(),
        wasted_kv_tokens=s.wasted_kv_tokens,
        kv_unused_mib=s.kv_unused_mib,
        recommended_basis=s.basis,
        pending_mib=pending,
        need_mib=used,
        room_mib=None if slack is None else slack - (c.request_pools_mib or 0.0),
    )
