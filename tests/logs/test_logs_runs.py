"""One run per server attempt, and wrapped messages joined before they are read (issue 11, parts 2 and 3).

The lines are real (fixtures named in each test); where a test builds a sequence, it is the sequence sglang
writes: scheduler lines "[time TPn] …" then the untagged traceback and torch's OOM message
(c10/cuda/CUDACachingAllocator.cpp, "… with X allocated in private pools (e.g., CUDA Graphs), and …").
"""

from __future__ import annotations

import pytest

from profiler.logs import parse_log
from tests.conftest import LOG_FIXTURES


def _lines(name: str, a: int = 0, b: int | None = None) -> list[str]:
    return (LOG_FIXTURES / name).read_text(errors="replace").splitlines()[a:b]


DOCKER = "repo_unknown_llama31-8b_24gb_docker.log"
STARTUP = [
    "[2025-07-14 05:48:10] Load weight begin. avail mem=23.10 GB",
    *_lines(DOCKER, 0, 8),
]  # weights, KV pool, decode graph (with ladder), ready line
# glm52 a3 (real): every figure torch prints, without private pools.
OOM_REAL = _lines("repo_unknown_glm52-fp8_8xH200_hisparse_a3.log")
OOM_TEXT = next(ln.split("| ", 1)[1] for ln in OOM_REAL if "Tried to allocate" in ln)
# torch >= 2.1 wording with CUDA graphs holding memory (private pools), as CUDACachingAllocator.cpp prints it.
OOM_POOLS = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 3 has a total capacity of 79.19 "
    "GiB of which 3.94 MiB is free. Including non-PyTorch memory, this process has 79.17 GiB memory in use. Of the "
    "allocated memory 60.10 GiB is allocated by PyTorch, with 2.50 GiB allocated in private pools (e.g., CUDA "
    "Graphs), and 1.20 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
    "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)
CAPTURE_FAIL = [
    "[2025-07-14 05:48:44] Capture cuda graph begin. This can take up to several minutes. avail mem=0.93 GB",
    "[2025-07-14 05:48:45] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/cuda_graph_runner.py", line 351, in capture',
]


def _hard_wrap(text: str, width: int) -> list[str]:
    """A terminal: cut every `width` characters, mid-word."""
    return [text[i : i + width] for i in range(0, len(text), width)]


def _word_wrap(text: str, width: int) -> list[str]:
    """An editor or a mail client: break at spaces."""
    import textwrap

    return textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False)


@pytest.mark.parametrize("wrap", [_hard_wrap, _word_wrap])
@pytest.mark.parametrize("width", [23, 31, 40, 57, 80, 131])  # the exception name (23 characters) on one line
def test_wrapped_oom_message_keeps_every_figure(wrap, width: int) -> None:  # type: ignore[no-untyped-def]
    (m,) = parse_log([*STARTUP[:5], *CAPTURE_FAIL, *wrap(OOM_POOLS, width), ""])
    f = m.failure
    assert f is not None and f.kind == "oom_during_capture", (width, f)
    assert f.tried_alloc_mib == 20.0 and f.gpu_index == 3
    assert f.total_capacity_mib == pytest.approx(79.19 * 1024)  # 81090.56 MiB
    assert f.free_mib == 3.94
    assert f.in_use_mib == pytest.approx(79.17 * 1024)  # 81070.08 MiB
    assert f.allocated_by_torch_mib == pytest.approx(60.10 * 1024)  # 61542.4 MiB
    assert f.private_pools_mib == 2.50 * 1024  # 2560 MiB
    assert f.reserved_unallocated_mib == pytest.approx(1.20 * 1024)  # 1228.8 MiB


@pytest.mark.parametrize("width", [47, 64, 80])  # "Exception: Capture cuda graph failed: CUDA out" on one line
def test_wrapped_real_oom_behind_compose_prefix(width: int) -> None:
    # glm52 a3's message, wrapped after docker compose wrote its prefix on the first line only.
    lines = [*STARTUP[:5], *CAPTURE_FAIL]
    wrapped = _hard_wrap(OOM_TEXT, width)
    lines += ["worker-longctx-1  | " + wrapped[0], *wrapped[1:], ""]
    (m,) = parse_log(lines)
    f = m.failure
    assert f is not None and f.kind == "oom_during_capture"
    assert (f.tried_alloc_mib, f.free_mib, f.reserved_unallocated_mib) == (1.5 * 1024, 488.19, 297.40)
    assert f.total_capacity_mib == pytest.approx(139.80 * 1024) and f.in_use_mib == pytest.approx(139.20 * 1024)
    assert f.allocated_by_torch_mib == pytest.approx(134.73 * 1024)


def test_oom_then_a_new_launch_is_two_runs_and_the_second_is_healthy() -> None:
    # Before: one run, and the healthy second start was labelled oom_during_capture (the OOM window took
    # the next command as part of the message).
    wsl = _lines("repo_unknown_qwen3-0.6b_wsl_4gb.log")
    lines = [*STARTUP[:5], *CAPTURE_FAIL, *_hard_wrap(OOM_POOLS, 60)[:3], *wsl]
    first, second = parse_log(lines)
    assert first.failure is not None and first.failure.kind == "oom_during_capture"
    assert second.failure is None or not second.failure.kind.startswith("oom")
    assert second.args_source == "server_args" and second.first_line == 5 + 3 + 3 + 1
    assert any("launch command" in n for n in second.notes)


def test_oom_then_startup_lines_without_a_command_is_two_runs() -> None:
    restart = [ln.replace("05:4", "06:4") for ln in STARTUP]  # a later restart: time goes forward
    lines = [*STARTUP[:5], *CAPTURE_FAIL, OOM_POOLS, *restart]
    first, second = parse_log(lines)
    assert first.failure is not None and first.failure.kind == "oom_during_capture"
    assert second.failure is None and [p.name for p in second.ranks[0].phases][:2] == ["weights", "kv_pool"]
    assert any("after it failed" in n for n in second.notes)


@pytest.mark.parametrize("later", [False, True])
def test_three_capture_snippets_pasted_one_after_another_are_three_runs(later: bool) -> None:
    snippet = _lines(DOCKER, 3, 7)  # Capture begin, bs list, tqdm ladder, Capture end
    pasted = snippet * 3
    if later:  # the same snippet from later restarts: time goes forward, the capture itself repeats
        pasted = [ln.replace("05:4", f"0{6 + i // 4}:4") for i, ln in enumerate(pasted)]
    ms = parse_log(pasted)
    assert len(ms) == 3
    for m in ms:
        (r,) = m.ranks
        assert [p.name for p in r.phases] == ["decode_graph"] and r.phase("decode_graph").elapsed_s == 18.07
    why = "capture begins again" if later else "timestamps go back"
    for m in ms[1:]:
        assert any(why in n for n in m.notes)
        assert any("pasted separately, it stays a run of its own" in n for n in m.notes)


def test_a_second_weight_load_with_memory_back_is_a_new_process() -> None:
    # STARTUP ends at ready; a second load before any ready line, with the GPU free again (23.10 GB > 0.93).
    ms = parse_log([*STARTUP[:7], "[2025-07-14 05:50:10] Load weight begin. avail mem=23.10 GB"])
    assert len(ms) == 2 and any("memory came back" in n for n in ms[1].notes)
    (m,) = parse_log([*STARTUP[:7], "[2025-07-14 05:50:10] Load weight begin. avail mem=0.80 GB"])  # a draft model
    assert len(m.ranks[0].phases_named("weights")) == 2


def test_a_new_pid_is_a_new_run() -> None:
    pfx = "Jul 14 05:48:43 gpu-node-7 python3[{}]: "
    lines = [pfx.format(4100) + ln for ln in STARTUP[:4]] + [pfx.format(5200) + ln for ln in STARTUP[:4]]
    ms = parse_log(lines)
    assert len(ms) == 2 and any("pid 4100 → 5200" in n for n in ms[1].notes)
    served = ["[2025-07-14 05:49:03] INFO:     Started server process [889167]"] * 2
    served[1] = served[1].replace("889167", "889999")
    assert len(parse_log([*STARTUP, served[0], *STARTUP[:1], served[1]])) >= 2
    assert len(parse_log([*STARTUP, served[0], served[0]])) == 1


def test_wrapped_server_args_repr_is_joined() -> None:
    sa = _lines("repo_sglang-docs_send-request_llama31-8b_1gpu.log", 0, 1)[0]
    (plain,) = parse_log([sa])
    for width in (80, 233, 16 * 1024 // 8):
        (m,) = parse_log([*_hard_wrap(sa, width), "[2025-01-23 19:35:14 TP0] Init torch distributed begin."])
        assert m.args == plain.args and len(m.args) > 50, width
        assert any("wrapped over" in n for n in m.notes)
    cut = parse_log([sa[:900], "[2025-01-23 19:35:14 TP0] Init torch distributed begin."])[0]
    assert any("is cut off" in n for n in cut.notes) and len(cut.args) < len(plain.args)
