"""Issue 24's last held-out misses, each a general rule held on the real lines of the log that showed it."""

from __future__ import annotations

from pathlib import Path

from profiler.logs import parse_log
from profiler.logs.launchcmd import parse_launch_command
from profiler.logs.printed import implied_fraction

# tests/fixtures/logs-heldout/sglang-30609.log lines 2 and 5 (sglang issue 30609, GLM-5.2 TP8 EP8 with MTP): only
# the NextN draft's load is in the excerpt, no "Load weight begin", no target load before it.
NEXTN_LOAD = [
    "[2026-07-14 07:51:06 TP0 EP0] Load weight end. elapsed=10.26 s, type=DeepseekV3ForCausalLMNextN, quant=fp8, "
    "fmt=e4m3, avail mem=41.92 GB, mem usage=1.00 GB.",
    "[2026-07-14 07:51:10 TP4 EP4] Load weight end. elapsed=14.48 s, type=DeepseekV3ForCausalLMNextN, quant=fp8, "
    "fmt=e4m3, avail mem=44.16 GB, mem usage=1.00 GB.",
]


def test_nextn_load_is_the_drafts_weights() -> None:
    (m,) = parse_log(NEXTN_LOAD, name="sglang-30609.log")
    r0 = m.rank("TP0 EP0")
    assert r0 is not None and r0.phase("weights") is None
    w = r0.phase("weights", "draft")
    assert w is not None and w.after is not None
    assert w.after.free_mib == 41.92 * 1024 and w.usage_mib == 1.0 * 1024 and w.elapsed_s == 10.26
    assert any("DeepseekV3ForCausalLMNextN" in n and "role draft" in n for n in m.notes)


def test_target_load_then_nextn_load() -> None:
    """A target load (begin and end, type the target's) then the draft's: two loads, the second the draft's."""
    lines = [
        "[2026-07-14 07:50:00 TP0 EP0] Load weight begin. avail mem=78.50 GB",
        "[2026-07-14 07:50:50 TP0 EP0] Load weight end. elapsed=50.00 s, type=DeepseekV3ForCausalLM, quant=fp8, "
        "fmt=e4m3, avail mem=42.92 GB, mem usage=35.58 GB.",
        NEXTN_LOAD[0],
    ]
    (m,) = parse_log(lines, name="t.log")
    r0 = m.rank("TP0 EP0")
    assert r0 is not None
    target, draft = r0.phase("weights"), r0.phase("weights", "draft")
    assert target is not None and target.usage_mib == 35.58 * 1024
    assert draft is not None and draft.usage_mib == 1.0 * 1024


# tests/fixtures/logs-heldout/sglang-565.log lines 16-24 (sglang issue 565, sglang 0.1.17, TP 4): the excerpt ends
# before any memory line; each worker says only "[gpu_id=N] Set cuda device." / "Init nccl begin.".
GPU_ID_ONLY = [
    "Special tokens have been added in the vocabulary, make sure the associated word embeddings are fine-tuned or "
    "trained.",
    "[gpu_id=0] Set cuda device.",
    "[gpu_id=1] Set cuda device.",
    "[gpu_id=2] Set cuda device.",
    "[gpu_id=3] Set cuda device.",
    "[gpu_id=0] Init nccl begin.",
    "[gpu_id=1] Init nccl begin.",
    "[gpu_id=2] Init nccl begin.",
]


def test_gpu_id_tags_on_lines_without_a_reading_are_ranks(tmp_path: Path) -> None:
    """The line scanner's rank discovery sees 2024 tags too, so a rank that logs no memory line still exists."""
    (m,) = parse_log(GPU_ID_ONLY, name="sglang-565.log")
    assert [r.label for r in m.ranks] == ["TP0", "TP1", "TP2", "TP3"]
    f = tmp_path / "gpu.log"
    f.write_text("\n".join(s.replace("gpu_id=", "gpu=") for s in GPU_ID_ONLY) + "\n")
    (m2,) = parse_log(f, chunk_bytes=64)  # 0.2.x's "[gpu=N]", the file read in small chunks
    assert [r.label for r in m2.ranks] == ["TP0", "TP1", "TP2", "TP3"]


# tests/fixtures/logs-heldout/sglang-744.log line 1 (sglang issue 744, July 2024): the command glued to the prose in
# front of it (":python") and followed by more prose on the same line.
PROSE_COMMAND = (
    "I execute :python -m sglang.launch_server --model-path Qwen/Qwen2-7B-Instruct  --tp 2 --mem-fraction-static "
    "0.7  --enable-p2p-check --host 0.0.0.0 --port 8000    follow error:"
)


def test_prose_wrapped_command_gives_its_flags() -> None:
    cmd = parse_launch_command(PROSE_COMMAND)
    assert cmd is not None
    assert cmd.args == {"model_path": "Qwen/Qwen2-7B-Instruct", "tp_size": 2, "mem_fraction_static": 0.7,
                        "enable_p2p_check": True, "host": "0.0.0.0", "port": 8000}  # fmt: skip
    assert cmd.leftovers == ("follow", "error:")
    # many-valued flags keep all their numbers; a path word glued to "python" is no program word
    many = parse_launch_command("python3 -m sglang.launch_server --cuda-graph-bs 1 2 4 --tp 2")
    assert many is not None and many.args == {"cuda_graph_bs": [1, 2, 4], "tp_size": 2}
    assert parse_launch_command("cpython -m sglang.launch_server --tp 2") is None


def test_prose_wrapped_command_sets_the_runs_fraction() -> None:
    lines = [
        PROSE_COMMAND,
        "[gpu_id=0] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=15.61 GB",
    ]
    (m,) = parse_log(lines, name="sglang-744.log")
    assert m.args.get("mem_fraction_static") == 0.7 and m.identity.tp == 2


def test_upper_bound_adds_back_the_request_pools(root: Path) -> None:
    """tests/fixtures/logs/repo_unknown_dsv4-flash_8xH20_fixture.log (DeepSeek-V4-Flash, 8 x H20, two runs at
    mem_fraction_static 0.88 and 0.60, no pool size printed as K/V, no "Load weight end"): the bound from the free
    memory after the pool, with req_to_token added back — int32 [256 + 1, 1,048,576 + 4] = 257 × 1,048,580 × 4 B
    = 1,077,940,240 B = 1028.004 MiB = 1.00391 GiB (max_running_requests=256, context_len=1048576 on the ready line,
    line 17/32).
    Run 1: 1 − (10.18 + 1.00391) / 93.61 (line 3, Load weight begin) = 1 − 11.18391 / 93.61 = 0.88053 → 0.881
    (without the request pool: 1 − 10.18 / 93.61 = 0.891, above the printed 0.88 by the pool).
    Run 2: 1 − (36.31 + 1.00391) / 93.58 (pre_model_load, line 24) = 0.60126 → 0.601 (printed 0.60)."""
    runs = parse_log(root / "tests/fixtures/logs/repo_unknown_dsv4-flash_8xH20_fixture.log")
    got = [implied_fraction(m) for m in runs]
    assert [(f.value, f.bound) for f in got if f is not None] == [(0.881, "upper"), (0.601, "upper")]
    assert all(f is not None and "req_to_token int32 [257 × 1,048,580] = 1028.0 MiB" in f.how for f in got)
    assert [m.args.get("mem_fraction_static") for m in runs] == [0.88, 0.6]  # each bound is above what was printed


def test_request_pools_need_the_requests() -> None:
    """No ready line and no server_args: the user's --max-running-requests is unknown, so nothing is added (the
    bound stays 1 − free after the pool / free at start: 1 − 10.18 / 93.61 = 0.891)."""
    lines = [
        "[2026-05-15 08:39:36 TP0] Load weight begin. avail mem=93.61 GB",
        "[2026-05-15 08:39:53 TP0] Memory pool end. avail mem=10.18 GB",
    ]
    (m,) = parse_log(lines, name="t.log")
    f = implied_fraction(m)
    assert f is not None and (f.value, f.bound) == (0.891, "upper") and "request pools" not in f.how
