"""The local executor hands out only GPUs nvidia-smi shows free, waits a bounded time, and says why a run never began.

A GPU another job keeps busy, or an nvidia-smi that fails, used to make the sweep wait forever. Now a run
waits at most `gpu_wait_s` (and never past the sweep's --budget) for GPUs that only foreign memory or an
unreadable nvidia-smi keep from it, then is recorded as not started with the reason; waiting for this sweep's
own runs does not count. Test doubles stand in for nvidia-smi (tests/fakes/nvidia-smi) and, where a run starts,
for the worker (tests/fakes/fake_sglang.py, "ok").
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from profiler.model.scenario import single_scenario
from profiler.sweep.executors import NOT_STARTED, Job, JobResult, LocalExecutor
from profiler.sweep.plan import RunGroup
from tests.conftest import FAKE_WORKER
from tests.fakes.smi import gpu, install

FAKE_WORKER = str(FAKE_WORKER)
A, B, C = (f"GPU-{c * 8}-1111-2222-3333-444444444444" for c in "abc")


def _job(tmp_path: Path, name: str) -> Job:
    s = single_scenario(
        "tiny-llama", "H100", mode="decode", name=name,
        run={"startup_timeout_s": 60, "load_timeout_s": 20, "stop_grace_s": 5},
    )  # fmt: skip
    return Job(RunGroup(name, s, (s,)), tmp_path / name, "cuda", FAKE_WORKER)


def _run(ex: LocalExecutor, jobs: list[Job], deadline: float | None = None, limit_s: float = 60):
    """Run the executor on a thread; a hang fails the test instead of the suite."""
    got: list[JobResult] = []
    left: list[list[Job]] = []
    th = threading.Thread(target=lambda: left.append(ex.run(jobs, got.append, deadline)), daemon=True)
    t0 = time.monotonic()
    th.start()
    th.join(limit_s)
    assert not th.is_alive(), f"the executor still waits after {limit_s} s"
    return got, left[0], time.monotonic() - t0


def test_a_gpu_busy_with_foreign_memory_is_waited_for_a_bounded_time(tmp_path, monkeypatch):
    install(monkeypatch, tmp_path, gpus=[gpu(0, A, 30000)])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    ex = LocalExecutor([0], "cuda", gpu_wait_s=1.0, poll_s=0.05)
    (r,), left, took = _run(ex, [_job(tmp_path, "busy")])
    assert r.status == NOT_STARTED and r.result is None and left == [r.job]
    assert "waited 1 s for 1 free GPU" in r.error
    assert f"GPU 0 ({A}) has 30000 MiB in use" in r.error and "under 1024 MiB" in r.error
    assert 1.0 <= took < 20


def test_nvidia_smi_failing_is_waited_for_a_bounded_time(tmp_path, monkeypatch):
    install(monkeypatch, tmp_path, gpus=[gpu(0, A, 0)], fail_from_call=1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    ex = LocalExecutor([0], "cuda", gpu_wait_s=0.5, poll_s=0.05)
    (r,), _, _ = _run(ex, [_job(tmp_path, "nosmi")])
    assert r.status == NOT_STARTED and "nvidia-smi" in r.error and "exited 9" in r.error


def test_the_sweep_budget_ends_the_wait_and_is_the_reason(tmp_path, monkeypatch):
    """--budget 1 s while the GPU stays busy: the run is recorded (not only returned) as not started."""
    install(monkeypatch, tmp_path, gpus=[gpu(0, A, 30000)])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    ex = LocalExecutor([0], "cuda")
    got, left, took = _run(ex, [_job(tmp_path, "late")], deadline=time.monotonic() + 1.0)
    assert [r.status for r in got] == [NOT_STARTED] and left == [got[0].job]
    assert "sweep budget (--budget) ran out" in got[0].error and "30000 MiB in use" in got[0].error
    assert took < 20


def test_busy_check_and_worker_name_the_same_gpu(tmp_path, monkeypatch):
    """Parent CUDA_VISIBLE_DEVICES=<B>,<C>: sweep GPU 0 is B (busy), so the run goes to sweep GPU 1 = C, never A."""
    install(monkeypatch, tmp_path, gpus=[gpu(0, A, 0), gpu(1, B, 30000), gpu(2, C, 0)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{B},{C}")
    monkeypatch.setenv("FAKE_BEHAVIOUR", "ok")
    monkeypatch.setattr("profiler.measure.runner.run.RELEASE_WAIT_S", 2.0)
    ex = LocalExecutor([0, 1], "cuda", gpu_wait_s=30, poll_s=0.05)
    (r,), left, _ = _run(ex, [_job(tmp_path, "ok")])
    assert r.status == "ok" and r.gpus == [1] and left == []
    env = json.loads((tmp_path / "ok" / "command.json").read_text())["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == C and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_waiting_for_our_own_run_does_not_count_against_the_bound(tmp_path, monkeypatch):
    """One free GPU, two runs, a 0.2 s bound: the second waits for the first (seconds), then runs."""
    install(monkeypatch, tmp_path, gpus=[gpu(0, A, 0)])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("FAKE_BEHAVIOUR", "ok")
    monkeypatch.setattr("profiler.measure.runner.run.RELEASE_WAIT_S", 2.0)
    ex = LocalExecutor([0], "cuda", gpu_wait_s=0.2, poll_s=0.05)
    got, left, _ = _run(ex, [_job(tmp_path, "first"), _job(tmp_path, "second")], limit_s=120)
    assert [(r.job.group.key, r.status) for r in got] == [("first", "ok"), ("second", "ok")] and left == []


def test_cpu_slots_never_ask_nvidia_smi(tmp_path, monkeypatch):
    smi = install(monkeypatch, tmp_path, gpus=[gpu(0, A, 0)])
    ex = LocalExecutor([], "cpu", slots=2)
    assert ex.idle([0, 1]) == ([0, 1], None) and smi.calls() == []


def test_sweep_records_a_run_that_never_started_and_resume_starts_it(tmp_path, monkeypatch):
    """The summary, the manifest and --resume all know the run did not start, and why."""
    from profiler.sweep.sweep import run_sweep

    smi = install(monkeypatch, tmp_path, gpus=[gpu(0, A, 30000)])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    f = tmp_path / "s.toml"
    f.write_text(
        '[[scenario]]\nname = "ok"\nmodel = "tiny-llama"\ngpu = "H100"\nmode = "decode"\n'
        'env = { FAKE_BEHAVIOUR = "ok" }\nrun = { startup_timeout_s = 60, load_timeout_s = 20, stop_grace_s = 5 }\n'
    )
    monkeypatch.setattr("profiler.measure.runner.run.RELEASE_WAIT_S", 2.0)
    lines: list[str] = []
    kw = {"out": str(tmp_path / "r"), "device": "cuda", "python": FAKE_WORKER, "say": lines.append,
          "echo": lines.append}  # fmt: skip
    rc = run_sweep(str(f), budget="2s", **kw)
    man = json.loads((tmp_path / "r" / "manifest.json").read_text())["runs"]
    assert man["ok"]["status"] == "not_started" and "30000 MiB in use" in man["ok"]["reason"]
    text = "\n".join(lines)
    assert "not started" in text and "waiting up to 600 s for free GPUs" in text and rc == 0
    smi.set(gpus=[gpu(0, A, 0)])  # the other job left
    lines.clear()
    assert run_sweep(str(f), resume=True, **kw) == 0
    assert "resume: 0 run(s) already recorded" in "\n".join(lines)
    assert json.loads((tmp_path / "r" / "manifest.json").read_text())["runs"]["ok"]["status"] == "ok"
