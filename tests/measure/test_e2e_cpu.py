"""End to end on the CPU with the REAL sglang 0.5.23: unified, decode-only and prefill-only workers.

Each worker starts once (module fixture) and is checked from every angle: the probe's hooks fired in the
scheduler process and say "host" in every record, the load driver's requests completed, /server_info was
saved, the log parses, and stop left no process behind. Prefill runs in a loopback-only network namespace
(mooncake listens on every interface), which needs root.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from profiler.logs import parse_log
from profiler.measure.runner.patience import Patience
from profiler.measure.runner.run import run_scenario
from profiler.model.scenario import load_scenarios
from tests.conftest import ROOT, needs_sglang

pytestmark = [pytest.mark.e2e, needs_sglang]

SCENARIOS = {s.mode: s for s in load_scenarios(ROOT / "scenarios" / "cpu-smoke.toml")}


def _prefill_possible() -> str | None:
    import ctypes.util
    import importlib.util

    if os.geteuid() != 0 or not shutil.which("unshare"):
        return "prefill on CPU runs in a network namespace: needs root and unshare"
    if importlib.util.find_spec("mooncake") is None:
        return "mooncake-transfer-engine-non-cuda not installed (make test installs it)"
    if ctypes.util.find_library("ibverbs") is None:
        return "libibverbs1 missing (make test installs it)"
    return None


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for mode in ("null", "decode", "prefill"):
        if mode == "prefill" and _prefill_possible():
            continue
        d = tmp_path_factory.mktemp(f"run-{mode}")
        out[mode] = run_scenario(SCENARIOS[mode], d, device="cpu")
    return out


@pytest.fixture(params=["null", "decode", "prefill"])
def run(request, runs):
    if request.param not in runs:
        pytest.skip(_prefill_possible() or "not run")
    return runs[request.param]


def _records(res) -> list[dict]:
    files = list((res.out_dir / "probe").glob("probe-*.jsonl"))
    assert len(files) == 1, "one probe file: the single scheduler process"
    return [json.loads(line) for line in files[0].read_text().splitlines()]


def test_worker_ran_ok(run):
    assert run.status == "ok", run.failure
    assert run.device == "cpu" and run.startup_s and run.startup_s > 1


def test_probe_hooks_fired_in_the_scheduler_and_say_host(run):
    recs = _records(run)
    start = recs[0]
    assert start["type"] == "start" and start["sglang_version"] == "0.5.23"
    assert all(t["ok"] for t in start["targets"] if t.get("required", True))
    patch = "sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender.supports_host_tensor_indices=False"
    assert patch in start["patches"]
    ends = [r for r in recs if r["type"] == "end"]
    phases = [r["phase"] for r in ends]
    for p in ("init_parallel", "baseline", "weights", "kv_pool", "attention_backends", "eager_runner"):
        assert p in phases
    assert all(r["kind"] == "host" for r in recs if "kind" in r), "every record says it is host memory"
    assert all("free_mib" not in r["before"] and r["before"]["rss_mib"] > 100 for r in ends)
    kv = next(r for r in ends if r["phase"] == "kv_pool")
    assert kv["details"]["budget_mib"] > 0  # KVCacheConfigurator._profile_available_bytes
    assert next(r for r in ends if r["phase"] == "baseline")["details"]["pre_model_load_mib"] > 0
    # the scheduler is a child of the server's main process, which is the worker we started
    cmd = json.loads((run.out_dir / "command.json").read_text())
    assert start["ppid"] != os.getpid() and cmd["argv"]


def test_measurement_is_a_host_measurement(run):
    from profiler.core.measurement import Measurement

    m = Measurement.load(run.out_dir / "measurement.json")
    assert m.memory_kind == "host" and m.identity.gpu_name == "cpu" and m.identity.gpu_total_mib is None
    assert any("host-memory measurement" in n for n in m.notes)
    r = m.primary
    assert r.label == "TP0" and r.phase("weights").used_mib is not None
    assert r.phase("weights").before.kind == "host" and r.phase("weights").before.free_mib is None
    assert r.phase("ready").details["max_total_num_tokens"] == 8192


def test_load_driver_completed(run):
    load = json.loads((run.out_dir / "load.json").read_text())
    # two prefill bursts: whole chunks, then short prompts toward max_prefill_tokens (runner/load.py plan_load)
    kinds = {"null": ["prefill", "prefill", "decode"], "decode": ["decode"], "prefill": ["prefill", "prefill"]}[
        SCENARIOS_MODE(run)]  # fmt: skip
    assert [b["plan"]["kind"] for b in load] == kinds
    for b in load:
        assert b["ok"] == b["sent"] == b["plan"]["requests"] > 0 and not b["errors"]
        if b["plan"]["kind"] == "prefill":
            assert b["plan"]["target_tokens"] == 4096  # the resolved chunk
        else:
            assert b["output_tokens"] == b["ok"] * b["plan"]["output_len"]  # ignore_eos: long outputs
    assert [b["plan"]["input_len"] for b in load if b["plan"]["kind"] == "prefill"][:1] in ([], [4089])  # a chunk


def test_decode_load_is_every_request_the_worker_admits(run):
    """Issue 26.1: the decode burst is what the worker itself says it admits (internal_states'
    effective_max_running_requests_per_dp, resolved by KVCacheConfigurator.resolve_max_num_reqs: here the scenario's
    max_running_requests 64 ≤ tokens // 2), not /server_info's unresolved max_running_requests; the probe's runtime
    window saw the largest batch the pool holds at once."""
    if SCENARIOS_MODE(run) == "prefill":
        pytest.skip("a prefill node runs no decode batch")
    info = json.loads((run.out_dir / "server_info.json").read_text())
    admits = sum(s["effective_max_running_requests_per_dp"] for s in info["internal_states"])
    (b,) = [b for b in json.loads((run.out_dir / "load.json").read_text()) if b["plan"]["kind"] == "decode"]
    assert admits == 64 and b["plan"]["admitted"] == admits
    assert b["plan"]["requests"] == b["plan"]["concurrency"] == b["sent"] == b["ok"] == admits
    from profiler.core.measurement import Measurement

    seen = Measurement.load(run.out_dir / "measurement.json").primary.phase("runtime").details["batches_seen"]
    assert seen["decode"]["max_requests"] >= min(b["plan"]["reachable_requests"], admits) * 0.9


def SCENARIOS_MODE(run) -> str:
    return json.loads((run.out_dir / "scenario.json").read_text())["mode"]


def test_server_info_saved_and_log_parses(run):
    info = json.loads((run.out_dir / "server_info.json").read_text())
    assert info["version"] == "0.5.23" and info["disaggregation_mode"] == SCENARIOS_MODE(run)
    (m,) = parse_log(run.out_dir / "sglang.log")
    assert m.args_source == "server_args" and m.args["disaggregation_mode"] == SCENARIOS_MODE(run)
    names = [p.name for p in m.primary.phases]
    assert "weights" in names and "kv_pool" in names and "ready" in names
    assert m.failure is None


def test_stop_left_nothing_behind(run):
    assert run.stop["left_behind"] == [] and run.stop["returncode"] is not None
    assert run.stop["sigkill"] is False, "SIGTERM to the main process is enough"


def test_prefill_ran_isolated(runs):
    if "prefill" not in runs:
        pytest.skip(_prefill_possible() or "not run")
    cmd = json.loads((runs["prefill"].out_dir / "command.json").read_text())
    assert cmd["argv"][:2] == ["unshare", "-n"]
    assert "mooncake_tcp" in cmd["argv"] and cmd["env"]["SGLANG_HOST_IP"] == "127.0.0.1"


def test_prefill_survives_a_request_longer_than_its_chunk(tmp_path):
    """sglang 0.5.23 on the CPU: the second chunk of a request starts with a cached prefix whose early send records
    a torch.cuda.Event on the CPU forward stream (disaggregation/prefill.py:1496) and kills the scheduler. Under
    load the smoke run's two concurrent 4089-token prefills share a batch, the second is chunked, and the run
    crashed ("expected stream to be a torch.Stream"). A 3000-token request with 1024-token chunks is chunked
    every time; the runner turns the optional early send off on the CPU."""
    if _prefill_possible():
        pytest.skip(_prefill_possible())
    from profiler.measure.runner.load import FAKE_BOOTSTRAP_HOST
    from profiler.measure.runner.net import client
    from profiler.measure.runner.worker import Worker, build_spec

    spec = build_spec(SCENARIOS["prefill"].with_(chunked_prefill_size=1024), tmp_path / "chunked", device="cpu")
    assert spec.env["SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX"] == "0"
    body = {
        "input_ids": [100 + (i * 7919) % 800 for i in range(3000)],  # tiny-llama's vocabulary is 1024
        "sampling_params": {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True},
        "bootstrap_host": FAKE_BOOTSTRAP_HOST, "bootstrap_port": spec.bootstrap_port, "bootstrap_room": 7,
    }  # fmt: skip
    w = Worker(spec)
    try:
        w.start()
        assert w.wait_ready(300), w.timeout_detail

        def post() -> int:
            with client(spec.port, Patience(120, "a chunked prefill").remaining_wall()) as c:
                return c.post("/generate", json=body).status_code

        assert w.net.call(post) == 200
        assert w.alive()
    finally:
        rep = w.stop()
    assert rep["left_behind"] == [] and "expected stream" not in spec.log_path.read_text()
    assert spec.log_path.read_text().count("Prefill batch") >= 3  # warm-up + at least 2 chunks of the request


def test_bad_arguments_are_classified_with_sglangs_message(tmp_path):
    s = SCENARIOS["null"].with_(extra_args=("--max-running-requests", "lots"))
    res = run_scenario(s, tmp_path / "bad", device="cpu")
    assert res.failure.kind == "bad_args" and res.failure.exit_code == 2
    assert "argument --max-running-requests: invalid int value: 'lots'" in res.failure.message


def test_cli_run_on_a_bundled_decode_scenario(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "cli"
    # the command bounds its own waits (startup, load, stop: machine-normalised); this only guards a hang of it
    limit = Patience(900, "memfrac run")
    r = subprocess.run(
        [sys.executable, "-m", "profiler.face.cli", "run", str(ROOT / "scenarios/cpu-smoke-decode.toml"),
         "--out", str(out)],
        capture_output=True, text=True, timeout=limit.remaining_wall() * 2,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "host-memory measurement" in r.stdout and "ready in" in r.stdout
    for f in ("command.json", "sglang.log", "server_info.json", "load.json", "measurement.json", "run.json"):
        assert (out / f).stat().st_size > 0
    assert list((out / "probe").glob("probe-*.jsonl"))
    assert "ready after" in r.stderr  # progress output


def test_real_worker_killed_mid_run_is_a_crash(tmp_path):
    """Kill the real scheduler after readiness: the main process notices, the run is a crash, nothing leaks."""
    import signal

    from profiler.measure.probe.reader import read_probe_dir
    from profiler.measure.runner.worker import Worker, build_spec

    spec = build_spec(SCENARIOS["null"], tmp_path / "kill", device="cpu")
    w = Worker(spec)
    try:
        w.start()
        assert w.wait_ready(300), w.timeout_detail
        sched = read_probe_dir(spec.probe_dir).ranks[0].pid
        os.kill(sched, signal.SIGKILL)
        exit_wait = Patience(60, "sglang's main process exiting after its scheduler died")
        assert exit_wait.until(lambda: not w.alive()), exit_wait.describe()
    finally:
        rep = w.stop()
    assert rep["left_behind"] == []
