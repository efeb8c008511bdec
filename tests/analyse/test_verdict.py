"""profiler.analyse.verdict: the run verdict from a failure, the startup state, and headroom against runtime need."""

from __future__ import annotations

import pytest

from profiler.analyse.verdict import TIGHT_MIB, VERDICTS, headroom_verdict, run_verdict, runtime_need
from profiler.core.measurement import Failure, Measurement, Phase, Rank, Snapshot

GIB = 1024.0


def _m(**kw: object) -> Measurement:
    m = Measurement(id="x.log#0", source="log")
    for k, v in kw.items():
        setattr(m, k, v)
    return m


def test_vocabulary() -> None:
    assert VERDICTS == ("oom_during_capture", "oom_startup", "oom_runtime", "failed", "incomplete", "short", "tight",
                        "ok", "wasteful", "unknown")  # fmt: skip


def test_oom_reason_carries_the_messages_numbers() -> None:
    # repo_unknown_glm52-fp8_8xH200_hisparse_a1.log: tried 1.50 GiB, 488.19 MiB free of 139.80 GiB,
    # 139.20 GiB in use of which 134.73 GiB torch-allocated and 297.40 MiB reserved-unallocated:
    # outside torch 139.20 − 134.73 − 0.2904 = 4.18 GiB
    f = Failure(kind="oom_during_capture", phase="decode_graph", tried_alloc_mib=1.5 * GIB, free_mib=488.19,
                total_capacity_mib=139.80 * GIB, in_use_mib=139.20 * GIB, allocated_by_torch_mib=134.73 * GIB,
                reserved_unallocated_mib=297.40)  # fmt: skip
    v, why = run_verdict(_m(failure=f), None, None, None)
    assert v == "oom_during_capture"
    assert why == ("CUDA out of memory in decode_graph: tried to allocate 1.50 GiB, 488 MiB free of 139.80 GiB, "
                   "134.73 GiB allocated by torch, 4.18 GiB outside torch (NCCL, DeepEP, context)")  # fmt: skip


def test_startup_states_come_before_headroom() -> None:
    assert run_verdict(_m(startup="no_kv", startup_seen="every rank profiled…"), 9e4, 1.0, 9e4)[0] == "oom_startup"
    assert run_verdict(_m(startup="aborted", startup_seen="capture aborted"), 9e4, 1.0, 9e4) == (
        "failed", "capture aborted")  # fmt: skip
    v, why = run_verdict(_m(startup="incomplete", startup_seen="decode_graph capture in progress"), 40 * GIB, 1, None)
    assert v == "incomplete"
    assert why == ("decode_graph capture in progress; 40.00 GiB free at the last reading: no verdict on headroom "
                   "before startup ends")  # fmt: skip


def test_tight_below_one_gib() -> None:
    assert TIGHT_MIB == 1024.0
    assert run_verdict(_m(startup="finished"), 1023.0, 100.0, 1023.0, (12288.0, "x"))[0] == "tight"
    assert run_verdict(_m(startup="finished"), 1025.0, 100.0, 1025.0, None)[0] == "ok"


def test_wasteful_only_against_runtime_need() -> None:
    need = (12288.0, "the 0.5.12 rules' activation reserve")  # chunked_prefill 8192 × 1.5 MiB
    # repo_unknown_dsv4-flash_8xH20_fixture.log run 1 (mfs 0.60): 34.24 GiB free > 2 × 12 GiB
    v, why = run_verdict(_m(startup="finished"), 34.24 * GIB, 2.02 * GIB, 34.24 * GIB, need)
    assert v == "wasteful"
    assert why == ("34.24 GiB free at the worst point vs 12.00 GiB runtime need (the 0.5.12 rules' activation "
                   "reserve): more than 2× left unused, 2.02 GiB used after the KV pool")  # fmt: skip
    # run 0 (mfs 0.88): 8.11 GiB free — less than the need: ok (the old rule called it wasteful: 8.11 > 2 × 2.01)
    assert run_verdict(_m(startup="finished"), 8.11 * GIB, 2.01 * GIB, 8.11 * GIB, need)[0] == "ok"
    # exactly 2× the need is not more than 2×
    assert run_verdict(_m(startup="finished"), 24576.0, 1.0, 24576.0, need)[0] == "ok"
    assert run_verdict(_m(startup="finished"), 24577.0, 1.0, 24577.0, need)[0] == "wasteful"
    # small GPUs: 3 GiB free vs a 1 GiB need is not worth a verdict (spare must exceed 2 GiB)
    assert run_verdict(_m(startup="finished"), 3000.0, 1.0, 3000.0, (1024.0, "x"))[0] == "ok"


def test_unknown_need_is_never_wasteful() -> None:
    v, why = run_verdict(_m(startup="finished"), 70 * GIB, 0.5 * GIB, 70 * GIB, None)
    assert v == "ok" and "runtime need unknown" in why


def test_serving_evidence_in_the_reason() -> None:
    m = _m(startup="finished", serving={"batches": 3, "peak_running_req": 64, "peak_token_usage": 0.97,
                                        "retractions": 2})  # fmt: skip
    v, why = run_verdict(m, 40 * GIB, 1.0, 40 * GIB, (12288.0, "x"))
    assert v == "wasteful"
    assert why.endswith("; serving: peak 64 running requests, peak token usage 0.97, 2 KV retractions (KV cache "
                        "pool full)")  # fmt: skip


def test_measured_runtime_peak_is_the_need() -> None:
    r = Rank(phases=[Phase(name="runtime", source="probe", before=Snapshot(free_mib=9000.0),
                           after=Snapshot(free_mib=5000.0))])  # fmt: skip
    m = Measurement(id="p", source="probe", ranks=[r])
    assert runtime_need(m, None) == (4000.0, "measured runtime peak (probe)")
    assert runtime_need(Measurement(id="q", source="probe"), None) is None


def test_host_runs_are_unknown() -> None:
    assert run_verdict(_m(startup="finished", memory_kind="host"), 9e4, 1.0, 9e4)[0] == "unknown"


# ------------------------------------------------------------------ what a judged run left unused (compare.spare)


def _fig(sp):
    return sp.kv_unused_mib, sp.wasted_kv_tokens, sp.recommended_mfs


def test_spare_by_hand() -> None:
    """A startup-only source still owes the activation reserve (pending 3,072); a served one holds its peak already
    (pending 0). Without the worker's own sizes (a log) the fraction is 1 − (used + pending + margin) / free at start
    and the basis says the request pools were not replayed.
    worst 10,000, pending 3,072, margin 1,024 → unused 5,904 MiB; at 131,072 B/token (8 tokens a MiB) 47,232
    tokens; used 2,000 of 100,000 free at start → floor((1 − 6,096/100,000) × 1000)/1000 = floor(939.04) = 0.939.
    Served (pending 0): 8,976 MiB → 71,808 tokens; floor((1 − 3,024/100,000) × 1000)/1000 = 0.969."""
    from profiler.analyse.compare import spare

    s = spare("ok", 10000.0, 2000.0, 100000.0, 3072.0, 1024.0, 131072.0, why_not_replayed="a log")
    assert _fig(s) == (5904.0, 47232, 0.939)
    assert s.basis == ("1 − (used 2,000 + pending 3,072 + margin 1,024) / free at start 100,000 — the request pools' "
                       "growth with the fraction not replayed (a log)")  # fmt: skip
    assert _fig(spare("wasteful", 10000.0, 2000.0, 100000.0, 0.0, 1024.0, 131072.0)) == (8976.0, 71808, 0.969)
    # below the need and the margin: nothing unused, a lower fraction recommended (1 − 6,096/8,000 = 0.238)
    assert _fig(spare("tight", 900.0, 2000.0, 8000.0, 3072.0, 1024.0, 131072.0)) == (0.0, 0, 0.238)
    # no fraction leaves 6,096 MiB on a 4,000 MiB start: no recommendation rather than a negative one
    assert _fig(spare("tight", 0.0, 2000.0, 4000.0, 3072.0, 1024.0, 131072.0)) == (0.0, 0, None)
    # bytes per token unknown: MiB but no tokens
    assert _fig(spare("ok", 10000.0, 2000.0, 100000.0, 3072.0, 1024.0, None)) == (5904.0, None, 0.939)


def test_spare_only_for_judged_runs() -> None:
    """A failed, cut, OOM or unread startup, or an unknown runtime need: no unused KV and no recommendation —
    the free memory of an aborted capture is not KV a fleet could have had."""
    from profiler.analyse.compare import JUDGED_VERDICTS, spare

    assert JUDGED_VERDICTS == ("short", "tight", "ok", "wasteful")
    for v in ("failed", "incomplete", "oom_during_capture", "oom_startup", "oom_runtime", "unknown"):
        got = spare(v, 44503.0, 1833.0, 290365.0, 6144.0, 1024.0, 70271.0)
        assert _fig(got) == (None, None, None) and got.basis == "none: not judged", v
    got = spare("ok", 10000.0, 2000.0, 100000.0, None, 1024.0, 131072.0)
    assert _fig(got) == (None, None, None) and got.basis == "none: what runtime still needs is unknown"


def test_short_only_when_the_worst_point_is_below_zero() -> None:
    """`short` is the worker as a whole out of room — an estimated headroom below zero (a derived variant); 0 MiB
    free is `tight`, −0.5 is `short`. A term over its constant is not this (the floor may cover it)."""
    assert headroom_verdict(0.0, 5000.0, None)[0] == "tight"
    v, why = headroom_verdict(-0.5, 5000.0, None)
    assert v == "short" and why.startswith("the worker needs 0 MiB more")
    assert headroom_verdict(-804.0, 5000.0, None)[1].startswith("the worker needs 804 MiB more than its fraction")


@pytest.mark.parametrize(
    ("worst", "need", "verdict"),
    [
        # wasteful needs worst > 2 × need AND worst − need > 2,048 (WASTE_MIN_SPARE_MIB): both sides of each
        (3048.0, 1000.0, "ok"),  # spare 2,048 is not more than 2 GiB
        (3048.5, 1000.0, "wasteful"),  # 2,048.5 > 2,048 (a 3 GiB minimum would call this ok)
        (5000.0, 2500.0, "ok"),  # exactly 2 × need
        (5000.5, 2500.0, "wasteful"),
        (1023.9, 100.0, "tight"),  # TIGHT_MIB 1,024
        (1024.0, 100.0, "ok"),
    ],
)
def test_verdict_boundaries_both_sides(worst, need, verdict):
    from profiler.analyse.verdict import headroom_verdict

    assert headroom_verdict(worst, None, (need, "measured"))[0] == verdict
