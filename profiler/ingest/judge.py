"""How `memfrac ingest` judges one logged run: the reservation of its release (or of every candidate release and
GPU the log is consistent with), the run's own fraction, and the verdict — decided once, by
`profiler.analyse.compare.compare`, with what the log supports (`LogJudging`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: worker processes start before the parser and comparison are loaded
    from profiler.analyse.compare import Comparison
    from profiler.core.measurement import Measurement
    from profiler.logs.reserve import LogReservation
    from profiler.results.store import RunContext


@dataclass(frozen=True, slots=True)
class Judged:
    """What ingest adds to a comparison: the rules chosen (and candidates), the need, and the notes."""

    reservation: LogReservation
    need: tuple[float, str] | None
    notes: list[str]


def judge(m: Measurement, *, margin_mib: float = 1024.0) -> tuple[Comparison, Judged]:
    """One logged run against the reservation of its release (or its candidates), with an honest verdict.

    The fraction reported is the run's own (printed, implied, or computed with the exact rules), never the
    heuristic's fallback; the wasteful yardstick is the largest activation reserve over the candidates. The
    verdict is compare's, decided once with these (nothing here patches it afterwards)."""
    from profiler.analyse.compare import LogJudging, compare
    from profiler.analyse.verdict import runtime_need
    from profiler.logs.reserve import log_reservation

    lr = log_reservation(m)
    m.mfs, m.mfs_origin, m.mfs_how = lr.mfs, lr.mfs_origin, lr.mfs_how
    notes = [f"rules: {lr.rules} — {lr.rules_why}", *lr.notes]
    need = runtime_need(m, None) or lr.activation_mib()
    c = compare(m, lr.headline, margin_mib=margin_mib, judging=LogJudging(m.mfs, lr.rules, need, lr.rule_sets))
    return c, Judged(lr, need, notes)


def log_context(m: Measurement, c: Comparison) -> RunContext:
    """What a log says about the scenario (resolved args), for the store's grouping and calibration columns."""
    from profiler.results.store import RunContext

    a = m.args

    def num(*keys: str) -> int | None:
        for k in keys:
            v = a.get(k)
            if isinstance(v, int | float) and not isinstance(v, bool):
                return int(v)
        return None

    graph = a.get("cuda_graph_config")
    dec = graph.get("decode", {}) if isinstance(graph, dict) else {}
    max_bs = num("cuda_graph_max_bs_decode", "cuda_graph_max_bs")
    if max_bs is None and isinstance(dec, dict) and isinstance(dec.get("max_bs"), int):
        max_bs = dec["max_bs"]
    a2a = a.get("moe_a2a_backend") or ("deepep" if a.get("enable_deepep_moe") else None)
    if max_bs is None and isinstance(a.get("cuda_graph_max_bs"), int):
        max_bs = a["cuda_graph_max_bs"]
    return RunContext(
        group=m.id,
        moe_a2a_backend=str(a2a) if a2a else None,
        decode_max_bs=max_bs,
        chunked_prefill_size=num("chunked_prefill_size"),
        deepep_tokens=None,
        hidden_size=None,  # a log names the model, not its shapes
        num_experts=None,
    )
