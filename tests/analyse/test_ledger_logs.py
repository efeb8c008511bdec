"""The ledger on every bundled real log: the books close (every MiB between the readings a log prints charged
once), or, where a log prints no reading before the weights, they open at its first reading and say so."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler.analyse.compare import compare, reservation_for
from profiler.logs import parse_log
from tests.conftest import LOG_FIXTURES

LOGS = sorted(LOG_FIXTURES.glob("*.log"))


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_every_log_ledger_closes_or_says_why_not(path: Path) -> None:
    for m in parse_log(path):
        c = compare(m, reservation_for(m)[0])
        if c.ledger is None:  # only a log that prints no free-memory reading of a window has no books
            readings = [  # (the ready line's available_gpu_mem alone is a marker, not a window: sglang-29575)
                s for r in m.ranks for p in r.phases if p.name != "ready"
                for s in (p.before, p.after) if s and s.free_mib is not None
            ]  # fmt: skip
            assert readings == [] and not c.ledgers, m.id
        for L in c.ledgers:
            assert L.opening_mib is not None, (m.id, L.rank, L.notes)
            assert L.closes, (m.id, L.rank, L.residual_mib)
            assert L.lines[-1].name == "headroom"
            if L.free_at_start_mib is None:
                assert L.opens_at.startswith("the first reading") and any("free memory at start unknown" in n
                                                                          for n in L.notes)  # fmt: skip


def test_a_log_ledger_by_hand() -> None:
    """repo_unknown_llama31-8b_24gb_docker.log as printed (GiB × 1024 = MiB):
    'Load weight end … avail mem=7.37 GB, mem usage=15.02 GB' → free at start 7.37 + 15.02 = 22.39 → 22,927.36
    (implied); weights 15.02 → 15,380.48; 'Memory pool end. avail mem=1.46' → KV pool window 7.37 − 1.46 = 5.91
    → 6,051.84; 'Capture cuda graph begin … avail mem=0.93' → 1.46 − 0.93 = 0.53 → 542.72 no window covers
    (unattributed); 'Capture cuda graph end … mem usage=0.11 GB. avail mem=0.83 GB' → decode graph 112.64, and the
    printed usage and avail disagree by rounding: 0.93 − 0.11 = 0.82 ≠ 0.83 → −10.24 unattributed; headroom 0.83
    → 849.92. 15,380.48 + 6,051.84 + 112.64 + 532.48 + 849.92 = 22,927.36."""
    m = parse_log(LOG_FIXTURES / "repo_unknown_llama31-8b_24gb_docker.log")[0]
    L = compare(m, reservation_for(m)[0]).ledger
    lines = {x.name: round(x.mib, 2) for x in L.lines}
    assert L.free_at_start_mib == pytest.approx(22927.36) and L.free_at_start_how.startswith("implied")
    assert lines == {"weights": 15380.48, "kv_pool": 6051.84, "decode_graph": 112.64, "unattributed": 532.48,
                     "headroom": 849.92}  # fmt: skip
    assert L.closes and abs(L.residual_mib) < 1e-6


def test_a_capture_whose_end_prints_no_memory_is_charged_to_its_lowest_rung() -> None:
    """STARTUP (tests/logs/test_logs_build.py) with the capture's end line cut to 'Time elapsed: 18.07 s.' (the
    0.4.x spelling: no avail mem): the graph's memory is its begin 0.93 GiB − the LOWEST ladder reading 0.86 GiB
    = 0.07 × 1024 = 71.68 MiB, and the startup headroom is that rung, 0.86 × 1024 = 880.64 MiB. The highest rung
    (bs=8, 0.93 GiB, read before the first capture) would say 0 MiB and 952.32 MiB."""
    from tests.logs.test_logs_build import STARTUP

    cut = "[2025-07-14 05:49:02] Capture cuda graph end. Time elapsed: 18.07 s."
    lines = [cut if "Capture cuda graph end" in x else x for x in STARTUP if "max_total_num_tokens" not in x]
    (m,) = parse_log(lines, name="s.log")
    c = compare(m, reservation_for(m)[0])
    g = next(t for t in c.terms if t.term == "decode_graph")
    assert g.measured_mib == pytest.approx(71.68) and "lowest capture-progress reading" in g.observed_from
    assert c.headroom_startup_mib == pytest.approx(880.64)
    lines_by_name = {x.name: x for x in c.ledger.lines}
    assert lines_by_name["decode_graph"].mib == pytest.approx(71.68) and c.ledger.closes
