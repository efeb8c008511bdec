"""Interrupted sweeps with the worker double (fast): `memfrac sweep` killed by SIGINT, SIGTERM or SIGKILL leaves no
process, and `--resume` finishes what was not finished and nothing else — a finished run is never re-run, an
unfinished run's files are set aside, a directory made from another scenario file is refused in one line.

memfrac itself runs for real in a subprocess (its CLI, its signal handling, its executor threads); only the sglang
worker is the double of tests/fakes (the real worker's interruption test is tests/sweep/test_interrupt_e2e.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from profiler.face.cli import main
from profiler.measure.runner.reaper import RECORD, group_members, record
from profiler.sweep.sweep import set_aside
from tests.conftest import FAKE_WORKER, ROOT

# memfrac's CLI with the worker double as the workers' interpreter (the executor's one call that starts a run)
DRIVER = (
    "import sys\n"
    "import profiler.sweep.executors as ex\n"
    "orig = ex._run_one\n"
    "def run_one(j, g, p=None):\n"
    f"    j.python = {str(FAKE_WORKER)!r}\n"
    "    return orig(j, g, p)\n"
    "ex._run_one = run_one\n"
    "from profiler.face.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def _file(tmp_path: Path) -> Path:
    """Run `a` serves at once; run `b` does what FAKE_BEHAVIOUR of memfrac's environment says (hang: never ready,
    deaf to SIGTERM)."""
    f = tmp_path / "s.toml"
    run = "run = { startup_timeout_s = 60, load_timeout_s = 20, stop_grace_s = 2 }\n"
    f.write_text(
        f'[[scenario]]\nname = "a"\nmodel = "tiny-llama"\ngpu = "H100"\nmode = "decode"\n'
        f'env = {{ FAKE_BEHAVIOUR = "ok" }}\n{run}\n'
        f'[[scenario]]\nname = "b"\nmodel = "tiny-llama"\ngpu = "H100"\nmode = "decode"\n{run}'
    )
    return f


def _sweep(tmp_path: Path, behaviour: str, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FAKE_BEHAVIOUR": behaviour}
    argv = [sys.executable, "-c", DRIVER, "sweep", "s.toml", "--device", "cpu", "--out", "out", "--no-validate", *extra]
    return subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(path: Path, p: subprocess.Popen[str], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert p.poll() is None, p.communicate()[0][-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def _left(pgids: list[int], out: Path, seconds: float = 15) -> list[str]:
    """What still runs of those groups, or names the out dir in its command line, after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        left = [f"group {g}" for g in pgids if group_members(g)]
        for p in psutil.process_iter(["cmdline"]):
            if str(out) in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid():
                left.append(" ".join(p.info["cmdline"])[:200])
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _runs(out: Path) -> dict[str, str]:
    return {k: v["status"] for k, v in json.loads((out / "manifest.json").read_text())["runs"].items()}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])  # SIGTERM: test_reaper (the same CLI path)
def test_an_interrupted_sweep_leaves_nothing_and_resume_finishes_only_the_rest(tmp_path, sig):
    out = tmp_path / "out"
    _file(tmp_path)
    p = _sweep(tmp_path, "hang")
    _wait_for(out / "raw" / "b" / RECORD, p)  # `a` is recorded; `b`'s worker started and will never be ready
    pgid = json.loads((out / "raw" / "b" / RECORD).read_text())["pgid"]
    time.sleep(0.5)
    p.send_signal(sig)
    text = p.communicate(timeout=60)[0]
    assert p.returncode == {signal.SIGKILL: -9, signal.SIGINT: 130, signal.SIGTERM: 143}[sig], text[-2000:]
    assert "Traceback" not in text
    assert _left([pgid], out) == []  # SIGKILL: memfrac ran no code, its watchdog stopped the worker
    assert _runs(out) == {"a": "ok"}
    first = pd.read_parquet(out / "results.parquet")

    p = _sweep(tmp_path, "ok", "--resume")
    text = p.communicate(timeout=120)[0]
    assert p.returncode == 0, text[-3000:]
    assert "resume: 1 run(s) already recorded" in text and "b.interrupted-1" in text
    assert _runs(out) == {"a": "ok", "b": "ok"}
    df = pd.read_parquet(out / "results.parquet")
    totals = df[df["term"] == "total"]
    assert sorted(totals["scenario"]) == ["a", "b"] and totals["run_id"].is_unique
    assert set(first["run_id"]) < set(df["run_id"])  # `a` kept as it was
    # `b`'s new probe holds only the new worker: the interrupted one's files are beside it
    assert (out / "raw" / "b.interrupted-1" / "sglang.log").exists()
    new = [json.loads(ln)["pid"] for f in (out / "raw" / "b" / "probe").glob("probe-*.jsonl")
           for ln in f.read_text().splitlines()[:1]]  # fmt: skip
    old = [json.loads(ln)["pid"] for f in (out / "raw" / "b.interrupted-1" / "probe").glob("probe-*.jsonl")
           for ln in f.read_text().splitlines()[:1]]  # fmt: skip
    m = json.loads((out / "raw" / "b" / "measurement.json").read_text())
    assert [r["pid"] for r in m["ranks"]] == new and not set(new) & set(old)

    p = _sweep(tmp_path, "ok", "--resume")  # nothing left to do: nothing runs again
    text = p.communicate(timeout=120)[0]
    assert p.returncode == 0 and "resume: 2 run(s) already recorded" in text and "0 worker start(s)" in text
    assert len(pd.read_parquet(out / "results.parquet")) == len(df)


def test_resume_into_a_directory_of_another_scenario_file_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    (tmp_path / "out").mkdir()
    (out / "manifest.json").write_text(json.dumps({"schema_version": 1, "runs": {},
                                                   "sweep": {"scenarios": str(ROOT / "scenarios/cpu-smoke.toml")}}))
    other = ROOT / "scenarios" / "cpu-smoke-decode.toml"
    rc = main(["sweep", str(other), "--out", str(out), "--resume", "--device", "cpu", "--no-validate"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0] == (f"memfrac: error: --resume {out}: that directory was made from {ROOT}/scenarios/cpu-smoke.toml, "
                      f"not {other}; resume it with {ROOT}/scenarios/cpu-smoke.toml, or give another --out")
    assert json.loads((out / "manifest.json").read_text())["sweep"]["scenarios"].endswith("cpu-smoke.toml")


def test_set_aside_stops_a_stale_worker_and_numbers_the_copies(tmp_path):
    run = tmp_path / "raw" / "x"
    assert set_aside(run, False, print) is None  # nothing there: nothing to do
    run.mkdir(parents=True)
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    record(run, p)
    lines: list[str] = []
    assert set_aside(run, False, lines.append) == tmp_path / "raw" / "x.interrupted-1"
    assert p.wait(timeout=30) != 0 and not run.exists()
    assert lines == [f"x: an earlier unfinished run's files moved to x.interrupted-1; stopped its worker still "
                     f"running (process group {p.pid})"]  # fmt: skip
    run.mkdir()
    (run / "sglang.log").write_text("x")
    assert set_aside(run, False, lines.append).name == "x.interrupted-2"
    run.mkdir()
    (run / "sglang.log").write_text("x")
    assert set_aside(run, True, lines.append).name == "x.replaced-1"
    assert lines[-1] == "x: an earlier run's files moved to x.replaced-1"
