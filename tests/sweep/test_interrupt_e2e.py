"""`memfrac sweep` interrupted with the REAL sglang 0.5.23 CPU worker (issue 23.4): Ctrl-C while the worker starts,
SIGKILL while it serves, then `--resume` until done, and once more.

After each interruption no process is left: no descendant of the killed memfrac (taken just before the signal),
no process whose command line names the results directory. The resumed sweep sets each interrupted run's files
aside, so the final measurement holds exactly one rank, from the worker that finished; the last `--resume` runs
nothing and the finished run stays as it was. One run of a tiny Llama with a short load keeps this to ~3 worker
starts' time; the same paths with the worker double and both signals at every point: tests/sweep/test_resume.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from tests.conftest import ROOT, needs_sglang

pytestmark = [pytest.mark.e2e, needs_sglang]

SCENARIO = (
    'name = "intr"\nmodel = "tiny-llama"\ngpu = "H100-80GB"\nmode = "decode"\n'
    "run = { startup_timeout_s = 600, load_timeout_s = 300, load_requests = 4, stop_grace_s = 10 }\n"
)


class Sweep:
    """`memfrac sweep s.toml --device cpu --out out` (a relative --out) as a subprocess; its output line by line."""

    def __init__(self, cwd: Path, *extra: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        argv = [sys.executable, "-m", "profiler.face.cli", "sweep", "s.toml", "--device", "cpu", "--out", "out",
                "--no-validate", *extra]  # fmt: skip
        self.p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_line(self, fragment: str, timeout_s: float = 900) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(fragment in x for x in self.lines):
            assert self.p.poll() is None, f"ended before {fragment!r}:\n{self.text()[-3000:]}"
            assert time.monotonic() < deadline, f"no {fragment!r} in {timeout_s:.0f} s:\n{self.text()[-3000:]}"
            time.sleep(0.2)

    def interrupt(self, sig: int) -> tuple[int, list[psutil.Process]]:
        """Send `sig` to memfrac; its exit status and every process below it just before (a worker among them)."""
        below = psutil.Process(self.p.pid).children(recursive=True)
        assert any("sglang.launch_server" in " ".join(p.cmdline()) for p in below), "a worker runs"
        self.p.send_signal(sig)
        rc = self.p.wait(timeout=120)
        self._reader.join(timeout=10)
        return rc, below

    def finish(self, timeout_s: float = 900) -> int:
        rc = self.p.wait(timeout=timeout_s)
        self._reader.join(timeout=10)
        return rc


def _left(below: list[psutil.Process], out: Path, seconds: float = 30) -> list[str]:
    deadline = time.monotonic() + seconds
    while True:
        left = []
        for p in below:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{p.pid} {' '.join(p.cmdline())[:160]}")
            except psutil.NoSuchProcess:
                pass
        for p in psutil.process_iter(["cmdline", "status"]):
            if p.info["status"] != psutil.STATUS_ZOMBIE and str(out) in " ".join(p.info["cmdline"] or []):
                left.append(f"{p.pid} {' '.join(p.info['cmdline'])[:160]}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _start_pids(probe: Path) -> list[int]:
    return [json.loads(f.read_text().splitlines()[0])["pid"] for f in sorted(probe.glob("probe-*.jsonl"))]


def test_interrupted_sweep_with_real_workers_leaves_nothing_and_resumes_cleanly(tmp_path):
    (tmp_path / "s.toml").write_text(SCENARIO)
    out = tmp_path / "out"

    # 1. Ctrl-C while the worker starts
    sw = Sweep(tmp_path)
    sw.wait_line("intr: starting decode worker")
    time.sleep(8)  # sglang is importing / loading
    rc, below = sw.interrupt(signal.SIGINT)
    assert rc == 130 and "memfrac: interrupted" in sw.text() and "Traceback" not in sw.text(), sw.text()[-3000:]
    assert _left(below, out) == []
    assert not json.loads((out / "manifest.json").read_text())["runs"]

    # 2. resume; SIGKILL while the worker serves: memfrac runs no code, the worker's watchdog stops it
    sw = Sweep(tmp_path, "--resume")
    sw.wait_line("intr: load decode: ")
    rc, below = sw.interrupt(signal.SIGKILL)
    assert rc == -signal.SIGKILL
    assert "intr.interrupted-1" in sw.text()
    assert _left(below, out) == []
    assert not json.loads((out / "manifest.json").read_text())["runs"]

    # 3. resume to the end
    sw = Sweep(tmp_path, "--resume")
    assert sw.finish() == 0, sw.text()[-3000:]
    assert "intr.interrupted-2" in sw.text()
    runs = json.loads((out / "manifest.json").read_text())["runs"]
    assert {k: v["status"] for k, v in runs.items()} == {"intr": "ok"}
    df = pd.read_parquet(out / "results.parquet")
    assert df[df["term"] == "total"]["run_id"].tolist() == runs["intr"]["ids"]  # one run, once
    # no rank from a dead worker: one probe file, one rank, the finishing worker's
    raw = out / "raw"
    assert sorted(p.name for p in raw.iterdir()) == ["intr", "intr.interrupted-1", "intr.interrupted-2"]
    (pid,) = _start_pids(raw / "intr" / "probe")
    dead = _start_pids(raw / "intr.interrupted-1" / "probe") + _start_pids(raw / "intr.interrupted-2" / "probe")
    assert pid not in dead
    for m in (raw / "intr" / "measurement.json", *(out / "measurements").glob("*.json")):
        ranks = json.loads(m.read_text())["ranks"]
        assert [r["pid"] for r in ranks] == [pid], m

    # 4. resume once more: nothing runs, the finished run is kept as it was
    sw = Sweep(tmp_path, "--resume")
    assert sw.finish() == 0, sw.text()[-3000:]
    assert "resume: 1 run(s) already recorded" in sw.text() and "0 worker start(s)" in sw.text()
    assert pd.read_parquet(out / "results.parquet").equals(df)
    assert sorted(p.name for p in raw.iterdir()) == ["intr", "intr.interrupted-1", "intr.interrupted-2"]
