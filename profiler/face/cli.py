"""The `memfrac` command: one subcommand per stage, each a thin shell over its module.

Every user error (bad scenario, missing file, unknown GPU) is a `MemfracError`: printed as one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable, Sequence

from profiler import __version__
from profiler.core.errors import FieldError, MemfracError, MemfracWarning
from profiler.core.validate import in_range
from profiler.model.heuristic.releases import DEFAULT_RELEASE

Handler = Callable[[argparse.Namespace], int]


def _cmd_explain(a: argparse.Namespace) -> int:
    from profiler.engine.validation import check
    from profiler.face.explain import compare_rules, explain, render_compare, render_text
    from profiler.model.heuristic import RULE_SETS, rules_for
    from profiler.model.heuristic.releases import is_newer_than_known
    from profiler.model.scenario import load_scenarios

    scenarios = load_scenarios(a.scenario)
    if a.free_at_start is not None:  # a reading of free memory: ≥ 0 and at most the GPU's capacity
        for s in scenarios:
            in_range("--free-at-start", "", a.free_at_start, 0, s.gpu.total_mib,
                     f"MiB (free memory at start: at most {s.name}'s GPU, {s.gpu.name})")  # fmt: skip
    if a.compare_rules:
        ra_, rb_ = rules_for(a.compare_rules[0]), rules_for(a.compare_rules[1])
    else:
        rules_for(a.rules)  # an unknown or unmodelled release is refused before sglang is asked
    validation = check(scenarios, None if a.compare_rules else a.rules, enabled=not a.no_validate, progress=_note)
    if not validation.validated or validation.inexpressible:
        print(f"note: {validation.summary()}", file=sys.stderr)
    if a.compare_rules:
        pairs = [(s, *compare_rules(s, ra_, rb_)) for s in scenarios]
        if a.json:
            out = [
                {
                    "scenario": s.name,
                    "a": x.as_dict(),
                    "b": y.as_dict(),
                    "delta_reserved_mib": y.reserved_mib - x.reserved_mib,
                    "delta_fraction": round(y.mem_fraction_static - x.mem_fraction_static, 6),
                }
                for s, x, y in pairs
            ]
            print(json.dumps(out if len(out) > 1 else out[0], indent=1))
        else:
            print("\n\n".join(render_compare(s, x, y) for s, x, y in pairs))
        return 0
    rules = rules_for(a.rules)
    if is_newer_than_known(a.rules) and a.rules not in RULE_SETS:
        print(f"memfrac: sglang {a.rules} is newer than {rules.name}, the newest release memfrac knows: "
              f"its rules are assumed to be {rules.name}'s", file=sys.stderr)  # fmt: skip
    exps = [explain(s, rules, a.free_at_start, validation) for s in scenarios]
    if a.oracle:
        from profiler.engine.oracle import resolve_scenario

        for e in exps:
            o = resolve_scenario(e.scenario)
            err = f" (error: {o.error})" if o.error else ""
            print(
                f"{e.scenario.name}: sglang {o.sglang_version} resolved mem_fraction_static = "
                f"{o.mem_fraction_static}{err}; model: {e.reservation.mem_fraction_static}"
            )
        return 0
    if a.calibration:
        from profiler.calibrate.codec import load_calibration
        from profiler.calibrate.reserve import calibrated_reserve
        from profiler.face.explain import render_calibrated

        cal = load_calibration(a.calibration)
        pairs = [(e, calibrated_reserve(e.scenario, e.reservation, cal)) for e in exps]
        if a.json:
            objs = [e.as_dict() | {"calibrated": _calibrated_dict(cr)} for e, cr in pairs]
            print(json.dumps(objs if len(objs) > 1 else objs[0], indent=1))
        else:
            print("\n\n".join(render_calibrated(e, cr, a.calibration) for e, cr in pairs))
        return 0
    if a.json:
        objs = [e.as_dict() for e in exps]
        print(json.dumps(objs if len(objs) > 1 else objs[0], indent=1))
    else:
        print("\n\n".join(render_text(e) for e in exps))
    return 0


def _note(line: str) -> None:
    """A progress line on stderr (stdout stays the command's output)."""
    print(f"memfrac: {line}", file=sys.stderr, flush=True)


def _calibrated_dict(cr) -> dict:
    from dataclasses import asdict

    return asdict(cr)


def _cmd_deepep_size(a: argparse.Namespace) -> int:
    from profiler.model.deepep import DeepEPInputs, analytic_sizes, inputs_from_model_config, render_sizes, sizes_dict
    from profiler.model.modelcfg import load_model_config, load_model_shape

    try:
        if a.model:
            load_model_shape(a.model)  # every field it reads checked: one line naming config.json and the key
            inp = inputs_from_model_config(
                load_model_config(a.model), tokens_per_rank=a.tokens, num_ranks=a.ranks, mode=a.mode
            )
        elif a.hidden is None or a.experts is None:
            raise MemfracError("give --hidden and --experts, or --model DIR (a directory with config.json)")
        else:
            inp = DeepEPInputs(
                hidden=a.hidden, num_experts=a.experts, tokens_per_rank=a.tokens, num_ranks=a.ranks, mode=a.mode
            )
        sizes = analytic_sizes(inp)
    except ValueError as e:
        raise MemfracError(str(e)) from None
    print(json.dumps(sizes_dict(sizes), indent=1) if a.json else render_sizes(sizes))
    return 0


def _pick(path: str, name: str | None):
    from profiler.model.scenario import pick_scenario

    return pick_scenario(path, name, "--scenario", " or use `memfrac sweep`")


def _parse_gpus(text: str | None) -> list[int] | None:
    if text is None:
        return None
    allowed = "GPU indices ≥ 0 like 0,1, or a rising range like 0-7"
    out: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part:
                a, b = part.split("-")
                lo, hi = int(a), int(b)
                if lo > hi:
                    raise ValueError
                out += list(range(lo, hi + 1))
            elif part.strip():
                out.append(int(part))
    except ValueError:
        raise FieldError("--gpus", "", text, allowed) from None
    if not out or min(out) < 0 or len(set(out)) != len(out):
        raise FieldError("--gpus", "", text, allowed + ", each once")
    return out


def _cmd_run(a: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from profiler.engine.validation import check
    from profiler.measure.runner.pair import pair_of, run_pair_command
    from profiler.measure.runner.run import run_scenario
    from profiler.measure.runner.summary import render_run

    pair = pair_of(a.scenario_file, a.scenario)  # a `mode = "pd"` scenario: both workers and sglang's router
    if pair is not None:
        return run_pair_command(pair, out=a.out, gpus=_parse_gpus(a.gpus), device=a.device,
                                validate=not a.no_validate, as_json=a.json)  # fmt: skip
    s = _pick(a.scenario_file, a.scenario)
    v = check([s], enabled=not a.no_validate, progress=_note)
    print(v.summary() if v.validated else f"note: {v.summary()}", file=sys.stderr)
    out = Path(a.out) if a.out else Path("results/runs") / f"{s.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    res = run_scenario(
        s,
        out,
        gpus=_parse_gpus(a.gpus),
        device=a.device,
        transfer_backend=a.transfer_backend,
        progress=lambda m: print(m, file=sys.stderr, flush=True),
    )
    print(json.dumps(res.as_dict(), indent=1, default=str) if a.json else render_run(res))
    return 0 if res.status == "ok" else 1


def _cmd_selfcheck(a: argparse.Namespace) -> int:
    from profiler.selfcheck.run import run_selfcheck

    return run_selfcheck(json_out=a.json, device=a.device, probe_dir=a.probe_dir)


def _cmd_ingest(a: argparse.Namespace) -> int:
    from profiler.ingest.core import run_ingest

    return run_ingest(a.files, fmt=a.format, out=a.out, per_rank=a.per_rank, margin_mib=a.margin, jobs=a.jobs)


def _add_ingest(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ingest", help="read SGLang server logs: memory per phase, headroom, verdict per run")
    p.add_argument(
        "files",
        nargs="+",
        help="log files or directories (*.log, *.txt, *.out, *.err; rotated .1 and .gz/.xz/.bz2/.zst too)",
    )
    p.add_argument("--jobs", type=int, default=None, metavar="N", help="files parsed at once (default: all cores)")
    p.add_argument("--format", default="table", choices=("table", "json", "csv", "parquet"))
    p.add_argument(
        "--out",
        help="a results directory for `memfrac report` (no suffix), or a file for the rows (.csv/.json/.parquet)",
    )
    p.add_argument("--per-rank", action="store_true", help="one row per rank instead of the rank closest to OOM")
    p.add_argument("--margin", type=float, default=1024.0, metavar="MIB", help="safety margin for recommendations")
    p.set_defaults(func=_cmd_ingest)


def _cmd_sweep(a: argparse.Namespace) -> int:
    from profiler.face.fallback import sweep_command

    return sweep_command(
        a.scenarios,
        gpus=_parse_gpus(a.gpus),
        executor=a.executor,
        out=a.out,
        resume=a.resume,
        budget=a.budget,
        dry_run=a.dry_run,
        ray_address=a.ray_address,
        device=a.device,
        parallel=a.parallel,
        validate=not a.no_validate,
        start_unloadable=a.start_unloadable,
    )


def _add_sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="plan and run a scenario file across this node's GPUs or a Ray cluster")
    p.add_argument("scenarios", help="scenario .toml (its [matrix] expanded)")
    p.add_argument("--gpus", help="GPU indices to use, e.g. 0-7 or 0,1,2,3 (default 0-7)")
    p.add_argument("--executor", choices=("local", "ray"), default="local")
    p.add_argument("--ray-address", help="an existing Ray cluster (default: start a local one)")
    p.add_argument("--out", help="results directory (default results/sweeps/<file stem>)")
    p.add_argument("--resume", action="store_true", help="skip runs already recorded in --out")
    p.add_argument("--budget", help="stop starting runs after this long, e.g. 2h or 90m")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the heuristic per scenario; run nothing")
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        help="default: cuda when nvidia-smi sees a GPU, else the CPU fallback (plan, one smoke worker, logs, report)",
    )
    p.add_argument("--parallel", type=int, default=1, help="CPU workers at once with --device cpu (default 1)")
    p.add_argument("--no-validate", action="store_true", help="do not resolve the scenarios with sglang first")
    p.add_argument("--start-unloadable", action="store_true",
                   help="start runs predicted not to load (weights over the fraction) instead of skipping them")
    p.set_defaults(func=_cmd_sweep)


def _cmd_gate(a: argparse.Namespace) -> int:
    from profiler.face.gate import run_gate

    return run_gate(a.results, a.baseline, a.max_regression, a.junit, a.min_regression_mib)


def _cmd_baseline(a: argparse.Namespace) -> int:
    from profiler.face.gate import write_baseline

    b = write_baseline(a.results, a.out)
    print(
        f"wrote {a.out}: {sum(len(t) for t in b['scenarios'].values())} measured terms "
        f"over {len(b['scenarios'])} scenarios"
    )
    return 0


def _add_gate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gate", help="fail on under-reserved terms, failed runs or regressions (nightly CI)")
    p.add_argument("results", help="results directory")
    p.add_argument("--baseline", help="a baseline written by `memfrac baseline`")
    p.add_argument("--max-regression", default="5%", help="allowed growth of a measured term (default 5%%)")
    p.add_argument(
        "--min-regression-mib", type=float, default=32.0, help="ignore growth below this (noise, default 32)"
    )
    p.add_argument("--junit", metavar="FILE", help="also write JUnit XML")
    p.set_defaults(func=_cmd_gate)
    p = sub.add_parser("baseline", help="write the measured terms of a results directory as a gate baseline")
    p.add_argument("results")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_baseline)


def _cmd_report(a: argparse.Namespace) -> int:
    from profiler.face.report import run_report

    return run_report(a.results, html=a.html, out=a.out)


def _cmd_calibrate(a: argparse.Namespace) -> int:
    from profiler.calibrate.command import run_calibrate

    if a.evaluate:
        from profiler.calibrate.evaluate import run_evaluate

        return run_evaluate(a.evaluate, a.results, "json" if a.json else a.format)
    return run_calibrate(
        a.results, quantile=a.quantile, margin_mib=a.margin, json_out=a.json, out=a.out, emit_patch=a.emit_patch
    )


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="report.md (and --html) with tables and plots for a results directory")
    p.add_argument("results")
    p.add_argument("--html", action="store_true", help="also write report.html")
    p.add_argument("--out", help="write the report elsewhere (default: into the results directory)")
    p.set_defaults(func=_cmd_report)
    p = sub.add_parser("calibrate", help="fit the constants behind each term, with LOO and KV recovered per node type")
    p.add_argument("results", nargs="+", help="one or more results directories")
    p.add_argument(
        "--quantile", type=float, default=1.0, help="safety quantile of the per-run ratios (default 1.0 = max)"
    )
    p.add_argument(
        "--margin", type=float, default=256.0, metavar="MIB", help="added to absolute constants (default 256)"
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", metavar="JSON", help="write calibration.json: the fitted constants with their evidence")
    p.add_argument(
        "--evaluate",
        metavar="CAL_JSON",
        help="judge a calibration.json on these results instead of fitting: per run and term today's, calibrated and "
        "measured MiB, new OOMs, OOMs avoided, KV gained per node type",
    )
    p.add_argument("--format", choices=("table", "json"), default="table", help="--evaluate's output (default table)")
    p.add_argument(
        "--emit-patch",
        nargs="?",
        const="memory_hook.patch",
        metavar="FILE",
        help="write a unified diff of the installed sglang's arg_groups/memory_hook.py with the justified constants "
        "(default FILE: memory_hook.patch; '-' prints it)",
    )
    p.set_defaults(func=_cmd_calibrate)


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="start one real sglang worker for a scenario, load it, record its memory")
    p.add_argument("scenario_file")
    p.add_argument("--scenario", help="which scenario of the file (when it holds several)")
    p.add_argument("--gpus", help="GPU indices for CUDA_VISIBLE_DEVICES, e.g. 0,1 or 0-7")
    p.add_argument("--out", help="artifacts directory (default results/runs/<scenario>-<time>)")
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when nvidia-smi sees a GPU")
    p.add_argument(
        "--transfer-backend",
        default="mooncake_tcp",
        choices=("mooncake_tcp", "mooncake", "nixl"),
        help="prefill workers' KV transfer engine (default mooncake_tcp)",
    )
    p.add_argument("--no-validate", action="store_true", help="do not resolve the scenario with sglang first")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_run)
    p = sub.add_parser(
        "selfcheck", help="acceptance run of a CUDA machine (torch, no sglang): probe attribution and a worker's life"
    )
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--json", action="store_true", help="one JSON document (schema memfrac-selfcheck/2)")
    p.add_argument("--probe-dir", metavar="DIR", help="keep the worker life's probe JSONL here (default: discarded)")
    p.set_defaults(func=_cmd_selfcheck)


def _add_explain(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help="the heuristic's terms for a scenario and what they leave for the KV cache")
    p.add_argument("scenario", help="scenario .toml (a [matrix] explains every expanded scenario)")
    p.add_argument(
        "--rules",
        default=DEFAULT_RELEASE,
        help=f"sglang release whose rules to apply, 0.4.0 on (default {DEFAULT_RELEASE})",
    )
    p.add_argument("--compare-rules", nargs=2, metavar=("A", "B"), help="show term by term how two releases differ")
    p.add_argument("--free-at-start", type=float, metavar="MIB", help="free GPU memory at start (default: capacity)")
    p.add_argument("--oracle", action="store_true", help="also resolve with the installed sglang and print both")
    p.add_argument(
        "--calibration",
        metavar="JSON",
        help="a calibration.json (memfrac calibrate --out): today's and the calibrated reserve, fraction, KV tokens",
    )
    p.add_argument(
        "--no-validate", action="store_true", help="do not resolve the scenarios with sglang's own resolver first"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_explain)


def _add_deepep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("deepep-size", help="analytic DeepEP buffer sizes beside the heuristic's hard-coded 2 GiB")
    p.add_argument("--hidden", type=int, help="model hidden size")
    p.add_argument("--experts", type=int, help="routed experts (as DeepEP sees them)")
    p.add_argument(
        "--tokens", type=int, default=128, help="SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK (default 128)"
    )
    p.add_argument("--ranks", type=int, default=8, help="EP group size (default 8)")
    p.add_argument("--mode", default="auto", choices=("low_latency", "normal", "auto"))
    p.add_argument("--model", metavar="CONFIG_DIR", help="read hidden size and experts from a model directory")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_deepep_size)


def _cmd_audit(a: argparse.Namespace) -> int:
    from profiler.calibrate.audit import run_audit

    return run_audit(a.models, a.gpus, a.modes, a.backends, a.calibration, a.out, a.rules)


def _add_audit(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "audit",
        help="the heuristic over every bundled model x GPU x role x parallelism x a2a backend: where it misreserves",
    )
    p.add_argument("--models", nargs="+", metavar="MODEL", help="bundled model directories (default: all)")
    p.add_argument("--gpus", nargs="+", metavar="GPU", help="bundled GPU names (default: the whole table)")
    p.add_argument("--modes", nargs="+", choices=("null", "prefill", "decode"), help="PD roles (default: all)")
    p.add_argument("--backends", nargs="+", metavar="BACKEND", help="moe_a2a_backend values (default: all 12)")
    p.add_argument("--calibration", metavar="FILE", help="calibration.json (memfrac calibrate --out): under-reserved")
    p.add_argument(
        "--rules", default=DEFAULT_RELEASE, help=f"sglang release whose rules to apply (default {DEFAULT_RELEASE})"
    )
    p.add_argument("--out", default="results/audit", help="directory for audit.parquet, findings and heat maps")
    p.set_defaults(func=_cmd_audit)


def _add_judge(sub: argparse._SubParsersAction) -> None:
    from profiler.face.judge import cmd_judge

    p = sub.add_parser("judge", help="re-judge a recorded run's probe files against a scenario (no GPU needed)")
    p.add_argument("probe_dir", help="a run's probe/ directory (raw/<run>/probe), its run directory, or any "
                   "directory of probe-*.jsonl")  # fmt: skip
    p.add_argument("--scenario", required=True, help="the scenario file the run was started from")
    p.add_argument("--name", help="the scenario's name, when the file holds several")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("--out", help="also store the re-judged run in this results directory (results.parquet, ledger, "
                   "ladder), so `memfrac report` and `memfrac gate` work on it")  # fmt: skip
    p.set_defaults(func=cmd_judge)


def _cmd_upstream_tests(a: argparse.Namespace) -> int:
    from profiler.calibrate.upstream_tests import run_upstream_tests

    return run_upstream_tests(a.out, a.rules, a.calibration, a.grid)


def _add_upstream_tests(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "upstream-tests",
        help="write sglang unit tests pinning mem_fraction_static per disaggregation mode, each case confirmed by "
        "that release's real resolver",
        description="Write one pytest module in sglang's unit-test style (CPU only): per case ServerArgs is built and "
        "its resolved mem_fraction_static asserted, with the heuristic's arithmetic in a comment. Every expected "
        "value is computed by memfrac and confirmed by the release's own resolver; a case they disagree on is left "
        "out and said so. With --calibration the values are the calibrated constants' (the patch of "
        "`memfrac calibrate --emit-patch`), and the header lists the cases the patch moves.",
    )
    p.add_argument("--out", required=True, metavar="FILE", help="the pytest module to write")
    p.add_argument(
        "--rules",
        metavar="RELEASE",
        help="the sglang release to pin: the installed one (default) or one installed side by side "
        "(.cache/sglang-releases/RELEASE, `make old-releases`; MEMFRAC_SGLANG_RELEASES moves it)",
    )
    p.add_argument(
        "--calibration",
        metavar="CAL_JSON",
        help="a calibration.json (memfrac calibrate --out): expect the calibrated constants' fractions",
    )
    p.add_argument(
        "--grid",
        choices=("small", "full"),
        default="small",
        help="small: 32 cases, what a PR carries (default); full: every role x GPU x variant (225), for a local run",
    )
    p.set_defaults(func=_cmd_upstream_tests)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="memfrac",
        description="Measure what SGLang reserves for non-KV GPU memory against what its workers really use.",
    )
    ap.add_argument("--version", action="version", version=f"memfrac {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_explain(sub)
    _add_deepep(sub)
    _add_run(sub)
    _add_ingest(sub)
    _add_sweep(sub)
    _add_gate(sub)
    _add_report(sub)
    _add_audit(sub)
    _add_judge(sub)
    _add_upstream_tests(sub)
    return ap


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt: the same way out, nothing left behind."""


def _raise_terminated(*_: object) -> None:
    raise _Terminated


def main(argv: Sequence[str] | None = None) -> int:
    import signal
    import threading

    ap = build_parser()
    a = ap.parse_args(argv)
    main_thread = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    with warnings.catch_warnings():  # restored on return: main() called in-process leaves no filter behind
        python_show = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None) -> None:
            """A MemfracWarning is one line on stderr ("memfrac: warning: …"); others as Python shows them."""
            if issubclass(category, MemfracWarning):
                print(f"memfrac: warning: {message}", file=sys.stderr, flush=True)
            else:
                python_show(message, category, filename, lineno, file, line)

        warnings.simplefilter("always", MemfracWarning)
        warnings.showwarning = show
        return _run(a, old)


#: Numeric options every command checks before it starts: option attribute → (flag, lowest, highest).
_NUMBERS: dict[str, tuple[str, float, float | None]] = {
    "free_at_start": ("--free-at-start", 0, None),
    "margin": ("--margin", 0, None),
    "quantile": ("--quantile", 0, 1),
    "min_regression_mib": ("--min-regression-mib", 0, None),
    "jobs": ("--jobs", 1, None),
    "parallel": ("--parallel", 1, None),
    "tokens": ("--tokens", 1, None),
    "ranks": ("--ranks", 1, None),
    "hidden": ("--hidden", 1, None),
    "experts": ("--experts", 1, None),
}


def check_numbers(a: argparse.Namespace) -> None:
    """Every numeric option finite and in range (argparse's float() takes "nan" and "inf")."""
    for attr, (flag, lo, hi) in _NUMBERS.items():
        v = getattr(a, attr, None)
        if v is None:
            continue
        in_range(flag, "", v, lo, hi)
        if attr == "quantile" and v == 0:
            raise FieldError(flag, "", v, "a number in (0, 1]: the share of runs a constant covers")


def _run(a: argparse.Namespace, old: object) -> int:
    """The command, with every way out handled; `old` is the SIGTERM handler main() replaced (put back on return)."""
    import signal

    try:
        check_numbers(a)
        return int(a.func(a) or 0)
    except MemfracError as e:
        print(f"memfrac: error: {e}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, _Terminated) as e:
        from profiler.measure.runner.reaper import stop_children

        what = "terminated" if isinstance(e, _Terminated) else "interrupted"
        print(f"memfrac: {what}; stopping the workers it started", file=sys.stderr, flush=True)
        try:
            left = stop_children()["left_behind"]
        except (KeyboardInterrupt, _Terminated):  # asked again: the watchdogs finish the job (reaper.py)
            left = []
        if left:
            print(f"memfrac: processes still alive: {left}", file=sys.stderr)
        return 143 if isinstance(e, _Terminated) else 130
    except BrokenPipeError:
        return 0
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


if __name__ == "__main__":
    sys.exit(main())
