"""How far a log shows the startup (profiler.logs.state), the fraction the log supports (profiler.logs.printed),
the arguments its lines print, and the GPU capacity inferred from it.

Each trace is built from real lines of the fixture logs named beside it; the sglang behaviour each replays is
cited (file in the sglang package, every release unless said).
"""

from __future__ import annotations

import pytest

from profiler.logs import parse_log

# repo_unknown_kimi-k25-amd-tp8.log (TP0's lines): the excerpt stops at the first tqdm frame of the capture.
KIMI = [
    "[2026-02-26 16:41:18 TP0] Load weight end. elapsed=618.04 s, type=KimiK25ForConditionalGeneration, "
    "dtype=torch.bfloat16, avail mem=209.98 GB, mem usage=73.58 GB.",
    "[2026-02-26 16:41:18 TP0] KV Cache is allocated. #tokens: 2454421, KV size: 160.63 GB",
    "[2026-02-26 16:41:18 TP0] Memory pool end. avail mem=45.25 GB",
    "[2026-02-26 16:41:19 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=45.03 GB",
    "[2026-02-26 16:41:19 TP0] Capture cuda graph bs [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, "
    "112, 120, 128, 136, 144, 152, 160, 168, 176, 184, 192, 200, 208, 216, 224, 232, 240, 248, 256, 272, "
    "288, 304, 320, "
    "336, 352, 368, 384, 400, 416, 432, 448, 464, 480, 496, 512]",
    "  0%|          | 0/52 [00:00<?, ?it/s]",
    "Capturing batches (bs=512 avail_mem=43.46 GB):   0%|          | 0/52 [00:00<?, ?it/s]",
]


def test_capture_in_progress_is_incomplete_with_what_was_seen() -> None:
    (m,) = parse_log(KIMI)
    assert m.startup == "incomplete"
    assert m.startup_seen == (
        "decode_graph capture in progress on rank 'TP0' when the text ends (last tqdm frame bs 512, 43.46 GiB free, "
        "0/52 sizes captured, began at line 4)"
    )


def test_capture_aborted_at_its_first_size() -> None:
    # The custom all-reduce registers the captured graphs' buffers when the capture context closes
    # (srt/distributed/device_communicators/custom_all_reduce.py register_graph_buffers: "Registering
    # {len(offset)} cuda graph addresses"); an exception at the first size closes it with none.
    (m,) = parse_log([*KIMI, "[2026-02-26 16:41:25 TP0] Registering 0 cuda graph addresses"])
    assert m.startup == "aborted" and m.failure is None
    assert m.startup_seen == (
        "decode_graph capture on rank 'TP0' aborted at 0/52: 'Registering 0 cuda graph addresses' at line 8 and no "
        "capture end (the exception is not in the text)"
    )


def test_registered_graphs_then_capture_end_is_finished() -> None:
    # repo_unknown_grok1_8xH100.log lines 27-29
    (m,) = parse_log([
        *KIMI[:5],
        "[2026-02-26 16:41:40 TP0] Registering 2967 cuda graph addresses",
        "[2026-02-26 16:41:40 TP0] Capture cuda graph end. Time elapsed: 21.00 s. mem usage=1.60 GB. avail "
        "mem=43.43 GB.",
    ])  # fmt: skip
    assert m.startup == "finished" and m.ranks[0].phase("decode_graph").details["graph_addresses"] == 2967
    assert m.startup_seen.startswith("startup seen through the end of decode_graph capture")


def test_negative_kv_budget_on_every_rank_is_no_kv() -> None:
    # srt/model_executor/model_runner.py init_memory_pool: with --max-total-tokens it warns
    # "max_total_tokens={} is larger than the profiled value {}. Use the profiled value instead." and then
    # raises "Not enough memory" when the profiled value is <= 0.
    lines = []
    for tp in (0, 1):
        lines += [
            f"[2025-08-01 10:00:00 TP{tp}] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
            "avail mem=10.00 GB, mem usage=70.00 GB.",
            f"[2025-08-01 10:00:01 TP{tp}] max_total_tokens=131072 is larger than the profiled value -561981. Use the "
            "profiled value instead.",
        ]
    (m,) = parse_log(lines)
    assert m.startup == "no_kv" and m.args["max_total_tokens"] == 131072
    assert m.startup_seen == "every rank profiled a KV budget of -561981 tokens (line 2): nothing left for the KV cache"


def test_tqdm_at_total_counts_as_captured() -> None:
    # sglang-pr4826.log: the bar reached 23/23, the end line is not in the excerpt
    (m,) = parse_log([
        "[2025-03-27 21:33:31 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=13.95 GB",
        "Capturing batches (avail_mem=12.55 GB):   0%|          | 0/23 [00:00<?, ?it/s]",
        "Capturing batches (avail_mem=9.72 GB): 100%|██████████| 23/23 [00:09<00:00,  2.51it/s]",
    ])  # fmt: skip
    assert m.startup == "finished"
    assert m.startup_seen == (
        "decode_graph capture on rank 'TP0' reached 23/23 sizes (tqdm); its end line and the ready line are not in "
        "the text"
    )


def test_serving_traffic_finishes_startup_and_is_counted() -> None:
    (m,) = parse_log([
        "[2025-07-22 06:20:00 TP0] Memory pool end. avail mem=12.00 GB",
        "[2025-07-22 06:20:01 TP0] Decode batch. #running-req: 37, #token: 18237, token usage: 0.41, gen throughput "
        "(token/s): 3412.12, #queue-req: 0",
        "[2025-07-22 06:20:02 TP0] Decode batch. #running-req: 64, #token: 41000, token usage: 0.97, gen throughput "
        "(token/s): 3412.12, #queue-req: 12",
        "[2025-07-22 06:20:03 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_tokens_gained: 9",
        "[2025-07-22 06:20:04 TP0] Decode batch. #running-req: 61, #token: 40000, token usage: 0.95, gen throughput "
        "(token/s): 3412.12, #queue-req: 15",
    ])  # fmt: skip
    assert m.startup == "finished"
    assert m.startup_seen == "serving traffic from line 2 (the ready line is not in the text)"
    s = m.serving
    assert (s["batches"], s["peak_running_req"], s["peak_token_usage"], s["peak_queue_req"]) == (3, 64, 0.97, 15)
    assert (s["retractions"], s["retracted_reqs"], s["first_retraction_line"]) == (1, 3, 4)


def test_excerpt_that_stops_after_the_pool() -> None:
    (m,) = parse_log(KIMI[:3])
    assert m.startup == "incomplete"
    assert m.startup_seen == "the text ends at line 3, after kv_pool on rank 'TP0': startup not finished"


# ---- the fraction ---------------------------------------------------------------------------------------


def test_implied_fraction_with_its_arithmetic() -> None:
    # repo_unknown_grok1_8xH100.log TP0: free at start 77.43 (Load weight begin), after weights 40.69,
    # KV 13.79 + 13.79 = 27.58. sglang (model_runner.profile_max_num_token): rest = avail − start × (1 − mfs)
    # → mfs = 1 − (40.69 − 27.58) / 77.43 = 1 − 13.11 / 77.43 = 0.830686…
    # ± (0.005 + 2 × 0.005) / 77.43 + 13.11 × 0.005 / 77.43² = 0.000194 + 0.0000109 = 0.0002
    (m,) = parse_log([
        "[2025-09-11 10:24:24 TP0] Load weight begin. avail mem=77.43 GB",
        "[2025-09-11 10:25:33 TP0] Load weight end. type=Grok1ForCausalLM, dtype=torch.bfloat16, avail mem=40.69 GB, "
        "mem usage=36.73 GB.",
        "[2025-09-11 10:25:43 TP0] KV Cache is allocated. #tokens: 903439, K size: 13.79 GB, V size: 13.79 GB",
    ])  # fmt: skip
    assert (m.mfs, m.mfs_origin, m.mfs_plus_minus) == (0.831, "implied", 0.0002)
    assert m.mfs_how == (
        "implied: 1 − (avail after weights 40.69 − KV pool (K+V) 27.58) / free at start 77.43 ('Load weight begin' "
        "avail mem) = 0.831 ± 0.000, on rank 'TP0'"
    )


def test_implied_without_a_begin_line_uses_after_plus_usage() -> None:
    # repo_unknown_llama31-8b_24gb_docker.log: start = 7.37 + 15.02 = 22.39 (±0.01), KV 2.33 + 2.33
    # mfs = 1 − (7.37 − 4.66) / 22.39 = 1 − 2.71 / 22.39 = 0.878964 → 0.879
    # ± 0.015 / 22.39 + 2.71 × 0.01 / 22.39² = 0.000670 + 0.0000541 = 0.0007
    (m,) = parse_log([
        "[2025-07-14 05:48:43] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=7.37 GB, "
        "mem usage=15.02 GB.",
        "[2025-07-14 05:48:43] KV Cache is allocated. #tokens: 38141, K size: 2.33 GB, V size: 2.33 GB",
    ])  # fmt: skip
    assert (m.mfs, m.mfs_plus_minus) == (0.879, 0.0007) and "(avail after weights + weights mem usage)" in m.mfs_how


def test_capped_pool_implies_nothing() -> None:
    # repo_unknown_sglang-docs-tokenize-qwen25-05b.log: a 20480-token pool on an 80 GB GPU
    # 1 − (77.45 − 0.24) / 78.43 = 0.0156: far below any fraction, the pool was capped
    (m,) = parse_log([
        "[2026-02-04 11:30:29] Load weight begin. avail mem=78.43 GB",
        "[2026-02-04 11:30:29] Load weight end. elapsed=0.38 s, type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail "
        "mem=77.45 GB, mem usage=0.98 GB.",
        "[2026-02-04 11:30:29] KV Cache is allocated. #tokens: 20480, K size: 0.12 GB, V size: 0.12 GB",
    ])  # fmt: skip
    assert m.mfs is None and m.mfs_origin == "unknown" and "it was capped" in m.mfs_how


def test_printed_fraction_and_who_chose_it() -> None:
    cmd = "python3 -m sglang.launch_server --model-path m --tp 1"
    sa = "[2025-05-01 10:00:00] server_args=ServerArgs(model_path='m', mem_fraction_static=0.85, tp_size=1)"
    (auto,) = parse_log([cmd, sa])
    assert (auto.mfs, auto.mfs_origin) == (0.85, "auto")
    (given,) = parse_log([cmd + " --mem-fraction-static 0.85", sa])
    assert (given.mfs, given.mfs_origin, given.mfs_how) == (0.85, "given", "set on the launch command")
    (unknown,) = parse_log([sa])
    assert (unknown.mfs, unknown.mfs_origin) == (0.85, "unknown")


def test_printed_and_implied_agree_or_are_noted() -> None:
    # repo_unknown_qwen3-0.6b_wsl_4gb.log: mfs 0.88 printed; 1 − (2.03 − 1.64) / 3.23 = 0.8793 ± 0.0049
    (m,) = parse_log(_wsl(0.88))
    assert m.mfs == 0.88 and "the KV budget agrees" in m.mfs_how
    (odd,) = parse_log(_wsl(0.70))
    assert odd.mfs == 0.70 and any("differs from the one the KV budget implies" in n for n in odd.notes)


def _wsl(mfs: float) -> list[str]:
    return [
        f"[2025-05-02 10:10:00] server_args=ServerArgs(model_path='Qwen3-0.6B', mem_fraction_static={mfs}, tp_size=1)",
        "[2025-05-02 10:10:04] Load weight begin. avail mem=3.23 GB",
        "[2025-05-02 10:10:06] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=2.03 GB, "
        "mem usage=1.20 GB.",
        "[2025-05-02 10:10:06] KV Cache is allocated. #tokens: 15387, K size: 0.82 GB, V size: 0.82 GB",
    ]


# ---- arguments the lines print ----------------------------------------------------------------------------


def test_log_lines_fill_args_with_their_origin() -> None:
    (m,) = parse_log([
        "python3 -m sglang.launch_server --model-path m --tp 2",
        "[2025-09-11 10:25:44 TP0] Capture cuda graph bs [1, 2, 4, 8, 512]",
        "[2025-09-11 10:26:01 TP0] max_total_num_tokens=903439, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        "max_running_requests=3529, context_len=131072, available_gpu_mem=10.26 GB",
    ])  # fmt: skip
    a, frm = m.args, m.args_from
    assert (a["tp_size"], frm["tp_size"]) == (2, "launch_command")
    assert (a["cuda_graph_max_bs"], frm["cuda_graph_max_bs"]) == (512, "log line 2 (largest captured bs)")
    assert a["cuda_graph_bs"] == [1, 2, 4, 8, 512] and frm["cuda_graph_bs"] == "log line 2 (captured bs list)"
    assert (a["chunked_prefill_size"], frm["chunked_prefill_size"]) == (8192, "log line 3")
    assert (a["context_length"], frm["context_length"]) == (131072, "log line 3 (context_len)")
    assert frm["max_running_requests"] == "log line 3 (resolved by sglang)"


def test_command_beats_the_log_line() -> None:
    (m,) = parse_log([
        "python3 -m sglang.launch_server --model-path m --chunked-prefill-size 4096",
        "[2025-09-11 10:26:01] max_total_num_tokens=9, chunked_prefill_size=2048, max_prefill_tokens=16384, "
        "max_running_requests=35, context_len=4096, available_gpu_mem=1.00 GB",
    ])  # fmt: skip
    assert m.args["chunked_prefill_size"] == 4096 and m.args_from["chunked_prefill_size"] == "launch_command"


def test_dp_attention_chunk_is_multiplied_back() -> None:
    # sglang divides chunked_prefill_size by the attention-DP width after the memory heuristic ran
    # (server_args: "chunked_prefill_size //= dp_size" under enable_dp_attention); the ready line prints the part.
    (m,) = parse_log([
        "python3 -m sglang.launch_server --model-path m --tp 8 --dp 8 --enable-dp-attention",
        "[2025-09-11 10:26:01 DP0 TP0] max_total_num_tokens=9, chunked_prefill_size=2048, max_prefill_tokens=16384, "
        "max_running_requests=35, context_len=4096, available_gpu_mem=1.00 GB",
    ])  # fmt: skip
    assert m.args["chunked_prefill_size"] == 16384 and m.args_from["chunked_prefill_size"] == "log line 2 (× attn_dp 8)"


# tests/fixtures/logs-heldout/sglang-25118.log, line 23 (0.4.0 … 0.5.15 wording); 0.5.16+ prints "from X to Y".
DP_CHUNK_OLD = (
    "[2026-05-13 02:13:58] DP attention is enabled. The chunked prefill size is adjusted to 2048 to avoid MoE "
    "kernel issues."
)


def test_dp_attention_adjusted_chunk_line() -> None:
    from profiler.logs.patterns import classify
    from profiler.logs.prefixes import split_prefix
    from profiler.logs.printed import log_args

    e = classify(split_prefix(DP_CHUNK_OLD).msg)
    assert e is not None and (e.kind, e.details) == ("resolved", {"chunked_prefill_size_per_attn_dp": 2048})
    e = classify("DP attention is enabled. chunked prefill size is adjusted from 8192 to 2048.")
    assert e is not None and e.details == {
        "chunked_prefill_size_per_attn_dp": 2048,
        "chunked_prefill_size_before_attn_dp": 8192,
    }
    # The command's 8192 stays: sglang divides after its memory heuristic ran (8192 // attn_dp 4 = 2048).
    (m,) = parse_log(["python3 -m sglang.launch_server --model-path m --tp 4 --dp 4 --enable-dp-attention "
                      "--chunked-prefill-size 8192"])  # fmt: skip
    out, frm, notes = log_args(m, {"chunked_prefill_size_per_attn_dp": (2048, 23)})
    assert out == {} and notes == [
        "sglang divided chunked_prefill_size for DP attention at line 23: 2048 per DP rank, after the memory "
        "heuristic, which saw the undivided 8192"
    ]
    # No chunk on the command: 2048 per DP rank × attn_dp 4 = 8192 (old wording), or the printed "from" value.
    (m,) = parse_log(["python3 -m sglang.launch_server --model-path m --tp 4 --dp 4 --enable-dp-attention"])
    out, frm, _ = log_args(m, {"chunked_prefill_size_per_attn_dp": (2048, 23)})
    assert out["chunked_prefill_size"] == 8192 and frm["chunked_prefill_size"].startswith("log line 23 (2048 per DP")
    resolved = {"chunked_prefill_size_per_attn_dp": (2048, 23), "chunked_prefill_size_before_attn_dp": (8195, 23)}
    out, frm, _ = log_args(m, resolved)
    assert out["chunked_prefill_size"] == 8195  # 8195 // 4 = 2048: only the printed value says 8195
    # A value read that the division does not explain is said.
    (m,) = parse_log(["python3 -m sglang.launch_server --model-path m --tp 4 --dp 4 --enable-dp-attention "
                      "--chunked-prefill-size 4096"])  # fmt: skip
    _, _, notes = log_args(m, {"chunked_prefill_size_per_attn_dp": (2048, 23)})
    assert notes[0].endswith("which does not follow from the 4096 read (÷ attn_dp 4)")


def test_draft_graph_means_speculative_decoding() -> None:
    (m,) = parse_log([
        "[2025-03-14 06:57:00 TP0] Capture draft cuda graph begin. This can take up to several minutes. "
        "avail mem=9.00 GB",
    ])  # fmt: skip
    assert m.args["speculative_algorithm"] == "EAGLE"
    assert "algorithm is not printed" in m.args_from["speculative_algorithm"]


# ---- GPU capacity ------------------------------------------------------------------------------------------


def test_gpu_from_load_free_plus_init_usage() -> None:
    # repo_unknown_grok1_8xH100.log: 77.43 + 1.25 = 78.68 GiB before NCCL init; H100/H800 (81559 MiB = 79.65
    # GiB) and A100-80GB (81920 MiB = 80.00 GiB) are both within 1.5 GiB above it: not named, the smaller estimated.
    (m,) = parse_log([
        "[2025-09-11 10:24:23 TP0] Init torch distributed ends. mem usage=1.25 GB",
        "[2025-09-11 10:24:24 TP0] Load weight begin. avail mem=77.43 GB",
    ])  # fmt: skip
    assert m.identity.gpu_candidates_mib == [81559, 81920] and m.identity.gpu_name is None
    assert (m.identity.gpu_total_mib, m.identity.gpu_total_origin) == (81559.0, "estimated")  # the smaller one
    assert any("first avail mem 77.43 GiB + init 1.25 GiB" in n and "within 1.5 GiB" in n for n in m.notes)


@pytest.mark.parametrize(
    ("lines", "total", "name"),
    [
        # sglang-pr22537.log (TP4, no init line): 160.78 + 15.50 = 176.28; B200 183359 MiB = 179.06 GiB (2.78 above)
        (["[2026-04-10 10:00:00 TP0] Load weight end. elapsed=30.00 s, type=Qwen3ForCausalLM, avail mem=160.78 GB, "
          "mem usage=15.50 GB."], 183359.0, "B200"),
        # sglang-pr17392.log: 121.95 + 16.39 = 138.34; H200 and H20-3e share 143771 MiB: capacity known, name not
        (["[2026-05-06 08:52:05 DP0 TP0 EP0] Load weight end. elapsed=33.79 s, type=Qwen3MoeForCausalLM, avail "
          "mem=121.95 GB, mem usage=16.39 GB."], 143771.0, None),
    ],
)  # fmt: skip
def test_gpu_capacity_without_init_line(lines: list[str], total: float, name: str | None) -> None:
    (m,) = parse_log(lines)
    assert (m.identity.gpu_total_mib, m.identity.gpu_name) == (total, name)


def test_oom_total_gives_the_capacity_candidates() -> None:
    # sglang-23602-t71.log: torch's total 95.07 GiB; the H20's memory.total (97871 MiB = 95.58 GiB) is 0.51 above
    (m,) = parse_log(["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total "
                      "capacity of 95.07 GiB of which 298.69 MiB is free."])  # fmt: skip
    assert m.identity.gpu_total_mib == pytest.approx(95.07 * 1024) and m.identity.gpu_candidates_mib == [97871]
    assert m.identity.gpu_name == "H20"


def test_gpu_named_by_a_kernel_config_path() -> None:
    # repo_unknown_grok1_8xH100.log line 25 (glued to a tqdm frame): the fused-MoE config file name
    (m,) = parse_log([
        "[2025-09-11 10:24:24 TP0] Load weight begin. avail mem=77.43 GB",
        "Capturing batches (bs=160 avail_mem=10.92 GB):   0%|          | 0/23 [00:00<?, ?it/s][2025-09-11 10:25:47 "
        "TP3] Config file not found at /sgl-workspace/sglang/python/sglang/srt/layers/moe/fused_moe_triton/configs/"
        "triton_3_4_0/E=8,N=2048,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json. Fallback to triton version "
        "3.1.0 and use MoE kernel config from /sgl-workspace/sglang/python/sglang/srt/layers/moe/fused_moe_triton/",
    ])  # fmt: skip
    assert (m.identity.gpu_name, m.identity.gpu_total_mib) == ("H100-80GB", 81559.0)
    assert m.identity.gpu_total_how == "device_name 'NVIDIA H100 80GB HBM3' at line 2 (a kernel-config path)"


def test_every_bundled_gpu_cites_its_nvidia_smi_source() -> None:
    from profiler.model.gpus import SOURCES, log_gpus

    assert {g.name for g in log_gpus()} == set(SOURCES)
    assert all(SOURCES[g.name] for g in log_gpus())


def test_a_larger_part_than_the_b300_is_not_called_a_b300() -> None:
    # a public log (search-index file id 54815375998): "Load weight begin. avail mem=275.75 GB" after init
    # used 0.10 GB — 275.85 GiB, more than a B300 SXM6 AC's 275040 MiB (268.59 GiB): not a B300, and not guessed
    (m,) = parse_log([
        "[2026-05-24 00:52:50] Init torch distributed ends. elapsed=0.21 s, mem usage=0.10 GB",
        "[2026-05-24 00:52:51] Load weight begin. avail mem=275.75 GB",
    ])  # fmt: skip
    assert m.identity.gpu_name is None and m.identity.gpu_total_mib is None and m.identity.gpu_candidates_mib == []
