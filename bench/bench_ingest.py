"""Ingest speed as a user sees it: whole `memfrac ingest` commands against `grep -E` on the same logs.

    .venv/bin/python bench/bench_ingest.py [--lines 4000000] [--repeat 3] [--files 8] [--dense-mb 162]
                                           [--skip-production] [--skip-multi] [--skip-dense]

1. Production-shaped log: one real startup (tests/fixtures/logs/repo_sglang-docs_send-request_llama31-8b_1gpu.log)
   followed by --lines lines of request traffic in sglang 0.5.23's own formats (≥ 500 MB by default):
   "Decode batch, #running-req: …, #token: …, token usage: …, cuda graph: …, gen throughput (token/s): …,
   #queue-req: …" and "Prefill batch, #new-seq: …" (srt/managers/scheduler_components/metrics_reporter.py,
   report_decode_stats / report_prefill_stats, usage parts from pool_stats_observer.py) and uvicorn access
   lines '[…] INFO:     127.0.0.1:PORT - "POST /generate HTTP/1.1" 200 OK' (srt/utils/common.py,
   set_uvicorn_logging_configs). Everything ingest reads from traffic is on (it has no switch to turn it off):
   the scanner looks at every #running-req and token usage value for the per-run peaks, and the KV-pool-full /
   retraction / OOM keywords are in its filter.
2. Dense log: the fixtures concatenated (no target; most lines are memory lines, i.e. Python work).
3. Many files: --files logs (the startup + a 1/--files slice of the production log's traffic each) in a directory,
   `memfrac ingest DIR` on one core and on two (taskset), alternating, reported as a speed-up; again with each
   slice --multi-times over (bigger files: the fixed start-up weighs less).

Whole commands as a user runs them (a fresh `memfrac` process from byte-compiled modules, output to a file),
ingest and grep alternating so both run under the same load, median of --repeat. grep writes its matches to a
file (GNU grep stops at the first match when its output is /dev/null, which is not what ingest does). The load
average is printed with every figure, and "cpu", the user+system seconds of the command and its children. On a
machine saturated by other sessions' processes the kernel shares CPU between sessions (autogroups), not
processes: there ingest's wall time tracks its cpu, and the parallel speed-up cannot show.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "logs"
STARTUP = FIXTURES / "repo_sglang-docs_send-request_llama31-8b_1gpu.log"
KEYWORDS = "avail mem|mem usage|avail_mem|GB|KV Cache|Capture|out of memory"  # the memory-line keywords
MEMFRAC = [str(ROOT / ".venv" / "bin" / "memfrac")]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's code, whatever the venv has installed


def traffic(n: int, seed: int = 7) -> bytes:
    """n lines of 0.5.23 request traffic: 30% decode, 40% prefill, 30% HTTP access lines."""
    rnd = random.Random(seed)
    out: list[str] = []
    t0 = 1737660928
    for i in range(0, n, 100):
        ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0 + i // 200))
        for k in range(min(100, n - i)):
            kind = (i + k) % 10
            r = rnd.randint(0, 256)
            if kind < 3:
                tok = rnd.randint(100, 444_500)
                out.append(
                    f"[{ts} TP0] Decode batch, #running-req: {r}, #token: {tok}, token usage: {tok / 444_500:.2f}, "
                    f"cuda graph: True, gen throughput (token/s): {rnd.uniform(100, 9000):.2f}, "
                    f"#queue-req: {rnd.randint(0, 40)}\n"
                )
            elif kind < 7:
                out.append(
                    f"[{ts} TP0] Prefill batch, #new-seq: {rnd.randint(1, 8)}, #new-token: {rnd.randint(1, 16384)}, "
                    f"#cached-token: {rnd.randint(0, 9000)}, token usage: {rnd.random():.2f}, #running-req: {r}, "
                    f"#queue-req: {rnd.randint(0, 40)}, #pending-token: 0, cuda graph: False, "
                    f"input throughput (token/s): {rnd.uniform(100, 90000):.2f}\n"
                )
            else:
                out.append(
                    f'[{ts}] INFO:     127.0.0.1:{rnd.randint(30000, 60000)} - "POST /generate HTTP/1.1" 200 OK\n'
                )
    return "".join(out).encode()


def startup() -> bytes:
    return STARTUP.read_bytes().rstrip(b"\n") + b"\n"


def production_log(path: Path, lines: int) -> None:
    with path.open("wb") as f:
        f.write(startup())
        step = 500_000
        for i in range(0, lines, step):
            f.write(traffic(min(step, lines - i), seed=i))


def dense_log(path: Path, size: int) -> None:
    one = b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in sorted(FIXTURES.glob("*.log")))
    with path.open("wb") as f:
        written = 0
        while written < size:
            f.write(one)
            written += len(one)


def load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def timed(cmd: list[str], out: Path) -> tuple[float, float]:
    """(wall seconds, cpu seconds of the command and its children) of one whole command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    with out.open("wb") as sink:
        subprocess.run(cmd, stdout=sink, stderr=subprocess.DEVNULL, check=False, env=ENV)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


class Rounds:
    """Alternating runs of some commands: per round each command's (wall, cpu), and the two-core headroom
    measured before and after the round (see `headroom`)."""

    def __init__(self, cmds: list[list[str]], repeat: int, tmp: Path) -> None:
        self.runs: list[list[tuple[float, float]]] = []
        self.room: list[float] = [headroom()]
        for _ in range(repeat):
            self.runs.append([timed(cmd, tmp / f"out-{k}") for k, cmd in enumerate(cmds)])
            self.room.append(headroom())

    def median(self, k: int, clear: float = 0.0) -> tuple[float, float, int] | None:
        """Median (wall, cpu) of command k over the rounds whose headroom stayed >= clear, and their count."""
        keep = [r[k] for i, r in enumerate(self.runs) if min(self.room[i], self.room[i + 1]) >= clear]
        if not keep:
            return None
        return statistics.median(w for w, _ in keep), statistics.median(c for _, c in keep), len(keep)


def report(label: str, path: Path, repeat: int, tmp: Path, clear: float) -> None:
    mb = path.stat().st_size / 1e6
    with path.open("rb") as f:
        nlines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
    before = load()
    ing_cmd = [*MEMFRAC, "ingest", str(path), "--format", "json"]
    rounds = Rounds([ing_cmd, ["grep", "-E", KEYWORDS, str(path)]], repeat, tmp)
    print(f"{label}: {mb:,.0f} MB, {nlines:,} lines; alternating, {repeat} rounds ({before} → {load()}; "
          f"two-core headroom {_rooms(rounds)})")  # fmt: skip
    for what, lim in (("all rounds", 0.0), (f"rounds with headroom >= {clear}", clear)):
        ing, grep = rounds.median(0, lim), rounds.median(1, lim)
        if ing is None or grep is None:
            print(f"  {what}: none")
            continue
        print(f"  {what} (median of {ing[2]}): memfrac ingest --format json {ing[0]:.2f} s ({mb / ing[0]:,.0f} MB/s,"
              f" cpu {ing[1]:.2f} s), grep -E '<keywords>' > file {grep[0]:.2f} s (cpu {grep[1]:.2f} s): ratio "
              f"{ing[0] / grep[0]:.2f}x (cpu {ing[1] / grep[1]:.2f}x)")  # fmt: skip


def _rooms(rounds: Rounds) -> str:
    return " ".join(f"{r:.2f}" for r in rounds.room)


def _spin(n: int) -> int:
    s = 0
    for i in range(n):
        s += i
    return s


def headroom(n: int = 3_000_000) -> float:
    """What two cores give right now: a pure-CPU job in two processes vs one after the other (2.0 on an idle
    machine; near 1.0 when other sessions' processes hold the second core)."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(2) as ex:
        list(ex.map(_spin, [1000, 1000]))  # workers up
        t = time.perf_counter()
        _spin(n)
        _spin(n)
        one = time.perf_counter() - t
        t = time.perf_counter()
        list(ex.map(_spin, [n, n]))
        return one / (time.perf_counter() - t)


def multi(prod: Path, files: int, repeat: int, tmp: Path, clear: float, times: int = 1) -> None:
    d = tmp / f"many-{times}"
    d.mkdir()
    head = startup()
    data = prod.read_bytes()[len(head) :]  # the production log's traffic, cut into --files slices at line ends
    at = 0
    for i in range(files):
        cut = len(data) if i == files - 1 else data.rfind(b"\n", 0, len(data) * (i + 1) // files) + 1
        (d / f"server-{i:02d}.log").write_bytes(head + data[at:cut] * times)
        at = cut
    del data
    taskset = shutil.which("taskset")
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if taskset is None or len(cores) < 2:
        print("many files: needs taskset and two cores; skipped")
        return
    cmd = [*MEMFRAC, "ingest", str(d), "--format", "json"]
    one = [taskset, "-c", str(cores[0]), *cmd]
    two = [taskset, "-c", f"{cores[0]},{cores[1]}", *cmd]
    before = load()
    rounds = Rounds([one, two], repeat, tmp)
    mb = sum(f.stat().st_size for f in d.iterdir()) / 1e6
    print(f"many files: {files} logs, {mb:,.0f} MB in all; `memfrac ingest DIR`; alternating, {repeat} rounds "
          f"({before} → {load()}; two-core headroom {_rooms(rounds)})")  # fmt: skip
    for what, lim in (("all rounds", 0.0), (f"rounds with headroom >= {clear}", clear)):
        a, b = rounds.median(0, lim), rounds.median(1, lim)
        if a is None or b is None:
            print(f"  {what}: none")
            continue
        print(f"  {what} (median of {a[2]}): 1 core {a[0]:.2f} s (cpu {a[1]:.2f} s), 2 cores {b[0]:.2f} s "
              f"(cpu {b[1]:.2f} s): speed-up {a[0] / b[0]:.2f}x")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=4_000_000, help="traffic lines after the startup (default 4M)")
    ap.add_argument("--repeat", type=int, default=5, help="alternating rounds, medians reported (default 5)")
    ap.add_argument("--clear", type=float, default=1.8, help="also report the rounds whose two-core headroom "
                    "stayed at least this (default 1.8; 2.0 is an idle machine)")  # fmt: skip
    ap.add_argument("--files", type=int, default=8, help="files for the multi-file measurement (default 8)")
    ap.add_argument("--multi-times", type=int, default=2, help="also measure many files holding each slice this "
                    "many times over (default 2: 8 x 162 MB; start-up weighs less)")  # fmt: skip
    ap.add_argument("--dense-mb", type=int, default=162, help="size of the dense log (default 162 MB)")
    ap.add_argument("--skip-multi", action="store_true")
    ap.add_argument("--skip-dense", action="store_true")
    ap.add_argument("--skip-production", action="store_true")
    args = ap.parse_args()
    if shutil.which("grep") is None:
        raise SystemExit("grep not found")
    sys.path.insert(0, str(ROOT))
    from profiler.logs.matchers import default_matcher

    print(f"matcher: {default_matcher().name} (MEMFRAC_MATCHER={os.environ.get('MEMFRAC_MATCHER', '')!r}); "
          f"{os.cpu_count()} cores; {load()}")  # fmt: skip
    # An installed memfrac runs from byte-compiled modules; a checkout under PYTHONDONTWRITEBYTECODE would
    # compile every module from source at each start (~50 ms): compile them once, as `pip install` does.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "profiler")], check=True)
    tmp = Path(tempfile.mkdtemp(prefix="memfrac-bench-"))
    try:
        prod = tmp / "production.log"
        t = time.perf_counter()
        production_log(prod, args.lines)
        print(f"(built {prod.stat().st_size / 1e6:,.0f} MB in {time.perf_counter() - t:.0f} s)")
        if not args.skip_production:
            report("production-shaped", prod, args.repeat, tmp, args.clear)
        if not args.skip_multi:
            for times in sorted({1, args.multi_times}):
                multi(prod, args.files, args.repeat, tmp, args.clear, times)
                shutil.rmtree(tmp / f"many-{times}")
        prod.unlink()
        if not args.skip_dense:
            dense = tmp / "dense.log"
            dense_log(dense, args.dense_mb * 10**6)
            report("dense (fixtures concatenated)", dense, max(3, args.repeat // 2), tmp, args.clear)
            dense.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
