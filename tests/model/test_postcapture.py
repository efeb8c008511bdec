"""Post-capture KV sizing as a scenario variant: both answers, and what a measured run would gain."""

from __future__ import annotations

from profiler.model.heuristic import rules_for
from profiler.model.postcapture import answers, gain_from_run, render
from profiler.model.scenario import single_scenario

LLAMA = "meta-llama--Llama-3.1-8B-Instruct"


def test_both_answers_for_a_llama_decode_node_on_h200():
    a = answers(single_scenario(LLAMA, "H200", mode="decode"), rules_for("0.5.23"))
    assert a.planned and not a.enabled
    # classic: the facts doc's verified 0.929; post-capture: (143771 − 1536 − 1·1/8·1024) / 143771
    # = 142107 / 143771 = 0.98843 → 0.988
    assert (a.classic.mem_fraction_static, a.post.mem_fraction_static) == (0.929, 0.988)
    # break-even = 143771 × (0.988 − 0.929) = 143771 × 0.059 = 8482.489 MiB
    assert abs(a.break_even_mib - 143771 * (0.988 - 0.929)) < 1e-6 and round(a.break_even_mib) == 8482
    text = "\n".join(render(a))
    assert "0.929" in text and "0.988" in text and "8,482 MiB" in text


def test_mla_is_not_post_capture_sized():
    # overrides.post_capture_kv_sizing_planned: `if mla_enabled: return False`
    a = answers(single_scenario("deepseek-ai--DeepSeek-V3", "H200", tp=8), rules_for("0.5.23"))
    assert not a.planned and "would not post-capture-size" in render(a)[1]


def test_gain_from_a_run_by_hand():
    # F 80,000 MiB, W 16,000, U 3,000, 128 KiB per token (8 tokens per MiB), mfs 0.9 → 0.98
    # classic F·0.9 − W = 56,000 MiB = 448,000 tokens; post F·0.98 − W − U = 59,400 MiB = 475,200 tokens
    g = gain_from_run(classic_mfs=0.9, post_mfs=0.98, free_at_start_mib=80_000, weights_mib=16_000,
                      used_after_kv_mib=3_000, kv_bytes_per_token=131_072)  # fmt: skip
    assert g.kv_tokens_gained == 27_200 and not g.oom_avoided
    # U 9,000 > the classic headroom F·(1 − 0.9) = 8,000: the classic pool OOMs; post-capture's pool is
    # 78,400 − 16,000 − 9,000 = 53,400 MiB = 427,200 tokens (fewer than the pool that would not have fit)
    g = gain_from_run(classic_mfs=0.9, post_mfs=0.98, free_at_start_mib=80_000, weights_mib=16_000,
                      used_after_kv_mib=9_000, kv_bytes_per_token=131_072)  # fmt: skip
    assert g.oom_avoided and g.kv_tokens_gained == 427_200 - 448_000 and "OOM" in g.how
    assert gain_from_run(classic_mfs=0.9, post_mfs=0.98, free_at_start_mib=1, weights_mib=0, used_after_kv_mib=None,
                         kv_bytes_per_token=1).kv_tokens_gained is None  # fmt: skip
    assert gain_from_run(classic_mfs=0.9, post_mfs=0.9, free_at_start_mib=1, weights_mib=0, used_after_kv_mib=1,
                         kv_bytes_per_token=1, planned=False).kv_tokens_gained == 0  # fmt: skip


def test_a_sweep_plans_a_scenario_with_and_without_it(tmp_path):
    from profiler.model.scenario import load_scenarios
    from profiler.sweep.plan import make_plan

    p = tmp_path / "pc.toml"
    body = f'name = "l"\nmodel = "{LLAMA}"\ngpu = "H200"\nmode = "decode"\n'
    p.write_text(body + "[matrix]\npost_capture_kv_sizing = [false, true]\n")
    plan = make_plan(load_scenarios(p), [0, 1])
    assert len(plan.runs) == 2  # the environment differs: two worker starts
    assert [plan.reservations[s.name].mem_fraction_static for s in plan.scenarios] == [0.929, 0.988]
    assert plan.runs[1].launch.env_dict == {"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "1"}
