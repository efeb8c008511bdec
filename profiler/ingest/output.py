"""What `memfrac ingest` prints and writes: one row per run (or per rank), as a table, JSON, CSV or parquet.

Every row names the rules it was judged with and why (`rules`, `rules_why`, `release`, `release_how`), the
fraction and where it comes from (`mfs_origin`: given | auto | implied | unknown, `mfs_how`), how far the
startup got (`state`), the failure's numbers, the serving evidence, and the notes that qualify a figure.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler.core.units import MIB_PER_GIB

if TYPE_CHECKING:
    from profiler.analyse.compare import Comparison
    from profiler.core.measurement import Measurement, Phase, Rank, Snapshot
    from profiler.ingest.judge import Judged
    from profiler.logs.reserve import LogReservation
    from profiler.results.store import RunContext


@dataclass(frozen=True, slots=True)
class IngestRow:
    """One run (or one rank of it) as the table shows it. Sizes in MiB; None = the log does not say."""

    file: str
    run: str
    rank: str
    model: str | None
    architecture: str | None
    gpu: str | None
    gpu_total_mib: float | None
    gpu_how: str
    mode: str | None
    tp: int | None
    dp: int | None
    ep: int | None
    release: str | None  # the sglang release, or the range the log's formats allow
    release_how: str
    rules: str  # the rule set(s) the reservation was computed with ("none" when none could be)
    rules_why: str
    mfs: float | None  # printed, implied or computed — never the heuristic's fallback (see mfs_how)
    mfs_origin: str  # given | auto | implied | unknown
    mfs_how: str
    heuristic_fraction: float | None  # what the headline rules would pick (None without the GPU size)
    heuristic_fraction_min: float | None  # over the candidate rule sets / capacities
    heuristic_fraction_max: float | None
    reserved_mib: float | None  # the heuristic's terms, total, of the headline rule set
    reserved_min_mib: float | None
    reserved_max_mib: float | None
    weights_mib: float | None
    kv_mib: float | None
    kv_tokens: int | None
    kv_tokens_from: str | None  # "KV pool line" | "ready line"
    graph_mib: float | None
    headroom_mib: float | None
    need_mib: float | None  # what runtime needs, the wasteful verdict's yardstick
    need_basis: str | None
    state: str | None  # finished | incomplete | aborted | no_kv
    state_seen: str
    verdict: str
    reason: str
    failure_kind: str | None
    failure_phase: str | None
    failure_rank: str | None
    failure_line: int | None
    oom_tried_mib: float | None
    oom_free_mib: float | None
    oom_capacity_mib: float | None
    oom_torch_allocated_mib: float | None
    oom_private_pools_mib: float | None
    oom_non_torch_mib: float | None
    serving_batches: int | None
    peak_running_req: int | None
    peak_token_usage: float | None
    retractions: int | None
    figures_from: str  # ranks other than the row's that a figure was read from
    qualifiers: str  # notes that qualify a figure: implied, lower bound, inferred, estimated
    unparsed_lines: int
    # ---- issue 19: every reading the log prints, as a field (read from the row's rank; None: not printed) ----
    rule_sets: tuple[str, ...] = ()  # the candidate rule sets in release order (`rules` is their display label)
    profiled_kv_tokens: int | None = None  # "max_total_tokens=… is larger than the profiled value -M": M (read)
    oom_in_use_mib: float | None = None  # "this process has X memory in use" (read)
    oom_reserved_unallocated_mib: float | None = None  # "X is reserved by PyTorch but unallocated" (read)
    oom_reserved_by_torch_mib: float | None = None  # old-format "X reserved in total by PyTorch" (read)
    oom_outside_torch_mib: float | None = None  # in use − allocated − reserved unallocated (implied from 3 reads)
    init_mib: float | None = None  # "Init torch distributed ends. mem usage" on this rank (read)
    load_begin_free_mib: float | None = None  # "Load weight begin. avail mem" on this rank (read)
    weights_end_free_mib: float | None = None  # "Load weight end. avail mem" on this rank (read)
    capture_begin_free_mib: float | None = None  # the decode/verify capture's begin-line avail mem (read)
    capture_min_free_mib: float | None = None  # the lowest tqdm avail_mem of any capture (read)
    ready_available_mib: float | None = None  # the ready line's available_gpu_mem (read)
    draft_weights_mib: float | None = None  # the speculative draft's own weight load, mem usage (read)
    draft_kv_mib: float | None = None  # the draft model runner's KV pool, K + V (read)
    draft_graph_mib: float | None = None  # the draft's own graph capture, mem usage as printed (read; may be < 0)


_FIGURES = ("weights_mib", "kv_mib", "kv_tokens", "graph_mib")


def rows_for(m: Measurement, c: Comparison, per_rank: bool = False, judged: Judged | None = None) -> list[IngestRow]:
    """The row of a run (its rank closest to OOM), or one row per rank. A figure the row's rank does not
    print is taken from the first rank that does, and `figures_from` says so."""
    from profiler.analyse.compare import rank_figures, worst_rank
    from profiler.logs.state import profiled_kv_tokens

    i = m.identity
    file, _, run = m.id.rpartition("#")
    lr = judged.reservation if judged is not None else None
    need = judged.need if judged is not None else None
    f = m.failure
    failing = next((r.label for r in m.ranks if r.failure is not None and r.failure is f), None)
    res_rng = lr.reserved_mib_range if lr else None
    frac_rng = lr.fraction_range if lr else None
    s = m.serving

    def row(r: Rank | None, headroom: float | None, borrow: bool) -> IngestRow:
        fig, taken = _figures(m, r, borrow)
        tokens, tokens_from = fig["kv_tokens"], "KV pool line" if fig["kv_tokens"] is not None else None
        if tokens is None:
            tokens, tokens_from = _ready_tokens(m, r)
        return IngestRow(
            file=file or m.id, run=run, rank=r.label if r else "", model=i.model, architecture=i.architecture,
            gpu=i.gpu_name, gpu_total_mib=i.gpu_total_mib, gpu_how=i.gpu_total_how, mode=i.mode, tp=i.tp,
            dp=i.dp if i.attn_dp is None else i.attn_dp, ep=i.ep,
            release=lr.release if lr else i.sglang_version, release_how=lr.release_how if lr else i.sglang_how,
            rules=lr.rules if lr else (c.rules or "none"), rules_why=lr.rules_why if lr else "",
            mfs=m.mfs, mfs_origin=m.mfs_origin, mfs_how=m.mfs_how, heuristic_fraction=c.heuristic_fraction,
            heuristic_fraction_min=frac_rng[0] if frac_rng else None,
            heuristic_fraction_max=frac_rng[1] if frac_rng else None, reserved_mib=c.reserved_terms_mib,
            reserved_min_mib=res_rng[0] if res_rng else None, reserved_max_mib=res_rng[1] if res_rng else None,
            weights_mib=fig["weights_mib"], kv_mib=fig["kv_mib"], kv_tokens=tokens, kv_tokens_from=tokens_from,
            graph_mib=fig["graph_mib"], headroom_mib=headroom, need_mib=need[0] if need else None,
            need_basis=need[1] if need else None, state=m.startup, state_seen=m.startup_seen,
            verdict=c.verdict, reason=c.reason,
            failure_kind=f.kind if f else None, failure_phase=f.phase if f else None, failure_rank=failing,
            failure_line=f.line if f else None, oom_tried_mib=f.tried_alloc_mib if f else None,
            oom_free_mib=f.free_mib if f else None, oom_capacity_mib=f.total_capacity_mib if f else None,
            oom_torch_allocated_mib=f.allocated_by_torch_mib if f else None,
            oom_private_pools_mib=f.private_pools_mib if f else None,
            oom_non_torch_mib=f.non_torch_mib if f else None,
            serving_batches=s.get("batches"), peak_running_req=s.get("peak_running_req"),
            peak_token_usage=s.get("peak_token_usage"), retractions=s.get("retractions"),
            figures_from="; ".join(taken), qualifiers="; ".join(qualifiers(m, c, lr, tokens_from)),
            unparsed_lines=m.unparsed_memory_lines,
            rule_sets=lr.rule_sets if lr else (() if c.rules is None else (c.rules,)),
            profiled_kv_tokens=profiled_kv_tokens(m),
            oom_in_use_mib=f.in_use_mib if f else None,
            oom_reserved_unallocated_mib=f.reserved_unallocated_mib if f else None,
            oom_reserved_by_torch_mib=f.reserved_by_torch_mib if f else None,
            oom_outside_torch_mib=f.outside_torch_mib if f else None,
            **readings(r),
        )  # fmt: skip

    if not per_rank:
        r = worst_rank(m)
        return [row(r, c.headroom_mib, borrow=True)]
    out = [row(r, rank_figures(r)["headroom_mib"], borrow=False) for r in m.ranks or []]
    return out or [row(None, c.headroom_mib, borrow=False)]


def readings(r: Rank | None) -> dict[str, float | None]:
    """What the rank's lines print, one field each (issue 19): init, the weight load's two readings, the capture
    begin and the lowest tqdm reading, the ready line's free memory, and the speculative draft's own weights, KV
    pool and graph. MiB; None where the rank does not print it."""
    out: dict[str, float | None] = dict.fromkeys(_READINGS)
    if r is None:
        return out

    def free(s: Snapshot | None) -> float | None:
        return None if s is None else s.free_mib

    last: dict[tuple[str, str], Phase] = {}  # one pass: the last phase of each (name, role), as Rank.phase gives
    lows: list[float] = []
    for p in r.phases:
        last[(p.name, p.role)] = p
        low = p.details.get("min_ladder_avail_mib")
        if low is not None:
            lows.append(low)
    init, w = last.get(("init_parallel", "target")), last.get(("weights", "target"))
    ready = last.get(("ready", "target"))
    out["init_mib"] = init.usage_mib if init is not None else None
    out["load_begin_free_mib"] = free(w.before) if w is not None else None
    out["weights_end_free_mib"] = free(w.after) if w is not None else None
    cap = last.get(("decode_graph", "target")) or last.get(("verify_graph", "target"))
    out["capture_begin_free_mib"] = cap.details.get("begin_avail_mib") if cap is not None else None
    out["capture_min_free_mib"] = min(lows) if lows else None
    out["ready_available_mib"] = ready.details.get("available_gpu_mem_mib") if ready is not None else None
    dw, dkv = last.get(("weights", "draft")), last.get(("kv_pool", "draft"))
    dg = last.get(("draft_graph", "draft")) or last.get(("draft_graph", "target"))
    out["draft_weights_mib"] = dw.used_mib if dw is not None else None
    if dkv is not None:
        d = dkv.details
        parts = [d[k] for k in ("k_mib", "v_mib") if isinstance(d.get(k), int | float)]
        out["draft_kv_mib"] = sum(parts) if parts else d.get("kv_mib")
    out["draft_graph_mib"] = dg.usage_mib if dg is not None else None
    return out


_READINGS = (
    "init_mib", "load_begin_free_mib", "weights_end_free_mib", "capture_begin_free_mib", "capture_min_free_mib",
    "ready_available_mib", "draft_weights_mib", "draft_kv_mib", "draft_graph_mib",
)  # fmt: skip


def _figures(m: Measurement, r: Rank | None, borrow: bool) -> tuple[dict[str, Any], list[str]]:
    from profiler.analyse.compare import rank_figures

    fig = rank_figures(r)
    taken: list[str] = []
    if not borrow:
        return fig, taken
    for key in _FIGURES:
        if fig[key] is not None:
            continue
        for other in m.ranks:
            if other is r:
                continue
            v = rank_figures(other)[key]
            if v is not None:
                fig[key] = v
                taken.append(f"{key.removesuffix('_mib')} from {other.label or 'the untagged lines'}")
                break
    return fig, taken


def _ready_tokens(m: Measurement, r: Rank | None) -> tuple[int | None, str | None]:
    for rank in ([r] if r is not None else []) + list(m.ranks):
        ready = rank.phase("ready")
        if ready is not None and isinstance(ready.details.get("max_total_num_tokens"), int):
            return ready.details["max_total_num_tokens"], "ready line"
    return None, None


def qualifiers(m: Measurement, c: Comparison, lr: LogReservation | None, tokens_from: str | None) -> list[str]:
    """The notes a reader needs before trusting a figure of this row."""
    from profiler.logs.patterns import GRAPH_PHASES

    q: list[str] = []
    if m.mfs_origin == "implied":
        bound = " (a lower bound)" if "a lower bound" in m.mfs_how else ""
        bound = " (an upper bound)" if "upper bound" in m.mfs_how else bound
        q.append("mfs implied from the KV budget" + bound)
    elif m.mfs_origin == "auto" and m.mfs_how.startswith("computed"):
        q.append("mfs computed with the release's rules (not printed)")
    if m.identity.gpu_total_how.startswith(("first avail", "avail mem after")):
        q.append(f"GPU inferred: {m.identity.gpu_total_how}")
    elif m.identity.gpu_total_how == "oom total capacity":
        q.append("GPU total is torch's (OOM message), ~0.6% under nvidia-smi's")
    if m.identity.gpu_candidates_mib and len(m.identity.gpu_candidates_mib) > 1:
        q.append("GPU capacity one of " + ", ".join(map(str, m.identity.gpu_candidates_mib)) + " MiB")
    for n in m.notes:
        if "inferred from rank tags" in n:
            q.append(n.split(";", 1)[0] + " (a lower bound)")
    if lr is not None and len({x.rule_set.name for x in lr.candidates}) > 1:
        q.append(f"reserved is one of {len(lr.candidates)} candidates (range in reserved_min/max)")
    if lr is not None and lr.candidates and all(x.fallback for x in lr.candidates):
        q.append("reserved computed without the GPU size (the heuristic's fallback defaults): an estimate")
    if tokens_from == "ready line":
        q.append("kv tokens from the ready line (the pool line does not print them)")
    if m.startup == "incomplete" and c.headroom_mib is not None:
        q.append("headroom is the last reading before the text ends, not the end of startup")
    elif m.startup == "finished" and any(p.name in GRAPH_PHASES and p.after is None for r in m.ranks for p in r.phases):
        q.append("a capture's end is not in the text: headroom is the last reading before it (an upper bound)")
    return q


COLUMNS = [f.name for f in fields(IngestRow)]


def _gib(x: float | None) -> str:
    return "—" if x is None else f"{x / MIB_PER_GIB:.2f}"


def _reserved(r: IngestRow) -> str:
    lo, hi = r.reserved_min_mib, r.reserved_max_mib
    if lo is not None and hi is not None and hi - lo > 5:
        return f"{lo / MIB_PER_GIB:.2f}–{hi / MIB_PER_GIB:.2f}"
    return _gib(r.reserved_mib)


def render_table(rows: list[IngestRow]) -> str:
    """The terminal table (profiler.core.ui: rich on a TTY, Markdown off it); every column's notes in the caption."""
    from profiler.core.ui import table

    head = ["run", "rank", "model", "gpu", "mode", "tp/dp/ep", "release", "rules", "mfs", "reserved", "weights",
            "kv", "graph", "headroom", "need", "state", "verdict", "unparsed"]  # fmt: skip
    body = []
    for r in rows:
        par = "/".join("—" if x is None else str(x) for x in (r.tp, r.dp, r.ep))
        model = (r.model or r.architecture or "?").rsplit("/", 1)[-1][:28]
        gpu = r.gpu or (f"{r.gpu_total_mib / MIB_PER_GIB:.0f}GiB?" if r.gpu_total_mib else "?")
        if r.gpu and r.gpu_how.startswith(("first avail", "avail mem after")):
            gpu += "?"  # inferred from the free memory at load, not named by the log
        mfs = "—" if r.mfs is None else f"{r.mfs:.3f} ({r.mfs_origin})"
        body.append([f"{r.file}#{r.run}", r.rank or "-", model, gpu, r.mode or "?", par, r.release or "?", r.rules,
                     mfs, _reserved(r), _gib(r.weights_mib), _gib(r.kv_mib), _gib(r.graph_mib), _gib(r.headroom_mib),
                     _gib(r.need_mib), r.state or "—", r.verdict, str(r.unparsed_lines)])  # fmt: skip
    right = [h in ("mfs", "reserved", "weights", "kv", "graph", "headroom", "need", "unparsed") for h in head]
    caption = ("sizes in GiB (sglang's 'GB'); release: stated, or the range the log's formats allow; reserved: the "
               "heuristic's terms under those rules (a range over candidates); headroom: free at the worst point; "
               "need: what runtime needs (activation reserve or measured peak). Why each row says what it says: "
               "--format json (rules_why, mfs_how, reason, qualifiers).")  # fmt: skip
    return table(head, body, title="memfrac ingest", caption=caption, right=right)


def render(rows: list[IngestRow], fmt: str) -> str:
    if fmt == "json":
        return json.dumps([asdict(r) for r in rows], indent=1)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r))
        return buf.getvalue()
    return render_table(rows)


def write_rows(rows: list[IngestRow], path: Path, fmt: str) -> None:
    """The rows as JSON, CSV or the table (a .parquet file is the results table: `write_results_parquet`)."""
    path.write_text(render(rows, fmt))


def write_results_parquet(batch: list[tuple[Measurement, Comparison, RunContext]], path: Path) -> None:
    """`ingest --out FILE.parquet`: the results.parquet table a results directory holds (profiler.results.store
    RESULT_COLUMNS, schema-versioned): one schema whether --out names a directory or a file."""
    import pandas as pd

    from profiler.results.store import RESULT_COLUMNS, result_rows

    rows = [row for m, c, ctx in batch for row in result_rows(m, c, ctx)]
    df = pd.DataFrame(rows, columns=list(RESULT_COLUMNS)).astype(RESULT_COLUMNS)
    tmp = path.with_name(path.name + ".tmp")
    df.to_parquet(tmp, index=False)
    tmp.replace(path)
