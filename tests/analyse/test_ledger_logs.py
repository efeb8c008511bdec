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
