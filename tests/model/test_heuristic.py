"""The pure model, checked by hand-worked numbers (each step written out) and by invariants."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiler.core.errors import MemfracError
from profiler.model.heuristic import TERM_NAMES, inputs_from_scenario, reserve, rules_for
from profiler.model.heuristic.model import decode_bs_list, evaluate, prefill_bs_list
from profiler.model.heuristic.record import HeuristicInputs
from profiler.model.scenario import single_scenario

LLAMA = "meta-llama--Llama-3.1-8B-Instruct"
DSV3 = "deepseek-ai--DeepSeek-V3"


def r_of(model: str, gpu: str, rules: str = "0.5.23", **kw):
    return reserve(inputs_from_scenario(single_scenario(model, gpu, **kw)), rules_for(rules))


def test_h200_llama_decode_floor():
    # decode node: activation max(max_bs 256 × 1, 2048) = 2048 tokens × 1.5 = 3072
    # 512 + 3072 + parallel 1×1/8×1024 = 128 + decode graph 256 × 2 = 512 → 4224 < 10240 → floor to 10240
    # (143771 − 10240) / 143771 = 0.92877 → 0.929
    r = r_of(LLAMA, "H200", mode="decode")
    assert r.mib("activation") == 3072 and r.mib("decode_graph") == 512 and r.mib("prefill_graph") == 0
    assert r.mib("floor_topup") == 10240 - 4224
    assert r.reserved_mib == 10240 and r.mem_fraction_static == 0.929
    assert "floor_applied" in r.flags


def test_h200_llama_null_and_prefill():
    # null: chunk 8192 → 12288 activation; decode graph 512; prefill graph: 58 buckets up to 8192 × 8 = 464
    # 512 + 12288 + 128 + 512 + 464 = 13904 → (143771 − 13904)/143771 = 0.90329 → 0.903
    assert len(prefill_bs_list(8192)) == 58
    r = r_of(LLAMA, "H200")
    assert (r.reserved_mib, r.mem_fraction_static, r.flags) == (13904, 0.903, ())
    # prefill node: no decode graph (role-gated) → 13392 → 0.90685 → 0.907
    r = r_of(LLAMA, "H200", mode="prefill")
    assert (r.reserved_mib, r.mem_fraction_static) == (13392, 0.907)
    assert not r.term("decode_graph").on and r.term("decode_graph").reason == "prefill node"


def test_dsv3_h100_decode_deepep_after_floor():
    # tp 8 ≥ 4 → max_bs 512; activation max(512, 2048) × 1.5 = 3072; parallel 8/8×1024 = 1024; decode graph 1024
    # 512 + 3072 + 1024 + 1024 = 5632 → floor 10240 → + DeepEP 2048 after the floor = 12288
    # (81559 − 12288)/81559 = 0.84934 → 0.849
    r = r_of(DSV3, "H100", mode="decode", tp=8, moe_a2a_backend="deepep")
    assert r.mib("deepep_a2a") == 2048 and r.reserved_mib == 12288 and r.mem_fraction_static == 0.849


def test_dsv3_null_deepep_bucket_alignment():
    # null + deepep: the breakable prefill buckets are aligned to multiples of 8 from the 2048-token default
    # list (38 buckets, max 2048) before the heuristic; MLA pays a flat 1536 anyway, + 1024 BCG-DeepEP delta.
    r = r_of(DSV3, "H200", mode="null", tp=8, moe_a2a_backend="deepep")
    assert r.resolved.prefill_max_bs == 2048 and len(r.resolved.prefill_bs) == 38
    assert r.mib("prefill_graph") == 1536 and r.mib("prefill_bcg_deepep") == 1024
    assert any(s.name == "deepep_bucket_alignment" for s in r.steps)


def test_negative_fraction_on_a_4090():
    # chunk 16384 given on a 24564 MiB GPU: 512 + 24576 + 128 + decode 48×2 = 96 + prefill 74 buckets × 8 = 592
    # = 25904 > 24564 → (24564 − 25904)/24564 = −0.0545 → −0.055
    assert len(prefill_bs_list(16384)) == 74
    r = r_of(LLAMA, "RTX-4090", chunked_prefill_size=16384)
    assert r.reserved_mib == 25904 and r.mem_fraction_static == -0.055 and "fraction_nonpositive" in r.flags


def test_attn_dp_padding_over_300():
    # tp 8 attn-dp 8, max_bs 400 (>300): pad = 400 × 8 × 3 + 400 × 8 × 1.5 = 9600 + 4800 = 14400
    r = r_of(DSV3, "H200", mode="decode", tp=8, attn_dp=8, decode_graph={"max_bs": 400})
    assert r.mib("dp_padding") == 14400


def test_user_fraction_wins_but_terms_remain():
    r = r_of(LLAMA, "H200", mode="decode", mem_fraction_static=0.8)
    assert r.mem_fraction_static == 0.8 and r.heuristic_fraction == 0.929 and "given_by_user" in r.flags
    assert r.effective_reserved_mib == pytest.approx(143771 * 0.2)


def test_pr_29615_headline_in_the_model():
    # H100 Llama-3.1-8B decode node: 0.835 (0.5.14: prefill-sized activation, unconditional graph terms)
    # → 0.874 (0.5.15: decode activation sized by running requests, floor)
    assert r_of(LLAMA, "H100", "0.5.14", mode="decode").mem_fraction_static == 0.835
    assert r_of(LLAMA, "H100", "0.5.15.post1", mode="decode").mem_fraction_static == 0.874
    assert r_of(LLAMA, "H100", "0.5.15", mode="prefill").mem_fraction_static == 0.841  # PD hook disables graphs
    assert r_of(LLAMA, "H100", "0.5.16", mode="prefill").mem_fraction_static == 0.836


def test_old_speculative_reserve_is_case_sensitive_and_after_floor():
    r = r_of(LLAMA, "H200", "0.5.12", speculative_algorithm="STANDALONE")
    assert r.mib("speculative") == 6144
    assert r_of(LLAMA, "H200", "0.5.13", speculative_algorithm="EAGLE").mib("speculative") == 4096
    assert r_of(LLAMA, "H200", "0.5.13", speculative_algorithm="NGRAM").mib("speculative") == 0
    assert r_of(LLAMA, "H200", "0.5.14", speculative_algorithm="EAGLE").mib("speculative") == 0


def test_bs_lists():
    assert decode_bs_list(12, False, False) == (1, 2, 4, 8, 12)
    assert decode_bs_list(20, False, False) == (1, 2, 4, 8, 12, 16, 20)
    assert decode_bs_list(5, True, False) == (1, 2, 3, 4, 5)
    assert decode_bs_list(3, False, True) == (1, 2, 3)
    assert prefill_bs_list(-1) == ()
    assert prefill_bs_list(2048)[-1] == 2048 and len(prefill_bs_list(2048)) == 42


def test_rules_for_releases():
    assert rules_for("0.5.15.post1").name == "0.5.15"
    assert rules_for("0.5.21").name == "0.5.20"
    assert rules_for("v0.5.23").name == "0.5.23"
    assert rules_for("0.6.1").name == "0.5.23"
    assert rules_for("0.4.6.post2").name == "0.4.6.post2"
    assert rules_for("v0.4.10.post1").name == "0.4.9.post3"
    assert rules_for("0.5.0rc2").name == "0.4.9.post3"
    with pytest.raises(MemfracError, match=r"predates 0\.4\.0"):
        rules_for("0.3.6.post3")
    with pytest.raises(MemfracError, match=r"unknown sglang release 'latest'"):
        rules_for("latest")


def test_unknown_gpu_size_falls_back():
    r = reserve(HeuristicInputs(gpu_mem_mib=None), rules_for("0.5.23"))
    assert r.mem_fraction_static == 0.95 and "gpu_mem_unknown" in r.flags
    assert reserve(HeuristicInputs(gpu_mem_mib=None), rules_for("0.5.19")).mem_fraction_static == 0.88


def _inputs(**kw) -> HeuristicInputs:
    return HeuristicInputs(**kw)  # only the fields drawn below; the rest keep their defaults


inputs = st.builds(
    _inputs,
    gpu_mem_mib=st.sampled_from([None, 15360, 24564, 46068, 81559, 97871, 143771, 183359]),
    mode=st.sampled_from(["null", "prefill", "decode"]),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2]),
    attn_dp=st.sampled_from([1, 2, 8]),
    is_mla=st.booleans(),
    chunked_prefill_size=st.one_of(st.none(), st.sampled_from([-1, 2048, 4096, 16384])),
    max_running_requests=st.one_of(st.none(), st.integers(1, 2048)),
    max_total_tokens=st.one_of(st.none(), st.integers(100, 100000)),
    disable_cuda_graph=st.booleans(),
    decode_max_bs=st.one_of(st.none(), st.integers(1, 640)),
    prefill_backend=st.sampled_from([None, "disabled", "breakable", "full"]),
    speculative_algorithm=st.sampled_from([None, "EAGLE", "NGRAM", "STANDALONE"]),
    speculative_num_draft_tokens=st.one_of(st.none(), st.integers(1, 16)),
    moe_a2a_backend=st.sampled_from(["none", "deepep"]),
    post_capture_env=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(inputs, st.sampled_from(sorted(__import__("profiler.model.heuristic.rules", fromlist=["RULE_SETS"]).RULE_SETS)))
def test_terms_sum_to_total_and_explanations_do_not_change_numbers(inp, rules_name):
    rules = rules_for(rules_name)
    r = reserve(inp, rules)
    additive = sum(t.mib for t in r.terms if t.name != "vlm_scaling")
    assert [t.name for t in r.terms] == list(TERM_NAMES)
    _, mib, on, why, _steps, total, frac, _flags = evaluate(inp, rules, explain=True)
    same = lambda a, b: a == b or (math.isnan(a) and math.isnan(b))  # noqa: E731
    assert tuple(mib) == r.term_mib and tuple(on) == r.term_on
    assert same(total, r.reserved_mib) and same(frac, r.heuristic_fraction)
    assert all(w for w in why), "every term says why it is on or off"
    if math.isnan(r.reserved_mib):  # a pre-0.5.3rc2 formula without a GPU size gives no MiB
        assert rules.formula != "terms" and inp.gpu_mem_mib is None and additive == 0
        return
    assert additive == pytest.approx(r.reserved_mib)
    if inp.gpu_mem_mib and r.mem_fraction_static == r.heuristic_fraction and not inp.is_multimodal:
        implied = (inp.gpu_mem_mib - r.reserved_mib) / inp.gpu_mem_mib
        if rules.formula == "tp_table":  # 0.4.0–0.4.7 do not round
            assert r.mem_fraction_static == pytest.approx(implied, abs=1e-9)
        else:
            assert r.mem_fraction_static == round(implied, 3)


def test_decode_activation_counts_draft_tokens_above_the_floor():
    """The decode activation term is max(running × draft tokens, 2048) × 1.5 MiB (0.5.23 memory_hook); at 64
    requests the 2048 floor hides the draft factor, so a case above it: 1024 running × 8 draft tokens = 8192
    tokens × 1.5 = 12288 MiB (without the factor: max(1024, 2048) × 1.5 = 3072). Terms 512 + 12288 + parallel 128
    + decode graph 256 × 2 = 512 → 13440 > 10240: no floor; (143771 − 13440) / 143771 = 0.90652 → 0.907."""
    r = r_of(LLAMA, "H200", mode="decode", max_running_requests=1024, speculative_algorithm="EAGLE",
             speculative_num_draft_tokens=8, speculative_num_steps=7, speculative_eagle_topk=1)  # fmt: skip
    assert r.mib("activation") == 12288
    assert r.term("activation").reason == (
        "decode node: max(max_running_requests 1024 × draft tokens 8, 2048) = 8192 tokens × 1.5"
    )
    assert r.mib("floor_topup") == 0 and r.reserved_mib == 13440 and r.mem_fraction_static == 0.907
