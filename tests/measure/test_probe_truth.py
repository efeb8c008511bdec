"""Probe truth: sglang 0.5.23 worker lives replayed through the REAL probe (hooks, recorder, reader), then the
ledger and the comparison — every figure computed by hand below.

The traces come from tests/fakes/sim_worker.py: a simulated device (driver free, torch allocated/reserved/peak,
a cache that only empty_cache releases, CUDA-graph pools) under sglang's call sequence, each step citing the
sglang source it replays. The probe's JSONL (format v2) is written by memfrac's own Recorder; server_info.json and
load.json beside it are what `memfrac run` stores (the load the corrected driver plans from the worker's report).

Shared numbers (MiB), every scenario: H200 143,771; init_parallel makes the CUDA context (520) and NCCL (280)
→ free at start F = 143,771 − 800 = 142,971; weights 15,400 → 127,571 free when the KV budget is taken.
Llama-3.1-8B bf16 KV: 131,072 B per token (8 a MiB), context 131,072. The KV pool is sized as sglang sizes it
(sim_worker.sglang_sizes, sglang's own functions): budget = 127,571 − F × (1 − mfs); tokens = budget // 131,072 B;
the pool (tokens + 1) rows (memory_pool.py:2260); then out of the slack the request pools — req_to_token int32
[admitted + 1, 131,072 + 4] (admitted = clamp(int(tokens / 131,072 × 512), 2,048, 4,096), kv_cache_configurator.py
:3119) and the allocator's int64 index over the tokens. At the decode node's 0.929: budget 127,571 − 10,150.941 =
117,420.059 → 939,360 tokens, pool 939,361 / 8 = 117,420.125; 3,669 admitted → req_to_token 3,670 × 131,076 × 4 B
= 1,835.056 and the index 939,360 × 8 B = 7.167: request pools 1,842.223 → 8,308.652 free after the KV window.
Between hooked windows, after capture (no memfrac hook: `unattributed`): init_overlap's FutureMap 2 in every
life (scheduler.py:692), and the unified life's sampling prewarm 32 (cuBLAS workspace, scheduler.py:1167, with
SGLANG_ENABLE_GRAPH_POOL_BORROW). The EAGLE draft's multi-step attention backends (16) have their own hooked
window (eagle_worker_v2.py:284).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler.analyse.compare import compare, derive_variant, ladder_graph_estimate
from profiler.analyse.ledger import ledger
from profiler.core.measurement import Measurement
from profiler.measure.probe.reader import read_probe_dir
from profiler.measure.probe.recorder import Recorder
from profiler.model.heuristic import HeuristicInputs, reserve, rules_for
from tests.conftest import ROOT
from tests.fakes import sim_worker

F = 142971.0
R23 = rules_for("0.5.23")
LLAMA = dict(gpu_mem_mib=143771, architecture="LlamaForCausalLM")


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe")
    return {name: sim_worker.write_trace(name, root) for name in sim_worker.SCENARIOS}


def _m(d: Path, name: str, mode: str) -> Measurement:
    return sim_worker.measurement(d, name, mode)


def _probe(d: Path):
    return read_probe_dir(d / "probe")


def _lines(L) -> dict[str, float]:
    return {x.name: round(x.mib, 3) for x in L.lines}


def _after(L) -> dict[str, float]:
    return {x.name: round(x.mib, 3) for x in L.after_worst}


# --- the ledger closes, line by line --------------------------------------------------------------------


def test_unified_books_close_with_the_prefill_pool_as_activation(traces):
    """A unified worker at 0.903: budget 127,571 − 142,971 × 0.097 = 113,702.813 → 909,622 tokens, pool 909,623 / 8
    = 113,702.875; 3,553 admitted → req_to_token 3,554 × 131,076 × 4 B = 1,777.054 + index 909,622 × 8 B = 6.940 →
    request pools 1,783.994; free after the KV window 12,084.131. Attention 60 → 12,024.131 · eager (static 240; its
    700 warm-up cache emptied at the window's end) 11,784.131 · prefill capture: its warm-up peak 1,500 (GraphPool-
    Precarve.measure resets torch's peaks inside, runner_utils/pool.py) → 10,284.131 inside; its torch pool 500 →
    activation (memory_hook.py:385: torch memory is reused, chunks replay there) and 30 of graph execs outside torch →
    prefill_graph: 11,254.131 · decode growth beyond the prefill pool 448 → 10,806.131 · finalize 20 → 10,786.131 ·
    cuBLAS workspace 32 and FutureMap 2, both unhooked → 10,752.131 serving baseline · the corrected driver's eager
    decode of 3,344 requests at once: 2,600 → 8,152.131, the worst point. 15,400 + 113,702.875 + 1,783.994 + 320 +
    activation (500 + 2,600) 3,100 + 30 + 448 + 34 + 8,152.131 = 142,971 = F."""
    m = _m(traces["unified"], "unified", "null")
    L = ledger(m.ranks[0], "gpu")
    assert L.free_at_start_mib == F
    assert L.worst_point == "serving peak"
    assert _lines(L) == {"weights": 15400.0, "kv_pool": 113702.875, "request_pools": 1783.994, "constant": 320.0,
                         "activation": 3100.0, "parallel": 0.0, "decode_graph": 448.0, "prefill_graph": 30.0,
                         "unattributed": 34.0, "headroom": 8152.131}  # fmt: skip
    assert L.residual_mib == pytest.approx(0.0, abs=1e-6) and L.closes
    pre = m.ranks[0].phase("prefill_graph")
    assert pre.details["foreign_peak_resets"] == 1  # the precarve reset was seen and its peak kept
    assert (pre.details["captured"], pre.details["runner"]) == (True, "BreakableCudaGraphRunner")
    assert [c.source for c in ledger(m.ranks[0], "gpu").lines if c.name == "activation"] == [
        "prefill_graph [target] 500; runtime [target] 2,600"]


def test_decode_activation_includes_the_warmup_request(traces):
    """Defect e: sglang's first run_batch is its warm-up request (1,800 of activations, cached afterwards);
    a baseline taken after it would read the serving peak 2,300 as 500. Free: 8,308.652 after the KV window ·
    attention 60 · eager 240 → 8,008.652 · decode 948 (pool 900 at bs 256, then 20+10+6+4+2+2+2+2) → 7,060.652 ·
    finalize 20 · disaggregation_init 30 → 7,010.652 · init_overlap's FutureMap 2 (unhooked) → 7,008.652 = serving
    baseline · the driver's 1,778 requests decoding eager at once: peak 2,300 → 4,708.652. 15,400 + 117,420.125 +
    request pools 1,842.223 + constant (60+240+20+30) 350 + 948 + 2,300 + unattributed 2 + 4,708.652 = 142,971."""
    m = _m(traces["decode"], "decode", "decode")
    L = ledger(m.ranks[0], "gpu")
    assert L.worst_point == "serving peak"
    assert _lines(L) == {"weights": 15400.0, "kv_pool": 117420.125, "request_pools": 1842.223, "constant": 350.0,
                         "activation": 2300.0, "parallel": 0.0, "decode_graph": 948.0, "unattributed": 2.0,
                         "headroom": 4708.652}  # fmt: skip
    assert L.closes and L.residual_mib == pytest.approx(0.0, abs=1e-6)
    assert L.line("unattributed").source.startswith("changed between the end of disaggregation_init and serving")
    assert L.line("request_pools").source == ("kv_pool: sglang's request pools as allocated (req to token 1,835.1, "
                                              "allocator 7.2 MiB)")  # fmt: skip


def test_deepep_buffer_inside_the_decode_capture_is_charged_once(traces):
    """Defect a: the DeepEP buffer (2,500, NVSHMEM + cudaMalloc: outside torch, deep_ep/buffers/legacy.py) is
    created by the first MoE dispatch inside the decode capture, with a lazily created NCCL buffer (64).
    At 0.915: budget 127,571 − 142,971 × 0.085 = 115,418.465 → 923,347 tokens, pool 115,418.5; 3,606 admitted →
    request pools 1,803.555 + 7.045 = 1,810.600 → 10,341.900 after the KV window; − 300 → 10,041.900. The decode
    window: 3,512 = pool 948 (torch reserved Δ) + DeepEP 2,500 (nested window) + 64 non-torch (parallel) →
    6,529.900; − 20 − 30 − FutureMap 2 = 6,477.900 at the serving baseline; − 2,300 = 4,177.900. Charging the
    DeepEP buffer to deepep_a2a AND to the decode window's non-torch growth would count 2,500 twice."""
    m = _m(traces["decode-deepep"], "decode-deepep", "decode")
    L = ledger(m.ranks[0], "gpu")
    lines = _lines(L)
    assert lines["deepep_a2a"] == 2500.0 and lines["decode_graph"] == 948.0 and lines["parallel"] == 64.0
    assert lines["constant"] == 350.0 and lines["activation"] == 2300.0
    assert lines["headroom"] == 4177.9 and lines["unattributed"] == 2.0 and lines["request_pools"] == 1810.6
    assert L.residual_mib == pytest.approx(0.0, abs=1e-6)
    # the source names whose buffer it was (every backend's is charged to the one all-to-all term)
    assert [x.source for x in L.lines if x.name == "deepep_a2a"] == [
        "a2a_buffer (deepep) window Δ (driver), inside decode_graph"
    ]


def test_prefill_node(traces):
    """A PD prefill worker at 0.907: budget 127,571 − 142,971 × 0.093 = 114,274.697 → 914,197 tokens, pool
    114,274.75; 3,571 admitted → request pools 1,786.055 + 6.975 = 1,793.029 → 11,503.221 after the KV window ·
    attention 60 · eager 240 → 11,203.221 · the prefill capture: its warm-up's 1,200 stay cached while the graph's
    private pool takes 900 more (a private pool does not reuse the default pool's blocks): peak 2,100 inside →
    9,103.221, the worst point; after it the pool's 900 (activation: chunks replay there, memory_hook.py:385) and
    the execs' 40 (prefill_graph: all the term counts). The books there hold 15,400 + 114,274.75 + 1,793.029 +
    constant 300 + activation at its peak 2,100 + 9,103.221 = 142,971; finalize 20, disaggregation_init 30, the
    FutureMap 2 and the chunks' 150 above the serving baseline come after it."""
    m = _m(traces["prefill"], "prefill", "prefill")
    L = ledger(m.ranks[0], "gpu")
    assert L.worst_point == "peak inside prefill_graph"
    assert _lines(L) == {"weights": 15400.0, "kv_pool": 114274.75, "request_pools": 1793.029, "constant": 300.0,
                         "activation": 2100.0, "parallel": 0.0, "prefill_graph": 0.0, "headroom": 9103.221}  # fmt: skip
    assert _after(L) == {"constant": 50.0, "activation": 150.0, "parallel": 0.0, "unattributed": 2.0}
    assert L.closes


def test_eagle_draft_phases_are_tagged_and_charged_once(traces):
    """Defect d: the draft ModelRunner (eagle_worker_v2.py: TpModelWorker(is_draft_worker=True)) repeats
    baseline, weights, kv_pool, attention backends, eager runner and finalize; its graphs are built by
    EAGLEDraftCudaGraphRunner / EAGLEDraftExtendCudaGraphRunner.__init__ (their own capture_one_shape).
    Weights 15,400 + draft 900 → 126,671 free at the budget; at 0.903 the budget 126,671 − 13,868.187 =
    112,802.813 is divided by the target's and the draft's bytes per token together (131,072 + 4,096: pool_
    configurator.py:259-300) → 875,076 tokens; the target's pool 875,077 × 131,072 B = 109,384.625, the draft's
    875,077 × 4,096 B = 3,418.270 (kv_pool 112,802.895); 3,418 admitted, req_to_token 3,419 × (131,072 + 4 + 4
    draft tokens) × 4 B = 1,709.604 + index 6.676 = 1,716.281, built once (the draft is handed the target's pools).
    Constant 60 + 240 + 20; activation = the prefill pool 500 + serving 1,900; the target's verify graph 1,144
    (1,100+20+10+6+4+2+2); speculative = draft attention 20 + the draft's multi-step attention backends 16
    (EagleDraftWorker.init_attention_backend, eagle_worker_v2.py:284: hooked, its own window — not unattributed) +
    draft eager 50 + draft graph 300 (280+10+10) + draft extend 150 (140+10) = 536; init_overlap's FutureMap 2
    unattributed. Headroom 142,971 − 16,300 − 112,802.895 − 1,716.281 − 320 − 2,400 − 1,144 − 536 − 2 =
    7,749.825."""
    m = _m(traces["eagle"], "eagle", "null")
    r = m.ranks[0]
    assert r.phase("weights").used_mib == 15400.0  # the target's, not the draft's (which sglang runs later)
    assert r.phase("weights", role="draft").used_mib == 900.0
    assert r.phase("verify_graph") is not None and r.phase("decode_graph") is None
    assert [lp.bs for lp in r.phase("draft_graph", role="draft").ladder] == [64, 32, 16]
    assert [lp.bs for lp in r.phase("draft_extend_graph", role="draft").ladder] == [64, 32]  # defect n
    assert [lp.bs for lp in r.phase("verify_graph").ladder] == [64, 32, 16, 8, 4, 2, 1]
    # the draft ModelRunner's backends, then the multi-step ones: two sibling draft windows, in that order
    backends = [(p.role, p.used_mib) for p in r.phases_named("attention_backends")]
    assert backends == [("target", 60.0), ("draft", 20.0), ("draft", 16.0)]
    assert "request_pools_mib" not in r.phase("kv_pool", role="draft").details  # handed the target's
    L = ledger(r, "gpu")
    assert _lines(L) == {"weights": 16300.0, "kv_pool": 112802.895, "request_pools": 1716.281, "constant": 320.0,
                         "activation": 2400.0, "parallel": 0.0, "decode_graph": 1144.0, "prefill_graph": 0.0,
                         "speculative": 536.0, "unattributed": 2.0, "headroom": 7749.825}  # fmt: skip
    assert "attention_backends [draft] 16" in L.line("speculative").source
    assert L.line("unattributed").source.startswith("changed between the end of draft_extend_graph and serving")
    assert L.residual_mib == pytest.approx(0.0, abs=1e-6)


def test_removing_the_nested_subtraction_breaks_the_books(traces, monkeypatch):
    """The closure check is not a tautology: if a parent window kept what its nested window took, the
    DeepEP buffer would be counted twice and the lines would exceed F by exactly 2,500."""
    from profiler.analyse import ledger as lg

    r = _m(traces["decode-deepep"], "x", "decode").ranks[0]
    monkeypatch.setattr(lg, "own_usage", lambda window, nested: window)
    L = lg.ledger(r, "gpu")
    assert L.residual_mib == -2500.0 and not L.closes


# --- probe records ----------------------------------------------------------------------------------------


def test_init_parallel_has_no_gpu_usage(traces):
    """Defect i: init_parallel begins before the CUDA context exists (no driver reading) and ends with one:
    two readings of different layers give no usage — never an RSS delta stored as a GPU figure."""
    r = _probe(traces["decode"]).ranks[0]
    p = r.phase("init_parallel")
    assert p.before.free_mib is None and p.after.free_mib == F
    assert p.used_mib is None


def test_kv_pool_details_come_from_the_configurator(traces):
    """Defect g, and issue 26.2: KVCacheConfigResult.max_total_num_tokens, the pool's mem_usage (GiB), the admitted
    requests, and the request pools read off sglang's objects (kv_cache_configurator.py:478-482): req_to_token's
    shape [3,670, 131,076] → 3,670 × 131,076 × 4 B = 1,835.056 MiB, the allocator's free_pages 939,360 × 8 B =
    7.167 MiB; the budget (_profile_available_bytes) 117,420.059 MiB."""
    p = _probe(traces["decode"]).ranks[0].phase("kv_pool")
    d = p.details
    assert d["kv_tokens"] == 939360 and d["kv_mib"] == 117420.125 and d["max_running_requests"] == 3669
    assert (d["req_to_token_rows"], d["req_to_token_cols"], d["context_len"]) == (3670, 131076, 131072)
    assert d["req_to_token_mib"] == pytest.approx(1835.056, abs=1e-3)
    assert d["allocator_mib"] == pytest.approx(7.167, abs=1e-3)
    assert d["request_pools_mib"] == pytest.approx(1842.223, abs=1e-3)
    assert d["budget_mib"] == pytest.approx(117420.059, abs=1e-3)


def test_the_dp_controller_leaves_no_probe_file(tmp_path):
    """Defect h: data_parallel_controller.py imports the scheduler module and loads plugins, but runs no phase:
    the recorder opens its file on the first record only."""
    rec = Recorder(str(tmp_path))
    rec.start_record = {"type": "start", "kind": "gpu"}
    assert list(tmp_path.iterdir()) == []
    rec.write({"type": "error", "error": "x"})
    assert [p.name for p in tmp_path.iterdir()] == [f"probe-{rec.pid}.jsonl"]


def test_a_phaseless_probe_file_is_not_a_rank(traces, tmp_path):
    """Older probes wrote a start record for the DP controller; its file must not become the primary rank."""
    d = tmp_path / "w"
    d.mkdir()
    for p in (traces["decode"] / "probe").glob("*.jsonl"):
        (d / p.name).write_text(p.read_text())
    (d / "probe-1.jsonl").write_text(json.dumps({"v": 1, "type": "start", "pid": 1, "kind": "gpu"}) + "\n")
    run = read_probe_dir(d)
    assert [r.pid for r in run.ranks] == [2001]


def test_decode_ladder_is_in_capture_order(traces):
    """Defect c: reversed(self.capture_bs) (decode_cuda_graph_runner.py): bs 256 first; the cumulative MiB
    grows as bs falls: 900, 920, 930, 936, 940, 942, 944, 946, 948."""
    m = _m(traces["decode"], "decode", "decode")
    c = compare(m, reserve(HeuristicInputs(mode="decode", **LLAMA), R23))
    assert c.ladder == ((256, 900.0), (128, 920.0), (64, 930.0), (32, 936.0), (16, 940.0), (8, 942.0),
                        (4, 944.0), (2, 946.0), (1, 948.0))  # fmt: skip


# --- the comparison, by hand --------------------------------------------------------------------------------


def test_decode_node_comparison(traces):
    """0.5.23 on a decode node (H200, Llama-3.1-8B): activation max(256 × 1, 2048) × 1.5 = 3,072; 512 + 3,072 +
    128 + decode 256 × 2 = 512 → 4,224 < 10,240 → floor top-up 6,016; fraction round(133,531/143,771, 3) = 0.929.
    slack = F × (1 − 0.929) = 142,971 × 0.071 = 10,150.941, of which the request pools take 1,842.223: room
    8,308.718; used after KV = 8,308.652 − 4,708.652 = 3,600 (the FutureMap's 2 unattributed included). The load
    reached the worst case: the 1,778 requests the pool holds at once (of 3,669 admitted) decoded together, eager.
    Wasted = (4,708.652 − 1,024) MiB at 117,420.125 × 2^20 / 939,360 = 131,072.14 B per token → 29,477 tokens.
    Recommended by sglang's sizing replayed (issue 26.2): at 0.954 the budget 127,571 − 142,971 × 0.046 =
    120,994.334 → 967,954 tokens (+28,594 × 131,072 B = 3,574.25 MiB of pool: the cell, 117,420.125 MiB over the
    pool's 939,361 rows), 3,781 admitted → req_to_token 3,782 × 131,076 × 4 B = 1,891.091 + index 7.385 (+56.254 out
    of the slack): headroom 4,708.652 − 3,574.25 − 56.254 = 1,078.1 ≥ 1,024; at 0.955 (969,098 tokens, 3,785
    admitted) 933.1 < 1,024 → 0.954. The old rule, floor((1 − (3,600 + 1,024)/142,971) × 1000)/1000 = 0.967,
    leaves −810 there (43,463 more tokens: 5,432.9; 3,839 admitted: 85.3 more of request pools)."""
    m = _m(traces["decode"], "decode", "decode")
    res = reserve(HeuristicInputs(mode="decode", **LLAMA), R23)
    assert res.mem_fraction_static == 0.929
    c = compare(m, res)
    assert c.free_at_start_mib == F and c.mfs == 0.929
    assert c.slack_mib == pytest.approx(10150.941)
    assert c.request_pools_mib == pytest.approx(1842.223, abs=1e-3)
    assert c.room_mib == pytest.approx(8308.718, abs=1e-3)
    assert c.used_after_kv_mib == pytest.approx(3600.0) and c.need_mib == pytest.approx(3600.0)
    # startup headroom: the serving baseline, 7,010.652 after disaggregation_init − init_overlap's FutureMap 2
    assert c.headroom_mib == pytest.approx(4708.652, abs=1e-3)
    assert c.headroom_startup_mib == pytest.approx(7008.652, abs=1e-3)
    assert c.kv_tokens == 939360 and c.kv_bytes_per_token == pytest.approx(131072.14, abs=0.01)
    assert c.wasted_kv_tokens == 29477
    assert c.load_reached is True and c.pending_mib == 0.0
    assert c.recommended_mfs == 0.954
    assert c.recommended_basis.startswith("sglang's sizing replayed at 0.954: 967,954 tokens admit 3,781 requests")
    assert "headroom 1,078 MiB ≥ margin 1,024" in c.recommended_basis
    t = {x.term: x for x in c.terms}
    assert (t["activation"].reserved_mib, t["activation"].measured_mib, t["activation"].verdict) == (3072.0, 2300.0,
                                                                                                    "fits")  # fmt: skip
    assert (t["decode_graph"].measured_mib, t["decode_graph"].verdict) == (948.0, "under")  # 948 > 512 + 2
    assert (t["constant"].measured_mib, t["constant"].verdict) == (350.0, "fits")
    # floor: the other terms 4,224; used 3,600 → none of the 6,016 top-up consumed
    assert (t["floor_topup"].measured_mib, t["floor_topup"].verdict) == (0.0, "over")
    assert c.ledger is not None and c.ledger.closes


def test_startup_headroom_counts_the_allocations_after_the_last_window(traces):
    """The end of startup is the serving baseline (ledger: the runtime window's before): decode 7,010.652 −
    FutureMap 2 = 7,008.652; unified 10,786.131 − cuBLAS workspace 32 − FutureMap 2 = 10,752.131. It was the free
    after the last hooked window, leaving out what sglang makes after it and before serving."""
    dec = compare(_m(traces["decode"], "decode", "decode"), reserve(HeuristicInputs(mode="decode", **LLAMA), R23))
    uni = compare(_m(traces["unified"], "unified", "null"), reserve(HeuristicInputs(mode="null", **LLAMA), R23))
    assert dec.headroom_startup_mib == pytest.approx(7008.652, abs=1e-3)
    assert uni.headroom_startup_mib == pytest.approx(10752.131, abs=1e-3)


def test_deepep_decode_comparison(traces):
    """DeepEP decode node: + 2,048 after the floor → 12,288 → round(131,483/143,771, 3) = 0.915; the 2,500
    buffer is under its 2,048 reserve; parallel (tp 1: 128) vs 64 fits."""
    m = _m(traces["decode-deepep"], "dd", "decode")
    res = reserve(HeuristicInputs(mode="decode", moe_a2a_backend="deepep", **LLAMA), R23)
    assert res.mem_fraction_static == 0.915
    t = {x.term: x for x in compare(m, res).terms}
    assert (t["deepep_a2a"].reserved_mib, t["deepep_a2a"].measured_mib, t["deepep_a2a"].verdict) == (
        2048.0, 2500.0, "under")  # fmt: skip
    assert (t["parallel"].measured_mib, t["parallel"].verdict) == (64.0, "fits")
    assert t["decode_graph"].measured_mib == 948.0


def test_unified_graph_terms_mean_what_sglang_means(traces):
    """Issue 26.4: each family on its own row, by sglang's meaning (memory_hook.py:364-389). The prefill term counts
    only the graph's non-torch memory — 58 buckets up to 8,192 × 8 = 464 vs the execs' 30 → fits; its torch pool (500,
    which the decode graphs reuse: runner_utils/pool.py "later backends reuse the same handle") is activation memory;
    the decode term 256 × 2 = 512 vs the growth beyond the shared pool, 448 → fits. Activation: max(8,192, 2,048)
    × 1.5 = 12,288 vs 500 + 2,600 = 3,100, the load having reached both worst cases (a chunk of 8,192 tokens; the
    3,344 requests the pool holds at once of 3,553 admitted) → over (12,288 − 3,100 > max(512, 6,144))."""
    m = _m(traces["unified"], "unified", "null")
    res = reserve(HeuristicInputs(mode="null", **LLAMA), R23)
    assert res.mem_fraction_static == 0.903
    c = compare(m, res)
    t = {x.term: x for x in c.terms}
    assert "prefill_graph+decode_graph" not in t
    assert (t["prefill_graph"].reserved_mib, t["prefill_graph"].measured_mib, t["prefill_graph"].verdict) == (
        464.0, 30.0, "fits")  # fmt: skip
    assert (t["decode_graph"].reserved_mib, t["decode_graph"].measured_mib, t["decode_graph"].verdict) == (
        512.0, 448.0, "fits")  # fmt: skip
    assert (t["activation"].reserved_mib, t["activation"].measured_mib, t["activation"].verdict) == (
        12288.0, 3100.0, "over")  # fmt: skip
    # constant = attention 60 + eager 240 (its warm-up cache emptied at its end, not moved into the graphs) + 20
    assert t["constant"].measured_mib == 320.0
    assert c.load_reached is True and len(c.load) == 2


def test_eagle_speculative_row(traces):
    """sglang ≥ 0.5.14 reserves nothing for the draft's graphs and buffers: 0 vs 536 (20 + 16 + 50 + 300 + 150)
    → under."""
    m = _m(traces["eagle"], "eagle", "null")
    res = reserve(HeuristicInputs(mode="null", speculative_algorithm="EAGLE", speculative_num_draft_tokens=4,
                                  **LLAMA), R23)  # fmt: skip
    c = compare(m, res)
    spec = next(x for x in c.terms if x.term == "speculative")
    assert (spec.reserved_mib, spec.measured_mib, spec.verdict) == (0.0, 536.0, "under")
    assert c.weights_mib == 15400.0


def test_derived_variant_reads_the_whole_capture_from_the_last_rung(traces):
    """Defect c: a max_bs 128 variant of the decode run. Capture order (256, 900) … (1, 948): the whole
    capture is the last rung, 948 (reading the first, 900, was the bug). Estimate for max_bs 128: the top
    increment scaled 900 × 128/256 = 450, plus the increments of every size below 128: 10+6+4+2+2+2+2 = 28 →
    478. Used after KV moves by 478 − 948 = −470: 3,600 − 470 = 3,130."""
    m = _m(traces["decode"], "decode", "decode")
    res = reserve(HeuristicInputs(mode="decode", **LLAMA), R23)
    c = compare(m, res)
    assert ladder_graph_estimate(c.ladder, 128) == 478.0
    res128 = reserve(HeuristicInputs(mode="decode", decode_max_bs=128, **LLAMA), R23)
    d = derive_variant(c, res128, "decode-128", 128)
    assert d.used_after_kv_mib == pytest.approx(3130.0)
    assert d.ladder[0] == (128, 920.0) and d.ledger is None
    # max_bs 128 still sits under the 10 GiB floor: same fraction (0.929), same slack → headroom moves only by the
    # graph: 4,708.652 + 470 = 5,178.652 MiB; judged against the measured serving peak 2,300: 5,178.652 > 2 × 2,300
    # and 5,178.652 − 2,300 = 2,878.652 > 2,048 → wasteful (the same rule as a measured run's verdict)
    assert res128.mem_fraction_static == 0.929 and d.headroom_mib == pytest.approx(5178.652, abs=1e-3)
    assert d.verdict == "wasteful" and "(estimated)" in d.reason and "measured runtime peak" in d.reason
    # served (the peak is inside the headroom): unused 5,178.652 − 1,024 = 4,154.652 MiB at 131,072.14 B a token =
    # 33,237 tokens; a variant has no request pools of its own to replay: floor((1 − (3,130 + 1,024)/142,971) ×
    # 1000)/1000 = floor(970.94)/1000 = 0.970, said so
    assert (round(d.kv_unused_mib, 3), d.wasted_kv_tokens, d.recommended_mfs) == (4154.652, 33237, 0.970)
    assert "not replayed (a variant read from another start's ladder)" in d.recommended_basis


# --- the store keeps the books ----------------------------------------------------------------------------


def test_results_directory_holds_the_ledger_and_the_ladder_in_capture_order(traces, tmp_path):
    """ledger.parquet: the decode run's lines sum to F per rank; ladder.parquet keeps capture order
    (capture_index 0 = bs 256); results.parquet carries the recommendation's basis, the room and the load."""
    from profiler.results.store import RunContext, Store, load_ladder, load_ledger, load_results

    m = _m(traces["decode"], "decode", "decode")
    c = compare(m, reserve(HeuristicInputs(mode="decode", **LLAMA), R23))
    st = Store(tmp_path / "R")
    st.init()
    st.add([(m, c, RunContext())], run_key="decode")
    led = load_ledger(tmp_path / "R")
    # unattributed: the FutureMap's 2 (init_overlap, unhooked); the request pools their own line
    lines = {"weights", "kv_pool", "request_pools", "constant", "activation", "parallel", "decode_graph",
             "unattributed", "headroom"}  # fmt: skip
    assert set(led["line"]) == lines
    assert led["mib"].sum() == pytest.approx(F) and led["closes"].all() and led["judged"].all()
    lad = load_ladder(tmp_path / "R")
    assert list(lad["bs"]) == [256, 128, 64, 32, 16, 8, 4, 2, 1] and list(lad["capture_index"]) == list(range(9))
    res = load_results(tmp_path / "R")
    assert res["ledger_closes"].all() and (res["recommended_mfs"] == 0.954).all()
    assert res["load_reached"].all() and res["recommended_basis"].str.startswith("sglang's sizing replayed").all()
    total = res[res["term"] == "total"].iloc[0]
    assert (total["reserved_mib"], total["measured_mib"], total["term_verdict"]) == (
        pytest.approx(8308.718, abs=1e-3), pytest.approx(3600.0), "fits")  # fmt: skip


def test_a_log_names_the_inputs_it_left_to_defaults():
    """A log whose server_args print no cuda_graph_max_bs / chunked_prefill_size: those came from defaults."""
    from profiler.core.provenance import defaulted_inputs

    m = Measurement(id="x", source="log", args={"tp_size": 8, "chunked_prefill_size": 8192, "cuda_graph_bs": [1, 2]})
    m.identity.gpu_total_how = "first avail mem 139.80 GiB ≈ H200"
    assert defaulted_inputs(m) == (
        "decode_backend,disable_cuda_graph,max_prefill_tokens,max_running_requests,speculative_num_draft_tokens,"
        "prefill_max_bs,prefill_bs,prefill_backend,max_total_tokens,pp,attn_dp,moe_a2a_backend,deepep_mode,"
        "deepep_tokens,gpu_mem_mib"
    )
    assert defaulted_inputs(Measurement(id="y", source="log")) is None  # no args at all: unknown


# --- term verdict boundaries, both sides -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reserved", "measured", "resolution", "verdict"),
    [
        (1000.0, 1010.24, 10.24, "fits"),  # measured ≤ reserved + resolution: within what the readings resolve
        (1000.0, 1010.25, 10.24, "under"),
        (1000.0, 1000.0, 0.0, "fits"),
        (1000.0, 1000.01, 0.0, "under"),
        (2000.0, 1000.0, 0.0, "fits"),  # over when the slack exceeds max(512, half the reserve) = 1,000
        (2000.0, 999.99, 0.0, "over"),
        (800.0, 288.0, 0.0, "fits"),  # max(512, 400) = 512: 800 − 288 = 512 is not more
        (800.0, 287.99, 0.0, "over"),
        (800.0, None, 0.0, "unobservable"),
    ],
)
def test_term_verdict_boundaries(reserved, measured, resolution, verdict):
    from profiler.analyse.compare import _verdict

    assert _verdict(reserved, measured, resolution) == verdict


def test_post_capture_sizing_gain_of_a_measured_decode_run(traces):
    """What SGLANG_ENABLE_POST_CAPTURE_KV_SIZING would have given the simulated decode run (Llama-3.1-8B, H200):
    post-capture reserve 1,536 + 128 = 1,664 → round(142,107/143,771, 3) = 0.988 vs 0.929. With F 142,971,
    W 15,400, U (used after the pool) 3,600: classic pool 142,971 × 0.929 − 15,400 = 117,420.06 MiB → 939,360
    tokens (× 8 per MiB, floored); post-capture 142,971 × 0.988 − 15,400 − 3,600 = 122,255.35 MiB → 978,042
    tokens: +38,682 tokens; no OOM avoided (3,600 < 142,971 × 0.071 = 10,150.94)."""
    from profiler.model.scenario import load_scenarios
    from profiler.sweep.sweep import post_capture_columns

    s = load_scenarios(ROOT / "scenarios" / "llama8b-h200-decode.toml")[0]
    m = _m(traces["decode"], "decode", "decode")
    res = reserve(HeuristicInputs(mode="decode", **LLAMA), R23)
    cols = post_capture_columns(s, compare(m, res), res)
    assert cols["post_capture_kv_tokens"] == 38682 and cols["post_capture_oom_avoided"] is False
    assert "122,255 MiB vs classic" in cols["post_capture_how"]
