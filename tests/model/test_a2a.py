"""profiler.model.a2a: every backend's buffer size pinned by hand arithmetic, the scenario → inputs mapping, the
report beside the reserve, and the probe's first-creation hook (a real Recorder on the CPU)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from profiler.model import a2a, a2a_inputs
from profiler.model.a2a import (
    A2AInputs,
    flashinfer_aux_bytes,
    flashinfer_workspace_bytes_per_rank,
    mooncake_ep_buffer_bytes,
    nixl_ep_rdma_buffer_bytes,
    pplx_internode_bytes,
    pplx_intranode_bytes,
    size_for,
)
from profiler.model.deepep import low_latency_rdma_size_hint, v2_elastic_buffer_bytes, v2_workspace_bytes
from profiler.model.heuristic import inputs_from_scenario, reserve
from profiler.model.scenario import single_scenario

MIB = 2**20
DSV3 = "deepseek-ai--DeepSeek-V3"


def test_the_backend_table_is_sglangs_cli_choices():
    # sglang 0.5.23 srt/arg_groups/fields/exec_.py moe_a2a_backend choices, in its order ("customized" is in the
    # MoeA2ABackend enum but not a CLI choice)
    assert a2a.A2A_BACKENDS == (
        "none", "deepep", "mooncake", "nixl", "mori", "ascend_fuseep", "flashinfer", "megamoe", "deepep_v2",
        "pplx", "ascend_tp", "flashinfer_megamoe",
    )  # fmt: skip
    unsized = {n for n, b in a2a.BACKENDS.items() if not b.sized}
    assert unsized == {"mori", "ascend_fuseep", "megamoe", "ascend_tp", "flashinfer_megamoe"}
    assert all(a2a.BACKENDS[n].unsized_reason for n in unsized)


@pytest.mark.skipif(not __import__("importlib").util.find_spec("sglang"), reason="sglang not installed")
def test_the_backend_table_matches_the_installed_sglangs_parser():
    import argparse

    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    (action,) = [x for x in p._actions if "--moe-a2a-backend" in x.option_strings]
    assert set(action.choices) == set(a2a.A2A_BACKENDS)


def test_mooncake_hint_by_hand():
    # E = 256, T = 128, H = 7168: signal 4E = 1024; data E·T·(32 + 2H) = 32768 · 14368 = 470,810,624
    # total = 4·1024 + 4·470,810,624 = 4,096 + 1,883,242,496 = 1,883,246,592
    assert mooncake_ep_buffer_bytes(128, 7168, 8, 256) == 1_883_246_592
    # the rank count does not enter
    assert mooncake_ep_buffer_bytes(128, 7168, 16, 256) == 1_883_246_592


def test_nixl_hint_by_hand_is_deepeps_with_8_byte_signals():
    # d = 16 + max(14336, 7168 + 224) = 14352, c = 224 + 14336 = 14560; send = recv = E·T·c = 477,102,080
    # signal = align128(8·256) = 2048; n = 4·477,102,080 + 2·2048 = 1,908,412,416 (a multiple of 128) → +128
    assert nixl_ep_rdma_buffer_bytes(128, 7168, 8, 256) == 1_908_412_544
    # DeepEP's low-latency hint differs only by the signal width (4 B: 2·1024 instead of 2·2048)
    assert nixl_ep_rdma_buffer_bytes(128, 7168, 8, 256) - low_latency_rdma_size_hint(128, 7168, 256) == 2048


def test_deepep_v2_direct_by_hand():
    # dispatch token: align32(2·7168) + align32(0) + align32(8·8 + 9·4 = 100 → 128) = 14464 B
    # dispatch = R·T·14464 = 8·4096·14464 = 473,956,352; combine token 14336 + align32(64) = 14400,
    # combine = min(8, 8)·4096·14400 = 471,859,200; max aligned to 2 MiB: 473,956,352 = 226 · 2 MiB
    assert v2_elastic_buffer_bytes(4096, 7168, 8, 8) == 473_956_352
    # FP8: 7168 + align32(ceil(7168/32)·4 = 896) + 128 = 8192 B → 8·4096·8192 = 268,435,456 < combine 471,859,200
    # → 471,859,200 aligned up to 2 MiB = 225 · 2 MiB = 471,859,200
    assert v2_elastic_buffer_bytes(4096, 7168, 8, 8, fp8_dispatch=True) == 471_859_200


def test_deepep_v2_direct_combine_counts_min_of_ranks_and_topk():
    # Direct mode's combine buffer holds min(R, top-k) copies of each token (allow_multiple_reduction), so with
    # R ≠ top-k; FP8 dispatch so that the combine can dominate. Dispatch token 8192 B, combine token 14400 B
    # (test_deepep_v2_direct_by_hand). R = 4 < k = 8: dispatch 4·4096·8192 = 134,217,728; combine
    # min(4, 8)·4096·14400 = 235,929,600 (k copies would be 471,859,200) → 112.5 → 113 · 2 MiB = 236,978,176
    assert v2_elastic_buffer_bytes(4096, 7168, 8, 4, fp8_dispatch=True) == 236_978_176
    # R = 16 > k = 8 (one scale-up domain): dispatch 16·4096·8192 = 536,870,912; combine min(16, 8)·4096·14400
    # = 471,859,200 (R copies would be 943,718,400) → the dispatch, 256 · 2 MiB = 536,870,912
    assert v2_elastic_buffer_bytes(4096, 7168, 8, 16, fp8_dispatch=True) == 536_870_912


def test_deepep_v2_hybrid_reproduces_the_public_measurement():
    # sglang PR #24443 (markw14, 2026-08-07): EP_BUFFER_DEBUG=1, 2 nodes / 16 ranks, num_max_tokens_per_rank
    # 4096, hidden 7168, BF16, num_topk 8 → "Initializing EP elastic buffer with 1218445312 bytes".
    # Hybrid: scale-out 2 × scale-up 8. Dispatch: 8·(2·4096)·14464 + 4096·14464 + 2·(4096 + 1280)·14464
    #   = 947,912,704 + 59,244,544 + 155,516,928 = 1,162,674,176
    # Combine: 8·(2·4096)·14400 + 2·4096·14400 + 1·2·(4096 + 1280)·14400
    #   = 943,718,400 + 117,964,800 + 154,828,800 = 1,216,512,000 → aligned to 2 MiB: 581 · 2,097,152
    assert v2_elastic_buffer_bytes(4096, 7168, 8, 16, hybrid=True) == 1_218_445_312


def test_deepep_v2_workspace_by_hand():
    # WorkspaceLayout::get_num_bytes with R = 1024, E = 2048, C = 1280 channels:
    # 16 + (R+E)·8 + R·16 + E·16 + R·4 + R·8 + E·8 + R·C·8 + R·C·4 + 32 + 33·R·4
    # = 16 + 24,576 + 16,384 + 32,768 + 4,096 + 8,192 + 16,384 + 10,485,760 + 5,242,880 + 32 + 135,168
    # = 15,966,256 → aligned to 2 MiB = 16 MiB
    assert v2_workspace_bytes() == 16 * MIB


def test_pplx_intranode_by_hand():
    # DeepSeek-V3 on 8 GPUs: L = 256/8 = 32, T = 128, BF16 hidden bytes 14336
    # dispatch = 16 + 128 + 128·32·round16(14340 → 14352) = 58,785,936; combine = 16 + 128 + 4096·28672 = 117,440,656
    # 8 send buffers of the max: 939,525,248; + 4T 512 + 4E 1024 + 4LW 1024 + 6·4·(32·128·8) 786,432 + 4 + 3·8·8 192
    assert pplx_intranode_bytes(128, 256, 8, 7168, 14336) == 940_314_436
    # internode (NVSHMEM), 16 ranks in 2 DP groups of 8: L 16, G 2, B = 16·2·128 = 4096, per token 14352
    # nvshmem = 2·8·16·2 512 + 8·128 1024 + 8·16 128 + 128·14352 1,837,056 + 4096·14352 58,785,792
    #         + 4096·28672 117,440,512 + 128·256·28672 939,524,096 = 1,117,589,120
    # cudaMalloc = 4·16·2 128 + 5·4·4096 81,920 + 4 → 1,117,671,172
    assert pplx_internode_bytes(128, 256, 16, 8, 7168, 14336) == 1_117_671_172


def test_flashinfer_workspace_by_hand():
    # aux (calculateOffsets, ep 8, T 4096, kMaxTopK 22): 4+4+32+32 = 72 → 128; +32 → 160 → 256; +32 → 288
    # → 384; + 4096·22·4 = 360,448 → 360,832; + 360,448 → 721,280; + 0 (no EPLB) → 721,280 (all 128-aligned)
    assert flashinfer_aux_bytes(8, 4096) == 721_280
    # payloads: dispatch 2·7168 + 8·4 + 8·4 = 14400, combine 14336; 8·4096·14400 + 8·4096·14336
    assert flashinfer_workspace_bytes_per_rank(8, 4096, 14400, 14336) == 721_280 + 471_859_200 + 469_762_048


def test_size_for_dispatches_and_says_why_not():
    inp = A2AInputs("mooncake", 7168, 256, 8, 8, 128, deepep_mode="low_latency")
    s = size_for(inp)
    assert s.analytic_bytes == 1_883_246_592 + 32 * MIB and not s.fails
    auto = size_for(A2AInputs("mooncake", 7168, 256, 8, 8, 128))
    assert "NotImplementedError" in auto.fails and "Mooncake" in auto.fails  # mooncake.py get_ep_buffer
    mm = size_for(A2AInputs("megamoe", 7168, 256, 8, 8, 8192))
    assert mm.analytic_bytes is None and "CUDA device" in mm.note
    assert size_for(A2AInputs("none", 7168, 256, 8, 8, 0)).analytic_bytes == 0
    with pytest.raises(ValueError, match=r"sglang 0\.5\.23 accepts"):
        size_for(A2AInputs("deepep3", 7168, 256, 8, 8, 128))


def test_report_for_dsv3_deepep_decode_exceeds_the_2gib_reserve():
    s = single_scenario(DSV3, "H200", mode="decode", tp=8, moe_a2a_backend="deepep")
    r = reserve(inputs_from_scenario(s))
    rep = a2a_inputs.report_for(s, r)
    # device: NVL 335,709,824 + 160 + workspace 33,554,432 + LL 1,908,410,496 rounded to 4 · 512 MiB
    # = 2,516,748,064 B = 2,400.16 MiB; reserve: deepep_a2a 2048 (no prefill graph on a decode node)
    assert rep.size.device_bytes == 2_516_748_064
    assert rep.reserve_mib == 2048.0 and rep.verdict == "over_reserve"
    assert abs(rep.excess_mib - (2_516_748_064 / MIB - 2048)) < 1e-9


def test_report_for_other_backends_reserves_nothing_and_flashinfer_defaults_to_4096_tokens():
    s = single_scenario(
        DSV3, "H200", mode="decode", tp=8, attn_dp=8, moe_a2a_backend="flashinfer", moe_runner_backend="x"
    )
    rep = a2a_inputs.report_for(s, reserve(inputs_from_scenario(s)))
    # chunk 8192 (H200 band) / attn_dp 8 = 1024 per DP rank; sglang takes max(1024, 4096)
    assert rep.size.tokens_per_rank == 4096 and rep.reserve_mib == 0.0 and rep.verdict == "over_reserve"
    assert rep.size.analytic_bytes == 942_342_528  # the flashinfer sum above


# ---------------------------------------------------------------- the probe's first-creation hook


def _records(d: Path) -> list[dict]:
    (f,) = d.glob("probe-*.jsonl")
    return [json.loads(x) for x in f.read_text().splitlines()]


def test_first_creation_hook_measures_once_with_the_arguments_and_the_analytic_size(tmp_path):
    from profiler.measure.probe.plugin import _a2a_hook
    from profiler.measure.probe.recorder import Recorder
    from profiler.measure.probe.targets import Target

    class Group:
        def size(self) -> int:
            return 8

    calls = []

    # the signature of sglang 0.5.23 mooncake.EPBuffer.get_ep_buffer (a classmethod: cls comes first)
    def get_ep_buffer(cls, group, hidden_size, param_bytes, deepep_mode, num_max_dispatch_tokens_per_rank=-1,
                      num_experts=-1):  # fmt: skip
        calls.append(1)
        return types.SimpleNamespace(num_ep_buffer_bytes=1_883_246_592)

    rec = Recorder(str(tmp_path))
    hook = _a2a_hook(rec, Target("a2a_buffer", "x.y", "a2a", False, "mooncake"))
    mode = types.SimpleNamespace(value="low_latency")
    for _ in range(3):
        hook(get_ep_buffer, object, Group(), 7168, 2, mode, 128, 256)
    assert len(calls) == 3
    ends = [r for r in _records(tmp_path) if r["type"] == "end"]
    assert len(ends) == 1 and ends[0]["phase"] == "a2a_buffer"
    d = ends[0]["details"]
    assert d["backend"] == "mooncake" and d["args"]["num_ranks"] == 8 and d["args"]["deepep_mode"] == "low_latency"
    assert d["analytic_bytes"] == 1_883_246_592 + 32 * MIB  # size_from_call: the hint + the 32 MiB workspace
    assert d["reported_bytes"] == 1_883_246_592  # what the Buffer object says it registered


def test_first_creation_hook_records_a_failing_creation(tmp_path):
    from profiler.measure.probe.plugin import _a2a_hook
    from profiler.measure.probe.recorder import Recorder
    from profiler.measure.probe.targets import Target

    def get_nixl_buffer(cls, group, hidden_size, deepep_mode, num_max_dispatch_tokens_per_rank=-1, num_experts=-1,
                        num_local_experts=-1):  # fmt: skip
        raise NotImplementedError("Normal mode is not supported for Nixl EP yet.")  # nixl.py, deepep_mode auto

    rec = Recorder(str(tmp_path))
    hook = _a2a_hook(rec, Target("a2a_buffer", "x.y", "a2a", False, "nixl"))
    with pytest.raises(NotImplementedError):
        hook(get_nixl_buffer, object, None, 7168, types.SimpleNamespace(value="auto"), 128, 256, 32)
    (end,) = [r for r in _records(tmp_path) if r["type"] == "end"]
    assert "Normal mode is not supported" in json.dumps(end)


def test_every_creation_target_names_a_backend():
    from profiler.measure.probe.targets import A2A_CREATION, TARGETS

    assert {b for b, _ in A2A_CREATION} == set(a2a.A2A_BACKENDS) - {"none", "ascend_fuseep", "ascend_tp"}
    a2a_targets = [t for t in TARGETS if t.kind == "a2a"]
    assert all(t.phase == "a2a_buffer" and not t.required and t.backend for t in a2a_targets)


def test_explain_shows_the_buffer_beside_the_reserve_and_both_post_capture_answers():
    from profiler.face.explain import explain, render_text
    from profiler.model.heuristic import rules_for

    s = single_scenario(DSV3, "H200", mode="decode", tp=8, moe_a2a_backend="deepep")
    e = explain(s, rules_for("0.5.23"))
    text = render_text(e)
    assert "all-to-all buffer (deepep), per GPU:" in text
    assert "on the device        2,400.2 MiB" in text and "reserved for it      2,048.0 MiB" in text
    assert "exceeds its reserve by 352 MiB" in text  # 2,400.16 − 2,048
    assert "post-capture KV sizing" in text  # MLA: sglang would not post-capture-size it
    d = e.as_dict()
    assert d["a2a"]["device_bytes"] == 2_516_748_064 and d["a2a"]["verdict"] == "over_reserve"
    assert d["post_capture"]["planned"] is False


def test_one_derivation_of_a_scenarios_deepep_inputs():
    """The sweep's DeepEP columns (a2a_inputs.deepep_sizes_mib) come from the same inputs as the a2a report:
    EP size = tp, dispatch tokens from SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK or sglang's 128."""
    s = single_scenario(DSV3, "H200", mode="decode", tp=8, moe_a2a_backend="deepep")
    inp = a2a_inputs.inputs_for(s)
    assert (inp.hidden, inp.num_experts, inp.num_ranks, inp.tokens_per_rank) == (7168, 256, 8, 128)
    analytic, device = a2a_inputs.deepep_sizes_mib(s)
    # analytic 335,709,824 + 160 + 33,554,432 + 1,908,410,496 = 2,277,674,912 B; device with the LL RDMA buffer
    # rounded to 4 NVSHMEM granules of 512 MiB: 2,516,748,064 B (tests/model/test_deepep.py, by hand)
    assert (analytic, device) == (2_277_674_912 / MIB, 2_516_748_064 / MIB)
    twice = single_scenario(DSV3, "H200", mode="decode", tp=8, moe_a2a_backend="deepep", a2a_dispatch_tokens=256)
    assert a2a_inputs.inputs_for(twice).tokens_per_rank == 256
    # the low-latency RDMA buffer doubles with the tokens (test_doubling_tokens_doubles_all_but_signal_and_last_block)
    assert a2a_inputs.deepep_sizes_mib(twice)[0] > analytic
    assert a2a_inputs.deepep_sizes_mib(single_scenario(DSV3, "H200", tp=8)) == (None, None)
