"""profiler.logs.build / identity: runs, ranks, phases, ladders, failures and identity from whole logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler.core.errors import MemfracError
from profiler.logs import iter_measurements, parse_log
from tests.conftest import LOG_FIXTURES

# One small single-GPU startup (lines from repo_unknown_llama31-8b_24gb_docker.log, with a begin line added).
STARTUP = [
    "[2025-07-14 05:48:00] server_args=ServerArgs(model_path='meta-llama/Llama-3.1-8B-Instruct', tp_size=1, "
    "mem_fraction_static=0.88, disaggregation_mode='null')",
    "[2025-07-14 05:48:10] Load weight begin. avail mem=23.10 GB",
    "[2025-07-14 05:48:43] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=7.37 GB, "
    "mem usage=15.02 GB.",
    "[2025-07-14 05:48:43] KV Cache is allocated. #tokens: 38141, K size: 2.33 GB, V size: 2.33 GB",
    "[2025-07-14 05:48:43] Memory pool end. avail mem=1.46 GB",
    "[2025-07-14 05:48:44] Capture cuda graph begin. This can take up to several minutes. avail mem=0.93 GB",
    "[2025-07-14 05:48:44] Capture cuda graph bs [1, 2, 4, 8]",
    "Capturing batches (bs=8 avail_mem=0.93 GB):   0%|          | 0/4 [00:00<?, ?it/s]",
    "Capturing batches (bs=8 avail_mem=0.93 GB):  25%|██▌       | 1/4 [00:05<00:15,  5.00s/it]",
    "Capturing batches (bs=4 avail_mem=0.90 GB):  25%|██▌       | 1/4 [00:05<00:15,  5.00s/it]",
    "Capturing batches (bs=1 avail_mem=0.86 GB): 100%|██████████| 4/4 [00:18<00:00,  4.51s/it]",
    "[2025-07-14 05:49:02] Capture cuda graph end. Time elapsed: 18.07 s. mem usage=0.11 GB. avail mem=0.83 GB.",
    "[2025-07-14 05:49:02] max_total_num_tokens=38141, chunked_prefill_size=2048, max_prefill_tokens=16384, "
    "max_running_requests=2048, context_len=131072, available_gpu_mem=0.83 GB",
]


def test_single_run_phases_and_units() -> None:
    (m,) = parse_log(STARTUP, name="s.log")
    assert m.id == "s.log#0" and m.source == "log" and (m.first_line, m.last_line) == (1, 13)
    assert m.args_source == "server_args" and m.identity.mode == "null" and m.identity.tp == 1
    (r,) = m.ranks
    assert r.label == "" and [p.name for p in r.phases] == ["weights", "kv_pool", "decode_graph", "ready"]
    w = r.phase("weights")
    assert w.before.free_mib == pytest.approx(23.10 * 1024) and w.after.free_mib == pytest.approx(7.37 * 1024)
    assert w.usage_mib == pytest.approx(15.02 * 1024) and w.resolution_mib == 10.24 and w.line == 2
    assert w.before.t is not None and w.after.t - w.before.t == 33
    kv = r.phase("kv_pool")
    assert kv.details == {"kv_tokens": 38141, "k_mib": pytest.approx(2.33 * 1024), "v_mib": pytest.approx(2.33 * 1024)}
    g = r.phase("decode_graph")
    assert g.details["max_bs"] == 8 and g.elapsed_s == 18.07 and g.usage_mib == pytest.approx(0.11 * 1024)
    assert [(p.bs, round(p.free_mib / 1024, 2)) for p in g.ladder] == [(8, 0.93), (4, 0.90), (1, 0.86)]
    assert g.ladder[-1].used_mib == pytest.approx((0.93 - 0.86) * 1024)
    ready = r.phase("ready")
    assert ready.details["available_gpu_mem_mib"] == pytest.approx(0.83 * 1024)
    assert ready.details["max_total_num_tokens"] == 38141
    assert m.failure is None and m.unparsed_memory_lines == 0


def test_gpu_from_first_avail_mem_when_one_gpu_fits() -> None:
    (m,) = parse_log(["[2025-08-08 03:34:30] Load weight begin. avail mem=15.15 GB"])
    assert (m.identity.gpu_name, m.identity.gpu_total_mib) == ("RTX-5080", 16303.0)
    assert m.identity.gpu_total_how == "first avail mem 15.15 GiB ≈ RTX-5080"


def test_gpu_estimated_as_the_smallest_when_several_fit() -> None:
    # 78.81 GiB free: H100/H800 (81559 MiB = 79.65 GiB) and A100-80GB (81920 MiB = 80.00 GiB) are both within
    # 3 GiB above it: not named; estimated as the smallest capacity, 81559 MiB, both kept as candidates
    (m,) = parse_log(["[2025-01-01 00:00:00 TP0] Load weight begin. avail mem=78.81 GB"])
    assert (m.identity.gpu_name, m.identity.gpu_total_mib, m.identity.gpu_total_origin) == (None, 81559.0, "estimated")
    assert m.identity.gpu_candidates_mib == [81559, 81920]
    assert m.identity.gpu_total_how.startswith("first avail mem 78.81 GiB ≤ capacity: estimated 81559 MiB")
    assert any("H100-80GB" in n and "A100-80GB" in n for n in m.notes)


# ---- run splitting ---------------------------------------------------------------------------------------


def test_two_server_args_two_runs() -> None:
    ms = parse_log(LOG_FIXTURES / "repo_unknown_dsv4-flash_8xH20_fixture.log")
    assert [m.id for m in ms] == [
        "repo_unknown_dsv4-flash_8xH20_fixture.log#0",
        "repo_unknown_dsv4-flash_8xH20_fixture.log#1",
    ]
    assert [m.args["mem_fraction_static"] for m in ms] == [0.88, 0.60]
    assert ms[1].first_line == 21 and "server_args line" in ms[1].notes[0]


def test_timestamps_going_back_split_runs() -> None:
    ms = parse_log(LOG_FIXTURES / "sglang-pr17392.log")
    assert len(ms) == 2 and ms[1].first_line == 15
    assert "timestamps go back" in ms[1].notes[0]


def test_load_begin_after_ready_and_second_ready_split_runs() -> None:
    ms = parse_log(STARTUP[1:] + STARTUP[1:])
    assert len(ms) == 2 and ms[1].first_line == 13
    ms = parse_log(STARTUP[-1:] * 2)  # two ready lines on one rank: two starts
    assert len(ms) == 2


def test_second_torch_distributed_init_on_a_rank_splits_runs() -> None:
    lines = [
        "[2025-03-08 12:29:13 TP0] Init torch distributed ends. mem usage=0.13 GB",
        "[2025-03-08 12:29:13 TP0] Load weight begin. avail mem=21.63 GB",
        "[2025-03-08 12:35:13 TP0] Init torch distributed ends. mem usage=0.13 GB",
    ]
    ms = parse_log(lines)
    assert len(ms) == 2 and [p.name for p in ms[1].ranks[0].phases] == ["init_parallel"]
    (m,) = parse_log(LOG_FIXTURES / "repo_sglang-docs_send-request_llama31-8b_1gpu.log")
    assert m.ranks[0].phase("init_parallel") is None  # only "Init torch distributed begin." (no number)


def test_command_then_server_args_is_one_run_and_args_merge() -> None:
    lines = [
        "$ python -m sglang.launch_server --model-path m --disaggregation-mode decode --mem-fraction-static 0.8",
        "[2025-05-29 23:22:47] server_args=ServerArgs(model_path='m', mem_fraction_static=0.8, tp_size=1, max_r",
    ]
    (m,) = parse_log(lines)
    assert m.args_source == "server_args" and m.args["disaggregation_mode"] == "decode"
    assert m.identity.mode == "decode" and m.mfs_origin == "given"
    assert any("cut off" in n for n in m.notes) and any("disaggregation_mode" in n for n in m.notes)
    assert len(parse_log(lines + lines)) == 2


def test_draft_model_second_load_stays_in_the_run() -> None:
    lines = [*STARTUP[1:12], "[2025-07-14 05:49:03] Load weight begin. avail mem=0.80 GB"]
    (m,) = parse_log(lines)
    assert len(m.ranks[0].phases_named("weights")) == 2
    assert any("second weight load" in n for n in m.notes)


# ---- ranks -------------------------------------------------------------------------------------------------


def test_rank_labels_numbers_and_ladder_attribution() -> None:
    ms = parse_log(LOG_FIXTURES / "sglang-pr17392.log")
    run2 = ms[1]
    assert [r.label for r in run2.ranks] == ["DP0 TP0 EP0", "DP1 TP1 EP1", "DP2 TP2 EP2", "DP3 TP3 EP3"]
    r0 = run2.ranks[0]
    assert (r0.dp, r0.tp, r0.ep, r0.pp) == (0, 0, 0, None)
    assert [(p.bs, p.free_mib / 1024) for p in r0.phase("decode_graph").ladder] == [
        (32, 27.49),
        (24, 21.80),
        (16, 21.80),
    ]
    assert all(not r.phase("decode_graph").ladder for r in run2.ranks[1:])
    assert (run2.identity.tp, run2.identity.dp, run2.identity.ep) == (4, 4, 4)
    assert any("inferred from rank tags" in n for n in run2.notes)


def test_ladder_without_bs_keeps_every_distinct_frame() -> None:
    # sglang-6320.log: the no-"bs=" variant, each value printed twice (tqdm redraw).
    (m,) = parse_log(LOG_FIXTURES / "sglang-6320.log")
    lad = m.rank("TP0").phase("decode_graph").ladder
    assert [(p.bs, p.free_mib / 1024) for p in lad] == [(None, 8.55), (None, 8.20)]


def test_pp_labels() -> None:
    lines = [
        "[2025-09-01 10:00:00 PP1 TP3] Load weight begin. avail mem=70.00 GB",
        "[2025-09-01 10:00:00 PP0 TP3] Load weight begin. avail mem=70.00 GB",
    ]
    (m,) = parse_log(lines)
    assert [(r.label, r.pp, r.tp) for r in m.ranks] == [("PP0 TP3", 0, 3), ("PP1 TP3", 1, 3)]
    assert (m.identity.pp, m.identity.tp) == (2, 4)


# ---- failures ------------------------------------------------------------------------------------------------


def test_untagged_failure_goes_to_the_rank_that_logged_last() -> None:
    (m,) = parse_log(LOG_FIXTURES / "sglang-14700.log")
    failed = {r.label: r.failure.kind for r in m.ranks if r.failure}
    assert failed == {
        "DP6 TP6": "capture_failed",
        "DP2 TP2": "capture_failed",
        "DP7 TP7": "capture_failed",
        "DP3 TP3": "capture_failed",
    }
    assert m.failure.line == 4 and m.failure.phase == "decode_graph"


def test_oom_before_any_rank_joins_the_first_failing_rank() -> None:
    (m,) = parse_log(LOG_FIXTURES / "sglang-5285.log")
    (r,) = m.ranks
    assert r.label == "TP7" and r.failure.kind == "oom_during_capture" and r.failure.gpu_index == 7
    assert m.identity.gpu_total_mib == 95.0 * 1024


def test_oom_at_runtime() -> None:
    lines = [
        *STARTUP,
        "[2025-07-14 05:50:00] Scheduler hit an exception: Traceback (most recent call last):",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "22.49 GiB of which 100.00 MiB is free.",
    ]
    (m,) = parse_log(lines)
    assert (m.failure.kind, m.failure.phase, m.failure.line) == ("oom_runtime", "runtime", 14)


def test_kv_pool_too_small_is_an_oom_at_startup() -> None:
    lines = [
        *STARTUP[:3],
        "[2025-07-14 05:48:43] Scheduler hit an exception: Traceback (most recent call last):",
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
    ]
    (m,) = parse_log(lines)
    assert (m.failure.kind, m.failure.phase) == ("oom_startup", "kv_pool")  # named by the message itself
    lines = [*STARTUP[:3], "[2025-07-14 05:48:43] Not enough memory. Please try to increase --mem-fraction-static."]
    (m,) = parse_log(lines)
    assert (m.failure.kind, m.failure.phase) == ("oom_startup", "kv_pool")


def test_sigquit_exit_code_timeout_and_bad_args() -> None:
    (m,) = parse_log(
        [
            *STARTUP[:3],
            "[2025-07-14 05:48:50] Received sigquit from a child process. It usually means the child failed.",
        ]
    )
    assert m.failure.kind == "crash"
    (m,) = parse_log(
        [
            *STARTUP[:3],
            "[2025-07-14 05:48:50] Rank 0 scheduler died during initialization (exit code: "
            "-9). If exit code is -9 (SIGKILL), a common cause is the OS OOM killer.",
        ]
    )
    assert (m.failure.kind, m.failure.exit_code) == ("crash", -9)
    (m,) = parse_log(
        [*STARTUP[:3], "[2025-07-14 05:58:43] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)"]
    )
    assert m.failure.kind == "timeout"
    (m,) = parse_log(
        [
            "python -m sglang.launch_server --model-path m --bogus-flag 1",
            "launch_server.py: error: unrecognized arguments: --bogus-flag 1",
        ]
    )
    assert m.failure.kind == "bad_args"


def test_traceback_that_did_not_stop_startup_is_not_a_failure() -> None:
    lines = [
        *STARTUP[:3],
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3/site-packages/flashinfer/jit/core.py", line 10, in load',
        "ImportError: prebuilt kernels not found",
        *STARTUP[3:],
    ]
    (m,) = parse_log(lines)
    assert m.failure is None and any("did not stop startup" in n for n in m.notes)


# ---- robustness, inputs -------------------------------------------------------------------------------


def test_unknown_memory_lines_are_counted_with_examples() -> None:
    lines = [f"[2026-01-01 00:00:0{i}] Weird new pool thing reserved, avail mem=1.0{i} GB" for i in range(7)]
    (m,) = parse_log(lines)
    assert m.unparsed_memory_lines == 7 and len(m.unparsed_examples) == 5
    assert m.unparsed_examples[0].startswith("line 1: ")


def test_host_memory_line_is_a_note_not_a_kv_size() -> None:
    (m,) = parse_log(LOG_FIXTURES / "sglang-21395.log")
    assert "k_mib" in m.ranks[0].phase("kv_pool").details
    assert any("HOST memory" in n for n in m.notes)


def test_inputs_and_errors(tmp_path: Path) -> None:
    with pytest.raises(MemfracError, match="no such log file"):
        parse_log(tmp_path / "missing.log")
    with pytest.raises(MemfracError, match="raw bytes"):
        parse_log(b"x")  # type: ignore[arg-type]
    (tmp_path / "a.log").write_text("\n".join(STARTUP))
    (tmp_path / "b.txt").write_text("\n".join(STARTUP))
    (tmp_path / "skip.json").write_text("{}")
    assert [m.id for m in iter_measurements([tmp_path])] == ["a.log#0", "b.txt#0"]
    assert parse_log([]) == [] and parse_log(tmp_path / "skip.json") == []


def test_measurement_round_trips_through_json() -> None:
    from profiler.core.measurement import Measurement

    for m in parse_log(LOG_FIXTURES / "sglang-pr17392.log") + parse_log(LOG_FIXTURES / "sglang-5285.log"):
        assert Measurement.from_json(m.to_json()).to_dict() == m.to_dict()
