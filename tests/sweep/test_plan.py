"""Planning: grouping max_bs variants into one start, GPU counts, packing, the dry-run text."""

from __future__ import annotations

from profiler.model.scenario import BUNDLED_MODELS, load_scenarios, scenarios_from_doc
from profiler.sweep.plan import assign_gpus, group_scenarios, make_plan, render_plan
from tests.conftest import ROOT


def _doc(**matrix):
    return scenarios_from_doc(
        {"name": "m", "model": "meta-llama--Llama-3.1-8B-Instruct", "gpu": "H200", "matrix": matrix},
        "<t>",
        BUNDLED_MODELS,
    )


def test_max_bs_variants_share_one_start_launching_the_largest():
    ss = _doc(mode=["null", "decode"], **{"decode_graph.max_bs": [32, 128, 64]})
    runs = group_scenarios(ss)
    assert len(ss) == 6 and len(runs) == 2
    for r in runs:
        assert r.launch.decode_graph.max_bs == 128 and len(r.members) == 3
        assert {s.decode_graph.max_bs for s in r.derived} == {32, 64}


def test_a_defaulted_max_bs_is_compared_by_its_resolved_value():
    # H200, tp 1: a left-out max_bs resolves to 256, larger than the explicit 64 → the default one launches
    ss = _doc(**{"decode_graph.max_bs": [None, 64]})
    plan = make_plan(ss, [0])
    (run,) = plan.runs
    assert run.launch.decode_graph.max_bs is None and [s.decode_graph.max_bs for s in run.derived] == [64]
    # explicit 512 is above the default: then 512 launches
    ss = _doc(**{"decode_graph.max_bs": [None, 512]})
    (run,) = make_plan(ss, [0]).runs
    assert run.launch.decode_graph.max_bs == 512


def test_different_roles_models_or_lists_do_not_share():
    ss = _doc(mode=["null", "prefill", "decode"], tp=[1, 2])
    assert len(group_scenarios(ss)) == 6
    ss = _doc(**{"decode_graph.bs": [[1, 2], [1, 2, 4]]})
    assert len(group_scenarios(ss)) == 2  # explicit lists are not ladders of one another


def test_gpu_counts_and_packing():
    ss = scenarios_from_doc(
        {
            "name": "x",
            "model": "deepseek-ai--DeepSeek-V3",
            "gpu": "H200",
            "matrix": {"tp": [8, 4], "attn_dp": [1, 4], "mode": ["decode"]},
        },
        "<t>",
        BUNDLED_MODELS,
    )
    runs = group_scenarios(ss)
    assert sorted(r.gpus_needed for r in runs) == [4, 4, 8, 8]  # attention DP lives inside tp
    dp = scenarios_from_doc(
        {"name": "d", "model": "Qwen--Qwen3-8B", "gpu": "H100", "tp": 2, "dp": 3}, "<t>", BUNDLED_MODELS
    )
    assert dp[0].gpus_needed == 6  # replicas multiply
    placed, bad = assign_gpus(runs, list(range(6)))
    assert [r.gpus_needed for r, _ in bad] == [8, 8] and all(len(g) == 4 for _, g in placed)


def test_default_set_dry_run_has_fewer_starts_than_scenarios():
    ss = load_scenarios(ROOT / "scenarios/default.toml")
    plan = make_plan(ss, list(range(8)))
    assert len(plan.runs) < len(ss) and plan.starts_saved == 6
    text = render_plan(plan)
    # the three DeepSeek-V3 runs on 8×H100-80GB are predicted not to load (weights ≈ 78.4 GiB/GPU): skipped
    assert "18 scenarios → 9 worker starts (6 saved by sharing decode-graph ladders, 3 skipped" in text
    assert "llama8b-H200-decode-max_bs64" in text and "floor_topup 5.88" in text
