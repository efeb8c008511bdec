"""`memfrac sweep`: plan a scenario file, run it on GPUs (or a Ray cluster, or the CPU), store, summarise.

What a machine without CUDA runs instead (the plan, a CPU smoke worker, the bundled logs, the report) is the
face's choice: `profiler.face.fallback`.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from profiler.analyse.compare import Comparison, compare, derive_variant, reservation_for
from profiler.core import ui
from profiler.core.errors import MemfracError
from profiler.measure.machine import default_gpus, node_gpu_mib
from profiler.measure.runner.reaper import stop_recorded
from profiler.model.a2a_inputs import deepep_sizes_mib, inputs_for
from profiler.model.gpus import gpu_from_mib
from profiler.model.scenario import Scenario, load_scenarios
from profiler.results.store import RunContext, Store
from profiler.sweep.executors import NOT_STARTED, Job, JobResult, LocalExecutor, RayExecutor
from profiler.sweep.plan import Plan, RunGroup, make_plan, render_plan

ROOT = Path(__file__).resolve().parents[2]
Say = Callable[[str], None]


def parse_budget(text: str | None) -> float | None:
    """'2h', '90m', '45s', '1h30m' → seconds."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s)?\s*", text)
    if not m or not any(m.groups()):
        raise MemfracError(f"--budget {text!r}: give a duration like 2h, 90m, 45s or 1h30m")
    h, mi, s = (float(x) if x else 0.0 for x in m.groups())
    return h * 3600 + mi * 60 + s


def context_for(s: Scenario, res_decode_max_bs: int | None, chunk: int | None) -> RunContext:
    shape = s.shape
    return RunContext(
        group="",
        moe_a2a_backend=s.moe_a2a_backend,
        decode_max_bs=res_decode_max_bs,
        chunked_prefill_size=chunk,
        deepep_tokens=inp.tokens_per_rank if s.moe_a2a_backend == "deepep" and (inp := inputs_for(s)) else None,
        hidden_size=shape.hidden_size,
        num_experts=shape.num_experts or None,
    )


def post_capture_columns(s: Scenario, c: Comparison, res: object) -> dict[str, object]:
    """What enabling post-capture KV sizing would have changed for this measured run (profiler.model.postcapture):
    the KV tokens gained (negative: lost) or the OOM avoided, with the arithmetic; nothing on a CPU run."""
    from profiler.model.postcapture import answers, gain_from_run

    rules = getattr(res, "rule_set", None)
    if c.memory_kind != "gpu" or rules is None or c.free_at_start_mib is None or c.weights_mib is None:
        return {}
    a = answers(s, rules, c.free_at_start_mib)
    gain = gain_from_run(
        classic_mfs=a.classic.mem_fraction_static, post_mfs=a.post.mem_fraction_static,
        free_at_start_mib=c.free_at_start_mib, weights_mib=c.weights_mib, used_after_kv_mib=c.used_after_kv_mib,
        kv_bytes_per_token=c.kv_bytes_per_token or 0.0, planned=a.planned,
    )  # fmt: skip
    return {"post_capture_kv_tokens": gain.kv_tokens_gained, "post_capture_oom_avoided": gain.oom_avoided,
            "post_capture_how": gain.how}  # fmt: skip


@dataclass
class SweepSummary:
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)  # scenario, status, verdict, detail
    failed: int = 0
    not_run: int = 0

    def render(self) -> str:
        if not self.rows:
            return "nothing ran"
        return ui.table(["scenario", "status", "verdict", "detail"], self.rows, title="sweep summary")


def record(store: Store, plan: Plan, r: JobResult, summary: SweepSummary) -> None:
    """Compare the launched scenario and every member measured from its ladder; store them atomically."""
    g: RunGroup = r.job.group
    if r.pair is not None:
        record_pair(store, plan, r, summary)
        return
    if r.status == NOT_STARTED:  # nothing ran: say why, and let --resume start it again
        summary.not_run += len(g.members)
        summary.rows += [(s.name, "not started", "—", (r.error or "")[:120]) for s in g.members]
        store.add([], run_key=g.key, status=NOT_STARTED, extra={"reason": r.error})
        return
    if r.result is None:
        summary.failed += len(g.members)
        for s in g.members:
            summary.rows.append((s.name, "error", "—", (r.error or "")[:120]))
        store.add([], run_key=g.key, status="error", extra={"error": r.error})
        return
    m = r.result.measurement
    res, notes = reservation_for(m, g.launch)
    m.notes.extend(notes)
    analytic, device = deepep_sizes_mib(g.launch)
    c = compare(m, res, deepep_analytic_mib=analytic, resolved_mfs=_resolved_mfs(plan, g.launch))
    items: list[tuple[object, Comparison, RunContext]] = []
    rv = plan.reservations[g.launch.name].resolved
    ctx = context_for(g.launch, rv.decode_max_bs, rv.chunked_prefill_size)
    items.append((m, c, replace(ctx, group=g.key, deepep_device_mib=device, **post_capture_columns(g.launch, c, res))))
    for s in g.derived:
        res_s = plan.reservations[s.name]
        if res is not None:
            from profiler.model.heuristic import inputs_from_scenario, reserve

            res_s = reserve(inputs_from_scenario(s), res.rule_set)
        cv = derive_variant(c, res_s, s.name, res_s.resolved.decode_max_bs)
        mv = _variant_measurement(m, s, cv)
        ctx_s = context_for(s, res_s.resolved.decode_max_bs, res_s.resolved.chunked_prefill_size)
        items.append((mv, cv, replace(ctx_s, group=g.key, deepep_device_mib=device, derived_from=m.id)))
    store.add(items, run_key=g.key, status=r.result.status, extra={"out_dir": str(r.result.out_dir)})  # type: ignore[arg-type]
    for mm, cc, _ in items:
        detail = (
            cc.reason
            if r.result.status == "ok"
            else f"{mm.failure.kind}: {mm.failure.message[:80]}"
            if mm.failure
            else ""
        )
        summary.rows.append((mm.scenario or mm.id, r.result.status, cc.verdict, detail[:110]))  # type: ignore[union-attr]
    if r.result.status != "ok":
        summary.failed += len(items)


def check_resume(store: Store, path: str) -> None:
    """--resume continues the sweep of one scenario file: a directory made from another one is refused."""
    sweep = store.manifest().get("sweep")
    prev = sweep.get("scenarios") if isinstance(sweep, dict) else None
    if not isinstance(prev, str) or _same_file(prev, path):
        return
    raise MemfracError(
        f"--resume {store.root}: that directory was made from {prev}, not {path}; resume it with {prev}, or give "
        "another --out"
    )


def _same_file(a: str, b: str) -> bool:
    """The same path, or files of the same bytes (a directory written with a path relative to another place)."""
    pa, pb = Path(a).resolve(), Path(b).resolve()
    if pa == pb:
        return True
    try:
        return pa.read_bytes() == pb.read_bytes()
    except OSError:
        return False


def finished_keys(store: Store) -> set[str]:
    """The run keys a sweep into `store` already measured (recorded as ok, failed or error): --resume skips them."""
    return {k for k, v in store.finished().items() if v.get("status") not in (NOT_STARTED, SKIPPED)}


def set_aside(run_dir: Path, finished: bool, say: Say) -> Path | None:
    """Before a run starts into `run_dir`: stop any worker an earlier memfrac left running there (worker.json), and
    move what is there to `<run_dir>.interrupted-<n>` (`.replaced-<n>` when that run had finished), so the new run's
    probe/ and log hold only its own worker's files. None when the directory is absent or empty."""
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return None
    stopped = stop_recorded(run_dir)
    label = "replaced" if finished else "interrupted"
    n = 1
    while (dest := run_dir.with_name(f"{run_dir.name}.{label}-{n}")).exists():
        n += 1
    run_dir.rename(dest)
    alive = f"; stopped its worker still running (process group {', '.join(map(str, stopped))})" if stopped else ""
    say(f"{run_dir.name}: an earlier {'run' if finished else 'unfinished run'}'s files moved to {dest.name}{alive}")
    return dest


def _resolved_mfs(plan: Plan, s: Scenario) -> float | None:
    """sglang's own resolved fraction for `s` when its resolver ran on the plan (the worker's /server_info, when it
    reports one, still comes first in compare)."""
    f = plan.fraction(s.name)
    return f.value if f.from_sglang else None


SKIPPED = "skipped"  # a manifest status: the sweep chose not to start the run (the reason is recorded)


def record_skipped(store: Store, g: RunGroup, why: str, summary: SweepSummary) -> None:
    """A run the sweep does not start (predicted not to load; a GPU this node does not have): in the manifest with
    the reason, so the report lists it; --resume plans it again."""
    summary.not_run += len(g.members)
    summary.rows += [(s.name, SKIPPED, "—", why[:120]) for s in g.members]
    store.add([], run_key=g.key, status=SKIPPED, extra={"reason": why, "scenarios": [s.name for s in g.members]})


def record_pair(store: Store, plan: Plan, r: JobResult, summary: SweepSummary) -> None:
    """Both workers of a PD pair, each compared with the heuristic of its own role, stored under the pair's key
    with the per-request transfer evidence (transfer.json) in the manifest."""
    g: RunGroup = r.job.group
    pr = r.pair
    items: list[tuple[object, Comparison, RunContext]] = []
    for side in (pr.prefill, pr.decode):
        if side is None:
            continue
        s = g.launch if side.measurement.identity.mode == "prefill" else g.peer
        assert s is not None
        m = side.measurement
        m.notes.append(f"one worker of PD pair {g.key} (its peer and sglang's router ran beside it: pair.json)")
        res, notes = reservation_for(m, s)
        m.notes.extend(notes)
        analytic, device = deepep_sizes_mib(s)
        c = compare(m, res, deepep_analytic_mib=analytic, resolved_mfs=_resolved_mfs(plan, s))
        rv = plan.reservations[s.name].resolved
        ctx = context_for(s, rv.decode_max_bs, rv.chunked_prefill_size)
        items.append((m, c, replace(ctx, group=g.key, deepep_device_mib=device, **post_capture_columns(s, c, res))))
    t = pr.transfer or {}
    extra = {"out_dir": str(pr.out_dir), "pair": True, "failure": pr.failure,
             "transfer": {k: t.get(k) for k in ("proven", "of", "kinds_proven", "negative_control_zero", "how")}}
    store.add(items, run_key=g.key, status=pr.status, extra=extra)  # type: ignore[arg-type]
    for mm, cc, _ in items:
        detail = cc.reason if pr.status == "ok" else (pr.failure or "")
        summary.rows.append((mm.scenario or mm.id, pr.status, cc.verdict, detail[:110]))  # type: ignore[union-attr]
    summary.rows.append((g.key, pr.status, "—", f"KV transfer proven for {t.get('proven')}/{t.get('of')} requests"))
    if pr.status != "ok":
        summary.failed += max(1, len(items))


def _variant_measurement(m: object, s: Scenario, c: Comparison) -> object:
    from profiler.core.measurement import Measurement

    assert isinstance(m, Measurement)
    v = Measurement(
        id=c.measurement_id,
        source=m.source,
        memory_kind=m.memory_kind,
        origin=m.origin,
        scenario=s.name,
        identity=m.identity,
        args=m.args,
        args_source=m.args_source,
        mfs_origin="given" if s.mem_fraction_static is not None else "auto",
        ranks=[],
        failure=m.failure,
        notes=[f"not started: derived from run {m.id}'s decode-graph ladder (max_bs {s.decode_graph.max_bs})"],
    )
    return v


class _SayStream:
    """A text stream that hands each line to `say` (the progress bar's plain lines reach the caller's sink)."""

    def __init__(self, say: Say) -> None:
        self.say, self._buf = say, ""

    def write(self, text: str) -> int:
        self._buf += text
        *lines, self._buf = self._buf.split("\n")
        for line in lines:
            self.say(line)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def _say_stderr(m: str) -> None:
    print(m, file=sys.stderr, flush=True)


class SweepProgress:
    """The sweep's progress: one bar over the runs (done/total, elapsed, ETA) whose note is the runs in flight,
    and a line per finished run (status, seconds) above it."""

    def __init__(self, bar: ui.Bar, total: int) -> None:
        self.bar, self.total, self.done = bar, total, 0
        self.flying: dict[str, float] = {}  # run key → when it started

    def _note(self) -> str:
        return "running: " + ", ".join(self.flying) if self.flying else ""

    def started(self, job: Job) -> None:
        self.flying[job.group.key] = time.monotonic()
        self.bar.update(self.done, self._note())

    def finished(self, r: JobResult) -> None:
        self.done += 1
        self.flying.pop(r.job.group.key, None)
        status = r.status
        self.bar.log(f"[{self.done}/{self.total}] {r.job.group.key}: {status} ({r.elapsed_s:.0f} s)")
        self.bar.update(self.done, self._note())


def run_sweep(
    path: str,
    *,
    gpus: list[int] | None = None,
    executor: str = "local",
    out: str | None = None,
    resume: bool = False,
    budget: str | None = None,
    dry_run: bool = False,
    ray_address: str | None = None,
    device: str | None = None,
    python: str | None = None,
    parallel: int = 1,
    say: Say = _say_stderr,
    echo: Callable[[str], None] = print,
    validate: bool = True,
    start_unloadable: bool = False,
) -> int:
    """The command. Exit status 0 when every started run succeeded, 1 when some failed, 2 on bad input."""
    scenarios = load_scenarios(path)
    gpu_ids = gpus if gpus is not None else default_gpus()
    plan = make_plan(scenarios, gpu_ids, validate=validate, start_unloadable=start_unloadable)
    if executor == "ray" and any(g.peer is not None for g in plan.runs):
        raise MemfracError(f"{path}: a PD pair (mode = \"pd\") runs with --executor local: its two workers and "
                           "their router share one node")  # fmt: skip
    if dry_run:
        echo(render_plan(plan))
        return 0
    out_dir = Path(out or f"results/sweeps/{Path(path).stem}")
    device = device or "cuda"  # the face decides between this and its CPU fallback (profiler.face.fallback)
    store = Store(out_dir)
    if resume:
        check_resume(store, path)
    store.init({"scenarios": str(Path(path).resolve()), "executor": executor, "device": device})
    skipped: list[tuple[RunGroup, str]] = [(g, why) for g in plan.runs if (why := plan.skipped.get(g.key))]
    runs = [g for g in plan.runs if g.key not in plan.skipped]
    if device == "cuda":
        node = node_gpu_mib()
        if node is not None:
            here = gpu_from_mib(int(node))
            keep = []
            for g in runs:
                if g.launch.gpu.total_mib != int(node):
                    skipped.append(
                        (
                            g,
                            f"targets {g.launch.gpu.name} ({g.launch.gpu.total_mib} MiB); "
                            f"this node has {here.name} ({int(node)} MiB)",
                        )
                    )
                else:
                    keep.append(g)
            runs = keep
    measured = finished_keys(store)
    if resume:
        done_keys = measured
        before = len(runs)
        runs = [g for g in runs if g.key not in done_keys]
        say(f"resume: {before - len(runs)} run(s) already recorded in {out_dir}, {len(runs)} to go")
    summary = SweepSummary()
    for g, why in skipped:  # recorded, with the reason: the report lists what the sweep did not start
        say(f"{g.key}: skipped — {why}")
        if g.key in measured:  # an earlier sweep into this directory measured it: keep that record
            continue
        record_skipped(store, g, why, summary)
    for g in runs:
        set_aside(store.raw_dir(g.key), g.key in measured, say)
    jobs = [Job(g, store.raw_dir(g.key), device, python) for g in runs]
    deadline = None if budget is None else time.monotonic() + (parse_budget(budget) or 0)
    say(
        f"sweep: {len(jobs)} worker start(s) for {sum(len(g.members) for g in runs)} scenario(s) on {device}; "
        f"results → {out_dir}"
    )
    stream = sys.stderr if say is _say_stderr else _SayStream(say)
    with ui.progress(len(jobs), "sweep", stream=stream) as bar:
        prog = SweepProgress(bar, len(jobs))

        def done(r: JobResult) -> None:
            record(store, plan, r, summary)
            prog.finished(r)

        # a run never started reaches `done` as not started, with the reason (budget, busy GPUs)
        if executor == "ray":
            ex = RayExecutor(ray_address, device=device, num_gpus=len(gpu_ids) if not ray_address else None)
            ex.run(jobs, done, deadline, started=prog.started)
        else:
            progress = bar.log if device == "cpu" else None  # a CPU worker is slow to start: show its steps
            ex_local = LocalExecutor(gpu_ids, device, slots=parallel, say=bar.log, progress=progress)
            ex_local.run(jobs, done, deadline, started=prog.started)
    echo(summary.render())
    echo(f"results: {out_dir} (memfrac report {out_dir}; memfrac gate {out_dir})")
    return 1 if summary.failed else 0
