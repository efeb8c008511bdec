"""Benchmark: `memfrac audit` over the bundled models × the whole GPU table × every backend, on one core.

Target: at least 1,000,000 configurations evaluated in under 10 seconds. Each repeat starts cold (the
scalar-model, size and refusal tables are cleared), so nothing from an earlier repeat is reused; the
process is pinned to one CPU and numpy's thread pools to one thread. Findings and the parquet are timed
apart from the evaluation.

    .venv/bin/python bench/bench_audit.py [--repeat 3] [--cpu 0]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import profiler.calibrate.audit as audit  # noqa: E402
from profiler.model.heuristic import rules_for  # noqa: E402

TARGET_CONFIGS, TARGET_S = 1_000_000, 10.0


def _clear() -> None:
    for f in (audit._heuristic, audit._a2a_size, audit._weights_kv, audit._model):
        f.cache_clear()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=0, help="the CPU to pin to (default 0)")
    a = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {a.cpu})
    rules = rules_for("0.5.23")
    space = audit.make_space()
    times, df = [], None
    for _ in range(a.repeat):
        _clear()
        t = time.perf_counter()
        df = audit.evaluate_space(space, rules)
        times.append(time.perf_counter() - t)
    assert df is not None
    t = time.perf_counter()
    f = audit.findings(df)
    t_find = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        df.to_parquet(Path(d) / "audit.parquet", index=False)
        t_write = time.perf_counter() - t
        size = (Path(d) / "audit.parquet").stat().st_size
    n, best = len(df), min(times)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    print(f"audit space: {n:,} configurations ({len(space.models)} models × {len(space.gpus)} GPUs × "
          f"{len(space.modes)} roles × {len(space.par())} tp/attn-dp × backends, tokens, modes × "
          f"{len(space.graphs)} graph settings × post-capture off/on), CPU {cpus}")  # fmt: skip
    print(f"evaluation (cold, best of {a.repeat}): {best:.2f} s = {n / best:,.0f} configurations/s "
          f"(all: {', '.join(f'{x:.2f}' for x in times)} s)")  # fmt: skip
    print(f"findings: {t_find:.2f} s ({len(f)} rows); parquet: {t_write:.2f} s, {size / 1e6:.1f} MB")
    ok = n >= TARGET_CONFIGS and best <= TARGET_S
    print(f"target ≥ {TARGET_CONFIGS:,} configurations in ≤ {TARGET_S:.0f} s: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
