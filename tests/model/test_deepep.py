"""Tests for profiler.model.deepep: every expected integer is worked out by hand in the comments.

Shared definitions for the hand arithmetic (sgl-deep-ep 0.1.2.post1, csrc/legacy/config.hpp):

Low-latency RDMA hint, H = hidden, E = experts, T = tokens per rank, S = H // 128:
    dispatch message d = 16 + max(2H, H + 4S)        combine message c = 4S + 2H
    send = max(T*d, E*T*c)    recv = E*T*max(d, c)    signal = align128(4E)
    n = 2*send + 2*recv + 2*signal;  hint = (n + 128) // 128 * 128
For every model below c > d and E*T*c > T*d, so send = recv = E*T*c and n = 4*E*T*c + 2*signal,
and n is a multiple of 128, so the hint is n + 128.

Normal NVL hint for R <= 8 with the recommended configs (num_sms 20 -> 10 channels, nvl_recv 256 for
both dispatch and combine), hidden_bytes = 2H:
    prefix = 10 * R * (2*1 + 3) * 4
    per token = 2H + 8 (SourceMeta) + 128*8 (top-k idx) + 128*4 (weights) + 128*4 (scales) = 2H + 2056
    hint = align128(prefix + 10 * R * 256 * per_token)
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from pathlib import Path

import pytest

from profiler.model.deepep import (
    DeepEPInputs,
    analytic_sizes,
    cross_check_with_deep_ep,
    inputs_from_model_config,
    low_latency_rdma_size_hint,
    normal_nvl_size_hint,
    normal_rdma_size_hint,
)

MIB = 2**20
GIB = 2**30
MODELS = Path("/work/shared/models")

# ---------------------------------------------------------------- low-latency RDMA, by hand
# DeepSeek-V3 / Kimi-K2: H = 7168, S = 56, d = 16 + max(14336, 7168 + 224) = 14352, c = 224 + 14336 = 14560.
# Qwen3-235B-A22B:       H = 4096, S = 32, d = 16 + max(8192, 4096 + 128) = 8208,   c = 128 + 8192 = 8320.
# Qwen3-30B-A3B:         H = 2048, S = 16, d = 16 + max(4096, 2048 + 64) = 4112,    c = 64 + 4096 = 4160.
LL_CASES = [
    # (label, H, E, T, expected bytes)
    # E*T*c = 256*128*14560 = 477,102,080; n = 4*477,102,080 + 2*1024 = 1,908,410,368; +128
    ("DeepSeek-V3", 7168, 256, 128, 1_908_410_496),
    # 256*256*14560 = 954,204,160; n = 4*954,204,160 + 2*1024 = 3,816,818,688; +128
    ("DeepSeek-V3", 7168, 256, 256, 3_816_818_816),
    # 288*128*14560 = 536,739,840; n = 2,146,959,360 + 2*1152 = 2,146,961,664; +128
    ("E288", 7168, 288, 128, 2_146_961_792),
    # 288*256*14560 = 1,073,479,680; n = 4,293,918,720 + 2*1152 = 4,293,921,024; +128
    ("E288", 7168, 288, 256, 4_293_921_152),
    # 384*128*14560 = 715,653,120; n = 2,862,612,480 + 2*1536 = 2,862,615,552; +128
    ("Kimi-K2", 7168, 384, 128, 2_862_615_680),
    # 384*256*14560 = 1,431,306,240; n = 5,725,224,960 + 2*1536 = 5,725,228,032; +128
    ("Kimi-K2", 7168, 384, 256, 5_725_228_160),
    # 128*128*8320 = 136,314,880; n = 545,259,520 + 2*512 = 545,260,544; +128
    ("Qwen3-235B", 4096, 128, 128, 545_260_672),
    # 128*256*8320 = 272,629,760; n = 1,090,519,040 + 2*512 = 1,090,520,064; +128
    ("Qwen3-235B", 4096, 128, 256, 1_090_520_192),
    # 128*128*4160 = 68,157,440; n = 272,629,760 + 2*512 = 272,630,784; +128
    ("Qwen3-30B", 2048, 128, 128, 272_630_912),
    # 128*256*4160 = 136,314,880; n = 545,259,520 + 2*512 = 545,260,544; +128
    ("Qwen3-30B", 2048, 128, 256, 545_260_672),
]


@pytest.mark.parametrize(("label", "hidden", "experts", "tokens", "expected"), LL_CASES)
def test_low_latency_hint_matches_hand_arithmetic(label, hidden, experts, tokens, expected):
    # The hand steps above, re-done here so a typo in a comment cannot hide.
    s = hidden // 128
    d, c = 16 + max(2 * hidden, hidden + 4 * s), 4 * s + 2 * hidden
    assert c > d
    n = 4 * experts * tokens * c + 2 * (-(-4 * experts // 128) * 128)
    assert n % 128 == 0 and n + 128 == expected, label
    assert low_latency_rdma_size_hint(tokens, hidden, experts) == expected
    sizes = analytic_sizes(DeepEPInputs(hidden, experts, tokens_per_rank=tokens, mode="low_latency"))
    assert sizes.low_latency_rdma == expected


@pytest.mark.parametrize(
    ("hidden", "experts", "gib"),
    [(7168, 256, "1.777"), (7168, 288, "2.000"), (7168, 384, "2.666"), (4096, 128, "0.508")],
)
def test_reference_gib_values(hidden, experts, gib):
    sizes = analytic_sizes(DeepEPInputs(hidden, experts))
    assert f"{sizes.low_latency_rdma_gib:.3f}" == gib


def test_doubling_tokens_doubles_all_but_signal_and_last_block():
    # hint(T) = 4*E*T*c + 2*signal + 128, so 2*hint(128) - hint(256) = 2*signal + 128 = 2*1024 + 128.
    t128 = low_latency_rdma_size_hint(128, 7168, 256)
    t256 = low_latency_rdma_size_hint(256, 7168, 256)
    assert 2 * t128 - t256 == 2 * 1024 + 128 == 2176


def test_low_latency_last_block_only_when_already_aligned():
    # H = 2880 (gpt-oss), E = 32, T = 1: S = 22, d = 16 + max(5760, 2968) = 5776, c = 88 + 5760 = 5848;
    # send = max(5776, 32*5848 = 187,136), recv = 32*5848 = 187,136, signal = align128(128) = 128;
    # n = 4*187,136 + 256 = 748,800 = 5850*128 -> hint 748,928.
    assert low_latency_rdma_size_hint(1, 2880, 32) == 748_928
    # H = 2048, E = 2, T = 1: d = 4112, c = 4160; send = max(4112, 8320) = 8320, recv = 2*4160 = 8320,
    # signal = 128; n = 4*8320 + 256 = 33,536 = 262*128 -> 33,664.
    assert low_latency_rdma_size_hint(1, 2048, 2) == 33_664
    # H = 2048, E = 3, T = 1: send = recv = 3*4160 = 12,480; n = 49,920 + 256 = 50,176 = 392*128 -> 50,304.
    assert low_latency_rdma_size_hint(1, 2048, 3) == 50_304


def test_low_latency_rejects_unaligned_messages():
    # H = 128, T = 1, E = 2: d = 16 + max(256, 132) = 272, c = 4 + 256 = 260, send = max(272, 520) = 520,
    # and 520 % 16 = 8: DeepEP's LowLatencyLayout asserts; so do we.
    with pytest.raises(ValueError, match="multiples of 16"):
        low_latency_rdma_size_hint(1, 128, 2)


def test_low_latency_does_not_depend_on_rank_count():
    sizes = {
        r: analytic_sizes(DeepEPInputs(7168, 256, num_ranks=r, mode="low_latency")).low_latency_rdma
        for r in (2, 4, 8, 16, 32, 64, 256)
    }
    assert set(sizes.values()) == {1_908_410_496}


# ---------------------------------------------------------------- normal mode, by hand
@pytest.mark.parametrize(
    ("hidden", "expected"),
    [
        # prefix = 10*8*5*4 = 1600; 10*8*256 = 20,480 tokens
        # H 7168: 20,480 * (14,336 + 2,056 = 16,392) = 335,708,160; +1600 = 335,709,760
        #         = 2,622,732.5 * 128 -> align up 2,622,733 * 128 = 335,709,824
        (7168, 335_709_824),
        # H 4096: 20,480 * 10,248 = 209,879,040; +1600 = 209,880,640 = 1,639,692.5*128 -> 209,880,704
        (4096, 209_880_704),
        # H 2048: 20,480 * 6,152 = 125,992,960; +1600 = 125,994,560 = 984,332.5*128 -> 125,994,624
        (2048, 125_994_624),
    ],
)
def test_normal_nvl_hint_8_ranks(hidden, expected):
    assert 20_480 * (2 * hidden + 2056) + 1600 + 64 == expected  # +64 is the half block the align adds
    assert normal_nvl_size_hint(2 * hidden, 8) == expected
    sizes = analytic_sizes(DeepEPInputs(hidden, 256, mode="normal"))
    assert sizes.normal_nvl == sizes.num_nvl_bytes == expected
    assert sizes.normal_rdma == sizes.num_rdma_bytes == 0  # one node: pure NVLink


def test_normal_nvl_hint_fewer_ranks_scales_with_peers():
    # R = 2: dispatch (24, 256) and combine (10, 256) share nvl_recv 256, so both give
    # prefix 10*2*5*4 = 400 and 10*2*256*16,392 = 83,927,040 -> 83,927,440 = 655,683.125*128 -> 83,927,552.
    assert normal_nvl_size_hint(14_336, 2) == 83_927_552


def test_normal_hints_16_ranks():
    # R = 16: n = 8 NVL peers, r = 2 RDMA ranks, 10 channels, hidden_bytes 14,336.
    # NVL: dispatch and combine both have nvl_recv 288; prefix 10*8*(2*2+3)*4 = 2,240;
    #      10*8*288*16,392 = 377,671,680; +2,240 = 377,673,920 = 2,950,577.5*128 -> 377,673,984.
    assert normal_nvl_size_hint(14_336, 16) == 377_673_984
    # RDMA: per token = 14,336 + 8 + 1,024 + 512 + 512 + 16 (int4) = 16,408, doubled = 32,816;
    #       prefix = 10*2*(8*2+2)*2*4 = 2,880.
    #   dispatch (rdma_send 20, rdma_recv 128 -> aligned up to 140): 10*2*140*32,816 = 91,884,800
    #       +2,880 = 91,887,680 = 717,872.5*128 -> 91,887,744
    #   combine (rdma_send 12, rdma_recv 128 -> 132): 10*2*132*32,816 = 86,634,240 +2,880 -> 86,637,184
    #   max = 91,887,744
    assert normal_rdma_size_hint(14_336, 16) == 91_887_744


def test_normal_rdma_is_zero_up_to_8_ranks():
    assert [normal_rdma_size_hint(14_336, r) for r in (2, 4, 8)] == [0, 0, 0]


def test_num_sms_scales_channels():
    # num_sms 32 -> 16 channels: 16*8*256*16,392 = 537,133,056; prefix 16*8*5*4 = 2,560;
    # 537,135,616 = 4,196,372*128 exactly -> 537,135,616.
    assert analytic_sizes(DeepEPInputs(7168, 256, num_sms=32, mode="normal")).normal_nvl == 537_135_616


# ---------------------------------------------------------------- modes and totals
def test_mode_auto_allocates_both_and_shares_rdma():
    s = analytic_sizes(DeepEPInputs(7168, 256, mode="auto"))
    assert s.low_latency_rdma == 1_908_410_496
    assert s.normal_nvl == s.num_nvl_bytes == 335_709_824
    assert s.num_rdma_bytes == 1_908_410_496  # max(normal RDMA 0, LL)
    assert s.nvl_metadata == 8 * 4 + 8 * 8 + 8 * 8 == 160
    assert s.workspace == 32 * MIB


def test_mode_low_latency_only():
    s = analytic_sizes(DeepEPInputs(7168, 256, mode="low_latency"))
    assert (s.normal_nvl, s.normal_rdma, s.num_nvl_bytes, s.nvl_metadata) == (0, 0, 0, 0)
    assert s.num_rdma_bytes == s.low_latency_rdma == 1_908_410_496
    # 1,908,410,496 B = 3.55 x 512 MiB -> 4 granules = 2 GiB of heap
    assert s.rdma_heap_reserved == 4 * 512 * MIB == 2 * GIB
    assert s.rdma_heap_rounding == 2 * GIB - 1_908_410_496 == 239_073_152
    # 32 MiB workspace + 2 GiB heap = 33,554,432 + 2,147,483,648 = 2,181,038,080
    assert s.total_bytes == 2_181_038_080
    assert s.analytic_bytes == 33_554_432 + 1_908_410_496 == 1_941_964_928


def test_mode_normal_only():
    s = analytic_sizes(DeepEPInputs(7168, 256, mode="normal"))
    assert s.low_latency_rdma == 0 and s.num_rdma_bytes == 0 and s.rdma_heap_reserved == 0
    # no NVSHMEM heap: NVL 335,709,824 + 160 + workspace 33,554,432 = 369,264,416
    assert s.total_bytes == s.analytic_bytes == 369_264_416


def test_mode_auto_totals_deepseek_v3():
    s = analytic_sizes(DeepEPInputs(7168, 256))
    # total = 335,709,824 + 160 + 33,554,432 + 2,147,483,648 = 2,516,748,064 (2.344 GiB)
    assert s.total_bytes == 2_516_748_064
    # analytic = 335,709,824 + 160 + 33,554,432 + 1,908,410,496 = 2,277,674,912
    assert s.analytic_bytes == 2_277_674_912
    assert s.heuristic_reserve_bytes == 2 * GIB
    assert s.excess_over_heuristic_bytes == 2_516_748_064 - 2_147_483_648 == 369_264_416
    assert f"{s.total_gib:.3f}" == "2.344"
    assert s.total_mib == pytest.approx(2_516_748_064 / MIB)


def test_mode_auto_16_ranks_takes_max_not_sum():
    s = analytic_sizes(DeepEPInputs(7168, 256, num_ranks=16))
    assert s.normal_rdma == 91_887_744 and s.low_latency_rdma == 1_908_410_496
    assert s.num_rdma_bytes == 1_908_410_496  # sglang: max(normal, LL) for the one RDMA buffer
    s_normal = analytic_sizes(DeepEPInputs(7168, 256, num_ranks=16, mode="normal"))
    assert s_normal.num_rdma_bytes == 91_887_744
    assert s_normal.rdma_heap_reserved == 512 * MIB  # one granule


def test_e288_is_just_below_2_gib_of_heap():
    # 2 GiB - 2,146,961,792 = 521,856 B of headroom: NVSHMEM's own symmetric objects can tip it over.
    s = analytic_sizes(DeepEPInputs(7168, 288, mode="low_latency"))
    assert s.rdma_heap_reserved == 2 * GIB and s.rdma_heap_rounding == 521_856


def test_sizes_are_frozen():
    s = analytic_sizes(DeepEPInputs(7168, 256))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.total_bytes = 0  # type: ignore[misc]


# ---------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        ({"tokens_per_rank": 0}, ["tokens_per_rank=0", "1..1024"]),
        ({"tokens_per_rank": 1025}, ["tokens_per_rank=1025", "1..1024"]),
        ({"num_ranks": 1}, ["num_ranks=1", "Unsupported number of EP ranks: 1", "2, 4, 8, 16"]),
        ({"num_ranks": 0}, ["num_ranks=0", ">= 1"]),
        ({"num_ranks": 12}, ["num_ranks=12", "multiple of 8"]),
        ({"hidden": 0}, ["hidden=0", "positive integer"]),
        ({"hidden": -7168}, ["hidden=-7168", "positive integer"]),
        ({"num_experts": 0}, ["num_experts=0", "positive integer"]),
        ({"hidden": 7168.0}, ["hidden must be an integer", "7168.0"]),
        ({"mode": "fast"}, ["mode='fast'", "low_latency, normal, auto"]),
        ({"num_sms": 21}, ["num_sms=21", "even"]),
        ({"num_sms": 0}, ["num_sms=0", "even"]),
        ({"hidden_bytes": 0}, ["hidden_bytes=0", "positive integer"]),
        ({"num_ranks": 6, "mode": "normal"}, ["num_ranks=6", "2, 4, 8, 16"]),
        ({"num_ranks": 256, "mode": "auto"}, ["num_ranks=256", "160"]),
        ({"num_experts": 100}, ["num_experts=100", "num_ranks=8"]),
    ],
)
def test_invalid_inputs_name_parameter_value_and_range(kwargs, fragments):
    args = {"hidden": 7168, "num_experts": 256} | kwargs
    with pytest.raises(ValueError) as err:
        DeepEPInputs(**args)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_valid_edge_inputs_are_accepted():
    DeepEPInputs(7168, 256, tokens_per_rank=1)
    DeepEPInputs(7168, 256, tokens_per_rank=1024)
    DeepEPInputs(7168, 258, num_ranks=6, mode="low_latency")  # LL needs no recommended config
    DeepEPInputs(7168, 256, num_ranks=1, mode="low_latency")  # sglang builds it at tp 1 too
    DeepEPInputs(7168, 100, mode="normal")  # divisibility is asserted only for low latency


def test_buffer_limit_is_enforced():
    # T = 1024, E = 2048, H = 7168: 4*2048*1024*14560 B ~ 114 GiB > DeepEP's 32 GiB (size/16 < INT_MAX).
    with pytest.raises(ValueError, match="32 GiB"):
        analytic_sizes(DeepEPInputs(7168, 2048, tokens_per_rank=1024, mode="low_latency"))


# ---------------------------------------------------------------- model configs
def _config(name: str) -> dict:
    path = MODELS / name / "config.json"
    if not path.exists():
        pytest.skip(f"{path} not available")
    return json.loads(path.read_text())


@pytest.mark.parametrize(
    ("name", "hidden", "experts"),
    [
        ("deepseek-ai--DeepSeek-V3", 7168, 256),  # n_routed_experts
        ("moonshotai--Kimi-K2-Instruct", 7168, 384),  # n_routed_experts
        ("Qwen--Qwen3-235B-A22B", 4096, 128),  # num_experts
        ("Qwen--Qwen3-30B-A3B", 2048, 128),  # num_experts
    ],
)
def test_inputs_from_real_model_configs(name, hidden, experts):
    inp = inputs_from_model_config(_config(name), tokens_per_rank=256, num_ranks=16, mode="low_latency")
    assert (inp.hidden, inp.num_experts) == (hidden, experts)
    assert (inp.tokens_per_rank, inp.num_ranks, inp.mode) == (256, 16, "low_latency")
    assert inp.hidden_bytes is None and inp.effective_hidden_bytes == 2 * hidden


@pytest.mark.parametrize("name", ["Qwen--Qwen3-8B", "meta-llama--Llama-3.1-8B-Instruct"])
def test_dense_model_config_raises(name):
    with pytest.raises(ValueError) as err:
        inputs_from_model_config(_config(name), tokens_per_rank=128, num_ranks=8, mode="auto")
    message = str(err.value)
    assert "n_routed_experts" in message and "num_experts" in message and "not an MoE model" in message


def test_extra_experts_and_missing_hidden():
    # EPLB: 256 routed + 32 redundant = the E-288 case.
    inp = inputs_from_model_config({"hidden_size": 7168, "n_routed_experts": 256}, extra_experts=32)
    assert inp.num_experts == 288
    assert analytic_sizes(inp).low_latency_rdma == 2_146_961_792
    with pytest.raises(ValueError, match="hidden_size"):
        inputs_from_model_config({"n_routed_experts": 256})
    with pytest.raises(ValueError, match="extra_experts=-1"):
        inputs_from_model_config({"hidden_size": 7168, "n_routed_experts": 256}, extra_experts=-1)


# ---------------------------------------------------------------- cross-check with deep_ep
def test_cross_check_returns_none_without_deep_ep(monkeypatch):
    monkeypatch.setitem(sys.modules, "deep_ep", None)  # makes `import deep_ep` raise ImportError
    assert cross_check_with_deep_ep(DeepEPInputs(7168, 256)) is None


def test_cross_check_reports_both_numbers(monkeypatch):
    class FakeConfig:
        def __init__(self, nvl: int, rdma: int) -> None:
            self.nvl, self.rdma = nvl, rdma

        def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
            return self.nvl

        def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
            return self.rdma

    class FakeBuffer:
        num_sms = 20

        @staticmethod
        def get_low_latency_rdma_size_hint(t: int, h: int, r: int, e: int) -> int:
            return 1_908_410_496

        @staticmethod
        def get_dispatch_config(r: int) -> FakeConfig:
            return FakeConfig(335_709_824, 0)

        @staticmethod
        def get_combine_config(r: int) -> FakeConfig:
            return FakeConfig(1, 0)

    fake = types.SimpleNamespace(Buffer=FakeBuffer, Config=FakeConfig, __version__="fake")
    monkeypatch.setitem(sys.modules, "deep_ep", fake)
    result = cross_check_with_deep_ep(DeepEPInputs(7168, 256))
    assert result is not None and result["match"] is True
    assert result["low_latency_rdma"] == {"ours": 1_908_410_496, "deep_ep": 1_908_410_496}
    assert result["normal_nvl"] == {"ours": 335_709_824, "deep_ep": 335_709_824}
    assert result["config_source"] == "deep_ep.Buffer recommended"


@pytest.mark.gpu
@pytest.mark.parametrize("num_ranks", [2, 8, 16])
def test_cross_check_against_installed_deep_ep(num_ranks):
    result = cross_check_with_deep_ep(DeepEPInputs(7168, 256, num_ranks=num_ranks))
    if result is None:
        pytest.skip("deep_ep is not importable here (it needs a CUDA device)")
    assert result["match"], result
