"""Nothing left behind, nothing recorded from nowhere: the reaper (profiler/measure/runner/reaper.py) with real
processes, every path a worker is handed absolute, and a run whose probe wrote no start record failing.

The processes stopped here are real process groups (a Python that ignores SIGTERM stands for a hung worker;
the worker double of tests/fakes for a served one). Fast: no sglang.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from profiler.measure.probe.activate import absolute_list
from profiler.measure.runner.reaper import RECORD, group_members, record, stop_group, stop_recorded
from tests.conftest import FAKE_WORKER, ROOT

STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(600)"


def _stubborn() -> subprocess.Popen[bytes]:
    """A process group that ignores SIGTERM, as a hung sglang worker does (returned once it ignores it)."""
    p = subprocess.Popen([sys.executable, "-c", STUBBORN], start_new_session=True, stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline()
    return p


def _gone_within(pgid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not group_members(pgid):
            return True
        time.sleep(0.1)
    return False


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_stop_group_escalates_to_sigkill_after_the_grace():
    p = _stubborn()
    t0 = time.monotonic()
    rep = stop_group(p.pid, grace_s=1.0)
    assert rep["sigkill"] is True and rep["left_behind"] == []
    assert 1.0 <= time.monotonic() - t0 < 8
    assert p.wait(timeout=5) == -signal.SIGKILL  # our child: its Popen keeps the exit status


def test_the_watchdog_stops_the_group_when_memfrac_is_killed():
    """memfrac's SIGKILL runs none of its code: the watchdog reads end-of-file on its pipe and stops the group."""
    parent_code = (
        "import subprocess, sys, time\n"
        "from profiler.measure.runner.reaper import Watchdog\n"
        f"p = subprocess.Popen([sys.executable, '-c', {STUBBORN!r}], start_new_session=True,\n"
        "                      stdout=subprocess.DEVNULL)\n"
        "w = Watchdog(p.pid, 1.0)\n"
        "print(p.pid, w.proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, env=_env(), text=True)
    worker, dog = map(int, parent.stdout.readline().split())
    time.sleep(0.5)
    assert group_members(worker), "the worker runs"
    parent.kill()
    parent.wait()
    assert _gone_within(worker, 15), "the watchdog stopped the worker's group"
    assert _exited_within(dog, 10), "and left"


def _exited_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_a_released_watchdog_leaves_and_touches_nothing():
    from profiler.measure.runner.reaper import Watchdog

    p = _stubborn()
    dog = Watchdog(p.pid, 0.5)
    dog.release()
    assert dog.proc.returncode == 0
    assert group_members(p.pid), "released: the group is memfrac's to stop"
    stop_group(p.pid, 0.5)
    p.wait(timeout=5)


def test_stop_recorded_stops_a_stale_worker_and_spares_a_reused_pid(tmp_path):
    p = _stubborn()
    run = tmp_path / "raw" / "x"
    (run / "decode").mkdir(parents=True)
    record(run / "decode", p)  # a pair's worker records in its side's directory
    rec = json.loads((run / "decode" / RECORD).read_text())
    assert rec["pid"] == rec["pgid"] == p.pid and rec["create_time"] > 0
    # the same pid with another start time is another process: left alone
    (run / "decode" / RECORD).write_text(json.dumps({**rec, "create_time": rec["create_time"] - 1000}))
    assert stop_recorded(run, grace_s=0.5) == [] and group_members(p.pid)
    (run / "decode" / RECORD).write_text(json.dumps(rec))
    assert stop_recorded(run, grace_s=0.5) == [p.pid]
    assert p.wait(timeout=5) == -signal.SIGKILL
    assert stop_recorded(run) == []  # nothing runs there any more


def test_stop_children_stops_every_group_this_process_started():
    """The CLI's interrupt path: the workers of a sweep run in threads that never get to stop them."""
    code = (
        "import json, subprocess, sys\n"
        "from profiler.measure.runner.reaper import stop_children\n"
        f"ps = [subprocess.Popen([sys.executable, '-c', {STUBBORN!r}], start_new_session=True,\n"
        "                       stdout=subprocess.DEVNULL) for _ in range(2)]\n"
        "import time; time.sleep(0.5)\n"
        "print(json.dumps({'pids': [p.pid for p in ps], **stop_children(1.0)}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    res = json.loads(out.stdout)
    assert sorted(res["groups"]) == sorted(res["pids"]) and res["left_behind"] == []
    assert all(not group_members(p) for p in res["pids"])


def test_absolute_list_resolves_each_entry_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # "" is the working directory to Python: it too must survive the worker's other working directory
    assert absolute_list(f"a{os.pathsep}{os.pathsep}/b") == os.pathsep.join([f"{tmp_path}/a", str(tmp_path), "/b"])


def test_a_worker_is_handed_only_absolute_paths(tmp_path, monkeypatch):
    from profiler.measure.runner.worker import build_spec
    from profiler.model.scenario import single_scenario

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "mine")
    s = single_scenario("tiny-llama", "H100", mode="decode")
    spec = build_spec(s, Path("results/runs/x"), device="cuda", python="venv/bin/python")
    assert spec.out_dir == tmp_path / "results/runs/x" and spec.log_path.is_absolute()
    assert spec.env["MEMFRAC_PROBE_DIR"] == str(tmp_path / "results/runs/x/probe")
    entries = spec.env["PYTHONPATH"].split(os.pathsep)
    assert entries[0] == str(tmp_path / "results/runs/x/plugin") and entries[-1] == str(tmp_path / "mine")
    assert all(os.path.isabs(e) for e in entries)
    assert spec.python == str(tmp_path / "venv/bin/python")
    assert Path(spec.argv[spec.argv.index("--model-path") + 1]).is_absolute()


def _fake_run(tmp_path: Path, monkeypatch, **env: str):
    from profiler.measure.runner.run import run_scenario
    from profiler.model.scenario import single_scenario

    monkeypatch.setenv("FAKE_BEHAVIOUR", "ok")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s = single_scenario("tiny-llama", "H100", mode="decode",
                        run={"startup_timeout_s": 30, "load_timeout_s": 20, "stop_grace_s": 2})  # fmt: skip
    return run_scenario(s, Path("rel/run"), device="cuda", python=str(FAKE_WORKER))


def test_a_run_whose_probe_wrote_no_start_record_fails(tmp_path, monkeypatch):
    from profiler.measure.runner.classify import NO_START

    monkeypatch.chdir(tmp_path)
    res = _fake_run(tmp_path, monkeypatch, FAKE_NO_START="1")
    assert res.status == "failed" and res.failure.kind == "probe_error" and res.failure.message == NO_START
    assert json.loads((tmp_path / "rel/run/run.json").read_text())["failure"]["kind"] == "probe_error"


def test_a_relative_out_dir_records_the_probe_and_leaves_no_watchdog(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = _fake_run(tmp_path, monkeypatch)
    assert res.status == "ok", res.failure
    assert res.out_dir == tmp_path / "rel/run" and list((tmp_path / "rel/run/probe").glob("probe-*.jsonl"))
    rec = json.loads((tmp_path / "rel/run" / RECORD).read_text())
    assert res.stop["left_behind"] == [] and not group_members(rec["pgid"])
    left = [c for c in psutil.Process().children(recursive=True) if "reaper.py" in " ".join(c.cmdline())]
    assert left == [], "the watchdog left with its worker"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_memfrac_run_interrupted_stops_its_worker(tmp_path, sig):
    """`memfrac run` killed by Ctrl-C or SIGTERM while its worker serves: one line, exit 130/143, no process left."""
    code = (
        "import sys\n"
        "import profiler.measure.runner.run as r\n"
        "orig = r.run_scenario\n"
        f"r.run_scenario = lambda *a, **k: orig(*a, **{{**k, 'python': {str(FAKE_WORKER)!r}, 'device': 'cuda'}})\n"
        "from profiler.face.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    f = tmp_path / "s.toml"
    f.write_text('name = "x"\nmodel = "tiny-llama"\ngpu = "H100"\nmode = "decode"\n'
                 'run = { startup_timeout_s = 60, load_timeout_s = 60, stop_grace_s = 2 }\n')  # fmt: skip
    env = {**_env(), "FAKE_BEHAVIOUR": "hang"}
    p = subprocess.Popen([sys.executable, "-c", code, "run", str(f), "--out", "o", "--no-validate"], cwd=tmp_path,
                         env=env, stderr=subprocess.PIPE, text=True)  # fmt: skip
    rec = tmp_path / "o" / RECORD
    deadline = time.monotonic() + 60
    while not rec.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    pgid = json.loads(rec.read_text())["pgid"]
    time.sleep(1.0)
    p.send_signal(sig)
    err = p.communicate(timeout=60)[1]
    assert p.returncode == (130 if sig == signal.SIGINT else 143), err[-2000:]
    assert ("interrupted" if sig == signal.SIGINT else "terminated") in err and "Traceback" not in err
    assert not group_members(pgid)


def test_a_pairs_network_namespace_goes_with_memfrac():
    """A CPU pair's namespace is held by a `sleep 86400`: memfrac's SIGKILL must not leave it for a day."""
    from profiler.measure.runner.pair import Namespace

    if why := Namespace.possible():
        pytest.skip(why)
    code = (
        "import time\n"
        "from profiler.measure.runner.pair import Namespace\n"
        "print(Namespace().start(), flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=_env(), text=True)
    sleep_pid = int(parent.stdout.readline())
    pgid = os.getpgid(sleep_pid)
    parent.kill()
    parent.wait()
    assert _gone_within(pgid, 15)
