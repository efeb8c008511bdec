"""Issue 24's classes of log text the parser missed: each read right (lines in the exact form sglang printed them)."""

from __future__ import annotations

from profiler.ingest.judge import judge
from profiler.logs import parse_log

# sglang 0.2.7, model_executor/model_runner.py and managers/tp_worker.py, logging format "%(message)s": every
# worker line starts "[gpu={gpu_id}] " (0.1.20, managers/controller/*: "[gpu_id={gpu_id}] ").
GPU_TAGGED = [
    "[gpu=0] Init nccl begin.",
    "[gpu=1] Init nccl begin.",
    "[gpu=0] Load weight begin. avail mem=78.50 GB",
    "[gpu=1] Load weight begin. avail mem=78.49 GB",
    "[gpu=0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=70.95 GB",
    "[gpu=1] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=70.94 GB",
    "[gpu=0] Memory pool end. avail mem=8.56 GB",
    "[gpu=1] Memory pool end. avail mem=8.55 GB",
    "[gpu=0] Capture cuda graph begin. This can take up to several minutes.",
    "[gpu=1] Capture cuda graph begin. This can take up to several minutes.",
    "[gpu=0] max_total_num_tokens=1012345, max_prefill_tokens=16384, max_running_requests=4095, context_len=8192",
    "[gpu=1] max_total_num_tokens=1012345, max_prefill_tokens=16384, max_running_requests=4095, context_len=8192",
]


def test_2024_gpu_tags_are_ranks() -> None:
    (m,) = parse_log(GPU_TAGGED, name="g.log")
    assert m.unparsed_memory_lines == 0
    assert sorted(r.label for r in m.ranks) == ["TP0", "TP1"] and m.identity.tp == 2
    r1 = m.rank("TP1")
    assert r1 is not None
    w = r1.phase("weights")
    assert w is not None and w.before is not None and w.after is not None
    assert w.before.free_mib == 78.49 * 1024 and w.after.free_mib == 70.94 * 1024
    pool = r1.phase("kv_pool")
    assert pool is not None and pool.after is not None and pool.after.free_mib == 8.55 * 1024
    ready = r1.phase("ready")
    assert ready is not None and ready.details["max_total_num_tokens"] == 1012345
    assert any("'[gpu=0]'" in n and "TP rank N" in n for n in m.notes)


def test_2024_gpu_id_tag_0_1_x() -> None:
    lines = [s.replace("[gpu=", "[gpu_id=") for s in GPU_TAGGED[2:8]]
    (m,) = parse_log(lines, name="g1.log")
    assert sorted(r.label for r in m.ranks) == ["TP0", "TP1"] and m.unparsed_memory_lines == 0
    r0 = m.rank("TP0")
    assert r0 is not None and r0.phase("weights").before.free_mib == 78.50 * 1024  # type: ignore[union-attr]


# An issue post: the log, then the "Reproduction" command, then `python3 -m sglang.check_env` (lines as sglang
# 0.4.x prints them; the check_env block from sglang-2805's post).
POST = [
    "[2025-03-07 09:25:00] server_args=ServerArgs(model_path='deepseek-ai/DeepSeek-V3', tp_size=8, "
    "mem_fraction_static=0.85, trust_remote_code=True)",
    "[2025-03-07 09:25:11 TP0] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=36.51 GB",
    "[2025-03-07 09:25:12 TP0] Memory pool end. avail mem=22.03 GB",
    "[2025-03-07 09:25:12 TP0] Capture cuda graph begin. This can take up to several minutes.",
    "",
    "### Reproduction",
    "",
    "python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 8 --trust-remote-code "
    "--mem-fraction-static 0.85",
    "",
    "### Environment",
    "",
    "python3 -m sglang.check_env",
    "Python: 3.11.5 (main, Sep 11 2023, 13:54:46) [GCC 11.2.0]",
    "CUDA available: True",
    "GPU 0: NVIDIA A40",
    "GPU 0 Compute Capability: 8.6",
    "PyTorch: 2.4.0+cu121",
    "sglang: 0.4.0.post2",
    "NVIDIA Topology: ",
    "        GPU0    NIC0    CPU Affinity    NUMA Affinity   GPU NUMA ID",
    "GPU0     X      NODE    0-31,64-95      0               N/A",
]


def test_reproduction_command_and_check_env_open_no_run() -> None:
    (m,) = parse_log(POST, name="post.log")
    assert m.args["tp_size"] == 8 and m.identity.sglang_version == "0.4.0.post2"
    assert any("line 8, after this run's log lines" in n for n in m.notes)


def test_command_after_a_log_without_one_is_its_command() -> None:
    lines = [*POST[1:4], "", "I ran: python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 8"]
    (m,) = parse_log(lines, name="post2.log")
    assert m.args == {"model_path": "deepseek-ai/DeepSeek-V3", "tp_size": 8}
    assert any("line 5, after this run's log lines" in n for n in m.notes)


def test_a_different_command_after_a_failed_run_is_another_attempt() -> None:
    failed = [*POST[1:4], "[2025-03-07 09:25:13 TP0] Scheduler hit an exception: torch.OutOfMemoryError: CUDA out of "
              "memory. Tried to allocate 2.00 GiB."]  # fmt: skip
    lines = [
        *failed,
        "python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 8 --mem-fraction-static 0.7",
    ]
    runs = parse_log(lines, name="retry.log")
    assert len(runs) == 2 and runs[1].args["mem_fraction_static"] == 0.7


# EAGLE on sglang 0.4.x: the target's load, pool and capture, then the draft ModelRunner's (model_runner.py prints
# the same lines for it), then eagle_worker's "Capture draft cuda graph".
SPEC = [
    "[2025-06-04 10:00:00 TP0] Load weight begin. avail mem=78.50 GB",
    "[2025-06-04 10:00:30 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=62.00 GB, "
    "mem usage=16.50 GB.",
    "[2025-06-04 10:00:31 TP0] KV Cache is allocated. #tokens: 400000, K size: 24.00 GB, V size: 24.00 GB",
    "[2025-06-04 10:00:31 TP0] Memory pool end. avail mem=13.50 GB",
    "[2025-06-04 10:00:32 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=13.40 GB",
    "[2025-06-04 10:00:50 TP0] Capture cuda graph end. Time elapsed: 18.00 s. mem usage=1.20 GB. avail mem=12.20 GB.",
    "[2025-06-04 10:00:51 TP0] Load weight begin. avail mem=12.20 GB",
    "[2025-06-04 10:00:52 TP0] Load weight end. type=LlamaForCausalLMEagle, dtype=torch.bfloat16, avail mem=11.50 GB, "
    "mem usage=0.70 GB.",
    "[2025-06-04 10:00:52 TP0] KV Cache is allocated. #tokens: 400000, K size: 1.50 GB, V size: 1.50 GB",
    "[2025-06-04 10:00:52 TP0] Memory pool end. avail mem=8.40 GB",
    "[2025-06-04 10:00:53 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=8.40 GB",
    "[2025-06-04 10:00:58 TP0] Capture cuda graph end. Time elapsed: 5.00 s. mem usage=0.40 GB. avail mem=8.00 GB.",
    "[2025-06-04 10:00:59 TP0] Capture draft cuda graph begin. This can take up to several minutes. avail mem=8.00 GB",
    "[2025-06-04 10:01:05 TP0] Capture draft cuda graph end. Time elapsed: 6.00 s. avail mem=7.50 GB. "
    "mem usage=0.50 GB.",
]


def test_draft_capture_and_pool_stay_in_the_target_run() -> None:
    (m,) = parse_log(SPEC, name="spec.log")
    r = m.rank("TP0")
    assert r is not None
    target, draft = r.phase("kv_pool"), r.phase("kv_pool", "draft")
    assert target is not None and target.after is not None and target.after.free_mib == 13.50 * 1024
    assert target.details["k_mib"] == 24 * 1024
    assert draft is not None and draft.after is not None and draft.after.free_mib == 8.40 * 1024
    graph, dgraph = r.phase("decode_graph"), r.phase("decode_graph", "draft")
    assert graph is not None and graph.usage_mib == 1.20 * 1024
    assert dgraph is not None and dgraph.before is not None and dgraph.before.free_mib == 8.40 * 1024
    assert dgraph.after is not None and dgraph.after.free_mib == 8.00 * 1024


def test_a_failed_spec_run_is_not_ok() -> None:
    oom = "[2025-06-04 10:00:55 TP0] Scheduler hit an exception: torch.OutOfMemoryError: CUDA out of memory."
    (m,) = parse_log([*SPEC[:11], oom], name="spec-oom.log")
    assert m.failure is not None and m.failure.kind != "ok" and m.startup != "finished"


def test_pool_end_kept_when_a_note_follows_the_capture_begin() -> None:
    lines = [
        "[2025-06-01 10:00:00 TP0] KV Cache is allocated. #tokens: 91749, K size: 7.00 GB, V size: 7.00 GB",
        "[2025-06-01 10:00:00 TP0] Memory pool end. avail mem=5.27 GB",
        "[2025-06-01 10:00:01 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=4.64 GB",
        "[2025-06-01 10:00:01 TP0] Using KV cache dtype: torch.bfloat16",
    ]
    (m,) = parse_log(lines, name="note.log")
    r = m.rank("TP0")
    assert r is not None and len(r.phases_named("kv_pool")) == 1
    pool = r.phase("kv_pool")
    assert pool is not None and pool.after is not None and pool.after.free_mib == 5.27 * 1024
    assert pool.details["kv_dtype"] == "torch.bfloat16"


def test_segfault_during_capture_is_a_failed_capture() -> None:
    lines = [*SPEC[:5], "!!!!!!! Segfault encountered !!!!!!!", '  File "<unknown>", line 0, in ncclCommInitRank']
    (m,) = parse_log(lines, name="segv.log")
    assert m.failure is not None and (m.failure.kind, m.failure.phase) == ("capture_failed", "decode_graph")
    assert judge(m)[0].verdict == "failed"


def test_oom_inside_a_decode_batch_is_a_runtime_oom() -> None:
    lines = [
        "[2025-06-01 10:05:00 TP0] Decode batch. #running-req: 30, #token: 300000, token usage: 0.75, "
        "gen throughput (token/s): 1000.00, #queue-req: 0",
        "[2025-06-01 10:05:01 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.10 GiB of which 1.00 GiB is free.",
    ]
    (m,) = parse_log(lines, name="decode-oom.log")
    assert m.failure is not None and (m.failure.kind, m.failure.phase) == ("oom_runtime", "runtime")


def _capped(tokens: int, cap: int) -> list[str]:
    return [
        f"[2025-06-01 10:00:00] server_args=ServerArgs(model_path='m', tp_size=1, page_size=1, max_total_tokens={cap})",
        "[2025-06-01 10:00:01] Load weight begin. avail mem=78.00 GB",
        "[2025-06-01 10:00:30] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=62.00 GB, "
        "mem usage=16.00 GB.",
        f"[2025-06-01 10:00:31] KV Cache is allocated. #tokens: {tokens}, K size: 2.00 GB, V size: 2.00 GB",
        "[2025-06-01 10:00:31] Memory pool end. avail mem=57.90 GB",
    ]


def test_no_fraction_implied_from_a_pool_capped_by_max_total_tokens() -> None:
    (m,) = parse_log(_capped(32768, 32768), name="cap.log")
    assert m.mfs is None and m.mfs_origin == "unknown" and "--max-total-tokens 32,768 cap" in m.mfs_how


def test_a_pool_below_its_cap_still_implies_the_fraction() -> None:
    # 1 − (62.00 − 4.00) / 78.00 = 0.2564… → below MIN_IMPLIED 0.3: capped some other way, unknown; with a bigger
    # pool (K=V=10 GB): 1 − (62 − 20) / 78 = 0.4615 implied, the cap (10⁶ tokens) not reached.
    lines = [x.replace("size: 2.00 GB", "size: 10.00 GB") for x in _capped(163840, 1_000_000)]
    (m,) = parse_log(lines, name="below.log")
    assert m.mfs_origin == "implied" and m.mfs is not None and abs(m.mfs - 0.462) < 0.001


def test_a_command_wrapped_by_the_terminal_is_joined() -> None:
    lines = [
        "$ python -m sglang.launch_server --model-path /m/qwen --mem-fraction-static 0.1",
        "2 --tp 2",
        "[2025-06-01 10:00:00 TP0] Load weight begin. avail mem=78.00 GB",
    ]
    (m,) = parse_log(lines, name="wrapped.log")
    assert m.args["mem_fraction_static"] == 0.12 and m.args["tp_size"] == 2
    lines2 = ["python -m sglang.launch_server --model-path m --bogus-flag 1",
              "launch_server.py: error: unrecognized arguments: --bogus-flag 1"]  # fmt: skip
    (m2,) = parse_log(lines2, name="bad.log")
    assert m2.failure is not None and m2.failure.kind == "bad_args"


STARTED = [
    *SPEC[:6],
    "[2025-06-04 10:01:06 TP0] max_total_num_tokens=400000, chunked_prefill_size=8192, "
    "max_prefill_tokens=16384, max_running_requests=48, context_len=8192, available_gpu_mem=12.20 GB",
]


def test_a_traceback_quoted_before_the_log_is_not_its_failure() -> None:
    lines = ["The traceback I got:", "Traceback (most recent call last):",
             '  File "/x/sglang/srt/model_executor/model_runner.py", line 10, in init_memory_pool',
             "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", "",
             "Then I lowered it and the log is:", *STARTED]  # fmt: skip
    (m,) = parse_log(lines, name="prose.log")
    assert m.failure is None and judge(m)[0].verdict == "ok"
    assert any(n.startswith("line 4: failure text before the startup at line 7") for n in m.notes)


def test_an_error_summary_above_the_log_does_not_replace_its_failure() -> None:
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    lines = [
        f"I get this error: {oom}",
        "",
        *STARTED,
        "[2025-06-04 10:02:00 TP0] Decode batch. #running-req: 30, #token: 300000, token usage: 0.75, "
        "gen throughput (token/s): 1000.00, #queue-req: 0",
        "[2025-06-04 10:02:01 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        oom,
    ]
    (m,) = parse_log(lines, name="summary.log")
    assert m.failure is not None and (m.failure.kind, m.failure.line) == ("oom_runtime", 11)
