"""Probe truth, part 3 (issue 26): the defects a review against sglang 0.5.23's source found, each replayed as a
recorded worker life (tests/fakes/sim_worker.py: the real hooks, recorder and reader; sglang's own sizing functions
for the KV and request pools) and judged from the outside with `memfrac judge` — every figure worked out by hand.

Shared numbers (MiB), as in test_probe_truth.py: free at start F = 142,971; weights 15,400 → 127,571 when the budget
is taken; Llama-3.1-8B 131,072 B a token, context 131,072; the decode node's 0.929 gives 939,360 tokens, 3,669
admitted requests and request pools of 1,842.223 (req_to_token 3,670 × 131,076 × 4 B + the allocator's index), so
8,308.652 after the KV window, 7,008.652 at the serving baseline (graphs 948, constant 350, FutureMap 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler.face.cli import main
from profiler.face.gate import gate
from profiler.measure.runner.load import admitted_requests, calls_of, plan_load
from tests.conftest import ROOT
from tests.fakes import sim_worker

DECODE_TOML = ROOT / "scenarios" / "llama8b-h200-decode.toml"


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe3")
    names = ("decode", "decode-64", "decode-oom", "prefill")
    return {n: sim_worker.write_trace(n, root) for n in names}


def _toml(tmp_path: Path, name: str, **kw: object) -> Path:
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in kw.items())
    p = tmp_path / f"{name}.toml"
    p.write_text(f'name = "{name}"\nmodel = "meta-llama--Llama-3.1-8B-Instruct"\ngpu = "H200"\n{body}\n')
    return p


def _judge(d: Path, scenario: Path, capsys, *extra: str) -> dict:
    assert main(["judge", str(d), "--scenario", str(scenario), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def _term(j: dict, name: str) -> tuple:
    t = next(x for x in j["terms"] if x["term"] == name)
    return t["reserved_mib"], t["measured_mib"], t["verdict"]


# --- 1. the load reaches what the reserve is for ---------------------------------------------------------------


def test_a_64_request_load_leaves_the_activation_not_reached_and_the_fraction_safe(traces, capsys):
    """The driver before this issue read /server_info's max_running_requests — the unresolved CLI field, None — and
    drove 64 requests: every step a graph replay of bs ≤ 256, activation 40 above the baseline (the warm-up's 20
    inside it). The worker admits 3,669 (its kv_pool record: KVCacheConfigResult.max_running_requests): the
    activation term (max(256, 2,048) × 1.5 = 3,072, memory_hook.py:299-310) is NOT reached — "not_reached", never
    "over". Pending: the reserve stands for what was not run, 3,072 − 40 = 3,032. Worst 7,008.652 − 40 = 6,968.652;
    the replay keeps 6,968.652 − 3,032 − Δpool − Δpools ≥ 1,024: at 0.949 (budget 127,571 − 142,971 × 0.051 =
    120,279.479 → 962,235 tokens, +22,875 × 0.125 = 2,859.375; 3,758 admitted → 3,759 × 131,076 × 4 B = 1,879.595
    + index 7.341, +44.713) the headroom is 1,032.6; at 0.950 (963,379 tokens: +3,002.4) it is not → 0.949 ≤ 0.973.
    Read as measured, the old rule said floor((1 − (1,340 + 1,024)/142,971) × 1000)/1000 = 0.983."""
    j = _judge(traces["decode-64"], DECODE_TOML, capsys)
    assert _term(j, "activation") == (3072.0, 40.0, "not_reached")
    assert j["load_reached"] is False and j["pending_mib"] == pytest.approx(3032.0)
    assert j["load"] == ["largest decode batch 64 requests of 3,669 requests (admitted requests sglang sized its "
                         "pools for (KVCacheConfigResult, probe))"]  # fmt: skip
    assert j["recommended_mfs"] == 0.949 and j["recommended_mfs"] <= 0.973
    assert "rests on a partial load: largest decode batch 64 requests of 3,669" in j["recommended_basis"]
    assert "headroom 1,033 MiB ≥ margin 1,024" in j["recommended_basis"]


def test_the_corrected_load_reaches_every_request_the_pool_holds(traces):
    """The corrected driver drives every admitted request at once (3,669, /server_info's
    effective_max_running_requests_per_dp); the decode node keeps 512 tokens free per request
    (disaggregation/decode.py:2052-2058), so its 939,360 tokens hold (939,360 − 528) // 528 = 1,778 of them at once:
    the probe's runtime window saw a decode batch of 1,778, eager (above the graph's max_bs 256)."""
    m = sim_worker.measurement(traces["decode"], "decode", "decode")
    seen = m.ranks[0].phase("runtime").details["batches_seen"]["decode"]
    assert (seen["max_requests"], seen["max_eager_requests"], seen["max_graph_requests"]) == (1778, 1778, 1)
    (plan,) = m.serving["load_plans"]
    assert (plan["requests"], plan["concurrency"], plan["admitted"], plan["reachable_requests"]) == (
        3669, 3669, 3669, 1778)  # fmt: skip


# --- 2. the recommended fraction by sglang's own sizing ------------------------------------------------------------


def test_the_recommended_fraction_counts_the_request_pools_it_grows(traces, capsys):
    """test_probe_truth.test_decode_node_comparison works it out: 0.954 (1,078.1 MiB left at the margin's side),
    where 1 − (3,600 + 1,024)/142,971 = 0.967 leaves −810. The request pools are a ledger line of their own, read off
    sglang's objects (1,842.223), and the room the fraction leaves is the slack less them: 10,150.941 − 1,842.223 =
    8,308.718."""
    j = _judge(traces["decode"], DECODE_TOML, capsys)
    assert j["recommended_mfs"] == 0.954 and j["load_reached"] is True and j["pending_mib"] == 0.0
    assert j["request_pools_mib"] == pytest.approx(1842.223, abs=1e-3)
    assert j["room_mib"] == pytest.approx(8308.718, abs=1e-3)
    assert {x["name"] for x in j["ledger"]["lines"]} >= {"kv_pool", "request_pools"}
    assert "the activation was measured at 1,778 requests at once; at 0.954 the pool holds ~1,832" in \
        j["recommended_basis"]


# --- 3. the gate judges the worker as a whole ----------------------------------------------------------------------


def test_a_floor_covered_term_passes_the_gate_and_a_worker_that_ran_out_fails_it(traces, tmp_path, capsys):
    """The decode life: decode_graph 948 over its 512 — but above 60 GiB sglang lifts the terms' sum (4,224) to the
    10 GiB floor (memory_hook.py:314-315) and the worker needs 3,600 of its 8,308.718 room: a calibration finding,
    shown, passed. The life given 0.975 ran out while serving (329 MiB at the serving baseline; run.json's
    oom_runtime): the gate fails it."""
    ok, bad = tmp_path / "ok", tmp_path / "bad"
    _judge(traces["decode"], DECODE_TOML, capsys, "--out", str(ok))
    checks = gate(ok)
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]
    finding = next(c for c in checks if c.name == "term decode_graph")
    assert finding.message.startswith("calibration finding: measured 948 MiB > its constant 512 MiB")
    room = next(c for c in checks if c.name == "worker room")
    assert room.passed and room.message == "needs 3,600 of 8,309 MiB"
    oom = _toml(tmp_path, "llama8b-h200-decode-0975", mode="decode", mem_fraction_static=0.975)
    j = _judge(traces["decode-oom"], oom, capsys, "--out", str(bad))
    assert j["verdict"] == "oom_runtime" and j["mfs"] == 0.975
    failed = [c for c in gate(bad) if not c.passed]
    assert [c.name for c in failed] == ["run"] and failed[0].message.startswith("oom_runtime: CUDA out of memory")
    assert main(["gate", str(bad)]) == 1 and main(["gate", str(ok)]) == 0


# --- 4. each term means what sglang means ----------------------------------------------------------------------------


def test_a_prefill_nodes_graph_pool_is_activation_and_its_graph_term_fits(traces, tmp_path, capsys):
    """A PD prefill node (0.907): the breakable prefill graph — a 900 MiB torch pool where every chunk replays and
    40 MiB of graph execs outside torch. sglang's prefill-graph term counts only non-torch memory (memory_hook.py:385,
    58 buckets up to the 8,192 chunk × 8 = 464): 40 fits (464 − 40 = 424 ≤ max(512, 232)). The pool is activation
    memory: activation 900 + the chunks' 150 above the serving baseline = 1,050 (it read 150, with prefill_graph 900
    "under", before); against max(8,192, 2,048) × 1.5 = 12,288 → over, the load having reached a chunk of 8,192."""
    j = _judge(traces["prefill"], _toml(tmp_path, "llama8b-h200-prefill", mode="prefill"), capsys)
    assert _term(j, "prefill_graph") == (464.0, 40.0, "fits")
    assert _term(j, "activation") == (12288.0, 1050.0, "over")
    assert j["load_reached"] is True and not any(t["term"] == "prefill_graph+decode_graph" for t in j["terms"])


# --- 9. plan_load, pinned by hand ------------------------------------------------------------------------------------


def _info(mode: str, *, tokens: int, admitted: list[int], max_input: int = 131066, chunk: int | None = 8192) -> dict:
    return {"disaggregation_mode": mode, "chunked_prefill_size": chunk, "max_prefill_tokens": 16384,
            "max_running_requests": None, "max_req_input_len": max_input, "num_reserved_decode_tokens": 512,
            "internal_states": [{"effective_max_running_requests_per_dp": a, "memory_usage": {"token_capacity": tokens}}
                                for a in admitted]}  # fmt: skip


def test_plan_load_drives_what_the_worker_admits():
    """Decode node, H200: 3,669 admitted; 16 tokens in, 512 kept per request → (939,360 − 528) // 528 = 1,778 held at
    once. Unified node at 0.903: 909,622 tokens, 3,553 admitted; chunks of 8,192 (two: every batch a full chunk),
    then 16,384 // 512 = 32 prompts of 512; decode 16 + 256 = 272 tokens a request → 909,622 // 272 = 3,344 held."""
    (d,) = plan_load("decode", _info("decode", tokens=939360, admitted=[3669]))
    assert (d.kind, d.requests, d.concurrency, d.input_len, d.output_len) == ("decode", 3669, 3669, 16, 256)
    assert (d.admitted, d.reachable_requests) == (3669, 1778)
    p1, p2, dd = plan_load("null", _info("null", tokens=909622, admitted=[3553]))
    assert (p1.requests, p1.input_len, p1.target_tokens) == (2, 8192, 8192)
    assert (p2.requests, p2.input_len) == (32, 512)
    assert (dd.requests, dd.reachable_requests) == (3553, 3344)


def test_plan_load_on_the_cpu_smoke_worker_and_attention_dp():
    """The CPU smoke decode worker: 8,192 tokens, max_req_input_len 4,090, 2,048 admitted → (8,192 − 528) // 528 = 14
    held; a prefill node there: a chunk of 4,096 > 4,089 (input < max_req_input_len) → two requests of 4,089. Two
    attention-DP ranks admitting 1,000 and 1,200: 2,200 requests at once. A worker that does not report what it admits:
    the CLI's max_running_requests or 64, said to be a partial load."""
    (d,) = plan_load("decode", _info("decode", tokens=8192, admitted=[2048], max_input=4090, chunk=4096),
                     output_len=16)  # fmt: skip
    assert (d.requests, d.reachable_requests, d.output_len) == (2048, 14, 16)
    p1, _ = plan_load("prefill", _info("prefill", tokens=8192, admitted=[2048], max_input=4090, chunk=4096))
    assert (p1.requests, p1.input_len, p1.target_tokens) == (2, 4089, 4096)
    assert admitted_requests(_info("decode", tokens=1, admitted=[1000, 1200]))[0] == 2200
    (old,) = plan_load("decode", {"max_total_num_tokens": 939360})
    assert old.requests == 64 and old.admitted is None and "a partial load" in old.why


def test_a_burst_goes_in_batches_of_prompts():
    """3,669 prompts at once, at most 64 a /generate call: ceil(3,669 / 64) = 58 calls of ceil(3,669 / 58) = 64 —
    57 of 64 and one of 21."""
    (d,) = plan_load("decode", _info("decode", tokens=939360, admitted=[3669]))
    sizes = calls_of(d)
    assert len(sizes) == 58 and sizes[:57] == [64] * 57 and sizes[-1] == 21 and sum(sizes) == 3669


# --- 7. the windows a role needs ------------------------------------------------------------------------------------


def test_a_role_whose_needed_window_never_opened_fails_the_run(traces):
    """Hooks applied is not windows opened: a decode node must open the baseline, weights, KV pool, its decode capture
    (capture_decode_graph is called whether the family is enabled or not), init_disaggregation and, once a request
    was answered, the serving window. The recorded decode life opens them all; with its decode capture's records
    gone — a hook on the wrong function — the run fails, naming the window."""
    from profiler.measure.probe.reader import read_probe_dir
    from profiler.measure.runner.classify import Witnesses, classify, missing_windows, needed_windows

    probe = read_probe_dir(traces["decode"] / "probe")
    assert missing_windows(probe, "decode", True) == []
    assert needed_windows("prefill", False) == (("baseline",), ("weights",), ("kv_pool",), ("prefill_graph",),
                                               ("disaggregation_init",))  # fmt: skip
    r = probe.ranks[0]
    r.phases = [p for p in r.phases if p.name != "decode_graph"]
    w = Witnesses(ready=True, timed_out=False, died=False, during_load=False, returncode=None, role="decode",
                  served=True)  # fmt: skip
    f = classify(w, probe, None)
    assert f is not None and f.kind == "probe_error"
    assert f.message == "the decode role's needed windows never opened (TP0: decode_graph or verify_graph): nothing " \
                        "measured them"
    # a unified node needs the prefill capture too; a worker that served nothing needs no serving window
    assert missing_windows(probe, "null", False) == ["TP0: decode_graph or verify_graph", "TP0: prefill_graph"]
