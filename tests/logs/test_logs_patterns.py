"""profiler.logs.patterns: one real line per format variant (copied from tests/fixtures/logs, or built from
the format string of the sglang release named in the test where no user log shows it)."""

from __future__ import annotations

import pytest

from profiler.logs.patterns import KNOWN, MEMORYISH, Event, classify, graph_phase
from profiler.logs.prefixes import split_prefix


def ev(line: str) -> Event:
    e = classify(split_prefix(line).msg)
    assert e is not None, line
    return e


# ---- weights -------------------------------------------------------------------------------------------


def test_load_weight_begin() -> None:
    e = ev("[2025-03-08 12:29:13 TP3] Load weight begin. avail mem=21.63 GB")
    assert (e.kind, e.phase, e.free) == ("begin", "weights", 21.63)


@pytest.mark.parametrize(
    ("line", "free", "usage", "elapsed", "details"),
    [
        (  # 2024 (0.3.x): no mem usage, no elapsed
            "[23:17:01 TP7] Load weight end. type=DeepseekV2ForCausalLM, dtype=torch.bfloat16, avail mem=22.01 GB",
            22.01,
            None,
            None,
            {"dtype": "torch.bfloat16", "architecture": "DeepseekV2ForCausalLM"},
        ),
        (  # 2025 (0.4.x)
            "[2025-03-08 12:29:21 TP1] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, "
            "avail mem=6.09 GB, mem usage=15.54 GB.",
            6.09,
            15.54,
            None,
            {"dtype": "torch.bfloat16", "architecture": "Qwen2ForCausalLM"},
        ),
        (  # 2026 with elapsed and dtype (ktransformers fork)
            "[2026-02-27 17:10:27 TP0] Load weight end. elapsed=653.47 s, type=Qwen3_5MoeForConditionalGeneration, "
            "dtype=torch.bfloat16, avail mem=19.08 GB, mem usage=3.76 GB.",
            19.08,
            3.76,
            653.47,
            {"dtype": "torch.bfloat16", "architecture": "Qwen3_5MoeForConditionalGeneration"},
        ),
        (  # 2026 without dtype
            "[2026-04-10 23:19:05 TP0] Load weight end. elapsed=112.68 s, type=Qwen3ForCausalLM, avail mem=160.78 GB, "
            "mem usage=15.50 GB.",
            160.78,
            15.50,
            112.68,
            {"architecture": "Qwen3ForCausalLM"},
        ),
        (  # 0.5.23 format with a quantization config
            "Load weight end. elapsed=41.20 s, type=DeepseekV3ForCausalLM, quant=fp8, fmt=e4m3, avail mem=60.00 GB, "
            "mem usage=70.10 GB.",
            60.0,
            70.1,
            41.2,
            {"architecture": "DeepseekV3ForCausalLM", "quant": "fp8, fmt=e4m3"},
        ),
    ],
)
def test_load_weight_end(line: str, free: float, usage: float | None, elapsed: float | None, details: dict) -> None:
    e = ev(line)
    assert (e.kind, e.phase, e.free, e.usage, e.elapsed, e.details) == ("end", "weights", free, usage, elapsed, details)


# ---- KV pool -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "details"),
    [
        (
            "[2025-01-23 19:35:20 TP0] KV Cache is allocated. K size: 27.13 GB, V size: 27.13 GB.",
            {"k_gib": 27.13, "v_gib": 27.13},
        ),
        (
            "[2025-03-08 12:29:21 TP0] KV Cache is allocated. #tokens: 46611, K size: 1.42 GB, V size: 1.42 GB",
            {"kv_tokens": 46611, "k_gib": 1.42, "v_gib": 1.42},
        ),
        (
            "> [2025-12-09 05:12:15 DP5 TP5] KV Cache is allocated. #tokens: 3627136, KV size: 162.38 GB"[2:],
            {"kv_tokens": 3627136, "kv_gib": 162.38},
        ),
        (
            # 0.5.14
            "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 500000, K size: 30.52 GB, V size: 30.52 GB",
            {"kv_dtype": "torch.bfloat16", "kv_tokens": 500000, "k_gib": 30.52, "v_gib": 30.52},
        ),
        (
            "KV Cache VA upper bound. dtype: torch.float8_e4m3fn, #tokens: 900000, KV size: 55.00 GB",  # 0.5.18+
            {"kv_dtype": "torch.float8_e4m3fn", "kv_tokens": 900000, "kv_gib": 55.0, "va_upper_bound": True},
        ),
        (
            "MiniMax MSA-v1 main NVFP4 KV Cache is allocated. dtype: torch.uint8, #tokens: 100, KV size: 1.25 GB",
            {"kv_dtype": "torch.uint8", "kv_tokens": 100, "kv_gib": 1.25, "label": "MiniMax MSA-v1 main NVFP4"},
        ),
    ],
)
def test_kv_cache_allocated(line: str, details: dict) -> None:
    e = ev(line)
    assert (e.kind, e.phase, e.details) == ("kv", "kv_pool", details)


def test_mamba_cache_unit_glued_and_trailing_space() -> None:
    e = ev(
        "[2026-02-27 17:10:28 TP0] Mamba Cache is allocated. max_mamba_cache_size: 82, conv_state size: 0.13GB, "
        "ssm_state size: 7.29GB "
    )
    assert e.details == {
        "mamba_conv_state_gib": 0.13,
        "mamba_ssm_state_gib": 7.29,
        "mamba_gib": 7.42,
        "mamba_max_cache_size": 82,
    }


def test_swa_pool_lines() -> None:
    e = ev("SWAKVPool mem usage: 12.50 GB, swa size: 1000, full size: 2000")
    assert e.details == {"swa_kv_gib": 12.5, "swa_tokens": 1000, "full_tokens": 2000}
    e = ev("SWAKVPool VA upper bound: 12.50 GB, swa size: 1000, full size: 2000")
    assert e.details["va_upper_bound"] is True
    e = ev("[2025-08-01 10:00:00 TP0] Use sliding window memory pool. full_layer_tokens=2000, swa_layer_tokens=1000")
    assert e.details == {"swa_tokens": 1000, "full_tokens": 2000}


def test_kv_dtype_memory_pool_end_and_budget_lines() -> None:
    e = ev("[2026-03-25 09:32:19] Using KV cache dtype: torch.bfloat16")
    assert (e.kind, e.details) == ("note", {"kv_dtype": "torch.bfloat16"})
    e = ev("[2025-03-08 12:29:21 TP0] Memory pool end. avail mem=2.09 GB")
    assert (e.kind, e.phase, e.free) == ("end", "kv_pool", 2.09)
    e = ev(
        "[2026-05-15 08:39:53 TP0] DSv4 memory calculation: bytes_per_full_token=15955.85, available_bytes=45.78 GB, "
        "full_token=3080960"
    )
    assert e.details == {
        "budget_gib": 45.78,
        "kv_tokens": 3080960,
        "dsv4_available_bytes_gib": 45.78,
        "dsv4_bytes_per_full_token": 15955.85,
    }
    # tests/fixtures/logs-heldout/repo_unknown_dsv4-flash-w4a8_ascend910b_dp4.log, line 19 (sglang's "DSV4" spelling,
    # 0.5.16+ field c128_state_fixed between available_bytes and full_token)
    e = ev(
        "[2026-08-10 09:47:28 DP0 TP0 EP0] DSV4 memory calculation: bytes_per_full_token=7705.45, available_bytes=6.16 "
        "GB, c128_state_fixed=0.04 GB, full_token=8529"
    )
    assert (e.kind, e.phase) == ("note", "kv_pool")
    assert e.details == {
        "budget_gib": 6.16,
        "kv_tokens": 8529,
        "dsv4_available_bytes_gib": 6.16,
        "dsv4_bytes_per_full_token": 7705.45,
        "dsv4_c128_state_fixed_gib": 0.04,
    }
    # 0.5.23's line (pool_configurator.py): flags first, five fixed parts; 0.5.12's sizes-only line carries no budget
    e = ev(
        "[2026-09-01 10:00:00 TP0] DSV4 memory calculation: unified=True, unified_fp8=False, dspark_draft_bf16=False, "
        "bytes_per_full_token=15955.85, available_bytes=45.78 GB, c128_state_fixed=0.50 GB, c2_state_fixed=0.00 GB, "
        "swa_fixed=1.25 GB, swa_ring_fixed=0.10 GB, c4_state_fixed=0.20 GB, full_token=2920448"
    )
    assert (e.details["budget_gib"], e.details["kv_tokens"]) == (45.78, 2920448)
    assert (e.details["dsv4_swa_fixed_gib"], e.details["dsv4_c4_state_fixed_gib"]) == (1.25, 0.2)
    assert classify("DSV4 memory calculation: c4=1024, c128=64, c4_state=8, c128_state=8") is None
    e = ev(
        "[2026-05-15 09:09:53 TP0] Memory profiling: available_gpu_memory=57.01 GB, total_gpu_memory=93.58 GB, "
        "mem_fraction_static=0.60, rest_memory=19.58 GB"
    )
    assert e.details["pre_model_load_gib"] == 93.58 and e.details["budget_gib"] == 19.58
    assert e.details["memprof_mem_fraction_static"] == 0.6


def test_symmetric_memory_prealloc() -> None:
    e = ev("[2026-01-05 10:00:00 TP0] Pre-allocating symmetric memory pool with 4 GiB")  # 0.5.10+
    assert (e.kind, e.phase, e.details) == ("note", "finalize", {"symm_mem_prealloc_gib": 4.0})


def test_deepgemm_warmup_warning_is_not_a_failure() -> None:
    from profiler.logs import parse_log

    line = (
        "[2026-01-05 10:00:00 TP0] Available memory 3.5GB is less than required memory 6GB for warmup, "
        "reducing max_m to 2048 to avoid out of memory"
    )
    assert ev(line) is KNOWN
    (m,) = parse_log([line])
    assert m.failure is None and m.unparsed_memory_lines == 0


def test_host_memory_is_not_gpu_memory() -> None:
    e = ev("[2026-03-25 09:32:19] Allocating 15.58 GB host memory for hierarchical KV cache.")
    assert (e.kind, e.details) == ("host_mem", {"gb_decimal": 15.58, "what": "hierarchical KV cache"})


# ---- init / baseline -----------------------------------------------------------------------------------


def test_init_and_baseline() -> None:
    e = ev("[2025-03-08 12:29:13 TP2] Init torch distributed ends. mem usage=0.13 GB")
    assert (e.kind, e.phase, e.usage, e.elapsed) == ("end", "init_parallel", 0.13, None)
    e = ev("Init torch distributed ends. elapsed=2.51 s, mem usage=1.25 GB")  # 0.5.10+
    assert (e.usage, e.elapsed) == (1.25, 2.51)
    e = ev("Memory baseline taken. mem usage=0.42 GB")  # 0.5.22+
    assert (e.kind, e.phase, e.usage) == ("end", "baseline", 0.42)


# ---- graphs --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "kind", "phase", "free", "usage", "elapsed"),
    [
        (
            "[23:17:01 TP3] Capture cuda graph begin. This can take up to several minutes.",
            "begin",
            "decode_graph",
            None,
            None,
            None,
        ),
        (
            "[2025-03-08 12:29:21 TP0] Capture cuda graph begin. This can take up to several minutes. "
            "avail mem=1.45 GB",
            "begin",
            "decode_graph",
            1.45,
            None,
            None,
        ),
        (
            "[2025-01-23 19:35:27 TP0] Capture cuda graph end. Time elapsed: 6.57 s",
            "end",
            "decode_graph",
            None,
            None,
            6.57,
        ),
        (
            "[2025-03-08 12:29:28 TP0] Capture cuda graph end. Time elapsed: 7.23 s. avail mem=0.53 GB. "
            "mem usage=0.93 GB.",
            "end",
            "decode_graph",
            0.53,
            0.93,
            7.23,
        ),
        (
            "[2025-09-11 10:26:00 TP0] Capture cuda graph end. Time elapsed: 17.13 s. mem usage=0.89 GB. "
            "avail mem=10.26 GB.",
            "end",
            "decode_graph",
            10.26,
            0.89,
            17.13,
        ),
        (
            "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=30.00 GB",
            "begin",
            "decode_graph",
            30.0,
            None,
            None,
        ),
        (
            "Capture target prefill CUDA graph end. elapsed=9.10 s, mem usage=1.20 GB, avail mem=28.80 GB.",
            "end",
            "prefill_graph",
            28.8,
            1.2,
            9.1,
        ),
        (
            "Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, avail mem=20.00 GB",
            "begin",
            "verify_graph",
            20.0,
            None,
            None,
        ),
        (
            "Capture draft decode CUDA graph end. elapsed=1.50 s, mem usage=0.30 GB, avail mem=19.00 GB.",
            "end",
            "draft_graph",
            19.0,
            0.3,
            1.5,
        ),
        (
            "Capture draft extend cuda graph begin (step 2). This can take up to several minutes. avail mem=18.00 GB",
            "begin",
            "draft_extend_graph",
            18.0,
            None,
            None,
        ),
        (
            "Capture single-CG draft extend end. elapsed=2.00 s, mem usage=0.10 GB, avail mem=17.90 GB.",
            "end",
            "draft_extend_graph",
            17.9,
            0.1,
            2.0,
        ),
        ("Capture piecewise CUDA graph begin. avail mem=40.00 GB", "begin", "prefill_graph", 40.0, None, None),
        (
            "Capture draft cuda graph end. Time elapsed: 3.00 s. avail mem=10.00 GB. mem usage=0.50 GB.",
            "end",
            "draft_graph",
            10.0,
            0.5,
            3.0,
        ),
    ],
)
def test_capture_begin_end(
    line: str, kind: str, phase: str, free: float | None, usage: float | None, elapsed: float | None
) -> None:
    e = ev(line)
    assert (e.kind, e.phase, e.free, e.usage, e.elapsed) == (kind, phase, free, usage, elapsed)


def test_capture_details_bs_lists_backend_tokens() -> None:
    e = ev(
        "Capture target decode CUDA graph end. bs=[1, 2, 4, 8], elapsed=3.21 s, mem usage=0.50 GB, avail mem=9.50 GB."
    )
    assert e.details == {"role": "target", "bs_list": [1, 2, 4, 8], "max_bs": 8}
    e = ev(
        "Capture target decode CUDA graph begin. backend=full, num_tokens_per_bs=1, bs=[1, 2, 4], avail mem=50.00 GB"
    )  # 0.5.14 fmt: skip
    assert e.details == {
        "role": "target",
        "backend": "full",
        "num_tokens_per_req": 1,
        "bs_list": [1, 2, 4],
        "max_bs": 4,
    }
    e = ev("Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8, 16], avail mem=60.00 GB")
    assert e.details == {"role": "target", "backend": "breakable", "bs_list": [4, 8, 16]}
    e = ev("[2025-07-14 05:48:44] Capture cuda graph bs [1, 2, 4, 8]")
    assert (e.kind, e.phase, e.details) == ("note", "decode_graph", {"bs_list": [1, 2, 4, 8], "max_bs": 8})
    e = ev("Capture cuda graph num tokens [512, 1024]")
    assert (e.phase, e.details) == ("prefill_graph", {"bs_list": [512, 1024]})
    e = ev("[BCG] Capture num tokens: [4, 8]")
    assert (e.phase, e.details) == ("prefill_graph", {"bs_list": [4, 8]})


@pytest.mark.parametrize(
    ("line", "phase", "bs", "free", "n"),
    [
        (
            "Capturing batches (bs=32 avail_mem=27.49 GB):   0%|          | 0/8 [00:00<?, ?it/s]",
            "decode_graph",
            32,
            27.49,
            0,
        ),
        (
            "Capturing batches (avail_mem=8.55 GB):   4%|▍         | 1/23 [00:00<00:14,  1.54it/s]",
            "decode_graph",
            None,
            8.55,
            1,
        ),
        (
            "Capturing batches (bs=1 avail_mem=10.28 GB): 100%|██████████| 23/23 [00:16<00:00,  1.42it/s]",
            "decode_graph",
            1,
            10.28,
            23,
        ),
        ("Capturing num tokens (num_tokens=512 avail_mem=20.10 GB)", "prefill_graph", 512, 20.1, None),
        ("Capturing prefill shape (num_tokens=4096 avail_mem=20.10 GB)", "prefill_graph", 4096, 20.1, None),
        ("[BCG] Capturing (num_tokens=8 avail_mem=3.00 GB)", "prefill_graph", 8, 3.0, None),
    ],
)
def test_tqdm_ladder(line: str, phase: str, bs: int | None, free: float, n: int | None) -> None:
    e = ev(line)
    assert (e.kind, e.phase, e.details["bs"], e.free, e.details.get("n")) == ("ladder", phase, bs, free, n)


def test_graph_phase_names() -> None:
    assert graph_phase("cuda graph") == "decode_graph"
    assert graph_phase("NPU graph") == "decode_graph"
    assert graph_phase("target verify CUDA graph") == "verify_graph"
    assert graph_phase("UNO tree draft CUDA graph") == "draft_graph"
    assert graph_phase("draft prefill CUDA graph") == "prefill_graph"


# ---- ready, post-capture -------------------------------------------------------------------------------


def test_ready_line_variants() -> None:
    e = ev(
        "[2025-01-23 19:35:27 TP0] max_total_num_tokens=444500, max_prefill_tokens=16384, "
        "max_running_requests=2049, context_len=131072"
    )
    assert (e.kind, e.free, e.details["max_total_num_tokens"]) == ("ready", None, 444500)
    e = ev(
        "[2026-02-27 17:10:29 TP0] max_total_num_tokens=580364, chunked_prefill_size=2048, max_prefill_tokens=16384, "
        "max_running_requests=1, context_len=8192, available_gpu_mem=3.63 GB"
    )
    assert e.free == 3.63 and e.details["chunked_prefill_size"] == 2048 and e.details["context_len"] == 8192
    e = ev(
        "max_total_num_tokens=100, chunked_prefill_size=-1, max_prefill_tokens=16384, max_running_requests=8, "
        "context_len=4096, available_cpu_mem=100.00 GB"
    )
    assert e.details["host"] is True and e.details["chunked_prefill_size"] == -1


def test_post_capture_kv_sizing() -> None:
    e = ev(
        "Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: 123456, KV size: 40.00 GB, "
        "avail mem=5.00 GB"
    )
    assert (e.kind, e.phase, e.free) == ("end", "post_capture_resize", 5.0)
    assert e.details == {"kv_dtype": "torch.bfloat16", "kv_tokens": 123456, "kv_gib": 40.0}
    e = ev("Post-capture KV sizing: max_total_num_tokens=1000, free memory=3.00 GB")  # 0.5.16
    assert (e.kind, e.free, e.details) == ("end", 3.0, {"kv_tokens": 1000})
    e = ev("Post-capture KV sizing: max_running_requests 256 -> 128")
    assert (e.kind, e.details) == ("note", {"max_running_requests": 128})


# ---- identity hints, known non-memory lines, unparsed ---------------------------------------------------


def test_identity_hints() -> None:
    e = ev(
        "[2026-05-15 08:39:19] INFO server_args.py:1217: Setting swa_full_tokens_ratio to 0.1 for "
        "DeepseekV4ForCausalLM."
    )
    assert (e.kind, e.details["architecture"]) == ("arch", "DeepseekV4ForCausalLM")
    e = ev(
        "[2026-04-14 16:08:45 TP0] Found local HF snapshot for Qwen/Qwen3.5-9B at /root/.cache/huggingface/hub/"
        "models--Qwen--Qwen3.5-9B/snapshots/c2022; skipping download."
    )
    assert (e.kind, e.details) == ("model", {"model": "Qwen/Qwen3.5-9B"})
    e = ev(
        "[2026-02-26 05:19:58] WARNING server_args.py:1245: DSA with TP mode is active, dp_size=1, tp_size=8, "
        "attn_tp_size=8, attention weights will be sharded across 8 ranks."
    )
    assert (e.kind, e.details) == ("resolved", {"dp_size": 1, "tp_size": 8})


@pytest.mark.parametrize(
    "line",
    [
        "[2026-02-26 05:19:58] WARNING server_args.py:1177: Set NSA backends for fp8_e4m3 KV Cache: "
        "prefill=flashmla_auto, decode=flashmla_kv.",
    ],
)
def test_known_lines_that_mention_memory_words(line: str) -> None:
    assert classify(split_prefix(line).msg) is KNOWN


def test_decode_server_only_message_gives_the_mode() -> None:
    # sglang-6753.log line 3: printed by srt/managers/scheduler.py only when disaggregation_mode == "decode".
    ev = classify("KV cache is forced as chunk cache for decode server")
    assert ev is not None and ev.kind == "mode" and ev.details == {"mode": "decode"}


def test_unknown_memory_line_is_not_classified_but_looks_like_memory() -> None:
    msg = "Capture something new begun oddly, avail mem=1.00 GB"
    assert classify(msg) is None
    assert MEMORYISH.search(msg)
    assert not MEMORYISH.search("#parameters (analytical): 243.74 B, #parameters (actual): 269.56 B")


def test_prose_about_the_kv_cache_is_not_a_memory_line() -> None:
    # vllm-21348_sglang-part.log line 6 (the issue author's words)
    assert not MEMORYISH.search("Seems like the KV Cache memory is almost **2x** for SGLang compared to vLLM.")
    assert MEMORYISH.search("KV Cache is allocated. #tokens: 12, something new")


def test_tqdm_frame_cut_before_its_numbers() -> None:
    assert classify("Capturing batches") is KNOWN  # ktransformers-1854.log line 29 (the excerpt ends there)
