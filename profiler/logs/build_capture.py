"""LogBuilder, capture ladders: tqdm "Capturing batches" points and graph-address lines, on the capture phase
they belong to (printed by TP rank 0, untagged)."""

from __future__ import annotations

from profiler.core.measurement import LadderPoint, Phase
from profiler.logs.build_base import (
    RESOLUTION_MIB,
    BuilderState,
    _mib,
)
from profiler.logs.patterns import GRAPH_PHASES, Event
from profiler.logs.run import _RankState, _Run


class CaptureLadders(BuilderState):
    """tqdm capture ladders and graph registration."""

    def _registered(self, lineno: int, label: str | None, ev: Event) -> None:
        """A "Registering N cuda graph addresses" line: the capture context closed with N graph buffers (0: none)."""
        rs = self._run.ranks.get(label or "") if label is not None else None
        if rs is None:
            rs = self._run.ranks.get(self._last_label or "")
        if rs is None:
            return
        self._run.touch(lineno)
        open_graphs = [p for n, p in rs.open.items() if n in GRAPH_PHASES]
        ph = max(open_graphs, key=lambda p: p.line or 0) if open_graphs else None
        if ph is None:
            graphs = [p for p in rs.rank.phases if p.name in GRAPH_PHASES]
            ph = graphs[-1] if graphs else None
        if ph is not None:
            ph.details["graph_addresses"] = (ev.details or {}).get("graph_addresses")
            ph.details["graph_addresses_line"] = lineno

    def _ladder(self, lineno: int, ev: Event, rs: _RankState | None = None) -> None:
        """A tqdm "Capturing batches (bs=… avail_mem=… GB)" point: printed by TP rank 0, untagged."""
        run = self._run
        if rs is None:
            rs = self._ladder_rank(run, ev.phase or "decode_graph")
        run.touch(lineno)
        ph = self._graph_in_flight(rs, ev.phase or "decode_graph")
        if ph is None:
            ph = Phase(name=ev.phase or "decode_graph", line=lineno)
            rs.rank.phases.append(ph)
            rs.open[ph.name] = ph
            run.m.notes.append(f"line {lineno}: tqdm capture progress without a capture-begin line; "
                               f"phase {ph.name} opened on rank '{rs.rank.label}'")  # fmt: skip
        d = ev.details or {}
        bs, n = d.get("bs"), d.get("n")
        free = _mib(ev.free)
        if free is not None:  # the lowest tqdm reading: the worst point seen when the capture never ended
            low = ph.details.get("min_ladder_avail_mib")
            if low is None or free < low:
                ph.details["min_ladder_avail_mib"] = free
        if ph.ladder:
            last = ph.ladder[-1]
            if bs is not None and last.bs == bs:
                rs.last_n = n
                if n is not None:
                    ph.details["progress"] = [n, d.get("total")]
                return
            if bs is None and last.free_mib == free and (n is None or rs.last_n is None or n == rs.last_n + 1):
                rs.last_n = n
                if n is not None:
                    ph.details["progress"] = [n, d.get("total")]
                return
        rs.last_n = n
        if n is not None:
            ph.details["progress"] = [n, d.get("total")]
        used = None
        if ph.before is not None and ph.before.free_mib is not None and free is not None:
            used = ph.before.free_mib - free
        ph.ladder.append(LadderPoint(bs=bs, free_mib=free, used_mib=used))  # bs None: the bar did not print it
        ph.resolution_mib = RESOLUTION_MIB

    def _ladder_rank(self, run: _Run, phase: str) -> _RankState:
        want_prefill = phase == "prefill_graph"
        best: tuple[tuple[int, int], _RankState] | None = None
        for rs in run.ranks.values():
            for name, ph in rs.open.items():
                if name in GRAPH_PHASES and (name == "prefill_graph") == want_prefill:
                    score = (1 if rs.rank.tp in (0, None) else 0, ph.line or 0)
                    if best is None or score > best[0]:
                        best = (score, rs)
        if best is not None:
            return best[1]
        for rs in run.ranks.values():
            if rs.rank.tp in (0, None):
                return rs
        label = self._last_label or ""
        rs = run.ranks.get(label)
        if rs is None:
            rs = run.ranks[label] = _RankState(label)
            if not label:  # a bar before any rank logged (an excerpt that starts mid-capture): TP0's, seen later
                self._orphans.append((run, rs))
        return rs

    @staticmethod
    def _graph_in_flight(rs: _RankState, phase: str) -> Phase | None:
        want_prefill = phase == "prefill_graph"
        cands = [p for n, p in rs.open.items() if n in GRAPH_PHASES and (n == "prefill_graph") == want_prefill]
        return max(cands, key=lambda p: p.line or 0) if cands else None


def _adopt_orphan(run: _Run, rs: _RankState) -> None:
    """tqdm bars printed before any rank logged went to an untagged rank; once the run shows its ranks, they are
    TP rank 0's (sglang draws the bar on TP0 only): each capture joins TP0's phase of the same name that begins
    or ends after it (sglang-pr12978: the 36/36 bar, then TP0's 'Capture cuda graph end')."""
    if run.ranks.get("") is not rs or rs.fs is not None or not rs.rank.phases:
        return
    if any(p.name not in GRAPH_PHASES for p in rs.rank.phases):
        return
    owners = [r for lbl, r in run.ranks.items() if lbl and r.rank.tp in (0, None)]
    if not owners:
        return
    owner = min(owners, key=lambda r: (r.rank.pp or 0, r.rank.dp or 0, r.rank.ep or 0, r.rank.label))
    for ph in rs.rank.phases:
        later = [p for p in owner.rank.phases if p.name == ph.name and (p.line or 0) >= (ph.line or 0) and not p.ladder]
        if later:
            mine = later[0]
            mine.ladder[:0] = ph.ladder
            for k, v in ph.details.items():
                mine.details.setdefault(k, v)
            if mine.before is None and mine.after is not None:
                mine.line = ph.line
            mine.resolution_mib = mine.resolution_mib or ph.resolution_mib
        else:
            owner.rank.phases.append(ph)
            owner.rank.phases.sort(key=lambda p: p.line or 0)
    del run.ranks[""]
    run.m.notes.append(f"tqdm capture progress before any rank tag (from line {rs.rank.phases[0].line}) given to "
                       f"rank '{owner.rank.label}' (sglang draws the bar on TP rank 0)")  # fmt: skip
