"""scenarios/nightly.toml covers the design card inside the 2 h budget (issue 26.10): a DeepEP low-latency decode
node (ep = tp = 8), a PD pair on two GPUs with a real transfer backend, and an EAGLE decode node with its draft
model, each accepted by sglang's own resolver, planned in waves whose estimate the dry run prints.

The estimate by hand (profiler.sweep.plan.estimated_s; every scenario's limits are nightly.toml's defaults:
startup 1200 s, load 300 s, stop grace 30 s; a pair waits up to ROUTER_READY_S = 180 s for its router):
  wave 1: Llama null/prefill/decode + EAGLE3 decode (1 GPU each) + Qwen3-30B-A3B TP2 null, prefill = 8 GPUs → 1530 s
  wave 2: Qwen3-30B-A3B TP2 decode (2) + TP4 decode (4) + the PD pair (2) = 8 GPUs → 1200 + 180 + 300 + 30 = 1710 s
  wave 3: Qwen3-235B-A22B TP8 → 1530 s;  wave 4: the DeepEP node TP8 → 1530 s
  = 6300 s = 105 min ≤ 120 min.
"""

from __future__ import annotations

import pytest

from profiler.core.errors import MemfracError
from profiler.engine.launch import server_argv
from profiler.model.scenario import load_scenarios, single_scenario
from profiler.sweep.plan import estimated_s, make_plan, render_plan, run_limit_s, waves
from tests.conftest import ROOT, needs_sglang

NIGHTLY = ROOT / "scenarios" / "nightly.toml"
GPUS = list(range(8))
BUDGET_S = 2 * 3600


def _plan(validate: bool = False):
    return make_plan(load_scenarios(NIGHTLY), GPUS, validate=validate)


def _by_name():
    return {s.name: s for s in load_scenarios(NIGHTLY)}


def test_the_three_new_kinds_are_in_the_nightly():
    s = _by_name()
    deepep = [x for x in s.values() if x.moe_a2a_backend == "deepep"]
    assert [(x.mode, x.tp, x.ep, x.deepep_mode, x.gpus_needed) for x in deepep] == [("decode", 8, 8, "low_latency", 8)]
    assert deepep[0].shape.num_experts == 128  # Qwen3-30B-A3B: a MoE whose bf16 weights fit 8 × H100 at TP8
    pair = sorted((x for x in s.values() if x.pair is not None), key=lambda x: x.mode)
    assert [(x.mode, x.transfer_backend, x.gpus_needed) for x in pair] == [("decode", "mooncake_tcp", 1),
                                                                          ("prefill", "mooncake_tcp", 1)]  # fmt: skip
    eagle = [x for x in s.values() if x.speculative_algorithm is not None]
    assert [(x.mode, x.speculative_algorithm, x.speculative_draft_model) for x in eagle] == [
        ("decode", "EAGLE3", "lmsys--sglang-EAGLE3-LLaMA3.1-Instruct-8B")]  # fmt: skip
    argv = server_argv(eagle[0])
    i = argv.index("--speculative-draft-model-path")
    assert argv[i + 1] == str(ROOT / "scenarios" / "models" / "lmsys--sglang-EAGLE3-LLaMA3.1-Instruct-8B")


def test_the_plan_fits_the_two_hour_budget_by_hand():
    plan = _plan()
    started = [g for g in plan.runs if g.key not in plan.skipped]
    assert len(plan.scenarios) == 15 and len(started) == 11 and not plan.unplaceable and not plan.skipped
    ws = waves(started, GPUS)
    assert [[g.key for g in w] for w in ws] == [
        ["llama8b-null-max_bs256", "llama8b-prefill-max_bs256", "llama8b-decode-max_bs256", "llama8b-eagle3-decode",
         "qwen3moe-tp2-null", "qwen3moe-tp2-prefill"],
        ["qwen3moe-tp2-decode", "qwen3moe-tp4-decode", "llama8b-pd"],
        ["qwen3-235b-tp8-decode"],
        ["qwen3moe-deepep-decode"],
    ]  # fmt: skip
    assert [sum(g.gpus_needed for g in w) for w in ws] == [8, 8, 8, 8]
    pair = next(g for g in started if g.peer is not None)
    assert run_limit_s(pair) == 1200 + 180 + 300 + 30 and run_limit_s(started[0]) == 1530
    assert estimated_s(started, GPUS) == 6300 <= BUDGET_S
    out = render_plan(plan, per_term=False)
    assert "estimated time: ≤ 105 min in 4 wave(s) (25.5 + 28.5 + 25.5 + 25.5 min" in out


def test_draft_model_key_names_the_bad_value():
    with pytest.raises(MemfracError, match="speculative_draft_model") as e:
        single_scenario("meta-llama--Llama-3.1-8B-Instruct", "H100-80GB", speculative_algorithm="EAGLE3",
                        speculative_draft_model="no-such-draft")  # fmt: skip
    assert "no-such-draft" in str(e.value) and "lmsys--sglang-EAGLE3-LLaMA3.1-Instruct-8B" in str(e.value)


@needs_sglang
def test_sglang_accepts_every_nightly_scenario_and_the_dry_run_shows_it():
    plan = _plan(validate=True)
    v = plan.validation
    assert v is not None and v.validated and not v.refused and not v.inexpressible, v.summary()
    assert set(v.results) == {s.name for s in plan.scenarios}
    for name in ("llama8b-eagle3-decode", "llama8b-pd-prefill", "llama8b-pd-decode", "qwen3moe-deepep-decode"):
        f = plan.fraction(name)
        assert f.from_sglang and not f.differs, (name, f)
    # DeepEP after the floor: (81559 − (10240 + 2048)) / 81559 = 0.84934 → 0.849, sglang's and the model's
    assert plan.fraction("qwen3moe-deepep-decode").value == 0.849
    out = render_plan(plan, per_term=False)
    assert not [x for x in out.splitlines() if x.startswith("!")], out


def test_a_draft_head_is_no_model_of_its_own():
    """The draft's config is served beside a target: the audit's model space leaves it out."""
    from profiler.calibrate.audit import bundled_models
    from profiler.model.modelcfg import is_draft_model

    models = ROOT / "scenarios" / "models"
    assert is_draft_model(models / "lmsys--sglang-EAGLE3-LLaMA3.1-Instruct-8B")
    assert not is_draft_model(models / "meta-llama--Llama-3.1-8B-Instruct")
    assert "lmsys--sglang-EAGLE3-LLaMA3.1-Instruct-8B" not in bundled_models()
    assert "meta-llama--Llama-3.1-8B-Instruct" in bundled_models()
