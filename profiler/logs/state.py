"""How far a log shows a server's startup, before any verdict: finished, incomplete, aborted, or no KV budget.

Why: a verdict on headroom is only meaningful once startup has finished — the graphs captured, the last
phase's free memory read. Excerpts are cut anywhere (mid-capture, right after the KV pool); a capture can
abort without a readable exception; sglang can profile a negative KV budget. Each of these has its own
state, and the verdict (`profiler.analyse.verdict`) reads it first.

- finished: a ready line (`max_total_num_tokens=… available_gpu_mem=…`), "The server is fired up and ready
  to roll!", serving traffic, or every capture that began has ended (then the ready line is simply not in
  the text, and the reason says so).
- aborted: a capture context closed having registered no graph ("Registering 0 cuda graph addresses", the
  custom all-reduce's exit message) and the capture never ended.
- no_kv: sglang profiled a KV budget of zero tokens or fewer ("max_total_tokens=… is larger than the profiled
  value -561981": model_runner.init_memory_pool, which then raises "Not enough memory").
- incomplete: anything else — the text stops before startup ends; `seen` says where.
"""

from __future__ import annotations

from profiler.core.measurement import Measurement, Phase, Rank
from profiler.core.units import MIB_PER_GIB
from profiler.logs.failures import says_no_kv
from profiler.logs.patterns import GRAPH_PHASES

_GIB = MIB_PER_GIB  # profiler.core.units


def startup_state(m: Measurement, ready_line: int | None, fired_line: int | None = None) -> tuple[str, str]:
    """(state, what was seen) for one run of a log."""
    ranks = [r for r in m.ranks if r.phases]
    no_kv = [(r, p) for r in ranks for p in r.phases_named("kv_pool") if _budget_not_positive(p)]
    if no_kv:
        r, p = no_kv[0]
        pools = sum(1 for x in ranks if x.phases_named("kv_pool"))
        who = "every rank" if len(no_kv) == pools and pools > 1 else f"rank '{r.label}'" if r.label else "the worker"
        tokens = p.details.get("profiled_tokens")
        what = f"{tokens} tokens" if tokens is not None else f"{(p.details.get('budget_mib') or 0) / _GIB:.2f} GiB"
        return "no_kv", f"{who} profiled a KV budget of {what} (line {p.line}): nothing left for the KV cache"
    refused = [r for r in m.ranks if r.failure is not None and says_no_kv(r.failure.message)]
    if refused:
        r, f = refused[0], refused[0].failure
        return "no_kv", (f"{_who(r)} stopped at line {f.line}: {f.message.strip()[:160]} (sglang found no memory "  # type: ignore[union-attr]
                         "left for the KV cache)")  # fmt: skip
    aborted = [(r, p) for r in ranks for p in r.phases if _aborted(p)]
    if aborted:
        r, p = aborted[0]
        prog = p.details.get("progress")
        at = f" at {prog[0]}/{prog[1]}" if prog and prog[1] else ""
        return "aborted", (
            f"{p.name} capture on {_who(r)} aborted{at}: 'Registering 0 cuda graph addresses' at line "
            f"{p.details.get('graph_addresses_line')} and no capture end (the exception is not in the text)"
        )
    if ready_line is not None:
        return "finished", f"startup finished (ready line at line {ready_line})"
    if fired_line is not None:
        return "finished", f"startup finished ('The server is fired up' at line {fired_line})"
    if m.serving.get("batches"):
        first = m.serving.get("first_line")
        return "finished", f"serving traffic from line {first} (the ready line is not in the text)"
    graphs = [(r, p) for r in ranks for p in r.phases if p.name in GRAPH_PHASES]
    open_graphs = [(r, p) for r, p in graphs if p.after is None and not _all_captured(p)]
    if graphs and not open_graphs:
        r, p = max(graphs, key=lambda rp: rp[1].line or 0)
        if p.after is None:
            n, total = p.details["progress"]
            return "finished", (f"{p.name} capture on {_who(r)} reached {n}/{total} sizes (tqdm); its end line and "
                                "the ready line are not in the text")  # fmt: skip
        return "finished", (
            f"startup seen through the end of {p.name} capture (line {p.line}); the ready line is not in the text"
        )
    if open_graphs:  # the rank whose lines show the most of it (TP0 prints the bs list and the tqdm bar)
        r, p = max(open_graphs, key=lambda rp: (bool(rp[1].ladder or rp[1].details.get("progress")), rp[1].line or 0))
        return "incomplete", f"{p.name} capture in progress on {_who(r)} when the text ends ({_where(p)})"
    last = max(((r, p) for r in ranks for p in r.phases), key=lambda rp: rp[1].line or 0, default=None)
    if last is None:
        return "incomplete", "no startup phase in the text"
    r, p = last
    return "incomplete", f"the text ends at line {m.last_line}, after {p.name} on {_who(r)}: startup not finished"


def profiled_kv_tokens(m: Measurement) -> int | None:
    """The KV budget sglang profiled, in tokens, as "max_total_tokens=N is larger than the profiled value -M"
    quotes it (read; every rank prints it, the lowest is kept), else None."""
    seen = [t for r in m.ranks for p in r.phases_named("kv_pool")
            if isinstance(t := p.details.get("profiled_tokens"), int) and not isinstance(t, bool)]  # fmt: skip
    return min(seen) if seen else None


def _all_captured(p: Phase) -> bool:
    """The tqdm bar reached total: every batch size was captured (only the end line is missing)."""
    prog = p.details.get("progress")
    return bool(prog and prog[1] and prog[0] == prog[1])


def _budget_not_positive(p: Phase) -> bool:
    d = p.details
    tokens = d.get("profiled_tokens")
    if isinstance(tokens, int) and tokens <= 0:
        return True
    budget = d.get("budget_mib")
    return isinstance(budget, int | float) and budget <= 0


def _aborted(p: Phase) -> bool:
    return p.name in GRAPH_PHASES and p.after is None and p.details.get("graph_addresses") == 0


def _who(r: Rank) -> str:
    return f"rank '{r.label}'" if r.label else "the worker"


def _where(p: Phase) -> str:
    bits = []
    if p.ladder:
        lp = p.ladder[-1]
        if lp.bs is not None:
            bits.append(f"last tqdm frame bs {lp.bs}")
        if lp.free_mib is not None:
            bits.append(f"{lp.free_mib / _GIB:.2f} GiB free")
    prog = p.details.get("progress")
    if prog and prog[1]:
        bits.append(f"{prog[0]}/{prog[1]} sizes captured")
    elif p.details.get("bs_list"):
        bits.append(f"{len(p.details['bs_list'])} sizes to capture")
    if p.before is not None and p.before.free_mib is not None and not p.ladder:
        bits.append(f"{p.before.free_mib / _GIB:.2f} GiB free at its begin")
    bits.append(f"began at line {p.line}")
    return ", ".join(bits)
