"""The ledger: every MiB that was free when a worker started, attributed exactly once.

    free_at_start = weights + kv_pool + Σ terms + unattributed + headroom        (± the readings' resolution)

Why a ledger: a measurement tool earns trust when its accounting adds up. Each phase window of a rank (probe
JSONL or log lines) is charged to one line; a window nested inside another (the DeepEP buffer, created at the
first MoE dispatch inside warm-up or capture) is subtracted from its parent; memory that changed between
windows is `unattributed` and shown; the books are taken at the worst point (the lowest free memory, inside
a window's peak or at the serving peak), so `headroom` is the OOM margin. If a charge were counted twice or
lost, the lines would not sum to free_at_start: `residual_mib` says by how much.

Worked example (a DeepEP decode worker, probe, MiB): free at start 139,000 (driver, after NCCL init);
weights window −15,400 → weights 15,400; KV pool window 112,000 → kv_pool; eager runner window 400, of which
torch reserved 300 → constant 300 and its non-torch 100 → parallel; the decode capture window 3,600 holds
the DeepEP buffer's creation (2,500, all non-torch) → deepep_a2a 2,500, and the capture itself 1,100 (torch
1,000 → decode_graph, non-torch 100 → parallel); gaps between windows 40 → unattributed; serving peak
2,300 above its baseline → activation. Headroom = 139,000 − 15,400 − 112,000 − 300 − 200 − 2,500 − 1,000 −
40 − 2,300 = 5,260, and the lines sum to 139,000: the ledger closes.

Parallel = non-torch growth after the KV pool (NCCL buffers made at the first collective, cuBLAS
workspaces, graph exec objects), read as driver Δ − torch reserved Δ per window; only the probe on a GPU
sees the split, so a log charges whole windows to their phase's line and says so.

What each line is, by what sglang 0.5.23's reserve term means (arg_groups/memory_hook.py; the line numbers are that
file's), so that a measured line and the constant it is judged against cover the same memory, for every role:

- kv_pool — not a term: the fraction's static part (the target's K/V buffers, a draft's). Charged: configure's
  window less the request pools; a post-capture resize.
- request_pools — not a term: req_to_token and the allocator's index, built out of the SLACK after the pool is
  sized (kv_cache_configurator.py:478-482), so a recommended fraction replays them (profiler.model.kv_sizing).
  Charged: configure's window, sizes read off sglang's objects by the probe.
- activation — `activation_tokens × 1.5` (:296-310): "activation slack" for the largest forward, a chunk (prefill,
  unified) or the running requests × draft tokens (decode). The prefill graph's torch pool is activation memory:
  "torch memory is reused by cuda graph capture" (:385) — the breakable graph's buckets reach the chunk and every
  chunk replays in that pool. Charged: the serving peak above its baseline + the prefill capture's torch
  reserved Δ (probe on a GPU).
- prefill_graph — `len(prefill.bs) × 8` (:383-386; MLA 1.5 GiB, :387-389): "Only non-torch memory is counted"
  (:385), the graph exec objects. Charged: the prefill capture's non-torch growth; a log's whole window.
- decode_graph — `decode.max_bs × 2` (:364-368): the decode graphs' pool and buffers (the verify graph when
  speculative). Charged: the decode capture's torch reserved Δ (its growth beyond a shared prefill pool).
- dp_padding — `max_bs × attn_dp × 3 (+1.5)` (:370-379): padding inside the decode graphs; judged with them.
- prefill_bcg_deepep — +1,024 (:391-397): DeepEP bridge pool + NVL first touch in a breakable prefill capture;
  judged with it.
- parallel — `tp × pp / 8 × 1,024` (:295, :312): "adjustments for large parallel size", communicator buffers.
  Charged: the non-torch growth of every window after the KV pool but the prefill capture's.
- constant — 512 (:308-309): "constant meta data (e.g., from attention backend)". Charged: attention backends,
  eager runner, finalize, disaggregation init (torch part).
- deepep_a2a — +2,048 after the floor (:400-414): DeepEP all-to-all buffers. Charged: the buffer's creation window.
- speculative — none since 0.5.14: the draft's own graphs and buffers. Charged: every draft window but its weights
  and KV pool.
- floor_topup — `max(reserved, 10 GiB)` above 60 GiB (:314-315). Judged: what the other terms' overflow used of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from profiler.core.measurement import Phase, Rank, Snapshot
from profiler.model.heuristic.record import TERM_NAMES

#: Which line each phase window is charged to (a draft model's weights and KV pool are weights and KV;
#: every other draft window is the speculative worker's own overhead).
PHASE_LINE = {
    "weights": "weights",
    "kv_pool": "kv_pool",
    "post_capture_resize": "kv_pool",
    "attention_backends": "constant",
    "eager_runner": "constant",
    "finalize": "constant",
    "disaggregation_init": "constant",
    "prefill_graph": "prefill_graph",
    "decode_graph": "decode_graph",
    "verify_graph": "decode_graph",
    "draft_graph": "speculative",
    "draft_extend_graph": "speculative",
    "deepep_buffer": "deepep_a2a",
    "a2a_buffer": "deepep_a2a",
    "runtime": "activation",
}
#: Windows whose non-torch growth is the `parallel` term's (after the KV pool; the a2a buffers are theirs).
_SPLIT_NONTORCH = frozenset({"constant", "prefill_graph", "decode_graph", "speculative"})
#: ... except where sglang's term IS the non-torch part: the prefill graph's constant counts only non-torch memory
#: and its torch pool is activation memory (memory_hook.py:385) — (torch part's line, non-torch part's line).
_SPLIT_AS = {"prefill_graph": ("activation", "prefill_graph")}
#: Windows that are readings, not allocations.
_MARKERS = frozenset({"init_parallel", "baseline", "ready"})
LINE_ORDER = ("weights", "kv_pool", "request_pools", *TERM_NAMES, "unattributed", "headroom")
#: Closing tolerance when no printed resolution applies (probe: allocator granularity of the driver).
PROBE_RESOLUTION_MIB = 2.0


@dataclass(frozen=True, slots=True)
class Charge:
    """One window's memory on one line. `mib` is what it still holds when it closes; `peak_mib` the most it
    held inside (≥ mib where a transient was released before the window ended)."""

    line: str
    window: str  # the phase (with its role), or "gap before <phase>"
    mib: float
    peak_mib: float
    how: str  # read | implied | estimated
    source: str
    order: int  # position on the rank's timeline
    complete: bool = True  # False: the window had not ended when the record does (a lower bound of its usage)


@dataclass(frozen=True, slots=True)
class LedgerLine:
    name: str
    mib: float
    how: str
    source: str


@dataclass(frozen=True, slots=True)
class Ledger:
    """One rank's books at its worst point. `lines` end with `headroom`; they sum to free_at_start."""

    rank: str
    memory_kind: str
    free_at_start_mib: float | None
    free_at_start_how: str
    lines: tuple[LedgerLine, ...]
    worst_point: str
    resolution_mib: float
    after_worst: tuple[LedgerLine, ...] = ()  # charged by windows that ran after the worst point
    notes: tuple[str, ...] = ()
    opening_mib: float | None = None  # = free_at_start, or the first reading when the start is unknown
    opens_at: str = "free at start"

    def line(self, name: str) -> LedgerLine | None:
        for ln in self.lines:
            if ln.name == name:
                return ln
        return None

    @property
    def headroom_mib(self) -> float | None:
        h = self.line("headroom")
        return None if h is None else h.mib

    @property
    def total_mib(self) -> float:
        return sum(ln.mib for ln in self.lines)

    @property
    def residual_mib(self) -> float | None:
        """opening (free_at_start) − Σ lines: zero, within the resolution, when every MiB was charged once."""
        return None if self.opening_mib is None else self.opening_mib - self.total_mib

    @property
    def closes(self) -> bool | None:
        r = self.residual_mib
        return None if r is None else abs(r) <= self.resolution_mib

    def as_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "memory_kind": self.memory_kind,
            "free_at_start_mib": self.free_at_start_mib,
            "free_at_start_how": self.free_at_start_how,
            "opening_mib": self.opening_mib,
            "opens_at": self.opens_at,
            "lines": [_line_dict(x) for x in self.lines],
            "after_worst": [_line_dict(x) for x in self.after_worst],
            "worst_point": self.worst_point,
            "resolution_mib": self.resolution_mib,
            "residual_mib": self.residual_mib,
            "closes": self.closes,
            "notes": list(self.notes),
        }


def _line_dict(x: LedgerLine) -> dict[str, Any]:
    return {"name": x.name, "mib": x.mib, "how": x.how, "source": x.source}


@dataclass
class Attribution:
    """Every charge of one rank on its timeline, the worst point, and the reading the books start from."""

    memory_kind: str
    free_at_start_mib: float | None
    free_at_start_how: str
    charges: list[Charge] = field(default_factory=list)
    worst_free_mib: float | None = None
    worst_point: str = ""
    worst_order: int = -1  # charges with order < this are held at the worst point …
    worst_inside: int | None = None  # … and this one at its peak (the worst point is inside its window)
    worst_how: str = "read"
    opening_mib: float | None = None  # where the books open: free_at_start, or the first reading there is
    unread_after: list[str] = field(default_factory=list)  # windows after the last reading, without readings
    opens_at: str = ""
    end_of_startup_free_mib: float | None = None
    after_kv_free_mib: float | None = None  # free at the end of the target's KV pool window
    #: KV memory charged after that window and held at the worst point: the draft's pool (allocated right after
    #: the target's, scheduler.py:1097-1110 init_memory_pools) and the post-capture resize, where a
    #: post-capture pool really commits its memory (kv_pool_runtime.py:151 finalize_backing; the configure
    #: window only reserves virtual address space, memory_pool.py:2217 "VA upper bound").
    kv_later_mib: float = 0.0
    resolution_mib: float = PROBE_RESOLUTION_MIB
    notes: list[str] = field(default_factory=list)

    def total(self, line: str, *, peak: bool = False, role: str | None = None) -> float | None:
        """Σ of one line's charges (their peaks with `peak`); None when nothing was charged to it, or when a
        window charged to it never ended (its figure is only a lower bound: no measurement of the term)."""
        cs = [c for c in self.charges if c.line == line and (role is None or c.window.endswith(f"[{role}]"))]
        if not cs or not all(c.complete for c in cs):
            return None
        return sum(c.peak_mib if peak else c.mib for c in cs)

    def charged(self, line: str) -> list[Charge]:
        return [c for c in self.charges if c.line == line]


# ---------------------------------------------------------------------------------------------------
# Readings of one window
# ---------------------------------------------------------------------------------------------------


def _free(s: Snapshot | None) -> float | None:
    return None if s is None else s.free_mib


def _level(s: Snapshot | None, host: bool) -> float | None:
    """The reading the books use: free device memory (GPU), or −RSS on the host (so usage = before − after
    reads the same way: memory taken)."""
    if s is None:
        return None
    if host:
        return None if s.rss_mib is None else -s.rss_mib
    return s.free_mib


def _window_name(p: Phase) -> str:
    return f"{p.name} [{p.role}]"


def _what(p: Phase) -> str:
    """A window as a source names it: an all-to-all buffer with its backend (every backend's buffer is charged
    to the deepep_a2a line, sglang's only all-to-all term, so the source must say whose buffer it was)."""
    backend = p.details.get("backend") if p.name == "a2a_buffer" else None
    return f"{p.name} ({backend})" if backend else p.name


def _line_of(p: Phase) -> str:
    line = PHASE_LINE.get(p.name, "unattributed")
    if p.role == "draft" and line not in ("weights", "kv_pool"):
        return "speculative"
    return line


def _ends(p: Phase, host: bool, cursor: float | None = None) -> tuple[float | None, float | None, str]:
    """(level before, level after, how) of a window. A log prints some sides only: a printed usage fills the
    other (implied); a window whose begin printed nothing starts at the previous reading (`cursor`: sglang
    prints "Memory pool end. avail mem" after "Load weight end. avail mem" and nothing between); a capture
    whose end printed no memory (or that never ended) is charged down to its lowest progress reading."""
    b, a = _level(p.before, host), _level(p.after, host)
    how = "read"
    if p.usage_mib is not None and p.source == "log":
        if b is None and a is not None:
            b, how = a + p.usage_mib, "implied"
        elif a is None and b is not None:
            a, how = b - p.usage_mib, "implied"
    if p.source == "log" and not host:
        if b is None and a is not None and cursor is not None:
            b, how = cursor, "implied"
        rungs = [lp.free_mib for lp in p.ladder if lp.free_mib is not None]
        if a is None and b is not None and rungs:
            a, how = min(rungs), "implied"
    return b, a, how


def _peak_above(p: Phase, host: bool, net: float, nested_nontorch: float = 0.0) -> tuple[float, str]:
    """The most a window held above its start: the lowest free reading inside it (its end, its ladder and
    progress readings), or, on a GPU, torch's peak reserved above its start plus the non-torch memory known to
    coexist with that peak — sglang empties the cache before the capture's end reading
    (get_available_gpu_memory(empty_cache=True), cuda_graph_setup.py), so transient warm-up activations appear
    only in the peak.

    Which non-torch memory coexisted with torch's peak: only what the nested windows made (an all-to-all
    buffer is created once and never freed, so it is there for every later moment of its parent). The rest of
    the window's non-torch growth (graph exec objects, lazily made NCCL buffers) has no time stamp: it may
    have come after the peak's transient was freed, so it is not added to it — the end reading and the readings
    inside still count it where they saw it. (Adding all of it overstated a capture whose warm-up transient was
    freed before its non-torch growth: the worst point came out 1,000 MiB too low.)"""
    best, how = net, "read"
    b = p.before
    rungs = [lp.free_mib for lp in p.ladder if lp.free_mib is not None]
    if b is not None and b.free_mib is not None and rungs and not host:
        best = max(best, b.free_mib - min(rungs))  # tqdm/ladder readings inside the capture (no empty_cache)
    if b is None or p.peak is None:
        return best, how
    if host:
        if b.rss_mib is not None and p.peak.rss_mib is not None:
            best = max(best, p.peak.rss_mib - b.rss_mib)
        return best, how
    if b.free_mib is not None and p.peak.free_mib is not None and b.free_mib - p.peak.free_mib > best:
        best = b.free_mib - p.peak.free_mib
    if b.torch_reserved_mib is not None and p.peak.torch_peak_reserved_mib is not None:
        est = p.peak.torch_peak_reserved_mib - b.torch_reserved_mib + max(0.0, nested_nontorch)
        if est > best + 1e-9:
            best, how = est, "implied"
    return best, how


# ---------------------------------------------------------------------------------------------------
# Attribution
# ---------------------------------------------------------------------------------------------------


def _start(rank: Rank, host: bool) -> tuple[float | None, str, int]:
    """The reading the books start from, how it was read, and the index of the first window after it: the one
    rule of `Rank.free_at_start` (profiler/core/measurement.py) on a GPU; on the host, the RSS the baseline
    window ended at (else the weights window's begin)."""
    idx = {p.name: i for i, p in reversed(list(enumerate(rank.phases))) if p.role == "target"}
    b, w = idx.get("baseline"), idx.get("weights")
    # the first window after the start: a probe measures the baseline before the weights; a log's baseline
    # phase (a printed pre_model_load) is placed after the weights it was printed after (logs/build.py)
    after_base = (b + 1) if b is not None and (w is None or b < w) else (w if w is not None else 0)
    if host:
        if b is not None:
            lv = _level(rank.phases[b].after, host)
            if lv is not None:
                return lv, "read: host RSS when sglang measured pre_model_load_memory", after_base
        if w is not None:
            lv = _level(rank.phases[w].before, host)
            if lv is not None:
                return lv, "read: host RSS when the weights began", w
        return None, "unknown: no reading before the weights", 0
    f = rank.free_at_start()
    if f.mib is None:
        return None, f"unknown: {f.what}", 0
    return f.mib, f"{f.how}: {f.what}", after_base if f.phase == "baseline" else (w if w is not None else 0)


def _opening(rank: Rank, host: bool) -> tuple[float | None, str, int]:
    """Where a record without a start reading can open its books: the first reading of any window."""
    for i, p in enumerate(rank.phases):
        if p.name in _MARKERS or p.details.get("parent"):
            continue
        b, a, how = _ends(p, host)
        if b is not None:
            what = "its printed usage + avail mem after it" if how == "implied" else "its begin reading"
            return b, f"the first reading: {_window_name(p)}, {what}", i
        if a is not None:
            return a, f"the first reading: the end of {_window_name(p)}", i + 1
    return None, "", 0


def _children(rank: Rank, p: Phase) -> list[Phase]:
    """Windows opened inside `p`: by the parent's seq (probe v2), else by the parent's name (probe v1)."""
    seq = p.details.get("seq")
    out = []
    for c in rank.phases:
        if c is p or not c.details.get("parent"):
            continue
        pseq = c.details.get("parent_seq")
        if (pseq is not None and pseq == seq) or (pseq is None and c.details["parent"] == p.name):
            out.append(c)
    return out


class _Walk:
    """The timeline walk: a cursor on the level (free MiB, or −RSS on the host) and the charges so far."""

    def __init__(self, att: Attribution, start: float) -> None:
        self.att = att
        self.cursor = start
        self.window = 0  # index of the window being charged (charges of one window share it)
        self.last = "the start"
        self.floating: list[tuple[str, float, str]] = []  # sized windows without readings, in this gap
        self.skipped: list[str] = []  # windows in this gap that lack a reading (their memory is in the gap)
        self.worst = (start, "start", 0, None, "read")  # (level, where, first window not held, inside, how)

    def charge(
        self, line: str, window: str, mib: float, peak: float, how: str, source: str, complete: bool = True
    ) -> None:
        self.att.charges.append(Charge(line, window, mib, peak, how, source, self.window, complete))

    def gap(self, to_level: float, what: str) -> None:
        """Charge what changed between the last reading and `to_level` that no window covers."""
        g = self.cursor - to_level
        for line, mib, name in self.floating:
            self.charge(line, name, mib, mib, "read", f"{name}: its size as printed (no readings around it)")
            g -= mib
        self.floating.clear()
        if abs(g) > 1e-9:
            why = (f"covers {', '.join(self.skipped)}, whose readings the record lacks" if self.skipped
                   else "no window covers it")  # fmt: skip
            self.charge("unattributed", f"gap before {what}", g, g, "implied",
                        f"changed between {self.last} and {what}; {why}")  # fmt: skip
        self.skipped.clear()
        self.window += 1
        self.cursor = to_level

    def low(self, level: float, where: str, inside: int | None = None, how: str = "read") -> None:
        if level < self.worst[0] - 1e-9:
            held_until = self.window if inside is None else inside + 1
            self.worst = (level, where, held_until, inside, how)


def attribute(rank: Rank, memory_kind: str, resolution_mib: float | None = None) -> Attribution:
    """Charge every window of `rank` once, on its timeline, and find the worst point."""
    host = memory_kind == "host"
    start, start_how, i0 = _start(rank, host)
    res = resolution_mib
    if res is None:
        prints = [p.resolution_mib for p in rank.phases if p.resolution_mib]
        res = max(prints) if prints else PROBE_RESOLUTION_MIB
    att = Attribution(memory_kind, None, start_how, resolution_mib=res)
    if start is None:
        start, where, i0 = _opening(rank, host)
        if start is None:
            att.notes.append("no memory reading at all: the books cannot be opened")
            return att
        att.opens_at = where
        att.notes.append(f"free memory at start unknown (no reading before the weights): the books open at {where}")
    else:
        att.free_at_start_mib = None if host else start
        att.opens_at = "free at start"
    att.opening_mib = None if host else start
    w = _Walk(att, start)
    seen_kv = False
    kv_order: int | None = None
    for p in rank.phases[i0:]:
        if p.details.get("parent"):
            continue  # charged inside its parent's window
        if p.name == "ready":
            lv = _level(p.after, host)
            avail = p.details.get("available_gpu_mem_mib")
            if lv is None and not host and isinstance(avail, int | float):
                lv = float(avail)
            if lv is not None:
                w.gap(lv, "the ready line")
                w.last = "the ready line"
                att.end_of_startup_free_mib = lv
                w.low(lv, "end of startup (the ready line)")
            continue
        if p.name in _MARKERS:
            continue
        if p.name == "runtime":
            # the end of startup is the serving baseline: what sglang allocates after the last hooked window
            # (init_overlap's FutureMap, scheduler.py:1664-1686; the sampling prewarm, 1160-1171) is in it
            if (base := _level(p.before, host)) is not None and not w.skipped:
                att.end_of_startup_free_mib = base
            _charge_runtime(w, rank, p, host)
            continue
        b, a, _ = _ends(p, host, None if w.skipped else w.cursor)
        if b is None or a is None:
            size = _known_size(p)
            if size is not None and _line_of(p) in ("kv_pool", "weights") and not w.skipped:
                w.floating.append((_line_of(p), size, _window_name(p)))
            else:
                w.skipped.append(_window_name(p))
                if p.details.get("in_flight") or p.after is None:
                    att.notes.append(f"{_window_name(p)} has no end reading (not finished when the record ends)")
            if p.name == "kv_pool" and p.role == "target":
                seen_kv = True
            continue
        w.gap(b, _window_name(p))
        if p.name == "kv_pool" and p.role == "target":
            kv_order = w.window
        _charge_window(w, rank, p, host, split=seen_kv and p.source == "probe" and not host)
        if p.name == "kv_pool" and p.role == "target":
            seen_kv = True
            att.after_kv_free_mib = a
        att.end_of_startup_free_mib = a
        w.low(a, f"end of {p.name}")
    if w.floating:
        level = w.cursor - sum(m for _, m, _ in w.floating)
        w.gap(level, "the end of the record")
        w.low(level, "after the last sized window")
    if w.skipped:  # windows after the last reading printed no memory: the worst point may lie after it
        att.unread_after = list(w.skipped)
        att.notes.append(
            f"{', '.join(w.skipped)} ran after the last free-memory reading and printed no memory: the headroom "
            "is at most the figure shown"
        )
    att.worst_free_mib = None if host else w.worst[0]
    att.worst_point = w.worst[1]
    att.worst_order, att.worst_inside, att.worst_how = w.worst[2], w.worst[3], w.worst[4]
    if kv_order is not None:
        att.kv_later_mib = sum(c.mib for c in att.charges if c.line == "kv_pool" and c.order > kv_order
                               and (c.order < att.worst_order or c.order == att.worst_inside))  # fmt: skip
    return att


def own_usage(window_mib: float, nested_mib: float) -> float:
    """A window's own usage: what it took minus what the windows nested inside it took (charged to theirs)."""
    return window_mib - nested_mib


def _charge_window(w: _Walk, rank: Rank, p: Phase, host: bool, *, split: bool) -> None:
    """Charge one window: its nested windows to their lines, the rest to its own (torch part) and, after the
    KV pool on a GPU, its non-torch growth to `parallel`. Moves the cursor to the window's end reading."""
    b, a, how = _ends(p, host, None if w.skipped else w.cursor)
    assert b is not None and a is not None
    idx = w.window
    layer = "host RSS" if host else "driver"
    printed = p.source == "log" and p.usage_mib is not None and how == "read"
    net = p.usage_mib if printed else b - a  # type: ignore[operator]
    kids_net = kids_reserved = kids_nontorch = 0.0
    kids = []
    for c in _children(rank, p):
        cb, ca, chow = _ends(c, host)
        if cb is None or ca is None:
            continue
        cn = cb - ca
        kids.append(_what(c))
        kids_net += cn
        kids_reserved += (c.delta.reserved_mib if c.delta is not None else None) or 0.0
        kids_nontorch += (c.delta.nontorch_mib if c.delta is not None else None) or 0.0
        w.charge(_line_of(c), _window_name(c), cn, cn, chow, f"{_what(c)} window Δ ({layer}), inside {p.name}")
    own = own_usage(net, kids_net)
    peak, peak_how = _peak_above(p, host, b - a, kids_nontorch)
    peak_own = max(own, peak - kids_net)
    how_own = how if peak_how == "read" else peak_how
    minus = f" − {', '.join(kids)} inside it" if kids else ""
    line, name = _line_of(p), _window_name(p)
    reserved = None if host or p.delta is None else p.delta.reserved_mib
    pools = p.details.get("request_pools_mib") if p.name == "kv_pool" and p.source == "probe" else None
    if split and line in _SPLIT_NONTORCH and reserved is not None:
        torch_part = reserved - kids_reserved
        nontorch = own - torch_part
        torch_line, nontorch_line = _SPLIT_AS.get(line, (line, "parallel"))
        why = {"activation": " — the prefill graph's pool, where chunks replay (memory_hook.py:385)",
               "prefill_graph": " — the graph's own memory, all sglang's prefill-graph term counts "
                                "(memory_hook.py:385)"}  # fmt: skip
        # at the window's peak: a driver reading holds both parts; torch's own peak holds none of the window's
        # untimed non-torch growth (`_peak_above`)
        torch_peak = peak_own if peak_how == "implied" else max(torch_part, peak_own - nontorch)
        w.charge(torch_line, name, torch_part, torch_peak, how_own,
                 f"{p.name}: torch reserved Δ{minus}{why.get(torch_line, '')}")  # fmt: skip
        w.charge(nontorch_line, name, nontorch, min(nontorch, 0.0) if peak_how == "implied" else nontorch,
                 "implied", f"{p.name}: non-torch growth (driver Δ − torch reserved Δ){minus}"
                 f"{why.get(nontorch_line, '')}")  # fmt: skip
    elif isinstance(pools, int | float) and not isinstance(pools, bool) and pools > 0:
        # configure builds the request pools out of the slack after sizing the KV pool (kv_cache_configurator.py
        # :478-482): their own line, sized from sglang's objects — a fraction's slack pays for them
        parts = ", ".join(f"{k.removesuffix('_mib').replace('_', ' ')} {p.details[k]:,.1f}"
                          for k in ("req_to_token_mib", "allocator_mib") if isinstance(p.details.get(k), int | float))
        w.charge("request_pools", name, float(pools), float(pools), "read",
                 f"{p.name}: sglang's request pools as allocated ({parts} MiB)")  # fmt: skip
        w.charge(line, name, own - float(pools), peak_own - float(pools), how_own,
                 f"{_what(p)}: window Δ ({layer}) − the request pools")  # fmt: skip
    else:
        src = f"{_what(p)}: " + ("mem usage as printed" if printed else f"window Δ ({layer})") + minus
        if p.source == "log" and _level(p.before, host) is None and not printed:
            src += ", from the previous reading"
        unfinished = p.after is None or bool(p.details.get("in_flight"))
        if p.source == "log" and _level(p.after, host) is None and p.ladder and not printed:
            src += ", to its lowest capture-progress reading" + (" (still capturing when the log ends: a lower bound)"
                                                                  if unfinished
                                                                  else " (its end line prints no memory)")  # fmt: skip
        w.charge(line, name, own, peak_own, how_own, src, complete=not unfinished)
    w.window = idx + 1
    w.cursor = b - net
    w.last = f"the end of {p.name}"
    if printed and abs(w.cursor - a) > 1e-9:  # printed usage vs printed avail: rounding, kept visible
        w.last = f"{p.name}'s printed mem usage"
        w.gap(a, f"the avail mem printed after {p.name}")
        w.last = f"the end of {p.name}"
    if peak > b - a + 1e-9:
        w.low(b - peak, f"peak inside {p.name}", inside=idx, how=peak_how)


def _charge_runtime(w: _Walk, rank: Rank, p: Phase, host: bool) -> None:
    """Serving: the activation charge is the peak above the serving baseline (a transient: the worst point
    of a loaded worker). The baseline is taken before sglang's warm-up request (the probe's first batch)."""
    b = _level(p.before, host)
    if b is None:
        return
    w.gap(b, "serving")
    w.last = "the serving baseline"
    kids = [c for c in _children(rank, p) if _ends(c, host)[0] is not None and _ends(c, host)[1] is not None]
    kids_net = 0.0
    for c in kids:  # windows that ran while serving (a buffer created at the first real batch)
        cb, ca, chow = _ends(c, host)
        kids_net += cb - ca  # type: ignore[operator]
        w.charge(_line_of(c), _window_name(c), cb - ca, cb - ca, chow, f"{c.name} window Δ, while serving")  # type: ignore[operator]
    peak_level = _level(p.peak, host)
    act = 0.0 if peak_level is None else b - peak_level - kids_net
    how, src = "read", ("host RSS peak while serving above its baseline" if host
                        else "lowest free sampled while serving, below the serving baseline")  # fmt: skip
    base_reserved = p.before.torch_reserved_mib if p.before else None
    peak_reserved = p.peak.torch_peak_reserved_mib if p.peak else None
    kids_reserved = sum((c.delta.reserved_mib if c.delta is not None else None) or 0.0 for c in kids)
    by_torch = None if base_reserved is None or peak_reserved is None else peak_reserved - base_reserved - kids_reserved
    if not host and by_torch is not None and by_torch > act:
        act, how = by_torch, "implied"
        src = "torch peak reserved while serving − reserved at the serving baseline (sampling missed the peak)"
    act = max(act, 0.0)
    w.charge("activation", _window_name(p), act, act, how, src)
    w.window += 1
    w.low(b - act - kids_net, "serving peak", how=how)


def _known_size(p: Phase) -> float | None:
    d = p.details
    if p.name == "kv_pool":
        kv = (d.get("k_mib") or 0) + (d.get("v_mib") or 0) or d.get("kv_mib")
        return float(kv) if kv else None
    return p.usage_mib


# ---------------------------------------------------------------------------------------------------
# The books at the worst point
# ---------------------------------------------------------------------------------------------------


def ledger(rank: Rank, memory_kind: str, resolution_mib: float | None = None) -> Ledger:
    """The rank's ledger at its worst point (see the module docstring)."""
    att = attribute(rank, memory_kind, resolution_mib)
    return ledger_of(att, rank.label)


def ledger_of(att: Attribution, rank_label: str = "") -> Ledger:
    """The books at the worst point: windows that closed before it at what they held, the window it lies
    inside at its peak, later windows listed apart (`after_worst`)."""
    held: dict[str, list[Charge]] = {}
    later: dict[str, list[Charge]] = {}
    for c in att.charges:
        if att.worst_inside is not None and c.order == att.worst_inside:
            held.setdefault(c.line, []).append(
                Charge(c.line, c.window, c.peak_mib, c.peak_mib, c.how, c.source + " (at its peak)", c.order)
            )
        elif c.order < att.worst_order:
            held.setdefault(c.line, []).append(c)
        else:
            later.setdefault(c.line, []).append(c)
    lines = [_merge(name, held[name]) for name in LINE_ORDER if name in held]
    if att.worst_free_mib is not None:
        where = f"free at the worst point: {att.worst_point}"
        if att.unread_after:
            where = f"free at the last reading ({att.worst_point}); {', '.join(att.unread_after)} printed no memory"
        lines.append(LedgerLine("headroom", att.worst_free_mib, att.worst_how, where))
    notes = list(att.notes)
    if att.memory_kind == "host":
        notes.append("host RSS of a CPU run: lines are RSS growth; there is no free device memory to close against")
    return Ledger(
        rank=rank_label,
        memory_kind=att.memory_kind,
        free_at_start_mib=att.free_at_start_mib,
        free_at_start_how=att.free_at_start_how,
        lines=tuple(lines),
        worst_point=att.worst_point,
        resolution_mib=att.resolution_mib,
        after_worst=tuple(_merge(name, later[name]) for name in LINE_ORDER if name in later),
        notes=tuple(notes),
        opening_mib=att.opening_mib,
        opens_at=att.opens_at,
    )


def _merge(name: str, cs: list[Charge]) -> LedgerLine:
    total = sum(c.mib for c in cs)
    hows = {c.how for c in cs}
    how = "read" if hows == {"read"} else ("estimated" if "estimated" in hows else "implied")
    if len(cs) == 1:
        src = cs[0].source
    else:
        src = "; ".join(f"{c.window} {c.mib:,.0f}" for c in cs)
    return LedgerLine(name, total, how, src)
