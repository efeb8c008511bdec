"""Sweep planning: which worker starts measure which scenarios, and how they pack onto GPUs.

One start measures everything it can: the decode capture ladder of a single start yields the memory of
every batch size, so scenarios that differ only in the decode graph's `max_bs` share one run, started with
the largest max_bs. Each run needs tp × pp GPUs, times dp when DP attention is off (attention DP lives
inside the TP group); runs are packed first-fit onto the GPUs given. The two roles of a PD pair (`mode = "pd"`)
are one run: both workers and their router start together, on GPUs for both.

A run whose weights are predicted not to fit under the fraction its GPU would get (`load_refusal`: sglang's
runtime rule, pool = free_at_start × mfs − weights ≤ 0, with free_at_start = the GPU's capacity — an upper
bound, so the prediction errs towards starting) would spend its start-up to fail at load: the plan skips it with
that reason, unless `start_unloadable` (the CLI's `--start-unloadable`) asks for the OOM on record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from profiler.core.errors import MemfracError
from profiler.engine.fraction import ScenarioFraction, scenario_fraction
from profiler.engine.validation import Validation
from profiler.model.a2a_inputs import report_for
from profiler.model.heuristic import Reservation, inputs_from_scenario, reserve, rules_for
from profiler.model.heuristic.releases import DEFAULT_RELEASE
from profiler.model.kv_budget import kv_budget
from profiler.model.scenario import Scenario, scenario_dict


@dataclass(frozen=True)
class RunGroup:
    """One worker start: the scenario it launches and every scenario it measures."""

    key: str  # stable across invocations: the name of the launched scenario, or the pair (for --resume)
    launch: Scenario
    members: tuple[Scenario, ...]
    peer: Scenario | None = None  # a PD pair: the decode worker started beside `launch` (the prefill)

    @property
    def gpus_needed(self) -> int:
        return self.launch.gpus_needed + (self.peer.gpus_needed if self.peer is not None else 0)

    @property
    def started(self) -> tuple[Scenario, ...]:
        """The scenarios whose workers this run starts: the launch, and a pair's decode worker."""
        return (self.launch,) if self.peer is None else (self.launch, self.peer)

    @property
    def derived(self) -> tuple[Scenario, ...]:
        """Members measured from the launched run's ladder rather than started themselves."""
        started = {s.name for s in self.started}
        return tuple(s for s in self.members if s.name not in started)


@dataclass
class Plan:
    scenarios: list[Scenario]
    runs: list[RunGroup]
    gpus: list[int]
    reservations: dict[str, Reservation] = field(default_factory=dict)
    unplaceable: list[tuple[RunGroup, str]] = field(default_factory=list)
    validation: Validation | None = None  # sglang's own resolution of every scenario (None: not asked)
    unloadable: dict[str, str] = field(default_factory=dict)  # run key → why it is predicted not to load
    start_unloadable: bool = False  # start them anyway (--start-unloadable)
    fractions: dict[str, ScenarioFraction] = field(default_factory=dict)  # the fraction each worker runs with

    def fraction(self, name: str) -> ScenarioFraction:
        """The fraction scenario `name`'s worker runs with (sglang's own where its resolver ran)."""
        f = self.fractions.get(name)
        return f if f is not None else scenario_fraction(self._scenario(name), self.reservations[name])

    def _scenario(self, name: str) -> Scenario:
        return next(s for s in self.scenarios if s.name == name)

    @property
    def skipped(self) -> dict[str, str]:
        """Run key → why the sweep does not start it (predicted not to load, unless asked to)."""
        return {} if self.start_unloadable else dict(self.unloadable)

    @property
    def starts_saved(self) -> int:
        return len(self.scenarios) - sum(len(g.started) for g in self.runs)


def _group_key(s: Scenario) -> tuple[Any, ...]:
    """Everything that changes what a worker does, except the decode graph's max_bs (the ladder covers it)."""
    d = scenario_dict(s)
    for k in ("name", "matrix", "source"):
        d.pop(k)
    d["decode_graph"] = {**d["decode_graph"], "max_bs": None}
    return tuple(sorted((k, repr(v)) for k, v in d.items()))


def group_scenarios(scenarios: list[Scenario], effective_max_bs: dict[str, int] | None = None) -> list[RunGroup]:
    """Scenarios that differ only in decode max_bs (no explicit bs list) share one start: the largest.

    `effective_max_bs` gives each scenario's decode max_bs after sglang's defaults (a left-out max_bs
    resolves per GPU size); the group launches the member whose ladder covers all the others.
    """
    eff = effective_max_bs or {}
    groups: dict[tuple[Any, ...], list[Scenario]] = {}
    order: list[tuple[Any, ...]] = []
    for s in scenarios:
        if s.pair is not None:
            k: tuple[Any, ...] = (("pair", s.pair),)
        else:
            k = _group_key(s) if s.decode_graph.bs is None else (("solo", s.name),)
        if k not in groups:
            groups[k] = []
            order.append(k)
        groups[k].append(s)
    runs = []
    for k in order:
        members = groups[k]
        if k[0][0] == "pair":
            pre = next((m for m in members if m.mode == "prefill"), None)
            dec = next((m for m in members if m.mode == "decode"), None)
            if pre is None or dec is None or len(members) != 2:
                raise MemfracError(f"pair {k[0][1]}: needs one prefill and one decode scenario, got "
                                   + ", ".join(f"{m.name} ({m.mode})" for m in members))  # fmt: skip
            runs.append(RunGroup(str(k[0][1]), pre, (pre, dec), peer=dec))
            continue
        launch = max(members, key=lambda m: eff.get(m.name, m.decode_graph.max_bs or 0))
        runs.append(RunGroup(launch.name, launch, tuple(members)))
    return runs


def assign_gpus(
    runs: list[RunGroup], gpus: list[int]
) -> tuple[list[tuple[RunGroup, list[int]]], list[tuple[RunGroup, str]]]:
    """A first-fit packing as the executor would do it when all runs take equally long (for the dry run)."""
    placed: list[tuple[RunGroup, list[int]]] = []
    bad: list[tuple[RunGroup, str]] = []
    for r in runs:
        if r.gpus_needed > len(gpus):
            bad.append((r, f"needs {r.gpus_needed} GPUs; {len(gpus)} given (--gpus)"))
            continue
        placed.append((r, []))
    # waves: fill the GPUs, then the next wave
    free = list(gpus)
    for i, (r, _) in enumerate(placed):
        if len(free) < r.gpus_needed:
            free = list(gpus)
        take, free = free[: r.gpus_needed], free[r.gpus_needed :]
        placed[i] = (r, take)
    return placed, bad


def run_limit_s(g: RunGroup) -> float:
    """The longest run `g` may take under its scenarios' limits (`run` table): start-up + load + stop grace; a
    pair starts both workers at once, then waits for the router (pair.ROUTER_READY_S) before its load."""
    from profiler.measure.runner.pair import ROUTER_READY_S

    r = g.launch.run
    if g.peer is None:
        return r.startup_timeout_s + r.load_timeout_s + r.stop_grace_s
    p = g.peer.run
    return (max(r.startup_timeout_s, p.startup_timeout_s) + ROUTER_READY_S + r.load_timeout_s
            + max(r.stop_grace_s, p.stop_grace_s))  # fmt: skip


def waves(runs: list[RunGroup], gpus: list[int]) -> list[list[RunGroup]]:
    """The runs as `assign_gpus` packs them: fill the GPUs in order, then the next wave (runs that fit no GPU set
    are left out)."""
    out: list[list[RunGroup]] = []
    free = 0
    for r in runs:
        if r.gpus_needed > len(gpus):
            continue
        if not out or free < r.gpus_needed:
            out.append([])
            free = len(gpus)
        out[-1].append(r)
        free -= r.gpus_needed
    return out


def estimated_s(runs: list[RunGroup], gpus: list[int]) -> float:
    """An estimate of the sweep's wall time from the limits: each wave lasts as long as its longest run may
    (`run_limit_s`), one wave after another. Nothing here was timed: it is what the limits allow."""
    return sum(max(run_limit_s(r) for r in w) for w in waves(runs, gpus))


def load_refusal(s: Scenario, r: Reservation, f: ScenarioFraction | None = None) -> str | None:
    """Why scenario `s` is predicted not to load under its fraction (`f`: sglang's own where its resolver ran;
    else the model's, from `r`), or None.

    sglang sizes the pool as free_at_start × mfs − weights (profiler.model.kv_budget); with free_at_start taken
    as the GPU's whole capacity — more than any worker really finds free — a budget ≤ 0 means the weights
    cannot fit under the fraction on that GPU."""
    mfs = f.value if f is not None else r.mem_fraction_static
    kv = kv_budget(s, mfs)
    if kv.budget_mib > 0:
        return None
    return (
        f"predicted not to load: weights ≈ {kv.weights_mib / 1024:.1f} GiB/GPU (estimated from config.json) do not "
        f"fit under mfs {mfs:.3f} of {s.gpu.total_mib} MiB ({s.gpu.name}); "
        "--start-unloadable starts it anyway"
    )


def make_plan(
    scenarios: list[Scenario], gpus: list[int], release: str = DEFAULT_RELEASE, validate: bool = False,
    start_unloadable: bool = False,
) -> Plan:  # fmt: skip
    """Group, pack and reserve; with `validate`, sglang's own resolver first refuses what it refuses
    (`profiler.engine.validation.check`: one line per refused scenario, before anything starts). Runs predicted
    not to load are listed in `unloadable` (and skipped unless `start_unloadable`)."""
    if not scenarios:
        raise MemfracError("no scenarios to sweep")
    validation = None
    if validate:
        from profiler.engine.validation import check

        validation = check(scenarios, release if release != DEFAULT_RELEASE else None)
    rules = rules_for(release)
    res = {s.name: reserve(inputs_from_scenario(s), rules) for s in scenarios}
    fr = {s.name: scenario_fraction(s, res[s.name], validation) for s in scenarios}
    runs = group_scenarios(scenarios, {n: r.resolved.decode_max_bs for n, r in res.items()})
    unloadable = {}
    for g in runs:
        why = next((w for s in g.started if (w := load_refusal(s, res[s.name], fr[s.name])) is not None), None)
        if why is not None:
            unloadable[g.key] = why
    _, bad = assign_gpus([g for g in runs if start_unloadable or g.key not in unloadable], gpus)
    return Plan(scenarios, runs, gpus, res, bad, validation, unloadable, start_unloadable, fr)


def _gib(x: float) -> str:
    return f"{x / 1024:.2f}"


def render_plan(plan: Plan, *, per_term: bool = True) -> str:
    """What --dry-run prints: runs, GPUs each needs, starts saved, sglang's own validation, the heuristic's
    reservation per scenario and each all-to-all buffer beside its reserve."""
    from profiler.core import ui

    skipped = plan.skipped
    placed, bad = assign_gpus([r for r in plan.runs if r.key not in skipped], plan.gpus)
    lines = [
        f"{len(plan.scenarios)} scenarios → {len(plan.runs) - len(skipped)} worker starts "
        f"({plan.starts_saved} saved by sharing decode-graph ladders"
        + (f", {len(skipped)} skipped: predicted not to load" if skipped else "")
        + f") on GPUs {plan.gpus or '[none]'}"
    ]

    def note(r: RunGroup) -> str:
        return "pair: prefill + decode + router" if r.peer is not None else str(len(r.members) - 1 or "")

    runs = [[r.key, r.gpus_needed, ",".join(map(str, gpus)), note(r)] for r, gpus in placed]
    runs += [[r.key, r.gpus_needed, "NOT RUNNABLE", why] for r, why in bad]
    runs += [[r.key, r.gpus_needed, "SKIPPED", skipped[r.key]] for r in plan.runs if r.key in skipped]
    lines.append(ui.table(["run", "GPUs", "GPU ids", "+ measured from its ladder"], runs,
                          right=[False, True, False, True], title="worker starts"))  # fmt: skip
    started = [r for r, _ in placed]
    ws = waves(started, plan.gpus)
    if ws:
        per = " + ".join(f"{max(run_limit_s(r) for r in w) / 60:.1f}" for w in ws)
        lines.append(f"estimated time: ≤ {estimated_s(started, plan.gpus) / 60:.0f} min in {len(ws)} wave(s) "
                     f"({per} min: each wave's longest run at its limits, start-up + load + stop grace, a pair's "
                     "router wait too; estimated from the limits, not timed)")  # fmt: skip
    if plan.validation is not None:
        lines.append(("" if plan.validation.validated else "note: ") + plan.validation.summary())
    rules = next(iter(plan.reservations.values())).rules
    rows, warnings = [], []
    for s in plan.scenarios:
        r = plan.reservations[s.name]
        f = plan.fraction(s.name)
        model = f"{f.model:.3f}" + (" ≠" if f.differs else "")
        row = [s.name, s.mode, f"{f.value:.3f}", f.source, model, _gib(r.reserved_mib), ",".join(r.flags)]
        if per_term:
            row.append(" · ".join(f"{t.name} {_gib(t.mib)}" for t in r.terms if t.on and t.mib))
        rows.append(row)
        kv = kv_budget(s, f.value)
        if kv.budget_mib <= 0:
            then = "started anyway (--start-unloadable)" if plan.start_unloadable else "skipped"
            warnings.append(
                f"! {s.name}: weights ≈ {kv.weights_mib / 1024:.1f} GiB/GPU do not fit under "
                f"mfs {f.value:.3f} of {s.gpu.total_mib} MiB: expect it to fail at load — {then}"
            )
        a2a = report_for(s, r)
        if a2a is not None:
            warnings.append(f"{s.name}: " + a2a_line(a2a))
        if f.note:
            warnings.append(f"! {s.name}: {f.note}")
    head = ["scenario", "mode", "mfs", "mfs from", "model mfs", "model reserve GiB", "flags"]
    head += ["terms GiB"] if per_term else []
    lines.append(ui.table(head, rows, right=[False, False, True, False, True, True, False, False],
                          title=f"heuristic reservation per scenario (sglang rules {rules})"))  # fmt: skip
    return "\n".join(lines + warnings)


def a2a_line(a: object) -> str:
    """One line: the all-to-all buffer beside its reserve (`profiler.model.a2a_inputs.A2AReport`)."""
    from profiler.model.a2a_inputs import A2AReport

    assert isinstance(a, A2AReport)
    z = a.size
    head = f"{z.backend} all-to-all buffer"
    if z.fails:
        return f"! {head}: creation fails — {z.fails}"
    if z.device_mib is None:
        return f"{head}: size unknown ({z.note.split(';')[0]}); reserve {_gib(a.reserve_mib)} GiB"
    verdict = {
        "oom": "larger than every non-KV term together: expect an OOM at capture or first dispatch",
        "over_reserve": f"exceeds its reserve by {_gib(a.excess_mib or 0)} GiB",
        "fits": "fits its reserve",
    }[a.verdict]
    ranks = a.inputs.num_ranks if a.inputs else "?"
    return (
        f"{head} {_gib(z.device_mib)} GiB ({z.tokens_per_rank} dispatch tokens/rank, {ranks} ranks) "
        f"vs reserve {_gib(a.reserve_mib)} GiB: {verdict}"
    )
