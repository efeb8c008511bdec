"""What `make run` does on a machine without CUDA: nothing is measured on a GPU, and the sweep says so in one
line, then runs what can run honestly — the plan with the heuristic per term for every scenario, one real CPU
sglang worker as a pipeline smoke run (host memory, labelled as such), the bundled real logs (package data,
`profiler/data/logs`) ingested as evidence, and the report.

It lives in the face, not the sweep: it strings together the sweep, ingest and the report, the last stages.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from profiler.face.report import run_report
from profiler.ingest.core import ingest, log_context
from profiler.measure.machine import cuda_machine, default_gpus
from profiler.model.scenario import load_scenarios
from profiler.results.store import Store
from profiler.sweep.executors import Job, JobResult, LocalExecutor
from profiler.sweep.plan import Plan, make_plan, render_plan
from profiler.sweep.sweep import (
    Say,
    SweepSummary,
    _say_stderr,
    check_resume,
    finished_keys,
    record,
    record_skipped,
    run_sweep,
    set_aside,
)

PACKAGE = Path(__file__).resolve().parents[1]
CPU_SMOKE = PACKAGE.parent / "scenarios" / "cpu-smoke-decode.toml"
BUNDLED_LOGS = PACKAGE / "data" / "logs"  # the real logs `make run` ingests (a frozen copy of tests' fixtures)
LOGS_KEY = "bundled-logs"  # their manifest entry


def sweep_command(
    path: str,
    *,
    device: str | None = None,
    gpus: list[int] | None = None,
    out: str | None = None,
    dry_run: bool = False,
    validate: bool = True,
    say: Say = _say_stderr,
    echo: Callable[[str], None] = print,
    **kw: object,
) -> int:
    """`memfrac sweep`: the sweep on CUDA (or on the device asked for), else the CPU fallback below."""
    if device is None and not dry_run and not cuda_machine():
        plan = make_plan(load_scenarios(path), gpus if gpus is not None else default_gpus(), validate=validate,
                         start_unloadable=bool(kw.get("start_unloadable")))  # fmt: skip
        out_dir = Path(out or f"results/sweeps/{Path(path).stem}")
        return cpu_fallback(plan, path, out_dir, say, echo, resume=bool(kw.get("resume")))
    return run_sweep(
        path, device=device, gpus=gpus, out=out, dry_run=dry_run, validate=validate, say=say, echo=echo, **kw
    )  # type: ignore[arg-type]


def cpu_fallback(
    plan: Plan, path: str, out_dir: Path, say: Say, echo: Callable[[str], None], *, resume: bool = False
) -> int:
    """The honest run of a machine without CUDA: plan, one CPU smoke worker, the bundled logs, the report.

    `resume`: what the directory already holds (the smoke run, the bundled logs) is kept, not done again."""
    store = Store(out_dir)
    if resume:
        check_resume(store, path)
    echo(
        "no CUDA device here: measuring nothing on a GPU; running the CPU fallback — the plan with the heuristic "
        "per term, one real CPU sglang worker as a pipeline smoke run, the bundled real logs, and the report"
    )
    echo(render_plan(plan))
    measured = finished_keys(store)
    store.init({"scenarios": str(Path(path).resolve()), "executor": "local", "device": "cpu", "fallback": True})
    smoke = load_scenarios(CPU_SMOKE)
    smoke_plan = make_plan(smoke, [0], validate=False)  # the bundled smoke scenario; the plan above was validated
    summary = SweepSummary()
    for g in plan.runs:  # what a GPU node would skip too: recorded with the reason, so the report lists it
        if why := plan.skipped.get(g.key):
            record_skipped(store, g, why, summary)

    def done(r: JobResult) -> None:
        record(store, smoke_plan, r, summary)
        status = r.status
        say(f"smoke run {r.job.group.key}: {status} ({r.elapsed_s:.0f} s)")

    runs = [g for g in smoke_plan.runs if not (resume and g.key in measured)]
    if resume:
        say(f"resume: {len(smoke_plan.runs) - len(runs)} smoke run(s) already recorded in {out_dir}, {len(runs)} to go")
    for g in runs:
        set_aside(store.raw_dir(g.key), g.key in measured, say)
    jobs = [Job(g, store.raw_dir(g.key), "cpu") for g in runs]
    LocalExecutor([], "cpu", slots=1, progress=say).run(jobs, done)  # the worker's own steps, as `memfrac run`
    if resume and LOGS_KEY in measured:
        say(f"resume: the bundled real logs are already ingested in {out_dir}")
    elif BUNDLED_LOGS.is_dir():
        batch = [(m, c, log_context(m, c)) for m, c, _ in ingest([BUNDLED_LOGS], progress=False)]
        store.add(batch, run_key=LOGS_KEY, extra={"runs": len(batch)})  # type: ignore[arg-type]
        say(f"ingested {len(batch)} runs from the bundled real logs ({BUNDLED_LOGS})")
    echo(summary.render())
    run_report(str(out_dir), html=True)
    echo(f"results: {out_dir}")
    return 1 if summary.failed else 0
