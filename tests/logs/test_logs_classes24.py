"""Issue 24's classes of log text the parser missed: each read right (lines in the exact form sglang printed them)."""

from __future__ import annotations

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
