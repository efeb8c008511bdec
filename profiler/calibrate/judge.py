"""A calibration judged on whole runs: would the calibrated fraction have run each one out of memory?

For one run of a results directory (a probe run or an ingested log), with a set of fitted shapes:

- today's reserve and the calibrated one, through the one calibrated sum (`shapes.calibrated_sum`: max(pre-floor
  terms, floor) + post-floor terms), and the fraction each gives, round((gpu − reserve) ÷ gpu, 3) (× sglang's
  VLM factor where the run had one);
- the room each fraction leaves for everything after the KV pool: free at start × (1 − fraction) (sglang sizes
  the pool from free memory at start, not capacity). Where the judged rank printed no start reading the run's
  free at start is another rank's (`compare.run_free_at_start`, column free_at_start_how): an estimate, said per
  run and named in the evaluation's notes;
- the run's measured non-KV need, read from its ledger: used after the KV pool (free after the pool − the
  lowest free after it; `used_after_kv_mib`). Where no serving load was seen it is the startup need only (a
  lower bound: said so per run). A run that ran out of memory today has no measured need, only a lower
  bound: more than the room its own fraction left;
- out of memory under a fraction: need > room. A new OOM: out of memory with the calibrated fraction but not
  with today's heuristic one; an OOM avoided: the reverse;
- KV gained: free at start × (calibrated fraction − today's) MiB, tokens through kv_bytes_per_token.

A run whose fraction the user gave is judged as if the heuristic had set it (its need does not depend on the
fraction) and flagged. Runs that cannot be judged are kept, each with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from profiler.analyse.compare import other_rank_start
from profiler.calibrate.shapes import Fit, calibrated_sum
from profiler.core import ui
from profiler.model.heuristic.constants import FLOOR_GPU_MIB, FLOOR_MIB, PRE_FLOOR_TERMS, PREFILL_GRAPH_MLA_MIB
from profiler.model.modelcfg import MLA_ARCHITECTURES
from profiler.results.frames import as_float, as_text, finite, short_model

#: MiB of slack when asking "is the need above the room?" (the logs print GiB with two decimals: 10 MiB).
TOLERANCE_MIB = 1e-6
_OOM = ("oom_during_capture", "oom_startup", "oom_runtime")
_OLD_FORMULA = ("fraction_table", "band_base", "big_gpu", "dp_attention")
_MEASURED = ("under", "fits", "over")


def is_mla(row: pd.Series, reserved: float) -> bool:
    """MLA by architecture; an unknown architecture with exactly sglang's flat 1536 MiB counts as MLA."""
    arch = as_text(row.get("architecture"))
    return arch in MLA_ARCHITECTURES if arch else reserved == PREFILL_GRAPH_MLA_MIB


def run_terms(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """run_id → its term rows (total excluded), for runs whose reservation was modelled."""
    terms = df[(df["term"] != "total") & df["rules"].notna()]
    return {str(k): g for k, g in terms.groupby("run_id", sort=True)}


def floor_eligible(total: pd.Series, terms: pd.DataFrame) -> bool:
    """Whether sglang's floor applies: the GPU is above 60 GiB (unknown GPU: the floor's top-up was on)."""
    gpu = as_float(total.get("gpu_total_mib"))
    if gpu is not None:
        return gpu > FLOOR_GPU_MIB
    floor = terms[terms["term"] == "floor_topup"]["reserved_mib"]
    return bool((floor.fillna(0) > 0).any())


def heuristic_sized(total: pd.Series) -> bool:
    """Whether the heuristic set this run's fraction: not given by the user, and (GPU known) equal to it."""
    if as_text(total.get("mfs_origin")) == "given":
        return False
    mfs, hf = as_float(total.get("mfs")), as_float(total.get("heuristic_fraction"))
    if as_text(total.get("mfs_origin")) != "auto" and as_float(total.get("gpu_total_mib")) and mfs and hf:
        return abs(mfs - hf) < 0.0015
    return True


def run_sum(terms: pd.DataFrame, fits: dict[str, Fit], floor_on: bool) -> tuple[float, float, dict[str, float]]:
    """(today's reserve, the reserve with the fitted shapes, each term calibrated) of one run; x, hidden size,
    tp and the DeepEP analytic size come from the run's rows."""
    today: dict[str, float] = {}
    first = terms.iloc[0] if len(terms) else pd.Series(dtype=object)
    for _, row in terms.iterrows():
        today[str(row["term"])] = today.get(str(row["term"]), 0.0) + (as_float(row["reserved_mib"]) or 0.0)
    pg = today.get("prefill_graph", 0.0)
    t, n, each = calibrated_sum(
        today, fits, floor_on=floor_on, is_mla=bool(pg) and is_mla(first, pg),
        hidden=as_float(first.get("hidden_size")), tp=as_float(first.get("tp")),
        analytic=as_float(first.get("deepep_analytic_mib")),
    )  # fmt: skip
    return float(t), float(n), {k: float(v) for k, v in each.items()}


def decider(terms: dict[str, float], floor_on: bool, floor_mib: float = FLOOR_MIB) -> str:
    """What decides the fraction: 'floor' where it lifts the pre-floor terms, else the largest term."""
    pre = sum(v for k, v in terms.items() if any(p in PRE_FLOOR_TERMS for p in k.split("+")))
    if floor_on and pre < floor_mib:
        return "floor"
    return max(terms.items(), key=lambda kv: kv[1])[0] if terms else "—"


@dataclass(frozen=True, slots=True)
class TermJudgement:
    term: str
    today_mib: float
    calibrated_mib: float
    measured_mib: float | None  # where the source shows it


@dataclass(frozen=True, slots=True)
class RunJudgement:
    """One run under today's heuristic fraction and the calibrated one (see the module docstring)."""

    run_id: str
    model: str
    mode: str
    rules: str
    judged: bool
    why: str = ""  # why it cannot be judged, or what to know about how it was
    today_mib: float | None = None
    calibrated_mib: float | None = None
    today_fraction: float | None = None
    calibrated_fraction: float | None = None
    free_at_start_mib: float | None = None
    free_at_start_how: str = ""  # where it comes from (results' free_at_start_how; "" in results made before it)
    need_mib: float | None = None  # measured non-KV need (None: ran out of memory today, need unknown)
    need_how: str = ""
    room_today_mib: float | None = None
    room_calibrated_mib: float | None = None
    oom_today: bool | None = None
    oom_calibrated: bool | None = None
    new_oom: bool = False
    oom_avoided: bool = False
    kv_gained_mib: float | None = None
    kv_gained_tokens: int | None = None
    given_fraction: bool = False  # the user set the fraction: judged as if the heuristic had
    decides_today: str = ""
    decides_calibrated: str = ""
    terms: tuple[TermJudgement, ...] = ()


@dataclass(frozen=True, slots=True)
class ModeSummary:
    mode: str
    runs: int  # judged
    not_judged: int
    new_ooms: int
    ooms_avoided: int
    kv_gained_mib: float
    kv_gained_tokens: int | None  # over the runs whose KV bytes per token are known (None: none)
    runs_without_bytes_per_token: int
    decides_today: dict[str, int] = field(default_factory=dict)
    decides_calibrated: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Evaluation:
    """A calibration judged on runs: per node type and per run (`--format json`: as_dict)."""

    by: str  # "held-out results" | "leave-one-model-out"
    runs: tuple[RunJudgement, ...]
    modes: tuple[ModeSummary, ...]
    notes: tuple[str, ...] = ()

    @property
    def judged(self) -> tuple[RunJudgement, ...]:
        return tuple(r for r in self.runs if r.judged)

    @property
    def new_ooms(self) -> int:
        return sum(r.new_oom for r in self.runs)

    @property
    def ooms_avoided(self) -> int:
        return sum(r.oom_avoided for r in self.runs)

    @property
    def kv_gained_mib(self) -> float:
        return sum(r.kv_gained_mib or 0.0 for r in self.runs)

    @property
    def kv_gained_tokens(self) -> int | None:
        t = [r.kv_gained_tokens for r in self.runs if r.kv_gained_tokens is not None]
        return sum(t) if t else None

    def as_dict(self) -> dict[str, Any]:
        summary = {
            "by": self.by, "runs": len(self.judged), "not_judged": len(self.runs) - len(self.judged),
            "new_ooms": self.new_ooms, "ooms_avoided": self.ooms_avoided,
            "kv_gained_mib": round(self.kv_gained_mib, 1), "kv_gained_tokens": self.kv_gained_tokens,
            "per_node_type": [asdict(m) for m in self.modes], "notes": list(self.notes),
        }  # fmt: skip
        runs: list[dict[str, Any]] = []
        for r in self.runs:  # one row per run and term, then the run's whole reserve as term "total"
            runs += [{"run_id": r.run_id, "mode": r.mode} | asdict(t) for t in r.terms]
            d = asdict(r)
            d.pop("terms")
            runs.append(d | {"term": "total", "measured_mib": r.need_mib})
        return finite({"summary": summary, "runs": runs})


def _fraction(gpu: float, reserve: float) -> float:
    return round((gpu - reserve) / gpu, 3)


def judge_run(total: pd.Series, terms: pd.DataFrame | None, fits: dict[str, Fit]) -> RunJudgement:
    """One run under today's heuristic fraction and the calibrated one (see the module docstring)."""
    base = {"run_id": str(total["run_id"]), "model": short_model(total), "mode": as_text(total.get("mode"), "unknown"),
            "rules": as_text(total.get("rules"), "—")}  # fmt: skip

    def no(why: str) -> RunJudgement:
        return RunJudgement(**base, judged=False, why=why)

    if as_text(total.get("memory_kind"), "gpu") != "gpu":
        return no("host memory (a CPU run): no GPU fraction to judge")
    if terms is None or not len(terms):
        return no("no modelled reservation (the release's rules are unknown)")
    names = set(terms["term"].astype(str))
    if names & set(_OLD_FORMULA):
        return no(f"sized by pre-0.5.3 rules ({base['rules']}): a fraction formula, not a sum of the calibrated terms")
    gpu = as_float(total.get("gpu_total_mib"))
    if not gpu:
        return no("GPU capacity unknown: no fraction can be computed")
    start = as_float(total.get("free_at_start_mib"))
    if not start:
        return no("free memory at start unknown: the room after the KV pool cannot be computed")
    floor_on = floor_eligible(total, terms)
    r_today, r_cal, each = run_sum(terms, fits, floor_on)
    f_today, f_cal = _fraction(gpu, r_today), _fraction(gpu, r_cal)
    vlm = terms[(terms["term"] == "vlm_scaling") & (terms["reserved_mib"].fillna(0) > 0)]
    start_how = as_text(total.get("free_at_start_how"))
    notes = [f"free at start {start_how}"] if other_rank_start(start_how) else []
    if len(vlm) and f_today > 0:
        factor = (f_today - float(vlm["reserved_mib"].iloc[0]) / gpu) / f_today
        f_today, f_cal = f_today * factor, f_cal * factor
        notes.append(f"multimodal: both fractions × {factor:.4f}")
    room_t, room_c = start * (1 - f_today), start * (1 - f_cal)
    verdict = as_text(total.get("verdict"))
    used = as_float(total.get("used_after_kv_mib"))
    act = terms[terms["term"] == "activation"]
    served = bool(act["term_verdict"].isin(_MEASURED).any()) if len(act) else False
    given = not heuristic_sized(total)
    if given:
        notes.append("fraction given by the user: judged as if the heuristic had set it")
    need, how = None, ""
    oom_t = oom_c = None
    if verdict in _OOM:
        mfs = as_float(total.get("mfs"))
        room_run = start * (1 - mfs) if mfs is not None else None
        how = f"ran out of memory today ({verdict}): need above {room_run:,.0f} MiB" if room_run else (
            f"ran out of memory today ({verdict}); its fraction is unknown")  # fmt: skip
        if room_run is None:
            return no(how)
        oom_t = room_t <= room_run + TOLERANCE_MIB or None
        oom_c = True if room_c <= room_run + TOLERANCE_MIB else None
        if oom_c is None:
            notes.append("the calibrated room is larger than the run's: whether it avoids the OOM is unknown")
    elif used is not None:
        need = used
        how = "used after the KV pool, startup and serving" if served else (
            "used after the KV pool at startup (no serving load seen: a lower bound)")  # fmt: skip
        oom_t, oom_c = need > room_t + TOLERANCE_MIB, need > room_c + TOLERANCE_MIB
    else:
        return no(f"no measured need after the KV pool (verdict {verdict or 'unknown'}: the source does not show it)")
    bpt = as_float(total.get("kv_bytes_per_token"))
    kv = start * (f_cal - f_today)
    rows = []
    for _, row in terms.iterrows():
        name = str(row["term"])
        if name in each:
            m = as_float(row["measured_mib"]) if as_text(row.get("term_verdict")) in _MEASURED else None
            rows.append(TermJudgement(name, as_float(row["reserved_mib"]) or 0.0, each[name], m))
    floor_new = fits["floor_topup"].constant if "floor_topup" in fits else FLOOR_MIB
    return RunJudgement(
        **base, judged=True, why="; ".join(notes), today_mib=r_today, calibrated_mib=r_cal, today_fraction=f_today,
        calibrated_fraction=f_cal, free_at_start_mib=start, free_at_start_how=start_how, need_mib=need, need_how=how,
        room_today_mib=room_t, room_calibrated_mib=room_c, oom_today=oom_t, oom_calibrated=oom_c,
        new_oom=bool(oom_c) and oom_t is False, oom_avoided=oom_t is True and oom_c is False, kv_gained_mib=kv,
        kv_gained_tokens=round(kv * 2**20 / bpt) if bpt else None, given_fraction=given,
        decides_today=decider({t.term: t.today_mib for t in rows}, floor_on),
        decides_calibrated=decider({t.term: t.calibrated_mib for t in rows}, floor_on, floor_new), terms=tuple(rows),
    )  # fmt: skip


_ORDER = {"prefill": 0, "decode": 1, "null": 2}


def summarise(by: str, runs: Sequence[RunJudgement], notes: Iterable[str] = ()) -> Evaluation:
    """Per node type; the notes name the judged runs whose free at start is another rank's reading."""
    notes = list(notes)
    other = [r for r in runs if r.judged and other_rank_start(r.free_at_start_how)]
    if other:
        listed = "; ".join(f"{r.run_id}: {r.free_at_start_how}" for r in other)
        notes.append(f"{len(other)} judged run(s) rest on another rank's start reading (their judged rank printed "
                     f"no free memory before the weights): {listed}")  # fmt: skip
    modes: dict[str, list[RunJudgement]] = {}
    for r in runs:
        modes.setdefault(r.mode, []).append(r)
    out = []
    for mode, rs in sorted(modes.items(), key=lambda kv: (_ORDER.get(kv[0], 9), kv[0])):
        j = [r for r in rs if r.judged]
        toks = [r.kv_gained_tokens for r in j if r.kv_gained_tokens is not None]

        def count(attr: str, rs: list[RunJudgement] = j) -> dict[str, int]:
            c: dict[str, int] = {}
            for r in rs:
                c[getattr(r, attr)] = c.get(getattr(r, attr), 0) + 1
            return dict(sorted(c.items()))

        out.append(ModeSummary(
            mode, len(j), len(rs) - len(j), sum(r.new_oom for r in j), sum(r.oom_avoided for r in j),
            sum(r.kv_gained_mib or 0.0 for r in j), sum(toks) if toks else None, len(j) - len(toks),
            count("decides_today"), count("decides_calibrated"),
        ))  # fmt: skip
    return Evaluation(by, tuple(runs), tuple(out), tuple(notes))


def judge(df: pd.DataFrame, fits: dict[str, Fit], by: str = "held-out results",
          keep: Callable[[pd.Series], bool] | None = None) -> Evaluation:  # fmt: skip
    """Every run of a results frame (one total row each) under the fitted shapes."""
    by_run = run_terms(df)
    runs = [judge_run(t, by_run.get(str(t["run_id"])), fits) for _, t in df[df["term"] == "total"].iterrows()
            if keep is None or keep(t)]  # fmt: skip
    return summarise(by, runs)


def _mib(v: float | None) -> str | None:
    return None if v is None else f"{v:,.0f}"


def _yes(v: bool | None) -> str:
    return "?" if v is None else "yes" if v else "no"


def render_evaluation(ev: Evaluation, title: str) -> str:
    """The summary per node type, then one row per run, then the runs not judged with why (profiler.core.ui)."""
    rows = [[m.mode, m.runs, m.not_judged, m.new_ooms, m.ooms_avoided, f"{m.kv_gained_mib:+,.0f}",
             "—" if m.kv_gained_tokens is None else f"{m.kv_gained_tokens:+,}",
             ", ".join(f"{k} {n}" for k, n in m.decides_today.items()) or "—",
             ", ".join(f"{k} {n}" for k, n in m.decides_calibrated.items()) or "—"] for m in ev.modes]  # fmt: skip
    head = ["node type", "runs judged", "not judged", "new OOMs", "OOMs avoided", "KV gained MiB", "KV tokens",
            "decides today", "decides calibrated"]  # fmt: skip
    out = [ui.table(head, rows, right=[False, *([True] * 6), False, False], title=title,
                    caption=f"total: {len(ev.judged)} runs judged, {ev.new_ooms} new OOMs, {ev.ooms_avoided} "
                            f"avoided, KV {ev.kv_gained_mib:+,.0f} MiB; decides: the floor where it lifts the "
                            "terms, else the largest term")]  # fmt: skip
    runs = [[r.run_id[:48], r.mode, _mib(r.today_mib), _mib(r.calibrated_mib), f"{r.today_fraction:.3f}",
             f"{r.calibrated_fraction:.3f}", _mib(r.need_mib) or "OOM", _mib(r.room_today_mib),
             _mib(r.room_calibrated_mib), _yes(r.oom_today), _yes(r.oom_calibrated),
             f"{r.kv_gained_mib or 0:+,.0f}"] for r in ev.judged]  # fmt: skip
    if runs:
        head = ["run", "mode", "reserve today", "calibrated", "mfs today", "calibrated", "need", "room today",
                "room cal.", "OOM today", "OOM cal.", "KV MiB"]  # fmt: skip
        out.append(
            ui.table(
                head,
                runs,
                right=[False, False, *([True] * 10)],
                caption="MiB; need: used after the KV pool (ledger); room: free at start × (1 − mfs)",
            )
        )
    startup = [r.run_id for r in ev.judged if "lower bound" in r.need_how]
    if startup:
        out.append(f"need at startup only (no serving load seen: a lower bound) for {len(startup)} run(s)")
    given = [r.run_id for r in ev.judged if r.given_fraction]
    if given:
        out.append(f"fraction given by the user, judged as if the heuristic had set it: {len(given)} run(s)")
    skipped = [r for r in ev.runs if not r.judged]
    if skipped:
        out.append(f"not judged ({len(skipped)}):")
        out += [f"  {r.run_id}: {r.why}" for r in skipped]
    out += [f"note: {n}" for n in ev.notes]
    return "\n".join(out)


def render_terms(ev: Evaluation) -> str:
    """Per run and term: today's, the calibrated and the measured MiB (where the source shows it)."""
    rows = [[r.run_id[:48], t.term, _mib(t.today_mib), _mib(t.calibrated_mib), _mib(t.measured_mib) or "—"]
            for r in ev.judged for t in r.terms if t.today_mib or t.calibrated_mib]  # fmt: skip
    if not rows:
        return ""
    return ui.table(["run", "term", "today MiB", "calibrated MiB", "measured MiB"], rows,
                    right=[False, False, True, True, True], title="per term")  # fmt: skip
