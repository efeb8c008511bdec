"""Worker supervision and failure classification with a test double in place of sglang (fast, no sglang).

The double only exercises the runner's process handling; every real measurement is in the e2e tests.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from profiler.measure.runner.run import run_scenario
from profiler.model.scenario import single_scenario
from tests.conftest import FAKE_WORKER

FAKE = str(FAKE_WORKER)


def _run(tmp_path: Path, behaviour: str, monkeypatch, **run) -> object:
    monkeypatch.setenv("FAKE_BEHAVIOUR", behaviour)
    s = single_scenario(
        "meta-llama--Llama-3.1-8B-Instruct", "H100", mode="decode",
        run={"startup_timeout_s": run.get("startup", 20), "load_timeout_s": 10, "stop_grace_s": 2},
    )  # fmt: skip
    return run_scenario(s, tmp_path / behaviour, device="cuda", python=FAKE)


def test_hang_is_a_timeout_and_is_killed(tmp_path, monkeypatch):
    t0 = time.monotonic()
    res = _run(tmp_path, "hang", monkeypatch, startup=4)
    assert res.status == "failed" and res.failure.kind == "timeout"
    assert res.failure.phase == "weights"  # the probe's begin without end
    # the timeout says which limit ran out, how it was counted, and what the worker last showed
    msg = res.failure.message
    assert "startup:" in msg and "limit 4 s counted at this machine's slowness" in msg
    assert "/health → ConnectError" in msg and "probe: in phase weights" in msg and "log: " in msg
    assert res.stop["sigkill"] is True and res.stop["left_behind"] == []
    assert time.monotonic() - t0 < 60


def test_oom_during_capture(tmp_path, monkeypatch):
    res = _run(tmp_path, "oom-capture", monkeypatch)
    f = res.failure
    assert f.kind == "oom_during_capture" and f.phase == "decode_graph"
    assert f.tried_alloc_mib == 448.0
    run = json.loads((res.out_dir / "run.json").read_text())
    assert run["failure"]["kind"] == "oom_during_capture" and run["status"] == "failed"
    assert (res.out_dir / "measurement.json").exists() and (res.out_dir / "sglang.log").exists()


def test_crash_at_startup(tmp_path, monkeypatch):
    res = _run(tmp_path, "crash-startup", monkeypatch)
    assert res.failure.kind == "crash" and res.failure.phase == "weights" and res.failure.exit_code == 1


def test_dies_under_load(tmp_path, monkeypatch):
    res = _run(tmp_path, "serve-then-die", monkeypatch)
    assert res.failure.kind == "crash" and res.failure.phase == "runtime"
    assert res.stop["left_behind"] == []


def test_artifacts_are_complete_even_on_failure(tmp_path, monkeypatch):
    res = _run(tmp_path, "crash-startup", monkeypatch)
    names = {p.name for p in res.out_dir.iterdir()}
    assert {"command.json", "scenario.json", "sglang.log", "probe", "measurement.json", "run.json"} <= names
    cmd = json.loads((res.out_dir / "command.json").read_text())
    assert cmd["argv"][1:3] == ["-m", "sglang.launch_server"] and "--disaggregation-transfer-backend" in cmd["argv"]
    assert cmd["env"]["MEMFRAC_PROBE_DIR"].endswith("probe")


def test_prefill_transfer_backend_is_checked_up_front(monkeypatch):
    from profiler.core.errors import MemfracError
    from profiler.measure.runner.worker import check_transfer_backend

    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(MemfracError, match="pip install nixl"):
        check_transfer_backend("nixl")
