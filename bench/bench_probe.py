"""Benchmark: the same real CPU sglang worker with and without memfrac's probe, alternating, in one run.

Prints startup time (process start → /health 200) and the scheduler's peak RSS for each, their ratios, and
the probe's own time inside the worker (it times itself) as a share of startup. The probe allocates
nothing on a device: it reads counters (on a CPU machine there is no device; on a GPU node `memfrac
selfcheck` shows a snapshot moves no GPU memory).

    .venv/bin/python bench/bench_probe.py [--repeat 3] [--mode decode]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from profiler.measure.probe.plugin import ENV_DIR
from profiler.measure.runner.worker import Worker, build_spec
from profiler.model.scenario import load_scenarios

ROOT = Path(__file__).resolve().parent.parent


def _status(pid: int, key: str) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _scheduler_pid(w: Worker) -> int | None:
    for pid in w.group_pids():
        try:
            if (
                "scheduler" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                or "scheduler" in Path(f"/proc/{pid}/comm").read_text()
            ):
                return pid
        except OSError:
            continue
    return None


def one(mode: str, probe: bool, root: Path, k: int) -> dict[str, float | None]:
    s = next(x for x in load_scenarios(ROOT / "scenarios/cpu-smoke.toml") if x.mode == mode)
    spec = build_spec(s, root / f"{'probe' if probe else 'plain'}-{k}", device="cpu")
    if not probe:
        spec.env.pop(ENV_DIR, None)
        spec.env["PYTHONPATH"] = str(ROOT)
    w = Worker(spec)
    try:
        w.start()
        if not w.wait_ready(600):
            raise SystemExit(f"worker did not start: see {spec.log_path}")
        startup = (w.ready_at or 0) - w.started_at
        sched = _scheduler_pid(w)
        peak = _status(sched, "VmHWM") if sched else None
    finally:
        w.stop()
    self_s = None
    if probe:
        for f in spec.probe_dir.glob("probe-*.jsonl"):
            for line in f.read_text().splitlines():
                rec = json.loads(line)
                if "probe_self_s" in rec:
                    self_s = rec["probe_self_s"]
    return {"startup_s": startup, "sched_peak_rss_mib": peak, "probe_self_s": self_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mode", default="decode", choices=("null", "decode"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        plain, probed = [], []
        for k in range(a.repeat):  # alternate, so drift on the machine hits both alike
            plain.append(one(a.mode, False, root, k))
            probed.append(one(a.mode, True, root, k))
            print(
                f"round {k + 1}: plain {plain[-1]['startup_s']:.1f} s, probe {probed[-1]['startup_s']:.1f} s",
                file=sys.stderr,
            )
    med = statistics.median
    sp, sq = med(x["startup_s"] for x in plain), med(x["startup_s"] for x in probed)
    mp = med(x["sched_peak_rss_mib"] or 0 for x in plain)
    mq = med(x["sched_peak_rss_mib"] or 0 for x in probed)
    self_s = med(x["probe_self_s"] or 0 for x in probed)
    print(f"{a.mode} worker on the CPU, median of {a.repeat} alternating starts each")
    print(f"{'':28}{'startup s':>12}{'sched peak RSS MiB':>22}")
    print(f"{'without probe':28}{sp:>12.2f}{mp:>22.1f}")
    print(f"{'with probe':28}{sq:>12.2f}{mq:>22.1f}")
    print(f"ratio (with / without): startup {sq / sp:.3f}, peak RSS {mq / mp:.3f}")
    print(f"probe's own time inside the worker: {self_s * 1000:.1f} ms = {100 * self_s / sq:.3f}% of startup")
    print("device allocations by the probe: none possible here (no device); see `memfrac selfcheck` on a GPU node")
    return 0


if __name__ == "__main__":
    sys.exit(main())
