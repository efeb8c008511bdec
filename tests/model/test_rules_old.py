"""Rule sets of the releases before 0.5.12, checked by cases computed by hand from each release's source.

Each case cites the file and line of `sglang-X/sglang/srt/...` (`pip download --no-deps sglang==X`) whose
arithmetic it replays; the value in the comment is worked out from that code, not read from the model.
GPU sizes are nvidia-smi's memory.total in MiB: RTX 4090 24564, H100 81559, H20 97871, H200 143771,
B200 183359, B300 275040. The real resolvers of the group representatives are checked against the same
model in tests/engine/test_conformance.py.
"""

from __future__ import annotations

import math

import pytest

from profiler.core.errors import MemfracError
from profiler.model.heuristic import TERM_NAMES, reserve, rules_for
from profiler.model.heuristic.record import HeuristicInputs
from profiler.model.heuristic.releases import (
    RELEASES,
    release,
    releases_between,
    rule_sets_for,
)
from profiler.model.heuristic.rules import RULE_SETS
from tests.conftest import ROOT

RTX4090, H100, H20, H200, B200, B300 = 24564, 81559, 97871, 143771, 183359, 275040


def mfs(rules: str, gpu: int | None, **kw) -> float:
    return reserve(HeuristicInputs(gpu_mem_mib=gpu, **kw), rules_for(rules)).mem_fraction_static


# -- 0.4.0 … 0.4.5.post2: the fraction by tp size ------------------------------------------------------------


@pytest.mark.parametrize(("tp", "expected"), [(1, 0.88), (2, 0.87), (4, 0.85), (8, 0.81), (16, 0.79)])
def test_0_4_0_tp_table(tp, expected):
    # 0.4.0 server_args.py:158-168: ≥16 0.79, ≥8 0.81, ≥4 0.85, ≥2 0.87, else 0.88 — whatever the GPU
    for rel in ("0.4.0", "0.4.3.post2", "0.4.5.post2"):
        assert mfs(rel, H200, tp=tp) == expected and mfs(rel, RTX4090, tp=tp) == expected


def test_0_4_0_term_is_the_table_reserve():
    # tp 8 on an H200: 0.81 → reserve 143771 × (1 − 0.81) = 27316.49 MiB, all in fraction_table
    r = reserve(HeuristicInputs(gpu_mem_mib=H200, tp=8), rules_for("0.4.0"))
    assert r.mib("fraction_table") == pytest.approx(27316.49) and r.reserved_mib == pytest.approx(27316.49)
    assert r.term("fraction_table").on and not r.term("activation").on and r.rules == "0.4.0"
    # 0.4.0 ignores pp in the table (0.4.6.post2 is the first to use tp·pp)
    assert mfs("0.4.0", H100, tp=2, pp=2) == 0.87


def test_unknown_gpu_in_the_tp_table_era():
    # 0.4.0 server_args.py:172 `if gpu_mem < 25_000` with gpu_mem None raises TypeError: no fraction
    r = reserve(HeuristicInputs(gpu_mem_mib=None), rules_for("0.4.0"))
    assert math.isnan(r.mem_fraction_static) and "no_fraction_without_gpu_size" in r.flags
    # 0.4.0.post1 guards it (`gpu_mem is not None and …`, server_args.py:180) and the table needs no GPU size
    r = reserve(HeuristicInputs(gpu_mem_mib=None, tp=4), rules_for("0.4.0.post1"))
    assert r.mem_fraction_static == 0.85 and math.isnan(r.reserved_mib) and "gpu_mem_unknown" in r.flags
    # 0.4.5.post3 server_args.py:225 `if gpu_mem <= 81920` and 0.4.6.post2-4 likewise: TypeError
    assert math.isnan(mfs("0.4.6", None)) and math.isnan(mfs("0.4.6.post4", None))
    # 0.4.6.post5 server_args.py:249 `gpu_mem is not None and gpu_mem <= 81920` else 0.88
    assert mfs("0.4.6.post5", None, tp=8) == 0.88


def test_small_gpu_defaults_0_4_0_vs_post1():
    # 0.4.0 server_args.py:179-183: under 25000 MiB max_bs 8; 0.4.0.post1:183-187: 80 with tp ≥ 4
    r0 = reserve(HeuristicInputs(gpu_mem_mib=RTX4090, tp=4), rules_for("0.4.0"))
    r1 = reserve(HeuristicInputs(gpu_mem_mib=RTX4090, tp=4), rules_for("0.4.0.post1"))
    assert (r0.resolved.chunked_prefill_size, r0.resolved.decode_max_bs) == (2048, 8)
    assert (r1.resolved.chunked_prefill_size, r1.resolved.decode_max_bs) == (2048, 80)
    assert r0.mem_fraction_static == r1.mem_fraction_static == 0.85  # the fraction does not read them


def test_runner_scales_multimodal_fraction_in_0_4_x():
    # 0.4.0 model_runner.py:118 `self.mem_fraction_static *= 0.95`; 0.4.4.post4 model_runner.py:273 `*= 0.90`:
    # at worker start, after server_args — the printed fraction stays the table's
    r = reserve(HeuristicInputs(gpu_mem_mib=H100, is_multimodal=True), rules_for("0.4.3"))
    assert r.mem_fraction_static == 0.88 and "runner_scales_fraction" in r.flags
    assert any("0.95" in s.detail for s in r.steps)
    r = reserve(HeuristicInputs(gpu_mem_mib=H100, is_multimodal=True), rules_for("0.4.5"))
    assert r.rules == "0.4.4.post4" and any("0.9 at start" in s.detail for s in r.steps)
    assert "runner_scales_fraction" not in reserve(HeuristicInputs(gpu_mem_mib=H100), rules_for("0.4.5")).flags


# -- 0.4.5.post3 … 0.4.7: the table only up to 80 GiB ---------------------------------------------------------


def test_0_4_5_post3_flat_13_gib_above_80_gib():
    # 0.4.5.post3 server_args.py:225-238: ≤ 81920 MiB the tp table, else (gpu − 1024 × 13) / gpu, not rounded
    assert mfs("0.4.6", H100, tp=8) == 0.81  # 81559 ≤ 81920
    # H200: (143771 − 13312) / 143771 = 130459 / 143771 = 0.907408…
    assert mfs("0.4.6", H200, tp=8) == 130459 / 143771
    r = reserve(HeuristicInputs(gpu_mem_mib=B200), rules_for("0.4.5.post3"))
    # B200: 170047 / 183359 = 0.927399…; the whole reserve is the flat 13 GiB
    assert r.mem_fraction_static == 170047 / 183359 and r.mib("band_base") == 13312 and r.reserved_mib == 13312


def test_0_4_6_post2_table_by_tp_pp_and_the_48_gib_blend():
    # 0.4.6.post2 server_args.py:226-245: table by tp·pp on GPUs ≤ 81920 MiB, else 0.88; above 96 GiB
    # min(f + 48·1024·(1 − f)/gpu, (gpu − 18·1024)/gpu)
    assert mfs("0.4.6.post2", H100, tp=2, pp=2) == 0.85  # tp·pp 4
    assert mfs("0.4.6.post3", H20) == 0.88  # 97871 < 98304 = 96 GiB: no blend
    # H200: min(0.88 + 49152 × 0.12 / 143771 = 0.921025…, (143771 − 18432)/143771 = 0.871796…) → the 18 GiB cap
    assert mfs("0.4.6.post2", H200) == pytest.approx(125339 / 143771, abs=1e-15)
    # B300: min(0.88 + 5898.24 / 275040 = 0.901445…, 256608 / 275040 = 0.932984…) → the 48 GiB blend wins
    r = reserve(HeuristicInputs(gpu_mem_mib=B300), rules_for("0.4.6.post4"))
    assert r.mem_fraction_static == pytest.approx(0.88 + 5898.24 / 275040, abs=1e-15)
    assert mfs("0.4.6.post5", H200) == mfs("0.4.6.post2", H200)  # post5 differs only without a GPU size
    # reserve: 0.12 × 275040 = 33004.8 in the table, the blend gives back 5898.24 → 27106.56 MiB
    assert r.mib("fraction_table") == pytest.approx(33004.8) and r.mib("big_gpu") == pytest.approx(-5898.24)
    assert r.reserved_mib == pytest.approx(27106.56)


def test_0_4_7_b200_and_speculative():
    # 0.4.7 server_args.py:268-285
    assert mfs("0.4.7", B200, tp=8) == 0.79  # CUDA GPU > 180 * 1000: 0.79
    # off CUDA the > 180 GB branch is skipped: the 18 GiB cap, 164927 / 183359 = 0.899476…
    assert mfs("0.4.7", B200, platform="non-cuda") == pytest.approx(164927 / 183359, abs=1e-15)
    # H200 + EAGLE: the cap is 20 GiB: (143771 − 20480) / 143771 = 123291 / 143771 = 0.857551…
    assert mfs("0.4.7", H200, speculative_algorithm="EAGLE") == pytest.approx(123291 / 143771, abs=1e-15)
    # ≤ 96 GiB + EAGLE: 0.88 × 0.95 = 0.836 (H100 tp 1, and H20 which is under 96 GiB)
    assert mfs("0.4.7", H100, speculative_algorithm="EAGLE") == pytest.approx(0.836, abs=1e-15)
    assert mfs("0.4.7", H20, speculative_algorithm="EAGLE") == pytest.approx(0.836, abs=1e-15)
    assert mfs("0.4.7", None, speculative_algorithm="EAGLE") == pytest.approx(0.836, abs=1e-15)  # None → 0.88


def test_pd_chunk_0_4_6_post2():
    # 0.4.6.post2 server_args.py:254-258: a PD node chunks 16384 unless the GPU is under 25000 MB
    r = reserve(HeuristicInputs(gpu_mem_mib=H100, mode="prefill"), rules_for("0.4.6.post2"))
    assert r.resolved.chunked_prefill_size == 16384 and r.resolved.decode_max_bs is None
    assert reserve(HeuristicInputs(gpu_mem_mib=RTX4090, mode="prefill"), rules_for("0.4.6.post2")).resolved[1] == 2048


# -- 0.4.7.post1 … 0.5.3rc0: a reserve by GPU band -----------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu", "kw", "expected"),
    [
        # 0.4.7.post1 server_args.py:261-285; reserve in MiB, fraction round((gpu − reserve)/gpu, 3)
        (RTX4090, {}, 0.879),  # < 35 GiB: (2.8 + 1/10) × 1024 = 2969.6 → 21594.4 / 24564 = 0.87911
        (H100, {}, 0.874),  # < 90 GiB: (9.5 + 1/2) × 1024 = 10240 → 71319 / 81559 = 0.87445
        (H20, {}, 0.869),  # < 100 GiB: (12 + 1/2) × 1024 = 12800 → 85071 / 97871 = 0.86922
        (H200, {"tp": 8}, 0.886),  # < 160 GiB: (12 + 8/2) × 1024 = 16384 → 127387 / 143771 = 0.88604
        # ≥ 160 GiB: 32768 flat, + 2048 EAGLE, + 4096 DP attention = 38912 → 144447 / 183359 = 0.78778
        (B200, {"tp": 8, "speculative_algorithm": "EAGLE", "attn_dp": 8}, 0.788),
        # STANDALONE is + 2 GiB before 0.5.2: 10240 + 2048 = 12288 → 69271 / 81559 = 0.84934
        (H100, {"speculative_algorithm": "STANDALONE"}, 0.849),
        (None, {"tp": 8}, 0.88),  # GPU size unknown: 0.88 (server_args.py:287)
    ],
)
def test_0_4_7_post1_band_reserve(gpu, kw, expected):
    for rel in ("0.4.7.post1", "0.4.10", "0.5.0rc2", "0.5.1.post3"):
        assert mfs(rel, gpu, **kw) == expected


def test_band_reserve_terms():
    r = reserve(HeuristicInputs(gpu_mem_mib=B200, tp=8, speculative_algorithm="EAGLE", attn_dp=8), rules_for("0.4.10"))
    got = tuple(r.mib(n) for n in ("band_base", "parallel", "speculative", "dp_attention"))
    assert got == (32768, 0, 2048, 4096)
    assert r.reserved_mib == 38912
    r = reserve(HeuristicInputs(gpu_mem_mib=H200, tp=8), rules_for("0.4.10"))
    assert r.mib("band_base") == 12288 and r.mib("parallel") == 4096  # 12 GiB + tp·pp/2 = 4 GiB
    unknown = reserve(HeuristicInputs(gpu_mem_mib=None), rules_for("0.4.10"))
    assert unknown.flags == ("gpu_mem_unknown", "fallback_fraction")


def test_multimodal_0_4_9_and_vlm_factor():
    # 0.4.9 server_args.py:296-299: × 0.9 → H100 0.874 × 0.9 = 0.7866
    assert mfs("0.4.9", H100, is_multimodal=True) == pytest.approx(0.7866, abs=1e-12)
    # 0.4.9.post3 adjust_mem_fraction_for_vlm (server_args.py:349, 1951-1985): ViT 32 × 1280² vs 24 × 1024²
    # ratio 52428800 / 25165824 = 2.083333; factor max(0.8, 1 − 0.1 × 1.083333) = 0.891667; × 0.95 = 0.847083
    # 0.874 × 0.847083 = 0.740351
    got = mfs("0.4.9.post3", H100, is_multimodal=True, vit_layers=32, vit_hidden=1280)
    assert got == pytest.approx(0.874 * 0.95 * (1 - 0.1 * (32 * 1280**2 / (24 * 1024**2) - 1)), abs=1e-12)
    assert got == pytest.approx(0.740351, abs=1e-6)
    # no vision_config: no scaling (server_args.py:1947 `if vision_config is None: return`)
    assert mfs("0.4.9.post3", H100, is_multimodal=True) == 0.874


def test_0_5_2_standalone_six_gib():
    # 0.5.2 server_args.py:474-477: STANDALONE + 6 GiB: 10240 + 6144 = 16384 → 65175 / 81559 = 0.79912
    assert mfs("0.5.2", H100, speculative_algorithm="STANDALONE") == 0.799
    assert mfs("0.5.3rc0", H100, speculative_algorithm="EAGLE") == 0.849  # others + 2 GiB: 12288 → 0.84934


# -- 0.5.3rc2 … 0.5.11: the term-by-term reserve -------------------------------------------------------------

LLAMA = {"model_path": "meta-llama/Llama-3.1-8B-Instruct", "architecture": "LlamaForCausalLM"}


def test_0_5_3_terms():
    # 0.5.3 server_args.py:637-660 (`_handle_gpu_memory_settings`), H100 < 90 GiB: chunk 8192, max_bs 256
    # 512 + 8192 × 1.5 = 12288 + 256 × 2 = 512 + 1 × 1 / 8 × 1024 = 128 → 13440 ≥ 10240 floor
    # (81559 − 13440) / 81559 = 68119 / 81559 = 0.83521 → 0.835
    r = reserve(HeuristicInputs(gpu_mem_mib=H100, **LLAMA), rules_for("0.5.3"))
    assert (r.reserved_mib, r.mem_fraction_static) == (13440, 0.835)
    assert not r.term("prefill_graph").on and r.resolved.prefill_backend == "disabled"
    # RTX 4090 < 35 GiB: chunk 2048, max_bs 16 (0.5.3 server_args.py:606-611): 512 + 3072 + 32 + 128 = 3744
    # → 20820 / 24564 = 0.84758 → 0.848; 0.5.4.post1 raised max_bs to 24: 3760 → 20804 / 24564 = 0.84693 → 0.847
    assert mfs("0.5.3", RTX4090, **LLAMA) == 0.848 and mfs("0.5.4", RTX4090, **LLAMA) == 0.848
    assert mfs("0.5.4.post1", RTX4090, **LLAMA) == 0.847 and mfs("0.5.6.post2", RTX4090, **LLAMA) == 0.847


def test_speculative_after_floor_2_then_4_gib():
    # 0.5.3 server_args.py:660-664: after the floor + 2 GiB (EAGLE): 13440 + 2048 = 15488 → 66071/81559 = 0.8101
    assert mfs("0.5.3", H100, speculative_algorithm="EAGLE", **LLAMA) == 0.810
    assert mfs("0.5.9", H100, speculative_algorithm="EAGLE", **LLAMA) == 0.810
    # 0.5.10 server_args.py:1318-1322: + 4 GiB; the piecewise graph is off with speculative decoding in 0.5.10
    # (`_handle_piecewise_cuda_graph`): 13440 + 4096 = 17536 → 64023 / 81559 = 0.78499 → 0.785
    assert mfs("0.5.10", H100, speculative_algorithm="EAGLE", **LLAMA) == 0.785
    # 0.5.11 keeps it on: + 58 buckets up to 8192 × 8 = 464 → 18000 → 63559 / 81559 = 0.77931 → 0.779
    assert mfs("0.5.11", H100, speculative_algorithm="EAGLE", **LLAMA) == 0.779
    # NGRAM drafts need no reserve (server_args.py:663 `elif self.speculative_algorithm != "NGRAM"`)
    assert mfs("0.5.3", H100, speculative_algorithm="NGRAM", **LLAMA) == 0.835


def test_0_5_3_nsa_override():
    # 0.5.3 server_args.py:824: DeepSeek NSA → 0.8, even when given; 0.5.3.post1 dropped it
    inp = HeuristicInputs(gpu_mem_mib=H200, tp=8, is_mla=True, architecture="DeepseekV32ForCausalLM")
    assert reserve(inp, rules_for("0.5.3")).mem_fraction_static == 0.8
    assert reserve(inp._replace(mem_fraction_static=0.9), rules_for("0.5.3rc2")).mem_fraction_static == 0.8
    assert reserve(inp, rules_for("0.5.3.post1")).mem_fraction_static != 0.8


def test_piecewise_opt_in_after_the_floor():
    on = {"prefill_backend": "breakable", "chunked_prefill_size": 2048, **LLAMA}  # --enable-piecewise-cuda-graph
    # H100 chunk 2048: 512 + 3072 + 512 + 128 = 4224 → floor 10240
    # 0.5.5.post1 server_args.py:824: + piecewise max tokens (default 4096) // 4 = 1024 after it:
    # 11264 → 70295 / 81559 = 0.86189 → 0.862 (before the floor it would vanish: 0.874)
    assert mfs("0.5.5.post1", H100, **on) == 0.862 and mfs("0.5.6.post2", H100, **on) == 0.862
    assert mfs("0.5.5", H100, **on) == 0.874  # no prefill-graph term before 0.5.5.post1
    assert mfs("0.5.5.post1", H100, **{**on, "prefill_backend": None}) == 0.874  # opt-in: off by default
    # 0.5.7 server_args.py:945: // 8 of max tokens, which now default to chunk: 2048 // 8 = 256 → 10496
    # → 71063 / 81559 = 0.87131 → 0.871
    assert mfs("0.5.7", H100, **on) == 0.871
    r = reserve(HeuristicInputs(gpu_mem_mib=H100, **on), rules_for("0.5.7"))
    assert r.mib("floor_topup") == 10240 - 4224 and r.mib("prefill_graph") == 256 and r.reserved_mib == 10496


def test_piecewise_buckets_0_5_8_vs_0_5_9():
    on = {"prefill_backend": "breakable", **LLAMA}
    # RTX 4090: chunk 2048, max_bs 24: 512 + 3072 + 48 + 128 = 3760 + buckets × 8 (0.5.8 server_args.py:1014)
    # 0.5.8 ladder up to 2048 (…, range(640, 1025, 64), range(1280, 4097, 256)): 8+14+8+7+4 = 41 → 328
    # → 4088 → 20476 / 24564 = 0.83358 → 0.834; 0.5.9 (range(576, 1025, 64)): 42 → 336 → 4096 → 0.83325 → 0.833
    assert mfs("0.5.8", RTX4090, **on) == 0.834 and mfs("0.5.8.post1", RTX4090, **on) == 0.834
    assert mfs("0.5.9", RTX4090, **on) == 0.833
    # 0.5.10 (piecewise on by default): the same 42 buckets without asking
    assert mfs("0.5.10", RTX4090, **LLAMA) == 0.833


def test_mla_prefill_graph_buckets_then_flat():
    dsv3 = {"tp": 8, "is_mla": True, "architecture": "DeepseekV3ForCausalLM", "prefill_backend": "breakable"}
    # H200 tp 8: chunk 8192, max_bs 512: 512 + 12288 + 1024 + 1024 = 14848
    # 0.5.8: MLA piecewise max tokens 2048 → 41 buckets × 8 = 328 → 15176 → 128595 / 143771 = 0.89444 → 0.894
    assert mfs("0.5.8", H200, **dsv3) == 0.894
    # 0.5.10 server_args.py:1308-1311: MLA → flat 1.5 GiB: 16384 → 127387 / 143771 = 0.88604 → 0.886
    assert mfs("0.5.10", H200, **dsv3) == 0.886
    # 0.5.7: MLA max tokens = chunk (8192) // 8 = 1024 after the floor: 15872 → 127899 / 143771 = 0.88960 → 0.890
    assert mfs("0.5.7", H200, **dsv3) == 0.890


# -- the release table and its API ----------------------------------------------------------------------------


def test_every_release_since_0_4_0_is_listed_in_order_with_its_rules():
    vs = [r.version for r in RELEASES]
    assert vs[0] == "0.4.0" and vs[-1] == "0.5.23" and len(vs) == len(set(vs)) == 101
    assert {"0.4.0.post2", "0.4.9.post6", "0.5.0rc2", "0.5.6.post2", "0.5.15.post1"} <= set(vs)
    assert "0.5.0" not in vs  # never published: 0.5.0rc2 was followed by 0.5.1
    assert all(r.rules in RULE_SETS for r in RELEASES)
    assert all(r.date and r.date[:4] in ("2024", "2025", "2026") for r in RELEASES)
    assert [r.date for r in RELEASES[:3]] == ["2024-12-03", "2024-12-06", "2024-12-21"]
    # every group is named after its first release and is contiguous in release order
    order = list(dict.fromkeys(r.rules for r in RELEASES))
    assert order == list(RULE_SETS)
    first = {}
    for r in RELEASES:
        first.setdefault(r.rules, r.version)
    assert all(first[n] == n or (n, first[n]) in {("0.5.3", "0.5.3rc2"), ("0.5.10", "0.5.10rc0")} for n in first)


def test_release_api():
    assert release("v0.4.10.post1").rules == "0.4.9.post3" and release("0.4.10.post1").date == "2025-08-01"
    with pytest.raises(MemfracError, match="not a published release"):
        release("0.4.11")
    got = releases_between("0.4.6.post4", "0.4.7")
    assert [r.version for r in got] == ["0.4.6.post4", "0.4.6.post5", "0.4.7"]
    assert len(releases_between(None, "0.4.0.post2")) == 3 and releases_between("0.5.23", None)[0].version == "0.5.23"
    assert [r.name for r in rule_sets_for(["0.4.7", "0.4.6.post2", "0.4.6.post3"])] == ["0.4.6.post2", "0.4.7"]
    assert rules_for("0.4.6.post6").name == "0.4.6.post5"  # an unpublished .post: the newest release under it
    with pytest.raises(MemfracError, match=r"predates 0\.4\.0"):
        rules_for("0.3.6")
    with pytest.raises(MemfracError, match=r"unknown sglang release 'v0\.x'"):
        rules_for("v0.x")


@pytest.mark.parametrize("rules", sorted(RULE_SETS))
def test_every_rule_set_explains_every_term(rules):
    r = reserve(HeuristicInputs(gpu_mem_mib=H200, tp=8, attn_dp=8, speculative_algorithm="EAGLE"), rules_for(rules))
    assert [t.name for t in r.terms] == list(TERM_NAMES) and all(t.reason for t in r.terms)
    assert r.rule_set.summary and r.rule_set.releases


def test_issue_headline_deepseek_r1_tp8_b200_on_0_4_10():
    # issue 10: a DeepSeek-R1 TP8 B200 log from 0.4.10 is 0.821 / 32 GiB reserved, not 0.950 / 8.2 GiB
    # 0.4.10 server_args.py:286-325: B200 183359 MiB ≥ 160 GiB → 32 × 1024 = 32768 flat;
    # (183359 − 32768) / 183359 = 150591 / 183359 = 0.82129 → 0.821
    r = reserve(HeuristicInputs(gpu_mem_mib=B200, tp=8, is_mla=True), rules_for("0.4.10"))
    assert (r.mem_fraction_static, r.reserved_mib) == (0.821, 32768)


def test_explain_cli_takes_every_release(capsys):
    import json

    from profiler.face.cli import main

    root = ROOT
    toml = str(root / "scenarios/llama8b-h200-decode.toml")
    # H200 tp 1 on 0.4.10.post1: 12 GiB + 1/2 GiB = 12800 → 130971 / 143771 = 0.91097 → 0.911
    assert main(["explain", toml, "--rules", "v0.4.10.post1", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["rules"], d["mem_fraction_static"], d["reserved_mib"]) == ("0.4.9.post3", 0.911, 12800)
    assert "reserve by GPU band" in d["rule"] and d["rule_releases"] == "0.4.9.post3 … 0.5.2rc2"
    assert main(["explain", toml, "--rules", "0.4.0"]) == 0
    out = capsys.readouterr().out
    assert "the rule: fraction by tp size" in out and "mem_fraction_static = 0.880" in out
    assert "activation" not in out  # terms of the later mechanism are not listed for a formula rule
    assert main(["explain", toml, "--rules", "0.6.1", "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["rules"] == "0.5.23" and "newer than 0.5.23" in cap.err
    assert main(["explain", toml, "--rules", "0.3.6"]) == 2
    assert "predates 0.4.0" in capsys.readouterr().err


def test_inputs_from_an_old_log_server_args():
    from profiler.model.heuristic import inputs_from_args

    # a 0.5.6 server_args with --enable-piecewise-cuda-graph: the opt-in term counts (max tokens 4096 // 4)
    args = {"tp_size": 1, "chunked_prefill_size": 2048, "cuda_graph_max_bs": 256, "enable_piecewise_cuda_graph": True,
            "piecewise_cuda_graph_max_tokens": 4096, "model_path": "m"}  # fmt: skip
    inp = inputs_from_args(args, gpu_mem_mib=H100, architecture="LlamaForCausalLM")
    # 512 + 3072 + 512 + 128 = 4224 → floor 10240 → + 1024 = 11264 → 70295 / 81559 = 0.86189 → 0.862
    assert reserve(inp, rules_for("0.5.6")).mem_fraction_static == 0.862
    # 0.4.x spell attention DP --dp-size 8 --enable-dp-attention and DeepEP --enable-deepep-moe
    args = {"tp_size": 8, "dp_size": 8, "enable_dp_attention": True, "enable_deepep_moe": True}
    inp = inputs_from_args(args, gpu_mem_mib=B200, architecture="DeepseekV3ForCausalLM")
    assert (inp.attn_dp, inp.moe_a2a_backend) == (8, "deepep")
    # 0.4.10: 32768 + 4096 (DP attention) = 36864 → 146495 / 183359 = 0.79895 → 0.799
    assert reserve(inp, rules_for("0.4.10")).mem_fraction_static == 0.799
