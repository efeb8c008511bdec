"""`memfrac selfcheck` without a GPU: the no-device exit, the judges of every check on recorded and hand-made readings
(each check has a test that it fires and one that it does not), the worker life on the simulated device, the JSON
schema, the report, the libcudart finder."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import types
from pathlib import Path

import pytest

from profiler.core.errors import MemfracError
from profiler.core.measurement import Snapshot
from profiler.measure.probe import plugin
from profiler.measure.probe.reader import read_probe_dir
from profiler.selfcheck import checks as sc
from profiler.selfcheck import cuda as scc
from profiler.selfcheck import life
from profiler.selfcheck import run as scr
from tests.fakes import sim_worker


def _no_cuda(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


# --- no CUDA device ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("json_out", [False, True])
def test_no_cuda_returns_2_with_one_line(monkeypatch, capsys, json_out):
    _no_cuda(monkeypatch)
    rc = scr.run_selfcheck(json_out=json_out)
    out, err = capsys.readouterr()
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert "no CUDA device visible" in lines[0] and lines[0].startswith("memfrac selfcheck:")
    if not json_out:
        assert out == ""
        return
    doc = json.loads(out)  # --json always prints a document; a refusal says why in `refused`
    assert doc["schema"] == sc.SCHEMA and doc["passed"] is False and doc["checks"] == [] and doc["ledger"] is None
    assert doc["refused"] == lines[0].removeprefix("memfrac selfcheck: ")
    assert doc["device"]["index"] == 0 and doc["device"]["name"] is None


def test_no_cuda_selfcheck_raises_a_memfrac_error(monkeypatch):
    _no_cuda(monkeypatch)
    with pytest.raises(sc.NoCudaDevice, match="no CUDA device visible") as ei:
        scr.selfcheck()
    assert isinstance(ei.value, MemfracError)


def test_device_index_not_visible(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert scr.run_selfcheck(device=3) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no CUDA device 3 visible" in err and "sees 2" in err


def test_torch_missing_is_no_cuda(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch → ImportError
    assert scr.run_selfcheck() == 2
    assert "torch is not installed" in capsys.readouterr().err


def test_cpu_only_torch_build(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "CPU-only build" in (scc.cuda_unavailable_reason() or "")


# --- tolerance and judging -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "tol"), [(512, 25.6), (256, 12.8), (-640, 32.0), (40, 2.0), (20, 2.0), (0, 2.0), (2, 2.0)]
)
def test_tolerance_is_5_percent_or_2_mib(size, tol):
    assert sc.tolerance_mib(size) == pytest.approx(tol)


def test_within():
    assert sc.within(514.0, 512.0, 25.6)
    assert sc.within(486.4, 512.0, 25.6)  # boundary counts
    assert not sc.within(486.3, 512.0, 25.6)
    assert sc.within(2.0, 0.0, 2.0) and sc.within(-2.0, 0.0, 2.0)
    assert not sc.within(2.01, 0.0, 2.0)
    assert not sc.within(None, 0.0, 2.0)  # no reading never passes


def test_judge_pass_and_fail():
    ok = sc.judge(
        "t", 512, {"driver": 520.0, "torch_reserved": 512.0, "non_torch": 8.0}, {"driver": 512, "non_torch": 0}
    )
    assert ok.passed and ok.tolerance == pytest.approx(25.6) and ok.expected == 512 and ok.note == ""
    bad = sc.judge(
        "c",
        256,
        {"driver": 256.0, "torch_reserved": 256.0, "non_torch": 0.0},
        {"driver": 256, "torch_reserved": 0, "non_torch": 256},
    )
    assert not bad.passed
    assert "torch_reserved +256.0 vs expected 0" in bad.note and "non_torch +0.0 vs expected +256.0" in bad.note
    missing = sc.judge("m", 0, {"driver": None}, {"driver": 0})
    assert not missing.passed and "driver no reading" in missing.note


def test_judge_extra_condition_and_nvml_note():
    c = sc.judge(
        "g", 0, {"driver": -4.0, "nvml": 30.0}, {"driver": -4.0}, also=(False, "memory went down during a capture")
    )
    assert not c.passed and "memory went down" in c.note
    assert "NVML Δ +30.0 differs from driver Δ -4.0 (informational)" in c.note
    # NVML alone never fails a check
    assert sc.judge("n", 512, {"driver": 512.0, "nvml": 0.0}, {"driver": 512.0}).passed


def test_deltas_from_hand_written_snaps():
    before = Snapshot(
        kind="gpu",
        t=0.0,
        free_mib=80_000.0,
        total_mib=81_559.0,
        torch_allocated_mib=100.0,
        torch_reserved_mib=120.0,
        torch_peak_allocated_mib=150.0,
        nvml_used_mib=1_000.0,
    )
    after = Snapshot(
        kind="gpu",
        t=1.0,
        free_mib=79_232.0,  # 768 MiB taken
        total_mib=81_559.0,
        torch_allocated_mib=612.0,
        torch_reserved_mib=632.0,  # 512 of it torch's
        torch_peak_allocated_mib=612.0,
        nvml_used_mib=1_768.0,
    )
    d = sc.deltas(before, after)
    assert d == {
        "driver": 768.0,
        "torch_reserved": 512.0,
        "torch_allocated": 512.0,
        "torch_peak_allocated": 462.0,
        "non_torch": 256.0,
        "nvml": 768.0,
    }
    host = Snapshot(kind="host", t=0.0, rss_mib=10.0)
    assert sc.deltas(host, host) == dict.fromkeys(d)  # no device layer: every reading None
    assert sc.deltas(before, after.__class__(**{**after.as_dict(), "nvml_used_mib": None}))["nvml"] is None


# --- the attribution judges on hand-made readings: each fires, and does not ------------------------------------
#
# A "GPU" here is a dict of readings written by hand, in MiB: the driver's free memory and torch's counters exactly
# as `Probe.snapshot()` records them.


def _s(free: float, reserved: float = 0.0, allocated: float = 0.0, peak: float | None = None) -> Snapshot:
    return Snapshot(
        kind="gpu",
        free_mib=free,
        total_mib=80_000.0,
        torch_reserved_mib=reserved,
        torch_allocated_mib=allocated,
        torch_peak_allocated_mib=allocated if peak is None else peak,
    )


def test_idle_judge_passes_when_nothing_moves_and_fires_when_the_driver_moves():
    (ok,) = sc.judge_idle(sc.IdleReadings(_s(70_000.0, 10.0, 8.0), _s(70_000.0, 10.0, 8.0)))
    assert ok.passed and ok.measured["driver"] == 0.0
    # another process took 300 MiB between the two snapshots: driver and non-torch move, torch does not
    (bad,) = sc.judge_idle(sc.IdleReadings(_s(70_000.0, 10.0, 8.0), _s(69_700.0, 10.0, 8.0)))
    assert not bad.passed and bad.measured["non_torch"] == 300.0
    assert "another process is using this GPU" in bad.note


def _alloc(before_free: float, taken_driver: float, taken_reserved: float, given_back: float) -> sc.AllocReadings:
    """512 MiB asked for; the step takes `taken_driver` from the driver of which `taken_reserved` is torch's."""
    b = _s(before_free, 100.0, 100.0)
    h = _s(before_free - taken_driver, 100.0 + taken_reserved, 100.0 + taken_reserved)
    f = _s(before_free - taken_driver + given_back, 100.0, 100.0)
    return sc.AllocReadings(512.0, b, h, f)


def test_torch_tensor_judge():
    held, freed = sc.judge_torch_tensor(_alloc(70_000.0, 512.0, 512.0, 512.0))
    assert held.passed and freed.passed and held.name == "torch tensor 512 MiB" and freed.expected == -512.0
    # the memory showed in the driver but not in torch's reserved: non-torch +512 vs 0, reserved 0 vs 512
    held, _ = sc.judge_torch_tensor(_alloc(70_000.0, 512.0, 0.0, 512.0))
    assert not held.passed and "torch_reserved +0.0 vs expected +512.0" in held.note
    # the tensor was freed but empty_cache gave nothing back: driver −0 vs −512
    _, freed = sc.judge_torch_tensor(_alloc(70_000.0, 512.0, 512.0, 0.0))
    assert not freed.passed and "driver +0.0 vs expected -512.0" in freed.note


def test_cuda_malloc_judge():
    r = sc.AllocReadings(256.0, _s(70_000.0), _s(69_744.0), _s(70_000.0), "via libcudart.so.13")
    held, freed = sc.judge_cuda_malloc(r)
    assert held.passed and freed.passed and held.measured["non_torch"] == 256.0 and held.note == "via libcudart.so.13"
    # a runtime whose cudaMalloc went through torch's allocator would show in reserved
    r = sc.AllocReadings(256.0, _s(70_000.0), _s(69_744.0, 256.0, 256.0), _s(70_000.0))
    held, freed = sc.judge_cuda_malloc(r)
    assert not held.passed and "torch_reserved +256.0 vs expected 0" in held.note


def _ladder(grow: list[tuple[float, float]], floor: float = 128.0) -> sc.LadderReadings:
    """(driver Δ, reserved Δ) per capture, bs 64 → 1."""
    free, res = 60_000.0, 500.0
    base = _s(free, res, res)
    rungs = []
    for bs, (d, r) in zip(sc.LADDER, grow, strict=True):
        free, res = free - d, res + r
        rungs.append((bs, _s(free, res, res)))
    return sc.LadderReadings(floor, base, tuple(rungs), _s(free, res, res))


def test_graph_ladder_judge():
    # bs=64 holds 160 (128 FFN activation + 32 output), every later capture 2 more: driver = reserved
    good = [(160.0, 160.0)] + [(2.0, 2.0)] * 6
    checks = sc.judge_graph_ladder(_ladder(good))
    assert all(c.passed for c in checks) and checks[-1].expected == 172.0  # 160 + 6 × 2
    # graph memory outside torch's stats (non-torch growth at bs=64): that rung and the total fire
    bad = [(160.0, 0.0)] + [(2.0, 2.0)] * 6
    failed = {c.name for c in sc.judge_graph_ladder(_ladder(bad)) if not c.passed}
    assert failed == {"graph capture bs=64", "graph ladder total (7 graphs, replayed)"}
    # a pool smaller than the FFN activation that must have been live: the total fires
    small = [(20.0, 20.0)] + [(2.0, 2.0)] * 6
    total = sc.judge_graph_ladder(_ladder(small))[-1]
    assert not total.passed and "reserved less than its bs=64 FFN activation (128 MiB)" in total.note


def test_peak_reset_judge():
    pre, reset, after = (
        _s(60_000.0, 600.0, 100.0, 612.0),
        _s(60_000.0, 600.0, 100.0, 100.0),
        _s(60_000.0, 600.0, 100.0, 356.0),
    )
    drop, transient = sc.judge_peak_reset(sc.PeakReadings(512.0, 256.0, pre, reset, after))
    assert drop.passed and transient.passed and drop.measured["torch_peak_allocated"] == -512.0
    # a reset that did nothing: the peak stays at 612 → drop 0 vs −512; the transient adds 0 above 612 → fires
    stuck = _s(60_000.0, 600.0, 100.0, 612.0)
    drop, transient = sc.judge_peak_reset(sc.PeakReadings(512.0, 256.0, pre, stuck, stuck))
    assert not drop.passed and not transient.passed


def test_readings_round_trip_through_json_and_rejudge():
    """A run's `readings` re-judge to the same checks on any machine (a recorded GPU run becomes a CPU test)."""
    recs = {
        "idle": sc.IdleReadings(_s(70_000.0), _s(70_000.0)),
        "torch tensor": _alloc(70_000.0, 512.0, 512.0, 512.0),
        "cudaMalloc": sc.AllocReadings(256.0, _s(70_000.0), _s(69_744.0), _s(70_000.0), "via x"),
        "graph ladder": _ladder([(160.0, 160.0)] + [(2.0, 2.0)] * 6),
        "peak reset": sc.PeakReadings(
            512.0, 256.0, _s(6e4, 600.0, 100.0, 612.0), _s(6e4, 600.0, 100.0, 100.0), _s(6e4, 600.0, 100.0, 356.0)
        ),
    }
    doc = json.loads(json.dumps({sc.ATTRIBUTION: {k: sc.readings_as_dict(v) for k, v in recs.items()}}))
    checks, ledger = scr.judge_readings(doc)
    direct = [c for name, r in recs.items() for c in sc._JUDGES[name](r)]
    assert [c.as_dict() for c in checks] == [c.as_dict() for c in direct] and ledger is None
    assert len(checks) == 15 and all(c.passed for c in checks)  # 1 + 2 + 2 + (7 rungs + total) + 2


# --- the worker life on the simulated device ------------------------------------------------------------------
#
# tests/fakes/sim_worker.SimLife runs the same `drive_life` (the plugin's hook functions, the real Recorder → JSONL →
# read_probe_dir → compare → ledger) on the simulated device; `judge_life_dir` is the judge the GPU run uses.

LIFE_CHECKS = [
    "life: probe records (one rank, every window, nothing in flight)",
    "life: the ledger closes",
    "life: weights",
    "life: kv_pool",
    "life: constant",
    "life: prefill pool (activation memory)",
    "life: prefill_graph",
    "life: prefill_graph peak inside its window",
    "life: decode_graph",
    "life: decode ladder (capture order, cumulative)",
    "life: deepep_a2a",
    "life: parallel",
    "life: activation",
    "life: unattributed",
    "life: headroom",
    "comparison: terms from the ledger (each as sglang means it)",
    "comparison: KV pool details from the configurator's result",
]


def _life(tmp_path, flaw: str = "", guard: bool = True, truth_edit=None, name: str = ""):
    d = tmp_path / f"life-{name or flaw or 'clean'}"
    d.mkdir()
    truth = sim_worker.selfcheck_life(d, flaw, guard=guard)
    if truth_edit is not None:
        truth = dataclasses.replace(truth, **truth_edit(truth))
    res = life.judge_life_dir(d, truth)
    return res, {c.name: c for c in res.checks}


def _failing(by: dict) -> set[str]:
    return {n for n, c in by.items() if not c.passed}


def test_the_clean_life_passes_every_check_with_figures_by_hand(tmp_path):
    """The simulated H200 (143,771) with a 520 CUDA context: free at start F = 143,251. Weights 1,280; KV 2,560
    (163,840 tokens × 16,384 B); eager static 320 (its 288 warm-up cache emptied by the probe at the window's
    end); prefill pool 144 + 2 = 146 → activation (where chunks replay: memory_hook.py:385), its 4 executables
    4 × 0.5 = 2 → prefill_graph (the term counts only non-torch memory); decode window 320 (DeepEP, nested) + pool
    growth 260 + 2 + 2 = 264 + 7 × 0.5 = 3.5 → parallel; activation 146 + 1,280 + 2 = 1,428 (the pool, then the
    warm-up request, inside the window). Headroom = 143,251 − 1,280 − 2,560 − 320 − 2 − 264 − 320 − 3.5 − 1,428
    = 137,073.5 = the free memory read inside the warm-up request.
    Prefill peak: 640 scratch + 150 forward = 790 above its start, kept across the precarve reset by the guard.
    Ladder, driver MiB since the decode window began, less the nested DeepEP window (320): bs 64: 260 + 0.5 =
    260.5; 32: 261.0; 16: 263.5; 8: 264.0; 4: 264.5; 2: 267.0; 1: 267.5."""
    res, by = _life(tmp_path)
    assert list(by) == LIFE_CHECKS
    assert not _failing(by), "\n".join(f"{c.name}: {c.note}" for c in res.checks if not c.passed)
    L = res.ledger
    assert {x.name: x.mib for x in L.lines} == {
        "weights": 1280.0,
        "kv_pool": 2560.0,
        "constant": 320.0,
        "activation": 1428.0,
        "parallel": 3.5,
        "decode_graph": 264.0,
        "prefill_graph": 2.0,
        "deepep_a2a": 320.0,
        "headroom": 137073.5,
    }
    assert L.free_at_start_mib == 143251.0 and L.residual_mib == 0.0 and L.worst_point == "serving peak"
    assert by["life: prefill_graph peak inside its window"].measured == {"peak": 790.0, "resets seen": 1.0}
    assert by["life: decode ladder (capture order, cumulative)"].measured == {
        "bs=64": 260.5,
        "bs=32": 261.0,
        "bs=16": 263.5,
        "bs=8": 264.0,
        "bs=4": 264.5,
        "bs=2": 267.0,
        "bs=1": 267.5,
    }
    assert by["comparison: KV pool details from the configurator's result"].measured == {
        "kv_tokens": 163840.0,
        "kv_bytes_per_token": 16384.0,
        "kv_mib": 2560.0,
    }
    assert by["life: decode_graph"].measured["non_torch"] == 323.5  # the buffer and 7 executables, not decode's


@pytest.mark.parametrize(
    ("flaw", "fires"),
    [
        # 64 MiB more inside the weights window: the weights line reads 1,344
        ("weights_extra", {"life: weights"}),
        # a 400 MiB req_to_token pool beside the KV: kv_pool reads 2,960
        ("kv_extra", {"life: kv_pool"}),
        # the buffer made where no deepep hook sees it (its target did not resolve): no nested window, its
        # 320 MiB land in the decode window's non-torch growth → parallel 323.5, and in its ladder rungs (no
        # nested window to take them out); the comparison's rows too
        (
            "a2a_unhooked",
            {
                "life: probe records (one rank, every window, nothing in flight)",
                "life: deepep_a2a",
                "life: parallel",
                "life: decode ladder (capture order, cumulative)",
                "comparison: terms from the ledger (each as sglang means it)",
            },
        ),
        # a lazily made 64 MiB NCCL buffer inside the first decode capture: parallel 67.5 vs 3.5, the ladder +64
        (
            "nccl_in_capture",
            {
                "life: parallel",
                "life: decode ladder (capture order, cumulative)",
                "comparison: terms from the ledger (each as sglang means it)",
            },
        ),
    ],
)
def test_each_life_check_fires_on_its_flaw(tmp_path, flaw, fires):
    _, by = _life(tmp_path, flaw)
    assert _failing(by) == fires, {n: by[n].note for n in _failing(by)}


def test_activation_fires_when_the_baseline_follows_the_warmup_request(tmp_path, monkeypatch):
    """Defect e, as the runtime hook was before the fix: the baseline taken at the first sample, after sglang's
    warm-up request. Its 1,282 MiB sit in the cache inside the baseline, the later batches (640, 960) reuse it:
    activation reads only the prefill pool's 146, and the cache between the decode window and the baseline is
    unattributed 1,282."""

    def baseline_after_first_batch(rec, phase):
        def hook(original, *a, **k):
            result = original(*a, **k)
            rec.runtime_sample()  # the first sample takes the baseline
            return result

        return hook

    monkeypatch.setitem(plugin._HOOKS, "runtime", baseline_after_first_batch)
    _, by = _life(tmp_path)
    assert _failing(by) == {
        "life: activation",
        "life: unattributed",
        "comparison: terms from the ledger (each as sglang means it)",
    }
    assert by["life: activation"].measured["ledger"] == 146.0 and by["life: unattributed"].measured["ledger"] == 1282.0


def test_the_ledger_closes_check_fires_without_the_nested_subtraction(tmp_path, monkeypatch):
    """If the decode window kept what its nested DeepEP window took, 320 MiB would be booked twice."""
    from profiler.analyse import ledger as lg

    monkeypatch.setattr(lg, "own_usage", lambda window, nested: window)
    res, by = _life(tmp_path)
    assert not by["life: the ledger closes"].passed and res.ledger.residual_mib == -320.0
    assert not by["life: parallel"].passed  # 323.5: the buffer again, as non-torch growth


def test_constant_and_unattributed_fire_without_the_probes_cache_boundary(tmp_path, monkeypatch):
    """Defect f: without emptying the cache at the eager runner's end, its 288 MiB warm-up cache is charged
    to constant (608) and given back by the next window's begin: unattributed −288."""
    monkeypatch.setattr(plugin, "EMPTY_CACHE_AT_END", frozenset())
    _, by = _life(tmp_path)
    assert _failing(by) == {
        "life: constant",
        "life: unattributed",
        "comparison: terms from the ledger (each as sglang means it)",
    }
    assert by["life: constant"].measured["ledger"] == 608.0 and by["life: unattributed"].measured["ledger"] == -288.0


def test_prefill_graph_fires_when_no_window_empties_the_cache(tmp_path, monkeypatch):
    """Without either boundary the eager warm-up's 288 MiB cache is released by sglang's own empty_cache inside
    the prefill capture: the prefill pool (its torch growth, activation memory) reads 146 − 288 = −142."""
    monkeypatch.setattr(plugin, "EMPTY_CACHE_AT_END", frozenset())
    monkeypatch.setattr(plugin, "EMPTY_CACHE_AT_BEGIN", frozenset())
    _, by = _life(tmp_path)
    c = by["life: prefill pool (activation memory)"]
    assert c.measured["ledger"] == -142.0 and not c.passed


def test_prefill_peak_fires_without_the_peak_reset_guard(tmp_path):
    """GraphPoolPrecarve.measure resets torch's peaks after the warm-up: unguarded, the window's 790 peak is
    lost and reads 148 (its pool 146, now activation memory, and its executables' 2), and no reset is seen."""
    _, by = _life(tmp_path, guard=False)
    c = by["life: prefill_graph peak inside its window"]
    assert not c.passed and c.measured == {"peak": 148.0, "resets seen": 0.0}
    assert _failing(by) == {"life: prefill_graph peak inside its window"}


def test_ladder_fires_when_the_reader_loses_capture_order(tmp_path, monkeypatch):
    """Defect c: a ladder sorted by bs (smallest first) is not the capture order sglang used."""
    from profiler.measure.probe import reader

    original = reader._ladder
    monkeypatch.setattr(reader, "_ladder", lambda recs, before, nested=None: sorted(original(recs, before, nested),
                                                                                     key=lambda p: p.bs))
    _, by = _life(tmp_path)
    c = by["life: decode ladder (capture order, cumulative)"]
    assert _failing(by) == {c.name} and "ladder order [1, 2, 4, 8, 16, 32, 64]" in c.note


def test_graph_lines_fire_when_the_pool_readings_disagree(tmp_path):
    """A shared pool that really grew 100 MiB more in the decode family than the decode window booked."""
    edit = lambda t: {"decode_rungs": tuple((bs, v + 100.0) for bs, v in t.decode_rungs)}  # noqa: E731
    _, by = _life(tmp_path, truth_edit=edit)
    assert _failing(by) == {
        "life: decode_graph",
        "life: decode ladder (capture order, cumulative)",
        "comparison: terms from the ledger (each as sglang means it)",
    }
    edit = lambda t: {"prefill_pool_mib": t.prefill_pool_mib + 100.0}  # noqa: E731
    _, by = _life(tmp_path, truth_edit=edit, name="prefill-pool")
    assert {"life: prefill pool (activation memory)", "life: decode_graph"} <= _failing(by)


def test_headroom_fires_when_the_books_miss_the_serving_peak(tmp_path):
    edit = lambda t: {"serving_peak_free_mib": t.serving_peak_free_mib - 50.0}  # noqa: E731
    _, by = _life(tmp_path, truth_edit=edit)
    assert _failing(by) == {"life: headroom"} and "+137073.5 vs expected +137023.5" in by["life: headroom"].note


def test_unattributed_fires_on_memory_taken_between_windows(tmp_path, monkeypatch):
    """50 MiB allocated after the KV pool's window ends and before the eager runner's begins."""
    made = []
    original = plugin._HOOKS["phase"]

    def phase(rec, name):
        h = original(rec, name)
        if name != "eager_runner":
            return h

        def before_it(fn, *a, **k):
            rec.probe.dev.raw_alloc(50.0)
            made.append(50.0)
            return h(fn, *a, **k)

        return before_it

    monkeypatch.setitem(plugin._HOOKS, "phase", phase)
    _, by = _life(tmp_path)
    assert made and _failing(by) == {"life: unattributed"}  # the headroom read inside the batch sees it too
    assert by["life: unattributed"].measured["ledger"] == 50.0


def test_kv_details_fire_when_the_configurators_result_is_not_read(tmp_path, monkeypatch):
    """Defect g: without the kv hook's reading of KVCacheConfigResult, tokens and bytes per token are unknown."""
    monkeypatch.setattr(plugin, "_kv_after", lambda fr, result, a, k: None)
    _, by = _life(tmp_path)
    c = by["comparison: KV pool details from the configurator's result"]
    assert _failing(by) == {c.name} and c.measured == {"kv_tokens": None, "kv_bytes_per_token": None, "kv_mib": None}


def test_graph_terms_fire_when_compare_judges_the_families_jointly(tmp_path, monkeypatch):
    """Issue 26.4: the prefill term counts only the graph's non-torch memory (memory_hook.py:385); a comparison that
    charged the whole shared pool to the graph terms (one joint row, as before) fires."""
    from profiler.analyse.compare import TermComparison, compare

    def joint(m, res, **kw):
        c = compare(m, res, **kw)
        rows = [t for t in c.terms if t.term not in ("prefill_graph", "decode_graph")]
        rows.append(TermComparison("prefill_graph+decode_graph", 0.0, 412.0, "under", "both windows"))
        return dataclasses.replace(c, terms=tuple(rows))

    monkeypatch.setattr(life, "compare", joint)
    _, by = _life(tmp_path)
    assert _failing(by) == {"comparison: terms from the ledger (each as sglang means it)"}


def test_probe_records_fire_on_a_window_left_in_flight(tmp_path):
    """A worker that died inside the decode capture: its end record is missing."""
    d = tmp_path / "w"
    d.mkdir()
    truth = sim_worker.selfcheck_life(d)
    recs = [json.loads(x) for x in (d / "probe-6001.jsonl").read_text().splitlines()]
    recs = [r for r in recs if not (r.get("type") == "end" and r.get("phase") == "decode_graph")]
    by = {c.name: c for c in life.judge_life_records(recs, truth).checks}
    assert not by["life: probe records (one rank, every window, nothing in flight)"].passed
    assert by["life: probe records (one rank, every window, nothing in flight)"].measured["in_flight"] == 1.0


def test_life_replays_from_its_recorded_readings(tmp_path):
    """The JSON report's life readings (truth + probe records) re-judge to the same checks and ledger."""
    res, _ = _life(tmp_path)
    d = tmp_path / "life-clean"
    truth = life.LifeTruth.from_dict(json.loads((d / "truth.json").read_text()))
    doc = json.loads(json.dumps({sc.LIFE: {"truth": truth.as_dict(), "probe_records": res.records}}))
    checks, ledger = scr.judge_readings(doc)
    assert [c.as_dict() for c in checks] == [c.as_dict() for c in res.checks]
    assert ledger.as_dict() == res.ledger.as_dict()


def test_recorder_counts_batches_not_flushes(tmp_path):
    """Three run_batch calls are three batches: the exit flush (Recorder.flush_runtime, registered atexit by the
    plugin) is no batch. Before the fix it went through runtime_sample and the record said 4."""
    s = sim_worker.Sim(tmp_path, 7001)
    s.dev.cuda_up = True
    run_batch = s.hook("runtime", "runtime")
    for act in (100.0, 50.0, 80.0):
        run_batch(lambda _s, _b, _a=act: s.dev.transient(_a), object(), object())
    s.rec.flush_runtime()
    s.close()
    rt = read_probe_dir(tmp_path).ranks[0].phase("runtime")
    assert rt.details["batches"] == 3 and rt.usage_mib == 100.0  # the first batch's 100 MiB is the peak


def test_drive_life_uses_the_plugins_hooks_in_sglangs_order(tmp_path):
    """The records name each window's role and parent as the plugin writes them for sglang 0.5.23."""
    sim_worker.selfcheck_life(tmp_path)
    recs = [json.loads(x) for x in next(tmp_path.glob("probe-*.jsonl")).read_text().splitlines()]
    begins = [(r["phase"], r["role"], r["parent"]) for r in recs if r["type"] == "begin"]
    assert begins == [
        ("init_parallel", "target", None),
        ("baseline", "target", None),
        ("weights", "target", None),
        ("kv_pool", "target", None),
        ("eager_runner", "target", None),
        ("prefill_graph", "target", None),
        ("decode_graph", "target", None),
        ("a2a_buffer", "target", "decode_graph"),
    ]
    assert [r["bs"] for r in recs if r["type"] == "ladder"] == list(life.DECODE_BS)
    ends = {r["phase"]: r for r in recs if r["type"] == "end"}
    assert ends["baseline"]["details"]["pre_model_load_mib"] == 143251.0  # free GiB × 1024
    assert ends["kv_pool"]["details"]["kv_tokens"] == 163840 and ends["kv_pool"]["details"]["kv_mib"] == 2560.0
    assert ends["a2a_buffer"]["details"]["backend"] == "deepep"


def test_free_memory_refusal():
    """8,192 MiB free is enough; 8,191 is not, and the one line names the device, both figures and the way out."""
    assert life.free_memory_refusal(8192.0) is None and life.free_memory_refusal(None) is None
    msg = life.free_memory_refusal(8191.0, device=3)
    assert msg.startswith("GPU 3 has 8,191 MiB free; the worker life needs 8,192 MiB") and "--device" in msg
    assert "\n" not in msg


def test_plan_arithmetic():
    # 4 × (2 × 4,096 × 1,024 + 4,096 + 1,024) = 33,574,912 bf16 elements = 64.04 MiB, inside the 1,280 MiB tensor
    assert life.params_elements() == 33_574_912 and life.params_elements() * 2 < life.WEIGHTS_MIB * 2**20
    # 2,560 MiB / (2 × 4 layers × 8 heads × 128 × 2 B = 16,384 B) = 163,840 tokens
    assert (
        life.KV_BYTES_PER_TOKEN == 16384
        and life.plan_truth(
            prefill_pool_mib=None,
            decode_rungs=(),
            serving_peak_free_mib=None,
            prefill_transient_mib=None,
            serve_transient_mib=None,
            graph_exec_mib=None,
        ).kv_tokens
        == 163840
    )
    # every size the life allocates is a multiple of 20 MiB (exact under both allocator modes)
    sizes = (
        life.WEIGHTS_MIB,
        life.KV_MIB,
        life.EAGER_STATIC_MIB,
        life.PREFILL_WARMUP_MIB,
        life.A2A_MIB,
        *life.SERVE_ACT_MIB,
    )
    assert all(s % 20 == 0 for s in sizes)
    # the static buffer holds the input rows: 16,384 × 1,024 × 2 B = 32 MiB ≤ 320
    assert life.MAX_ROWS * life.HIDDEN * 2 <= life.EAGER_STATIC_MIB * 2**20


def test_missing_readings_fail_and_say_so(tmp_path):
    """A torch whose memory_snapshot names no pools gives no graph truth: the graph checks fail, saying why."""
    edit = lambda t: {"prefill_pool_mib": None, "decode_rungs": tuple((bs, None) for bs, _ in t.decode_rungs)}  # noqa: E731
    _, by = _life(tmp_path, truth_edit=edit)
    c = by["life: prefill pool (activation memory)"]
    assert not c.passed and "no expectation (its reading is missing)" in c.note


# --- the JSON document and the tables ---------------------------------------------------------------------------


def _full_report(tmp_path) -> sc.SelfcheckReport:
    res, _ = _life(tmp_path)
    attr = sc.judge_torch_tensor(_alloc(70_000.0, 512.0, 512.0, 512.0))
    return sc.SelfcheckReport(
        device=0,
        device_name="NVIDIA H200",
        total_mib=143_771.0,
        torch_version="2.11.0",
        allocator="native",
        checks=[*attr, *res.checks],
        libcudart="/x/libcudart.so.13",
        free_mib=142_000.0,
        cuda_version="13.0",
        ledger=res.ledger,
        readings={sc.LIFE: {"probe_records": res.records}},
        elapsed_s=12.345,
    )


def test_json_schema(tmp_path):
    doc = json.loads(json.dumps(_full_report(tmp_path).as_dict(), default=str))
    assert set(doc) == {
        "schema",
        "passed",
        "device",
        "torch",
        "cuda",
        "allocator",
        "libcudart",
        "elapsed_s",
        "checks",
        "ledger",
        "readings",
    }
    assert doc["schema"] == "memfrac-selfcheck/2" and doc["passed"] is True and doc["elapsed_s"] == 12.35
    assert doc["device"] == {"index": 0, "name": "NVIDIA H200", "total_mib": 143771.0, "free_mib": 142000.0}
    keys = {
        "name",
        "group",
        "unit",
        "expected",
        "expected_how",
        "expected_by_layer",
        "measured",
        "tolerance",
        "tolerance_why",
        "passed",
        "note",
    }
    assert all(set(c) == keys for c in doc["checks"])
    assert [c["group"] for c in doc["checks"]][:2] == ["attribution", "attribution"]
    w = next(c for c in doc["checks"] if c["name"] == "life: weights")
    assert (w["expected"], w["measured"]["ledger"], w["tolerance"], w["unit"]) == (1280.0, 1280.0, 2.0, "MiB")
    assert doc["ledger"]["closes"] is True and doc["ledger"]["residual_mib"] == 0.0
    assert [x["name"] for x in doc["ledger"]["lines"]][-1] == "headroom"


def test_render_text_tables(tmp_path):
    r = _full_report(tmp_path)
    text = sc.render_text(r, rich_look=False)
    lines = text.splitlines()
    assert lines[0] == (
        "memfrac selfcheck: GPU 0 (NVIDIA H200, 143,771 MiB, 142,000 free), torch 2.11.0 (CUDA 13.0), allocator native"
    )
    assert "attribution: what each snapshot layer saw (MiB)" in text and "max(5% of the check's size, 2 MiB)" in text
    row = next(ln for ln in lines if ln.startswith("| torch tensor 512 MiB "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["torch tensor 512 MiB", "512.0", "512.0", "512.0", "512.0", "(512.0)", "0.0", "-", "25.6", "pass"]
    row = next(ln for ln in lines if ln.startswith("| life: decode ladder"))
    assert [c.strip() for c in row.strip("|").split("|")][1:3] == ["260.5", "bs=64 260.5"]
    row = next(ln for ln in lines if ln.startswith("| headroom "))
    assert [c.strip() for c in row.strip("|").split("|")][:3] == ["headroom", "137,073.5", "read"]
    assert "residual 0.0 MiB (resolution 2): closes" in text
    assert lines[-1] == "19/19 checks passed: all pass"


def test_render_marks_what_failed(tmp_path):
    r = _full_report(tmp_path)
    bad = sc.judge_cuda_malloc(sc.AllocReadings(256.0, _s(7e4), _s(69_744.0, 256.0, 256.0), _s(7e4)))
    r.checks += bad
    text = sc.render_text(r, rich_look=False)
    row = next(ln for ln in text.splitlines() if ln.startswith("| cudaMalloc 256 MiB"))
    assert [c.strip() for c in row.strip("|").split("|")][-8:] == [
        "256.0",
        "256.0!",
        "256.0!",
        "(256.0)",
        "0.0!",
        "-",
        "12.8",
        "FAIL",
    ]
    assert "cudaMalloc 256 MiB (non-torch): torch_reserved +256.0 vs expected 0" in text
    assert text.splitlines()[-1] == "19/21 checks passed: FAILED"  # its cudaFree saw torch give 256 back too


@pytest.mark.parametrize(("pass_all", "rc"), [(True, 0), (False, 1)])
def test_run_selfcheck_exit_status_and_json(monkeypatch, capsys, tmp_path, pass_all, rc):
    r = _full_report(tmp_path)
    if not pass_all:
        r.checks += sc.judge_cuda_malloc(sc.AllocReadings(256.0, _s(7e4), _s(69_744.0, 256.0, 256.0), _s(7e4)))
    monkeypatch.setattr(scc, "cuda_unavailable_reason", lambda device=0: None)
    monkeypatch.setattr(scr, "selfcheck", lambda device=0, probe_dir=None: r)
    assert scr.run_selfcheck() == rc
    assert "checks passed" in capsys.readouterr().out
    assert scr.run_selfcheck(json_out=True) == rc
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] is pass_all and [c["name"] for c in doc["checks"]] == [c.name for c in r.checks]


def test_too_little_free_memory_exits_2_with_one_line(monkeypatch, capsys):
    def refuse(device=0, probe_dir=None):
        raise sc.NotEnoughFreeMemory(life.free_memory_refusal(5000.0, device))

    monkeypatch.setattr(scc, "cuda_unavailable_reason", lambda device=0: None)
    monkeypatch.setattr(scr, "selfcheck", refuse)
    assert scr.run_selfcheck(json_out=True) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1
    assert err.startswith("memfrac selfcheck: GPU 0 has 5,000 MiB free; the worker life needs 8,192 MiB")
    doc = json.loads(out)
    assert doc["refused"].startswith("GPU 0 has 5,000 MiB free") and doc["passed"] is False and doc["checks"] == []


def test_report_passes_only_with_checks_all_passed(tmp_path):
    r = _full_report(tmp_path)
    assert r.passed
    r.checks = []
    assert not r.passed


def test_guarded_turns_an_exception_into_a_failed_check():
    def boom() -> list[sc.Check]:
        raise sc.LibcudartNotFound("no CUDA runtime library (libcudart.so*) found: ...")

    (c,) = scr._guarded("cudaMalloc 256 MiB (non-torch)", boom, None)  # settling without torch is skipped
    assert not c.passed and c.note.startswith("could not measure: LibcudartNotFound: no CUDA runtime library")


# --- libcudart finder ----------------------------------------------------------------------------------------


def _isolate_finder(monkeypatch, dirs: list[Path]) -> None:
    monkeypatch.setattr(scc, "loaded_libcudart", lambda: None)
    monkeypatch.setattr(scc, "libcudart_search_dirs", lambda: dirs)
    monkeypatch.setattr(scc, "_system_libcudart", lambda: None)


def test_finder_names_what_it_looked_for(monkeypatch, tmp_path):
    a, b = tmp_path / "torch" / "lib", tmp_path / "nvidia" / "cu13" / "lib"
    b.mkdir(parents=True)
    (b / "libcudart_static.a").write_bytes(b"")  # a static archive is no shared library
    _isolate_finder(monkeypatch, [a, b])
    with pytest.raises(sc.LibcudartNotFound) as ei:
        scc.find_libcudart()
    msg = str(ei.value)
    assert isinstance(ei.value, MemfracError)
    assert "libcudart.so*" in msg and str(a) in msg and str(b) in msg
    assert "/proc/self/maps" in msg and "find_library('cudart')" in msg
    assert "nvidia-cuda-runtime" in msg and "CUDA_HOME" in msg


def test_finder_picks_the_runtime_matching_torch(monkeypatch, tmp_path):
    d = tmp_path / "lib"
    d.mkdir()
    for n in ("libcudart.so.12", "libcudart.so.13", "libcudart_static.a"):
        (d / n).write_bytes(b"")
    _isolate_finder(monkeypatch, [tmp_path / "missing", d])
    monkeypatch.setattr(scc, "_torch_cuda_major", lambda: "13")
    assert scc.find_libcudart() == d / "libcudart.so.13"
    monkeypatch.setattr(scc, "_torch_cuda_major", lambda: "12")
    assert scc.find_libcudart() == d / "libcudart.so.12"


def test_finder_prefers_the_loaded_runtime_then_the_system_one(monkeypatch, tmp_path):
    _isolate_finder(monkeypatch, [])
    monkeypatch.setattr(scc, "_system_libcudart", lambda: "libcudart.so.13")
    assert scc.find_libcudart() == Path("libcudart.so.13")
    monkeypatch.setattr(scc, "loaded_libcudart", lambda: tmp_path / "libcudart.so.13")
    assert scc.find_libcudart() == tmp_path / "libcudart.so.13"


def test_loaded_libcudart_reads_maps_and_skips_vendored_copies(tmp_path):
    plain, vendored = tmp_path / "libcudart.so.13", tmp_path / "libcudart.faf08d9a.so.13"
    plain.write_bytes(b"")
    vendored.write_bytes(b"")
    maps = tmp_path / "maps"
    maps.write_text(
        f"7f00-7f01 r-xp 00000000 08:01 42 {vendored}\n"
        "7f01-7f02 rw-p 00000000 00:00 0\n"
        f"7f02-7f03 r-xp 00000000 08:01 43 {plain}\n"
        "7f03-7f04 r--p 00000000 08:01 44 /gone/libcudart.so.12 (deleted)\n"
    )
    assert scc.loaded_libcudart(str(maps)) == plain
    maps.write_text(f"7f00-7f01 r-xp 00000000 08:01 42 {vendored}\n")
    assert scc.loaded_libcudart(str(maps)) == vendored
    assert scc.loaded_libcudart(str(tmp_path / "no-such-maps")) is None


def test_search_dirs_cover_torch_and_the_runtime_wheels(monkeypatch, tmp_path):
    sp = tmp_path / "site-packages"
    (sp / "nvidia" / "cuda_nvrtc" / "lib").mkdir(parents=True)
    monkeypatch.setattr(scc.site, "getsitepackages", lambda: [str(sp)])
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(__file__=str(sp / "torch" / "__init__.py")))
    dirs = scc.libcudart_search_dirs()
    for want in (
        sp / "torch" / "lib",
        sp / "nvidia" / "cuda_runtime" / "lib",
        sp / "nvidia" / "cu13" / "lib",
        sp / "nvidia" / "cuda_nvrtc" / "lib",
        tmp_path / "cuda" / "lib64",
    ):
        assert want in dirs
    assert dirs.index(sp / "torch" / "lib") < dirs.index(sp / "nvidia" / "cu13" / "lib")
    assert len(dirs) == len(set(dirs))


def test_ladder_floor():
    # bs 64 × 256 rows × FFN 4096 × 2 bytes: the FFN activation the largest capture must hold at once
    assert scc.ladder_floor_mib(2) == 128.0


# --- the whole run against a simulated GPU -------------------------------------------------------------------
#
# A fake `torch` whose caching allocator keeps the books the way CUDA does (reserved ⊆ driver, graph pools inside
# reserved, empty_cache releases the default pool's free cache), so that the orchestration, the sign conventions
# and the expectations are exercised end to end without a GPU; and flawed variants to show each check can fail.

MiB = 1 << 20


class _Gpu:
    total = 80_000 * MiB

    def __init__(self, flaw: str = "") -> None:
        self.flaw = flaw
        self.allocated = self.reserved = self.non_torch = self.peak = self.peak_reserved = 0
        self.free_cache: dict[object, int] = {"default": 0}
        self.capturing: object | None = None

    def alloc(self, n: int) -> object:
        pool = self.capturing or "default"
        if pool != "default" and self.flaw == "graphs_outside_reserved":
            self.non_torch += n  # graph memory the allocator's stats do not see
            return "hidden"
        self.allocated += n
        cached = self.free_cache.setdefault(pool, 0)
        self.reserved += max(0, n - cached)
        self.free_cache[pool] = max(0, cached - n)
        self.peak = max(self.peak, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return pool

    def release(self, n: int, pool: object) -> None:
        if pool == "hidden":
            return
        self.allocated -= n
        self.free_cache[pool] += n

    def empty_cache(self) -> None:
        self.reserved -= self.free_cache["default"]
        self.free_cache["default"] = 0


class _Tensor:
    def __init__(self, gpu: _Gpu, nbytes: int, rows: int = 0) -> None:
        self.gpu, self.nbytes, self.rows = gpu, nbytes, rows
        self.pool = gpu.alloc(nbytes)

    def __getitem__(self, sl: slice) -> _Tensor:
        view = object.__new__(_Tensor)
        view.gpu, view.nbytes, view.rows, view.pool = self.gpu, 0, sl.stop, None
        return view

    def element_size(self) -> int:
        return 2

    def __del__(self) -> None:
        if self.pool is not None:
            self.gpu.release(self.nbytes, self.pool)


def _fake_torch(gpu: _Gpu) -> types.SimpleNamespace:
    import contextlib

    class Graph:
        def replay(self) -> None:
            pass

    @contextlib.contextmanager
    def graph(g, pool=None, stream=None):
        gpu.empty_cache()
        gpu.capturing = id(pool if pool is not None else g)
        try:
            yield
        finally:
            gpu.capturing = None

    def reset_peak(dev=None) -> None:
        if gpu.flaw != "peak_reset_ignored":
            gpu.peak, gpu.peak_reserved = gpu.allocated, gpu.reserved

    stream = types.SimpleNamespace(wait_stream=lambda s: None)
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        device_count=lambda: 1,
        current_device=lambda: 0,
        set_device=lambda d: None,
        synchronize=lambda *a: None,
        empty_cache=gpu.empty_cache,
        mem_get_info=lambda d=None: (gpu.total - gpu.reserved - gpu.non_torch, gpu.total),
        memory_stats=lambda d=None: {
            "allocated_bytes.all.current": gpu.allocated,
            "reserved_bytes.all.current": gpu.reserved,
            "allocated_bytes.all.peak": gpu.peak,
            "reserved_bytes.all.peak": gpu.peak_reserved,
        },
        reset_peak_memory_stats=reset_peak,
        get_device_properties=lambda d: types.SimpleNamespace(name="FakeGPU", total_memory=gpu.total, uuid="0"),
        get_allocator_backend=lambda: "native",
        is_bf16_supported=lambda: True,
        Stream=lambda device=None: stream,
        current_stream=lambda: stream,
        stream=lambda s: contextlib.nullcontext(),
        CUDAGraph=Graph,
        graph=graph,
        graph_pool_handle=object,
    )
    return types.SimpleNamespace(
        __version__="fake",
        version=types.SimpleNamespace(cuda="13.0"),
        cuda=cuda,
        uint8="uint8",
        bfloat16="bf16",
        float16="fp16",
        no_grad=contextlib.nullcontext,
        empty=lambda n, dtype=None, device=None: _Tensor(gpu, n),
        zeros=lambda n, device=None: _Tensor(gpu, 4),
        randn=lambda rows, cols, device=None, dtype=None: _Tensor(gpu, rows * cols * 2, rows),
        tensor=lambda data, dtype=None: _Tensor(gpu, 0),
    )


class _FakeRuntime:
    def __init__(self, gpu: _Gpu) -> None:
        self.gpu, self.path, self.version, self.sizes = gpu, Path("/fake/libcudart.so.13"), 13000, {}

    def malloc(self, n: int) -> int:
        self.gpu.non_torch += n
        self.sizes[id(n)] = n
        return id(n)

    def free(self, ptr: int) -> None:
        if self.gpu.flaw != "cudafree_keeps_memory":
            self.gpu.non_torch -= self.sizes.pop(ptr)

    def synchronize(self) -> None:
        pass


def _fake_model(gpu: _Gpu):
    def model(x: _Tensor) -> _Tensor:
        h = _Tensor(gpu, x.rows * sc.FFN * 2)  # the FFN activation, freed inside the forward
        out = _Tensor(gpu, x.rows * sc.HIDDEN * 2)
        del h
        return out

    return model


def _run_fake(monkeypatch, flaw: str = "") -> sc.SelfcheckReport:
    gpu = _Gpu(flaw)
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(gpu))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: that column reads "-"
    monkeypatch.setattr(scc, "find_libcudart", lambda: Path("/fake/libcudart.so.13"))
    monkeypatch.setattr(scc, "CudaRuntime", lambda path, device: _FakeRuntime(gpu))
    monkeypatch.setattr(scc, "_mlp", lambda torch, device, dtype: _fake_model(gpu))
    return scr.selfcheck(0, life=False)


def test_simulated_gpu_passes_every_check(monkeypatch):
    r = _run_fake(monkeypatch)
    assert r.passed, sc.render_text(r)
    names = [c.name for c in r.checks]
    assert names == [
        "idle: snapshot costs nothing",
        "torch tensor 512 MiB",
        "torch tensor 512 MiB freed",
        "cudaMalloc 256 MiB (non-torch)",
        "cudaFree 256 MiB",
        *(f"graph capture bs={bs}" for bs in sc.LADDER),
        "graph ladder total (7 graphs, replayed)",
        "reset_peaks drops a 512 MiB peak",
        "transient 256 MiB after reset",
    ]
    by = {c.name: c for c in r.checks}
    assert by["cudaMalloc 256 MiB (non-torch)"].measured["non_torch"] == 256.0
    assert by["torch tensor 512 MiB freed"].measured["driver"] == -512.0
    assert by["graph capture bs=64"].measured["torch_reserved"] == 160.0  # 128 MiB activation + 32 MiB output
    assert by["graph ladder total (7 graphs, replayed)"].expected == 160.0
    assert by["transient 256 MiB after reset"].measured["torch_peak_allocated"] == 256.0
    assert r.libcudart == "/fake/libcudart.so.13 (runtime 13000)"


@pytest.mark.parametrize(
    ("flaw", "failing"),
    [
        (
            "graphs_outside_reserved",
            {*(f"graph capture bs={bs}" for bs in sc.LADDER), "graph ladder total (7 graphs, replayed)"},
        ),
        ("cudafree_keeps_memory", {"cudaFree 256 MiB"}),
        ("peak_reset_ignored", {"reset_peaks drops a 512 MiB peak", "transient 256 MiB after reset"}),
    ],
)
def test_simulated_flaws_fail_their_check(monkeypatch, flaw, failing):
    r = _run_fake(monkeypatch, flaw)
    assert not r.passed
    assert {c.name for c in r.checks if not c.passed} == failing, sc.render_text(r)


# --- the CUDA life's own code on a fake CUDA layer --------------------------------------------------------------
#
# `CudaLife` runs on a GPU only. Here its every line runs on the CPU against real torch ops on META tensors (shapes,
# no data) under a fake `torch.cuda` that books each tensor torch.empty/zeros makes, and each cudaMalloc, as driver
# memory. It measures nothing about a GPU (intermediates of meta ops are invisible to it, graph pools stay empty); it
# proves the code path calls torch the way it means to and that the explicitly sized lines come out of the pipeline.


class _MetaCuda:
    def __init__(self, real) -> None:
        self.real = real
        self.total = 81_559 * MiB
        self.live: dict[int, int] = {}  # id → bytes of the tensors torch.empty/zeros made
        self.raw = 0
        self.peak = 0
        self.resets = 0
        self.pools = 0
        self.capturing = False

    # -- torch.empty / zeros on "cuda": meta tensors booked as allocated (and reserved) memory
    def make(self, fn, *size, dtype=None, device=None):
        import weakref

        t = fn(*size, dtype=dtype, device="meta")
        n = t.untyped_storage().nbytes()
        key = id(t)
        self.live[key] = n
        self.peak = max(self.peak, self.allocated)
        weakref.finalize(t, self.live.pop, key, None)
        return t

    @property
    def allocated(self) -> int:
        return sum(self.live.values())

    def namespace(self):
        real, me = self.real, self

        class Stream:
            def __init__(self, device=None) -> None:
                pass

            def wait_stream(self, other) -> None:
                pass

        class CUDAGraph:
            def replay(self) -> None:
                pass

        @contextlib.contextmanager
        def graph(g, pool=None, stream=None):
            me.capturing = True
            try:
                yield
            finally:
                me.capturing = False

        def reset(device=None) -> None:
            me.resets += 1
            me.peak = me.allocated

        def pool_handle():
            me.pools += 1
            return (0, me.pools)

        def snapshot(include_traces=True):
            return [{"device": 0, "segment_pool_id": (0, me.pools), "total_size": 0}]

        def stats(d=None):
            return {
                "allocated_bytes.all.current": me.allocated,
                "reserved_bytes.all.current": me.allocated,
                "allocated_bytes.all.peak": me.peak,
                "reserved_bytes.all.peak": me.peak,
            }

        cuda = types.SimpleNamespace(
            is_available=lambda: True,
            is_initialized=lambda: True,
            current_device=lambda: 0,
            device_count=lambda: 1,
            synchronize=lambda *a: None,
            empty_cache=lambda: None,
            is_bf16_supported=lambda: True,
            mem_get_info=lambda d=None: (me.total - me.allocated - me.raw, me.total),
            memory_stats=stats,
            memory_reserved=lambda d=None: me.allocated,
            max_memory_reserved=lambda d=None: me.peak,
            reset_peak_memory_stats=reset,
            Stream=Stream,
            current_stream=lambda: Stream(),
            stream=lambda s: contextlib.nullcontext(),
            CUDAGraph=CUDAGraph,
            graph=graph,
            graph_pool_handle=pool_handle,
            memory_snapshot=snapshot,
            current_blas_handle=lambda: 0,
            get_device_properties=lambda d: types.SimpleNamespace(name="MetaGPU", total_memory=me.total, uuid="0"),
        )
        return types.SimpleNamespace(
            __version__=real.__version__,
            version=types.SimpleNamespace(cuda="13.0"),
            cuda=cuda,
            nn=real.nn,
            bfloat16=real.bfloat16,
            float16=real.float16,
            uint8=real.uint8,
            no_grad=real.no_grad,
            empty=lambda *s, dtype=None, device=None: me.make(real.empty, *s, dtype=dtype, device=device),
            zeros=lambda *s, dtype=None, device=None: me.make(real.zeros, *s, dtype=dtype, device=device),
        )


class _MetaRuntime:
    def __init__(self, gpu: _MetaCuda) -> None:
        self.gpu, self.sizes = gpu, {}

    def malloc(self, n: int) -> int:
        self.gpu.raw += n
        ptr = 0x7000_0000 + len(self.sizes)
        self.sizes[ptr] = n
        return ptr

    def free(self, ptr: int) -> None:
        self.gpu.raw -= self.sizes.pop(ptr)

    def synchronize(self) -> None:
        pass


def test_the_cuda_life_code_path_runs_on_a_fake_cuda_layer(monkeypatch, tmp_path):
    real = pytest.importorskip("torch")
    gpu = _MetaCuda(real)
    fake = gpu.namespace()
    from profiler.measure.probe import snapshot

    probe_init = snapshot.Probe.__init__

    def init(self) -> None:  # the real Probe, reading the fake CUDA layer
        probe_init(self)
        self._torch = fake

    monkeypatch.setattr(snapshot.Probe, "__init__", init)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    rt = _MetaRuntime(gpu)
    original_reset = fake.cuda.reset_peak_memory_stats
    truth = life.run_cuda_life(fake, 0, rt, tmp_path)
    assert fake.cuda.reset_peak_memory_stats is original_reset  # the probe's guard is taken off again
    assert gpu.raw == 0 and gpu.allocated == 0  # everything given back, the DeepEP stand-in included
    assert gpu.resets >= 1 and truth.decode_rungs and [bs for bs, _ in truth.decode_rungs] == list(life.DECODE_BS)
    assert truth.prefill_pool_mib == 0.0  # meta ops allocate nothing the fake can see: the pools stay empty
    assert truth.prelife["graph_exec_mib"] == 0.0 and truth.serving_peak_free_mib is not None
    res = life.judge_life_dir(tmp_path, truth)
    by = {c.name: c for c in res.checks}
    # what the life sizes explicitly comes out of the real Recorder → JSONL → reader → ledger exactly
    for name in (
        "life: probe records (one rank, every window, nothing in flight)",
        "life: the ledger closes",
        "life: weights",
        "life: kv_pool",
        "life: constant",
        "life: deepep_a2a",
        "life: unattributed",
        "life: headroom",
        "comparison: KV pool details from the configurator's result",
    ):
        assert by[name].passed, (name, by[name].note)
    assert by["life: weights"].measured["ledger"] == 1280.0 and by["life: deepep_a2a"].measured["ledger"] == 320.0
    # the serving peak: 1,280 of activations (the forward's meta intermediates are invisible here)
    assert by["life: activation"].measured["ledger"] == 1280.0
    assert by["life: prefill_graph peak inside its window"].measured == {"peak": 640.0, "resets seen": 1.0}
