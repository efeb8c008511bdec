"""Probe truth: sglang 0.5.23 worker lives replayed through the REAL probe (hooks, recorder, reader), then the
ledger and the comparison — every figure computed by hand below.

The traces come from tests/fakes/sim_worker.py: a simulated device (driver free, torch allocated/reserved/peak,
a cache that only empty_cache releases, CUDA-graph pools) under sglang's call sequence, each step citing the
sglang source it replays. The probe's JSONL (format v2) is written by memfrac's own Recorder.

Shared numbers (MiB), every scenario: H200 143,771; init_parallel makes the CUDA context (520) and NCCL (280)
→ free at start F = 143,771 − 800 = 142,971; weights 15,400. Llama-3.1-8B bf16 KV: 131,072 B per token.
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
from profiler.core.measurement import Identity, Measurement
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
    run = read_probe_dir(d)
    return Measurement(id=name, source="probe", memory_kind="gpu", origin=str(d), scenario=name,
                       identity=Identity(gpu_total_mib=143771.0, mode=mode), ranks=run.ranks)  # fmt: skip


def _lines(L) -> dict[str, float]:
    return {x.name: x.mib for x in L.lines}


def _after(L) -> dict[str, float]:
    return {x.name: x.mib for x in L.after_worst}


# --- the ledger closes, line by line --------------------------------------------------------------------


def test_unified_worst_point_is_the_prefill_warmup_peak(traces):
    """Defect f: capture_prefill_graph calls get_available_gpu_memory(empty_cache=True) after capturing
    (cuda_graph_setup.py), so the largest bucket's warm-up (1,500) is gone from the end reading; and
    GraphPoolPrecarve.measure (runner_utils/pool.py) resets torch's peaks inside the window.

    Free after each window: weights 127,571 · KV (117,000 + req_to_token 400) 10,171 · attention 60 → 10,111 ·
    eager (static 240; its 700 warm-up cache emptied at the window's end) 9,871 · prefill: warm-up peak
    9,871 − 1,500 = 8,371, pool 500 → 9,371 · decode growth beyond the prefill pool 448 → 8,923 · finalize 20
    → 8,903 · sampling prewarm's cuBLAS workspace 32 and init_overlap's FutureMap 2, both unhooked → 8,869
    serving baseline · serving peak 300 → 8,569. Worst = 8,371, inside the prefill capture: the books there
    hold 15,400 + 117,400 + constant (60 + 240) + prefill at its peak 1,500 + headroom 8,371 = 142,971 = F;
    the 34 unattributed come after it (after_worst), with the decode growth, finalize and serving."""
    m = _m(traces["unified"], "unified", "null")
    L = ledger(m.ranks[0], "gpu")
    assert L.free_at_start_mib == F
    assert L.worst_point == "peak inside prefill_graph"
    assert _lines(L) == {"weights": 15400.0, "kv_pool": 117400.0, "constant": 300.0, "parallel": 0.0,
                         "prefill_graph": 1500.0, "headroom": 8371.0}  # fmt: skip
    assert _after(L) == {"constant": 20.0, "activation": 300.0, "parallel": 0.0, "decode_graph": 448.0,
                         "unattributed": 34.0}  # fmt: skip
    assert L.residual_mib == 0.0 and L.closes
    pre = m.ranks[0].phase("prefill_graph")
    assert pre.details["foreign_peak_resets"] == 1  # the precarve reset was seen and its peak kept


def test_decode_activation_includes_the_warmup_request(traces):
    """Defect e: sglang's first run_batch is its warm-up request (1,800 of activations, cached afterwards);
    a baseline taken after it would read the serving peak 2,300 as 500. Free: … eager 9,871 · decode 948
    (pool 900 at bs 256, then 20+10+6+4+2+2+2+2) → 8,923 · finalize 20 → 8,903 · disaggregation_init 30 →
    8,873 · init_overlap's FutureMap 2 (unhooked) → 8,871 = serving baseline · peak 8,871 − 2,300 = 6,571.
    15,400 + 117,400 + constant (60+240+20+30) 350 + 948 + 2,300 + unattributed 2 + 6,571 = 142,971."""
    m = _m(traces["decode"], "decode", "decode")
    L = ledger(m.ranks[0], "gpu")
    assert L.worst_point == "serving peak"
    assert _lines(L) == {"weights": 15400.0, "kv_pool": 117400.0, "constant": 350.0, "activation": 2300.0,
                         "parallel": 0.0, "decode_graph": 948.0, "unattributed": 2.0, "headroom": 6571.0}  # fmt: skip
    assert L.closes and L.residual_mib == 0.0
    assert L.line("unattributed").source.startswith("changed between the end of disaggregation_init and serving")


def test_deepep_buffer_inside_the_decode_capture_is_charged_once(traces):
    """Defect a: the DeepEP buffer (2,500, NVSHMEM + cudaMalloc: outside torch, deep_ep/buffers/legacy.py) is
    created by the first MoE dispatch inside the decode capture, with a lazily created NCCL buffer (64).
    The decode window: 9,871 → 6,359 = 3,512 = pool 948 (torch reserved Δ) + DeepEP 2,500 (nested window)
    + 64 non-torch (parallel). Charging the DeepEP buffer to deepep_a2a AND to the decode window's non-torch
    growth would count 2,500 twice and the books would not close."""
    m = _m(traces["decode-deepep"], "decode-deepep", "decode")
    L = ledger(m.ranks[0], "gpu")
    lines = _lines(L)
    assert lines["deepep_a2a"] == 2500.0 and lines["decode_graph"] == 948.0 and lines["parallel"] == 64.0
    assert lines["constant"] == 350.0 and lines["activation"] == 2300.0
    # 6,359 − 20 − 30 − FutureMap 2 = 6,307 at the serving baseline; − 2,300 = 4,007
    assert lines["headroom"] == 4007.0 and lines["unattributed"] == 2.0
    assert L.residual_mib == 0.0
    # the source names whose buffer it was (every backend's is charged to the one all-to-all term)
    assert [x.source for x in L.lines if x.name == "deepep_a2a"] == [
        "a2a_buffer (deepep) window Δ (driver), inside decode_graph"
    ]


def test_prefill_node(traces):
    """A PD prefill worker: KV 110,000 + 400 → 17,171 · attention 60 · eager 240 → 16,871 · prefill pool 500
    (warm-up 1,200: peak at 15,671) → 16,371 · finalize 20 · disaggregation_init 30 → 16,321 · FutureMap 2
    (unhooked) → 16,319 · chunked-prefill activations 3,000 → 13,319. 15,400 + 110,400 + 350 + 500 + 3,000 +
    unattributed 2 + 13,319 = 142,971."""
    m = _m(traces["prefill"], "prefill", "prefill")
    L = ledger(m.ranks[0], "gpu")
    assert _lines(L) == {"weights": 15400.0, "kv_pool": 110400.0, "constant": 350.0, "activation": 3000.0,
                         "parallel": 0.0, "prefill_graph": 500.0, "unattributed": 2.0, "headroom": 13319.0}  # fmt: skip
    assert L.closes


def test_eagle_draft_phases_are_tagged_and_charged_once(traces):
    """Defect d: the draft ModelRunner (eagle_worker_v2.py: TpModelWorker(is_draft_worker=True)) repeats
    baseline, weights, kv_pool, attention backends, eager runner and finalize; its graphs are built by
    EAGLEDraftCudaGraphRunner / EAGLEDraftExtendCudaGraphRunner.__init__ (their own capture_one_shape).
    weights 15,400 + draft 900; KV 110,400 + draft 3,000; constant 60 + 240 + 20; prefill 500; the target's
    verify graph 1,144 (1,100+20+10+6+4+2+2); speculative = draft attention 20 + the draft's multi-step
    attention backends 16 (EagleDraftWorker.init_attention_backend, eagle_worker_v2.py:284: hooked, its own
    window — not unattributed) + draft eager 50 + draft graph 300 (280+10+10) + draft extend 150 (140+10) = 536;
    init_overlap's FutureMap 2 unattributed; activation 1,900. Headroom 142,971 − 16,300 − 113,400 − 320 − 500
    − 1,144 − 536 − 2 − 1,900 = 8,869."""
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
    L = ledger(r, "gpu")
    assert _lines(L) == {"weights": 16300.0, "kv_pool": 113400.0, "constant": 320.0, "activation": 1900.0,
                         "parallel": 0.0, "decode_graph": 1144.0, "prefill_graph": 500.0, "speculative": 536.0,
                         "unattributed": 2.0, "headroom": 8869.0}  # fmt: skip
    assert "attention_backends [draft] 16" in L.line("speculative").source
    assert L.line("unattributed").source.startswith("changed between the end of draft_extend_graph and serving")
    assert L.residual_mib == 0.0


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
    r = read_probe_dir(traces["decode"]).ranks[0]
    p = r.phase("init_parallel")
    assert p.before.free_mib is None and p.after.free_mib == F
    assert p.used_mib is None


def test_kv_pool_details_come_from_the_configurator(traces):
    """Defect g: KVCacheConfigResult.max_total_num_tokens and the pool's mem_usage (GiB, kv_cache_configurator.py)
    → 117,000 MiB × 2^20 / 131,072 B = 936,000 tokens."""
    p = read_probe_dir(traces["decode"]).ranks[0].phase("kv_pool")
    assert p.details["kv_tokens"] == 936000 and p.details["kv_mib"] == 117000.0


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
    for p in traces["decode"].glob("*.jsonl"):
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
    slack = F × (1 − 0.929) = 142,971 × 0.071 = 10,150.941; used after KV = 10,171 − 6,571 = 3,600 (the
    FutureMap's 2 unattributed included); wasted = (6,571 − 1,024) MiB × 2^20 / 131,072 B = 5,547 × 8 = 44,376
    tokens; recommended = floor((1 − (3,600 + 1,024)/142,971) × 1000)/1000 = floor(967.66)/1000 = 0.967."""
    m = _m(traces["decode"], "decode", "decode")
    res = reserve(HeuristicInputs(mode="decode", **LLAMA), R23)
    assert res.mem_fraction_static == 0.929
    c = compare(m, res)
    assert c.free_at_start_mib == F
    assert c.slack_mib == pytest.approx(10150.941)
    assert c.used_after_kv_mib == 3600.0
    # startup headroom: the serving baseline, 8,873 after disaggregation_init − init_overlap's FutureMap 2 = 8,871
    assert c.headroom_mib == 6571.0 and c.headroom_startup_mib == 8871.0
    assert c.kv_bytes_per_token == 131072.0 and c.kv_tokens == 936000
    assert c.wasted_kv_tokens == 44376
    assert c.recommended_mfs == 0.967
    t = {x.term: x for x in c.terms}
    assert (t["activation"].reserved_mib, t["activation"].measured_mib, t["activation"].verdict) == (3072.0, 2300.0,
                                                                                                    "fits")  # fmt: skip
    assert (t["decode_graph"].measured_mib, t["decode_graph"].verdict) == (948.0, "under")  # 948 > 512 + 2
    assert (t["constant"].measured_mib, t["constant"].verdict) == (350.0, "fits")
    # floor: the other terms 4,224; used 3,600 → none of the 6,016 top-up consumed
    assert (t["floor_topup"].measured_mib, t["floor_topup"].verdict) == (0.0, "over")
    assert c.ledger is not None and c.ledger.closes


def test_startup_headroom_counts_the_allocations_after_the_last_window(traces):
    """The end of startup is the serving baseline (ledger: the runtime window's before): decode 8,873 −
    FutureMap 2 = 8,871; unified 8,903 − cuBLAS workspace 32 − FutureMap 2 = 8,869. It was the free after the
    last hooked window (8,873 / 8,903), leaving out what sglang makes after it and before serving."""
    dec = compare(_m(traces["decode"], "decode", "decode"), reserve(HeuristicInputs(mode="decode", **LLAMA), R23))
    uni = compare(_m(traces["unified"], "unified", "null"), reserve(HeuristicInputs(mode="null", **LLAMA), R23))
    assert (dec.headroom_startup_mib, uni.headroom_startup_mib) == (8871.0, 8869.0)


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


def test_unified_graphs_are_judged_jointly(traces):
    """Defect b: prefill and decode graphs share one pool (runner_utils/pool.py "later backends reuse the same
    handle"; prefill first "so both coalesce", cuda_graph_setup.py): the decode window holds only the growth
    beyond the prefill pool (448, not the 948 its graphs would take alone). Reserved: 58 prefill buckets up to
    8,192 × 8 = 464 + decode 256 × 2 = 512 = 976; measured 500 + 448 = 948 → fits (976 − 948 = 28 ≤ 512)."""
    m = _m(traces["unified"], "unified", "null")
    res = reserve(HeuristicInputs(mode="null", **LLAMA), R23)
    assert res.mem_fraction_static == 0.903
    c = compare(m, res)
    t = {x.term: x for x in c.terms}
    assert "decode_graph" not in t and "prefill_graph" not in t
    g = t["prefill_graph+decode_graph"]
    assert (g.reserved_mib, g.measured_mib, g.verdict) == (976.0, 948.0, "fits")
    # constant = attention 60 + eager 240 (its warm-up cache emptied at its end, not moved into the graphs) + 20
    assert t["constant"].measured_mib == 320.0
    assert c.headroom_mib == 8371.0  # the prefill warm-up peak, not the 8,603 of the end readings
    # used after KV = 10,171 − 8,371 = 1,800 (the 34 unattributed after the worst point do not move it);
    # recommended = floor((1 − 2,824/142,971) × 1000)/1000 = 0.980
    assert c.used_after_kv_mib == 1800.0 and c.recommended_mfs == 0.980


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
    assert d.used_after_kv_mib == 3130.0
    assert d.ladder[0] == (128, 920.0) and d.ledger is None
    # max_bs 128 still sits under the 10 GiB floor: same fraction (0.929), same slack → headroom moves only by the
    # graph: 6,571 − (478 − 948) = 7,041 MiB; judged against the measured serving peak 2,300: 7,041 > 2 × 2,300
    # and 7,041 − 2,300 = 4,741 > 2,048 → wasteful (the same rule as a measured run's verdict)
    assert res128.mem_fraction_static == 0.929 and d.headroom_mib == 7041.0
    assert d.verdict == "wasteful" and "(estimated)" in d.reason and "measured runtime peak" in d.reason
    # served (the peak is inside the headroom): unused 7,041 − 1,024 = 6,017 MiB → × 8 tokens a MiB (131,072 B)
    # = 48,136; recommended floor((1 − (3,130 + 1,024)/142,971) × 1000)/1000 = floor(970.94)/1000 = 0.970
    assert (d.kv_unused_mib, d.wasted_kv_tokens, d.recommended_mfs) == (6017.0, 48136, 0.970)


# --- the store keeps the books ----------------------------------------------------------------------------


def test_results_directory_holds_the_ledger_and_the_ladder_in_capture_order(traces, tmp_path):
    """ledger.parquet: the decode run's lines sum to F per rank; ladder.parquet keeps capture order
    (capture_index 0 = bs 256); a probe run's inputs all came from its scenario (defaulted_inputs "")."""
    from profiler.results.store import RunContext, Store, load_ladder, load_ledger, load_results

    m = _m(traces["decode"], "decode", "decode")
    c = compare(m, reserve(HeuristicInputs(mode="decode", **LLAMA), R23))
    st = Store(tmp_path / "R")
    st.init()
    st.add([(m, c, RunContext())], run_key="decode")
    led = load_ledger(tmp_path / "R")
    # unattributed: the FutureMap's 2 (init_overlap, unhooked)
    lines = {"weights", "kv_pool", "constant", "activation", "parallel", "decode_graph", "unattributed", "headroom"}
    assert set(led["line"]) == lines
    assert led["mib"].sum() == F and led["closes"].all() and led["judged"].all()
    lad = load_ladder(tmp_path / "R")
    assert list(lad["bs"]) == [256, 128, 64, 32, 16, 8, 4, 2, 1] and list(lad["capture_index"]) == list(range(9))
    res = load_results(tmp_path / "R")
    assert set(res["defaulted_inputs"]) == {""} and res["ledger_closes"].all()


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
