"""Ingest speed of `profiler.logs.parse_log` against `grep -E` on the same big log.

    .venv/bin/python bench/bench_ingest.py [--mb 200] [--repeat 3]

Builds a file of at least --mb MB by concatenating the fixture logs (tests/fixtures/logs/*.log) in a
temporary directory, then times, best of --repeat each: parse_log over it, and grep -E with the
memory-line keywords. GNU grep stops at the first match when its output is /dev/null (it knows nothing
will be read), so that timing is printed for completeness but the ratio uses grep writing its matches
to a file, which makes it read the whole input as parse_log must.

The fixtures are almost nothing but memory lines (about half of all lines match), the worst case for a
parser; a second file of the same size mixes them with request traffic (real "Prefill/Decode batch" and
HTTP lines, ~1 memory line in 200) as a long-running server's log looks. Use --only-fixtures to skip it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from profiler.logs import parse_log  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "logs"
KEYWORDS = "avail mem|mem usage|avail_mem|GB|KV Cache|Capture|out of memory"
TRAFFIC = (
    b"[2025-07-22 06:20:01 TP0] Decode batch. #running-req: 37, #token: 18237, token usage: 0.01, cuda graph: True, "
    b"gen throughput (token/s): 3412.12, #queue-req: 0, \n"
    b"[2025-07-22 06:20:01 TP0] Prefill batch. #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, "
    b"#running-req: 0, #queue-req: 0, \n"
    b'[2025-07-22 06:20:01] INFO:     127.0.0.1:49540 - "POST /generate HTTP/1.1" 200 OK\n'
)


def build_file(directory: Path, megabytes: int, traffic_lines: int = 0) -> Path:
    """Concatenate the fixtures (each copy followed by `traffic_lines` lines of traffic) up to `megabytes` MB."""
    logs = sorted(FIXTURES.glob("*.log"))
    if not logs:
        raise SystemExit(f"no fixture logs in {FIXTURES}")
    one = b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in logs)
    one += TRAFFIC * (traffic_lines // 3)
    target = megabytes * 1_000_000
    out = directory / ("mixed.log" if traffic_lines else "big.log")
    with out.open("wb") as f:
        written = 0
        while written < target:
            f.write(one)
            written += len(one)
    return out


def best_of(n: int, fn: Callable[[], object]) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(n):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def grep(path: Path, out: str) -> Callable[[], int]:
    def run() -> int:
        with open(out, "wb") as sink:
            return subprocess.run(["grep", "-E", KEYWORDS, str(path)], stdout=sink, check=False).returncode

    return run


def measure(path: Path, repeat: int, tmp: Path) -> None:
    mb = path.stat().st_size / 1e6
    with path.open("rb") as f:
        lines = sum(1 for _ in f)
    t_parse, runs = best_of(repeat, lambda: parse_log(path))
    t_null, _ = best_of(repeat, grep(path, "/dev/null"))
    t_grep, _ = best_of(repeat, grep(path, str(tmp / "grep.out")))
    with (tmp / "grep.out").open("rb") as f:
        matches = sum(1 for _ in f)
    print(f"{path.name}: {mb:.1f} MB, {lines} lines, {matches} match the keywords; best of {repeat}")
    print(f"  parse_log          {t_parse:7.3f} s  {mb / t_parse:8.1f} MB/s  ({len(runs)} runs)")  # type: ignore[arg-type]
    print(f"  grep -E > file     {t_grep:7.3f} s  {mb / t_grep:8.1f} MB/s")
    print(f"  grep -E >/dev/null {t_null:7.3f} s  {mb / t_null:8.1f} MB/s  (GNU grep stops at the first match)")
    print(f"  ratio parse_log / grep (full read): {t_parse / t_grep:.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200, help="size of each generated log (MB, default 200)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N runs (default 3)")
    ap.add_argument("--only-fixtures", action="store_true", help="skip the file mixed with request traffic")
    args = ap.parse_args()
    if shutil.which("grep") is None:
        raise SystemExit("grep not found")
    tmp = Path(tempfile.mkdtemp(prefix="memfrac-bench-"))
    try:
        measure(build_file(tmp, args.mb), args.repeat, tmp)
        if not args.only_fixtures:
            (tmp / "big.log").unlink()
            measure(build_file(tmp, args.mb, traffic_lines=30000), args.repeat, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
