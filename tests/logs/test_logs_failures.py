"""How runs end: torch OOM numbers (every unit, damaged pastes), failure evidence and kinds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiler.logs import parse_log
from profiler.logs.failures import DETAIL_CHARS, DETAIL_LINES, ExceptionDetail, FailureState, evidence, failure_kind
from profiler.logs.oom import parse_oom

# sglang-23602-t71.log, line 1 (the damage "PY            YTORCH" is verbatim and after the numbers).
OOM_2026 = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total capacity of "
    "95.07 GiB of which 298.69 MiB is free. Including non-PyTorch memory, this process has 94.77 GiB memory in use. "
    "Of the allocated memory 79.00 GiB is allocated by PyTorch, and 206.06 MiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting PY            YTORCH_CUDA_ALLOC_CONF="
    "expandable_segments:True to avoid fragmentation."
)


def test_oom_numbers_all_units_to_mib() -> None:
    n = parse_oom(OOM_2026)
    assert n.gpu_index == 0
    assert n.tried_alloc_mib == 1024.0 and n.free_mib == 298.69 and n.reserved_unallocated_mib == 206.06
    assert n.total_capacity_mib == pytest.approx(95.07 * 1024)
    assert n.in_use_mib == pytest.approx(94.77 * 1024) and n.allocated_by_torch_mib == pytest.approx(79.0 * 1024)
    n = parse_oom(
        "CUDA out of memory. Tried to allocate 512 bytes. GPU 1 has a total capacity of 23.99 GiB of which "
        "768.00 KiB is free."
    )
    assert n.tried_alloc_mib == pytest.approx(512 / 2**20) and n.free_mib == pytest.approx(0.75)


def test_oom_private_pools_and_process_list() -> None:
    n = parse_oom(
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 3 has a total capacity of 79.19 GiB of which 3.94 MiB "
        "is free. Process 4242 has 10.00 GiB memory in use. Including non-PyTorch memory, this process has 69.17 GiB "
        "memory in use. Of the allocated memory 60.10 GiB is allocated by PyTorch, with 2.50 GiB allocated in private "
        "pools (e.g., CUDA Graphs), and 1.20 GiB is reserved by PyTorch but unallocated."
    )
    assert (n.gpu_index, n.free_mib, n.private_pools_mib) == (3, 3.94, 2560.0)
    assert n.in_use_mib == pytest.approx(69.17 * 1024) and n.reserved_unallocated_mib == pytest.approx(1228.8)


def test_oom_torch_2_1_typo_and_torch_2_0_format() -> None:
    n = parse_oom(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacty of 79.15 GiB of which "
        "1.06 GiB is free."
    )
    assert n.total_capacity_mib == pytest.approx(79.15 * 1024) and n.free_mib == pytest.approx(1.06 * 1024)
    n = parse_oom(
        "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB already "
        "allocated; 3.44 MiB free; 14.65 GiB reserved in total by PyTorch)"
    )
    assert (n.gpu_index, n.tried_alloc_mib, n.free_mib) == (0, 20.0, 3.44)
    assert n.allocated_by_torch_mib == pytest.approx(14.56 * 1024)
    assert n.reserved_unallocated_mib == pytest.approx((14.65 - 14.56) * 1024)


def test_oom_cut_after_total_number_reads_gib_with_a_note() -> None:
    # sglang-5285.log, last line (the paste ends right after "95.00").
    n = parse_oom(
        "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB. GPU 7 has "
        "a total capacity of 95.00"
    )
    assert (n.gpu_index, n.tried_alloc_mib, n.total_capacity_mib) == (7, 448.0, 95.0 * 1024)
    assert n.notes and "unit cut off" in n.notes[0]
    assert parse_oom("GPU 7 has a total capacity of 95.0").total_capacity_mib is None  # a cut number is refused


def test_oom_wrapped_mid_word_across_lines() -> None:
    lines = [
        "[2025-06-01 10:00:00 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=2.00 GB",
        "[2025-06-01 10:00:05 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.5",
        "0 GiB. GPU 0 has a total capa",
        "city of 79.19 GiB of which 488.19 MiB is free. Including non-PyTorch memory, this pro",
        "cess has 78.70 GiB memory in use. Of the allocated memory 70.00 GiB is allocated by PyTorch, and",
        "297.40 MiB is reserved by PyTorch but unallocated.",
        "[2025-06-01 10:00:06] Received sigquit from a child process. It usually means the child failed.",
    ]
    (m,) = parse_log(lines)
    f = m.failure
    assert f is not None and (f.kind, f.phase) == ("oom_during_capture", "decode_graph")
    assert f.tried_alloc_mib == 1536.0 and f.free_mib == 488.19 and f.reserved_unallocated_mib == 297.4
    assert f.total_capacity_mib == pytest.approx(79.19 * 1024) and f.in_use_mib == pytest.approx(78.70 * 1024)
    assert m.identity.gpu_total_how == "oom total capacity"


# tests/fixtures/logs-heldout/sglang-23769.log, lines 36-48: the reporter put each of torch's sentences on its own
# line, with a blank line after "Tried to allocate"; NVML listed one process ("Process 1939284 has …").
OOM_23769 = [
    "Exception: Capture cuda graph failed: CUDA out of memory.",
    "Tried to allocate 672.00 MiB.",
    "",
    "GPU 0 has a total capacity of 140.06 GiB of which 200.75 MiB is free.",
    "Process 1939284 has 139.86 GiB memory in use.",
    "Of the allocated memory 128.50 GiB is allocated by PyTorch,",
    "with 3.23 GiB allocated in private pools (e.g., CUDA Graphs),",
    "and 1.01 GiB is reserved by PyTorch but unallocated.",
    "",
    "Possible solutions:",
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
]


def test_oom_sentences_on_their_own_lines_across_a_blank_line() -> None:
    (m,) = parse_log(OOM_23769)
    f = m.failure
    assert f is not None and f.kind == "oom_during_capture" and f.gpu_index == 0
    assert (f.tried_alloc_mib, f.free_mib) == (672.0, 200.75)
    assert f.total_capacity_mib == pytest.approx(140.06 * 1024)  # 143421.44
    assert f.in_use_mib == pytest.approx(139.86 * 1024)  # 143216.64, the only process listed
    assert f.allocated_by_torch_mib == pytest.approx(128.5 * 1024)  # 131584.0
    assert f.private_pools_mib == pytest.approx(3.23 * 1024)  # 3307.52
    assert f.reserved_unallocated_mib == pytest.approx(1.01 * 1024)  # 1034.24
    # outside torch = in use − allocated − reserved-unallocated = (139.86 − 128.50 − 1.01) GiB = 10.35 GiB
    assert f.outside_torch_mib == pytest.approx(10.35 * 1024)
    assert any("only process torch listed" in n for n in m.notes)


def test_oom_blank_line_then_other_text_ends_the_message() -> None:
    # The same start, but the line after the blank is not one of torch's sentences: nothing after it is read.
    (m,) = parse_log([*OOM_23769[:3], "GPU note: 140.06 GiB of which 200.75 MiB is free."])
    f = m.failure
    assert f is not None and f.tried_alloc_mib == 672.0 and f.free_mib is None and f.total_capacity_mib is None
    # Two blank lines end it too.
    (m,) = parse_log([*OOM_23769[:3], "", *OOM_23769[3:]])
    assert m.failure is not None and m.failure.total_capacity_mib is None


def test_oom_several_processes_listed_leave_in_use_unknown() -> None:
    n = parse_oom(
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 3 has a total capacity of 79.19 GiB of which 3.94 MiB "
        "is free. Process 4242 has 10.00 GiB memory in use. Process 4343 has 69.17 GiB memory in use. Of the "
        "allocated memory 60.10 GiB is allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated."
    )
    assert n.in_use_mib is None and n.outside_torch_mib is None and n.free_mib == 3.94


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ("[2025-04-11 16:24:18 TP7] Scheduler hit an exception: Traceback (most recent call last):", "exception"),
        ("[23:17:08 TP4] Exception in run_tp_server:", "exception"),
        ("Traceback (most recent call last):", "traceback"),
        ("TypeError: cannot unpack non-iterable ForwardMetadata object", "tail"),
        (
            "CUDA error (_deps/repo-flashmla-src/csrc/smxx/get_mla_metadata.cu:93): no kernel image is available for "
            "execution on the device",
            "cuda_error",
        ),
        ("[2026-02-26 05:35:13] Received sigquit from a child process. It usually means the child failed.", "sigquit"),
        ("Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)", "timeout"),
        ("Not enough memory. Please try to increase --mem-fraction-static.", "no_kv"),
        (
            "Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), a common cause "
            "is the OS OOM killer.",
            "exit",
        ),
        ("launch_server.py: error: unrecognized arguments: --bogus", "exit"),
        ("Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 1.50 GiB.", "capture"),
    ],
)
def test_failure_evidence(line: str, what: str) -> None:
    from profiler.logs.prefixes import split_prefix

    e = evidence(split_prefix(line).msg)
    assert e is not None and e.what == what


def test_not_failures() -> None:
    assert evidence("Prefill transfer failed for request rank=0 with exception KVTransferError(...)") is None
    assert evidence("Decode batch. #running-req: 1, #token: 7, token usage: 0.00, cuda graph: True") is None


def test_failure_kind_rules() -> None:
    kw = {"ready": False, "timeout": False, "bad_args": False}
    assert failure_kind(oom=True, capture=False, phase="decode_graph", **kw) == "oom_during_capture"
    assert failure_kind(oom=True, capture=False, phase="weights", **kw) == "oom_startup"
    assert failure_kind(oom=True, capture=False, phase="runtime", ready=True, timeout=False, bad_args=False) == (
        "oom_runtime"
    )
    assert failure_kind(oom=False, capture=False, phase="prefill_graph", **kw) == "capture_failed"
    assert failure_kind(oom=False, capture=False, phase=None, ready=False, timeout=True, bad_args=False) == "timeout"
    assert failure_kind(oom=False, capture=False, phase=None, ready=False, timeout=False, bad_args=True) == "bad_args"
    assert failure_kind(oom=False, capture=False, phase="kv_pool", **kw) == "crash"


# tests/fixtures/logs-heldout/sglang-24650.log, lines 67-70: TVM's exception message continues on a second line.
TVM_24650 = (
    "tvm.error.InternalError: Tensor match failed for Tensor<126>[strides=<1>, dtype=int32, device=cuda:0] at "
    "/workspace/sglang/python/sglang/jit_kernel/csrc/deepseek_v4/rope.cuh:130"
)
ROOT_24650 = "- Root cause: Size mismatch for shape#0('batch_size'): expected 128 but got 126"


def _tail_state(line: int) -> FailureState:
    fs = FailureState(line, "Scheduler hit an exception: Traceback (most recent call last):")
    fs.absorb(evidence(TVM_24650))  # type: ignore[arg-type]
    assert fs.failure.message == TVM_24650
    return fs


def test_exception_message_keeps_its_following_lines() -> None:
    fs = _tail_state(67)
    d = ExceptionDetail(fs, 67)
    assert d.take(68, ROOT_24650) is True
    assert d.take(69, "") is False  # the blank line ends it; the SIGQUIT record after it would too
    assert fs.failure.message == f"{TVM_24650}\n{ROOT_24650}"
    fs = _tail_state(67)
    d = ExceptionDetail(fs, 67)
    assert d.take(70, ROOT_24650) is False  # not the next line (the scanner skipped some): not the message's
    assert d.take(68, "[2026-05-08 01:57:04] SIGQUIT received.", tagged=True) is False
    assert (
        d.take(68, '  File "x.py", line 1, in f') is False and d.take(68, "Traceback (most recent call last):") is False
    )
    assert d.take(68, "ValueError: another exception") is False  # evidence of its own
    assert fs.failure.message == TVM_24650


def test_exception_detail_is_bounded_and_yields_to_a_better_message() -> None:
    fs = _tail_state(10)
    d = ExceptionDetail(fs, 10)
    assert all(d.take(11 + i, f"detail {i}") for i in range(DETAIL_LINES))
    assert d.take(11 + DETAIL_LINES, "one more") is False
    assert fs.failure.message.count("\n") == DETAIL_LINES == 4
    d = ExceptionDetail(_tail_state(10), 10)
    assert d.take(11, "x" * (DETAIL_CHARS + 1)) is False  # 600 characters at most
    fs = _tail_state(10)
    d = ExceptionDetail(fs, 10)
    fs.absorb(evidence("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."))  # type: ignore[arg-type]
    assert d.take(11, "GPU 0 has a total capacity of 79.15 GiB") is False  # the OOM line is the message now


def test_traceback_through_an_sglang_process_entry_is_a_failure() -> None:
    # tests/fixtures/logs-heldout/sglang-4489.log, lines 6-8: an untagged startup traceback, cut ("self.init_cu")
    # before its exception line; its outermost frame is the scheduler process's entry, which logs and exits.
    frame = (
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 1748, in run_scheduler_process'
    )
    e = evidence(frame)
    assert e is not None and e.what == "exception"
    (m,) = parse_log([
        "Traceback (most recent call last):",
        frame,
        "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, dp_rank)",
        '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", line 207, in initialize',
        "    self.init_cu",
    ])  # fmt: skip
    assert m.failure is not None and m.failure.kind == "crash" and m.failure.line == 2
    # A frame of the same name outside sglang, or any other function, is only a frame.
    assert evidence('  File "/app/mine.py", line 3, in run_scheduler_process') is None
    e = evidence('  File "/x/sglang/srt/managers/scheduler.py", line 9, in event_loop_normal')
    assert e is None or e.what == "frame"


def test_a_logged_traceback_record_is_sglangs_own_report() -> None:
    # tests/fixtures/logs-heldout/sglang-1751.log, line 4 (0.3.x: the scheduler logs the bare traceback,
    # "logger.error(get_exception_traceback())"); a bare "Traceback" line is only tentative.
    from profiler.logs.prefixes import split_prefix

    p = split_prefix("[2024-10-22 06:31:49 TP0] Traceback (most recent call last):")
    e = evidence(p.msg, record=p.hms is not None)
    assert e is not None and e.what == "exception"
    e = evidence("Traceback (most recent call last):")
    assert e is not None and e.what == "traceback"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_characters="\n"), max_size=300), max_size=12))  # one line each
def test_exception_detail_never_exceeds_its_bounds(lines: list[str]) -> None:
    fs = _tail_state(1)
    d = ExceptionDetail(fs, 1)
    for i, s in enumerate(lines, start=2):
        if not d.take(i, s):
            break
    extra = fs.failure.message[len(TVM_24650) :]
    assert fs.failure.message.startswith(TVM_24650) and extra.count("\n") <= DETAIL_LINES
    assert len(extra) <= DETAIL_CHARS + DETAIL_LINES  # the characters kept, plus one newline per line


def test_exception_line_replaces_the_process_entry_frame_as_message() -> None:
    (m,) = parse_log([
        "Traceback (most recent call last):",
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 1748, in run_scheduler_process',
        "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, dp_rank)",
        "ValueError: bad value",
    ])  # fmt: skip
    assert m.failure is not None and m.failure.message == "ValueError: bad value" and m.failure.line == 2
