"""Benchmark: the pure heuristic model vs the real sglang resolver on the same conformance grid, one run.

Both start from their native, prepared input (the model: HeuristicInputs; the resolver: the argv sglang's
own argparse takes) and end with mem_fraction_static. The conversion from a Scenario is timed separately
and reported too, so nothing is hidden. Best of N repeats each, side by side in one process.

    .venv/bin/python bench/bench_heuristic.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from profiler.engine.launch import server_argv
from profiler.model.heuristic import inputs_from_scenario, reserve, rules_for
from profiler.model.heuristic.grid import conformance_grid


def best_of(repeat: int, fn) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    from profiler.engine.oracle import Resolver

    grid = conformance_grid()
    resolver = Resolver(patch=True)
    rules = rules_for(resolver.version)
    inputs = [inputs_from_scenario(s) for s in grid]
    argvs = [(server_argv(s, resolver.version), s.gpu.total_mib, s.env_dict) for s in grid]
    model_out = [reserve(i, rules).mem_fraction_static for i in inputs]
    real_out = [resolver.resolve(*x).mem_fraction_static for x in argvs]
    agree = sum(m == r for m, r in zip(model_out, real_out, strict=True))

    n = len(grid)
    t_model = best_of(a.repeat * 20, lambda: [reserve(i, rules).mem_fraction_static for i in inputs])
    t_real = best_of(a.repeat, lambda: [resolver.resolve(*x).mem_fraction_static for x in argvs])
    t_conv_model = best_of(a.repeat * 20, lambda: [inputs_from_scenario(s) for s in grid])
    t_conv_real = best_of(a.repeat * 20, lambda: [server_argv(s, resolver.version) for s in grid])

    print(f"grid: {n} configurations, sglang {resolver.version}; model and resolver agree on {agree}/{n}")
    print(f"{'':34}{'configs/s':>14}{'µs/config':>12}")
    print(f"{'pure model (reserve)':34}{n / t_model:>14,.0f}{t_model / n * 1e6:>12.2f}")
    print(f"{'real resolver (argparse+resolve)':34}{n / t_real:>14,.0f}{t_real / n * 1e6:>12.2f}")
    print(f"ratio (model faster by): {t_real / t_model:,.0f}×")
    tm, tr = t_model + t_conv_model, t_real + t_conv_real
    print(
        f"including conversion from a Scenario: model {n / tm:,.0f}/s, resolver {n / tr:,.0f}/s, ratio {tr / tm:,.0f}×"
    )
    return 0 if agree == n else 1


if __name__ == "__main__":
    sys.exit(main())
