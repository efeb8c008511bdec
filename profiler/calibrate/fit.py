"""`memfrac calibrate`: fit the constants behind sglang's reservation terms from what workers really used.

Each term is a constant times what sglang already multiplies it by (recovered from today's reserve, so a
fitted constant drops straight into the same line of memory_hook.py):

| term | x (from today's reserve) | fitted constant |
|---|---|---|
| activation | tokens = reserved ÷ ACTIVATION_MIB_PER_TOKEN | the shape chosen by held-out error (below) |
| decode_graph | decode max_bs = reserved ÷ DECODE_GRAPH_MIB_PER_BS | the shape chosen by held-out error (below) |
| prefill_graph | buckets = reserved ÷ PREFILL_GRAPH_MIB_PER_BUCKET (non-MLA) | by held-out error; MLA: flat + margin |
| parallel | tp·pp = reserved ÷ PARALLEL_MIB_PER_TP_PP | the shape chosen by held-out error (below) |
| constant | — | Q-quantile of measured + margin |
| deepep_a2a | deepep_analytic_mib (T, hidden, experts, ranks) | analytic × (1 + overhead) + constant |
| floor_topup | runs the floor sized | Q-quantile of what the pre-floor terms had to cover + margin |

Q = 1 takes the largest per-run ratio, so no run the constant was fitted on is under-reserved by it; leave-one-out
(fit without run i's worker start, test on run i) says how well it carries to a run it has not seen. Scenarios a
sweep estimated from another start's ladder are not evidence and stay out of the fits. The margin is added only
where a constant is absolute MiB (a per-unit slope already scales with its run). The decode-graph constant
becomes MiB per bs per unit of hidden size when every run knows its hidden size and there are at least two.

Only read inputs are evidence. x comes from today's reserve, and today's reserve from the heuristic's inputs
(decode max_bs, chunked_prefill_size, …); when a log did not print one and memfrac took sglang's default, x is
a guess and the ratio measured ÷ x means nothing (a default bs list once made a 47 MiB/bs "constant"). So a
run enters a term's fit only when results.parquet's `defaulted_inputs` (comma-separated HeuristicInputs
names taken from defaults; "" when every input was read) names none of the inputs that term's x rests on
(`X_INPUTS`); NA or a missing column is unknown and excludes the run from every term that rests on inputs.
Every exclusion is listed with its reason. Beside leave-one-out (by worker start) the fit is tested
leave-one-model-out, its residuals (fitted − measured, MiB) are reported, and it is refitted per model
family, attention backend and a2a backend where at least `MIN_GROUP_RUNS` runs of two groups support it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiler.calibrate.judge import (
    Evaluation,
    floor_eligible,
    heuristic_sized,
    is_mla,
    judge_run,
    run_sum,
    run_terms,
    summarise,
)
from profiler.calibrate.shapes import DIVISOR as _DIVISOR
from profiler.calibrate.shapes import Fit
from profiler.core.errors import MemfracError
from profiler.model.deepep import DeepEPExample, deepep_examples
from profiler.model.heuristic import DEFAULT_RULES
from profiler.model.heuristic.constants import (
    ACTIVATION_MIB_PER_TOKEN,
    CONSTANT_MIB,
    DECODE_GRAPH_MIB_PER_BS,
    DEEPEP_A2A_MIB,
    FLOOR_MIB,
    PARALLEL_MIB_PER_TP_PP,
    POST_FLOOR_TERMS,
    PRE_FLOOR_TERMS,
    PREFILL_GRAPH_MIB_PER_BUCKET,
    PREFILL_GRAPH_MLA_MIB,
)
from profiler.model.heuristic.record import SGLANG_TERM_SOURCE, TERM_NAMES
from profiler.model.scenario import BUNDLED_MODELS
from profiler.results.frames import (
    LadderSlope,
    as_float,
    as_text,
    derived_runs,
    finite,
    ladder_slopes,
    load_dirs,
    rule_sets_of,
    short_model,
)

#: Floating-point slack when asking "is measured above the reserve?" (MiB).
TOLERANCE_MIB = 1e-6
#: Terms sglang sums before the floor, and the ones it adds after it.
PRE_FLOOR = PRE_FLOOR_TERMS
POST_FLOOR = POST_FLOOR_TERMS
_BAD_RUN = ("oom_during_capture", "oom_startup", "oom_runtime", "failed", "incomplete")
#: A group (model family, attention backend, a2a backend) gets a fit of its own from this many runs.
MIN_GROUP_RUNS = 3

_GRAPH_DECODE = ("decode_max_bs", "decode_bs", "decode_backend", "disable_cuda_graph")
_ACTIVATION = ("chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "speculative_num_draft_tokens",
               "decode_max_bs", "decode_bs")  # fmt: skip
_PREFILL = ("chunked_prefill_size", "prefill_max_bs", "prefill_bs", "prefill_backend", "max_total_tokens")
#: The heuristic inputs (HeuristicInputs names, as `defaulted_inputs` lists them) each constant's x rests on.
X_INPUTS: dict[str, tuple[str, ...]] = {
    "constant": (),
    "activation": _ACTIVATION,
    "parallel": ("tp", "pp"),
    "decode_graph": _GRAPH_DECODE,
    "prefill_graph": _PREFILL,
    "prefill_graph_mla": ("prefill_backend",),
    # the floor's evidence is the whole pre-floor sum (was the floor on?) and the post-floor reserves
    "floor_topup": ("gpu_mem_mib", "tp", "pp", *_ACTIVATION, *_GRAPH_DECODE, *_PREFILL, "attn_dp", "deepep_tokens"),
    "deepep_a2a": ("deepep_tokens", "deepep_mode", "moe_a2a_backend"),
}
#: sglang's flag names and memfrac's column names for the same inputs.
_INPUT_ALIASES = {
    "tp_size": "tp", "pp_size": "pp", "attn_dp_size": "attn_dp", "cuda_graph_max_bs": "decode_max_bs",
    "cuda_graph_bs": "decode_bs", "cuda_graph_max_bs_decode": "decode_max_bs", "cuda_graph_bs_decode": "decode_bs",
    "cuda_graph_max_bs_prefill": "prefill_max_bs", "cuda_graph_bs_prefill": "prefill_bs",
    "deepep_dispatch_tokens": "deepep_tokens", "gpu_total_mib": "gpu_mem_mib",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Spec:
    """One fittable constant: the sglang term it belongs to, today's value and what it multiplies."""

    key: str
    term: str  # the sglang term name (SGLANG_TERM_SOURCE key)
    today: float
    unit: str  # what the constant is per ("" for absolute MiB)
    x_from: str  # how x is recovered, in words
    needs: str  # what measures it


_SPEC_ROWS = (
    ("constant", "constant", CONSTANT_MIB, "", "1 (absolute MiB)",
     "probe runs: attention backends, eager runner, finalize, disaggregation init"),
    ("activation", "activation", ACTIVATION_MIB_PER_TOKEN, "token", f"tokens = reserved ÷ {ACTIVATION_MIB_PER_TOKEN:g}",
     "probe runs under serving load (runtime peak)"),
    ("parallel", "parallel", PARALLEL_MIB_PER_TP_PP, "tp·pp", f"tp·pp = reserved ÷ {PARALLEL_MIB_PER_TP_PP:g}",
     "probe runs: non-torch growth after the KV pool"),
    ("decode_graph", "decode_graph", DECODE_GRAPH_MIB_PER_BS, "bs",
     f"decode max_bs = reserved ÷ {DECODE_GRAPH_MIB_PER_BS:g}",
     "a decode capture without attention DP (probe, or a log's capture line)"),
    ("prefill_graph", "prefill_graph", PREFILL_GRAPH_MIB_PER_BUCKET, "bucket",
     f"buckets = reserved ÷ {PREFILL_GRAPH_MIB_PER_BUCKET:g}", "a prefill capture of a non-MLA model"),
    ("prefill_graph_mla", "prefill_graph", PREFILL_GRAPH_MLA_MIB, "", "1 (absolute MiB)",
     "a prefill capture of an MLA model"),
    ("floor_topup", "floor_topup", FLOOR_MIB, "", "1 (absolute MiB)",
     "healthy runs the 10 GiB floor sized (GPU > 60 GiB), with used-after-KV"),
    ("deepep_a2a", "deepep_a2a", DEEPEP_A2A_MIB, "", "deepep_analytic_mib (NVL + RDMA + workspace bytes)",
     "probe runs with DeepEP (buffer creation)"),
)  # fmt: skip
SPECS: dict[str, Spec] = {r[0]: Spec(*r) for r in _SPEC_ROWS}


@dataclass(frozen=True, slots=True)
class Obs:
    """One run's evidence for one constant: what the term scales with (x) and what was measured."""

    run_id: str
    model: str
    mode: str
    x: float  # tokens, bs, buckets, tp·pp or analytic MiB; 1 for an absolute constant
    measured: float
    reserved: float  # today's reserve for this term in this run
    hidden: int | None = None
    tp: int | None = None
    unit_floor: float | None = None  # a per-unit rate the constant must also cover (decode ladder slope)
    group: str = ""  # the worker start that measured it: leave-one-out leaves the whole start out
    family: str = ""  # model family (architecture without its head suffix)
    attention: str = ""  # attention backend, when the results record it
    a2a: str = ""  # moe_a2a_backend
    rules: str = ""  # the rule set (or range, "0.5.9 … 0.5.12 (3 rule sets)") today's reserve was computed with
    rule_sets: tuple[str, ...] = ()  # every rule set that label names (results.parquet `rule_sets`)


@dataclass(frozen=True, slots=True)
class GroupFit:
    """The constant fitted on one group alone (a model family, an attention or a2a backend, a hidden size)."""

    dimension: str  # "model family" | "attention backend" | "a2a backend" | "hidden size" | "model"
    group: str
    runs: int
    value: float  # in the term's unit (MiB per unit, or MiB)


@dataclass(frozen=True, slots=True)
class Excluded:
    """A run that measured the term but is not evidence for its constant, and why."""

    run_id: str
    why: str


@dataclass(frozen=True, slots=True)
class HeldOut:
    """A fit tested on runs it was not fitted on: each held-out set predicted by the fit on the others."""

    by: str  # "worker start" | "model"
    sets: int  # how many held-out sets (worker starts or models)
    tested: int  # runs predicted
    under: tuple[str, ...]  # runs the held-out fit under-reserves
    residuals: tuple[tuple[str, float], ...] = ()  # (run, held-out prediction − measured MiB)


@dataclass(frozen=True, slots=True)
class TermResult:
    """A fitted constant against today's, with the runs it rests on and how it would have done."""

    key: str
    term: str
    sglang_source: str
    today: float
    unit: str
    observations: tuple[Obs, ...]
    fit: Fit | None
    formula: str  # the fitted reserve in words ("not observable in these results" when no data)
    form_note: str
    under_today: tuple[str, ...]
    under_fitted: tuple[str, ...]
    loo_tested: int
    loo_under: tuple[str, ...]
    groups: tuple[GroupFit, ...] = ()
    notes: tuple[str, ...] = ()
    excluded: tuple[Excluded, ...] = ()
    lomo: HeldOut | None = None  # leave-one-model-out (None: fewer than two models)
    loo: HeldOut | None = None  # leave-one-worker-start-out, with residuals
    residuals: tuple[float, ...] = ()  # fitted − measured MiB, aligned with observations (≥ 0: covered)
    candidates: tuple[Candidate, ...] = ()  # the shapes tried, each held out (per-unit terms)
    shape_why: str = ""  # why the chosen shape won

    @property
    def thin(self) -> str | None:
        """Why the fit rests on too little to patch (None: at least two runs of two models)."""
        if self.runs < 2:
            return f"rests on {self.runs} run"
        if len(self.models) < 2:
            return f"rests on one model ({self.models[0]})"
        return None

    @property
    def runs(self) -> int:
        return len(self.observations)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted({o.model for o in self.observations}))

    @property
    def starts(self) -> int:
        return len({o.group for o in self.observations})


@dataclass(frozen=True, slots=True)
class KvRecovered:
    """KV memory the fitted constants give back (negative: take away) for one node type."""

    mode: str
    runs: int
    runs_given_mfs: int  # the fraction was not the heuristic's (given by the user): constants do not move their pool
    mib: float
    mean_mib: float
    tokens: int | None
    runs_without_bytes_per_token: int


@dataclass(frozen=True, slots=True)
class Calibration:
    """Everything `memfrac calibrate` prints (text) or dumps (--json)."""

    results: tuple[str, ...]
    quantile: float
    margin_mib: float
    runs: int
    terms: tuple[TermResult, ...]
    unobservable: tuple[tuple[str, str], ...]  # sglang terms with no fit, and why
    scenarios_under_today: tuple[str, ...]
    scenarios_under_fitted: tuple[str, ...]
    scenarios_loo_under: tuple[str, ...]
    kv: tuple[KvRecovered, ...]
    ladders: tuple[LadderSlope, ...]
    deepep_examples: tuple[DeepEPExample, ...] = ()
    notes: tuple[str, ...] = field(default=())
    rules: str = ""  # the sglang rule set the evidence was sized with (most runs')
    sglang_version: str | None = None  # the sglang release most evidence ran (None: not recorded)
    held_out_reserve: Evaluation | None = None  # leave-one-model-out at the level of the whole reserve

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["terms"] = [asdict(t) | {"runs": t.runs} for t in self.terms]
        d["held_out_reserve"] = None if self.held_out_reserve is None else self.held_out_reserve.as_dict()
        d["unobservable"] = [
            {"term": t, "why": w, "sglang_source": SGLANG_TERM_SOURCE[t]} for t, w in self.unobservable
        ]
        return finite(d)


# ---------------------------------------------------------------------------------------------------
# Reading results directories
# ---------------------------------------------------------------------------------------------------


def family(row: pd.Series) -> str:
    """The model family: the architecture without its head ('LlamaForCausalLM' → 'Llama'); '' when unknown."""
    arch = as_text(row.get("architecture"))
    for suffix in ("ForCausalLMNextN", "ForCausalLM", "ForConditionalGeneration", "LMHeadModel", "Model"):
        if arch.endswith(suffix) and len(arch) > len(suffix):
            return arch[: -len(suffix)]
    return arch


def defaulted_inputs(row: pd.Series) -> frozenset[str] | None:
    """The heuristic inputs of this run taken from defaults rather than read (None: unknown)."""
    if "defaulted_inputs" not in row.index:
        return None
    v = row["defaulted_inputs"]
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    names = (n.strip() for n in str(v).split(","))
    return frozenset(_INPUT_ALIASES.get(n, n) for n in names if n)


def input_exclusion(row: pd.Series, key: str) -> str | None:
    """Why this run's x for constant `key` is not evidence (None: every input it rests on was read)."""
    needs = X_INPUTS[key]
    if not needs:
        return None
    got = defaulted_inputs(row)
    if got is None:
        where = "no defaulted_inputs column" if "defaulted_inputs" not in row.index else "defaulted_inputs is NA"
        return f"unknown whether {', '.join(needs[:3])}{', …' if len(needs) > 3 else ''} were read ({where})"
    hit = sorted(got & set(needs))
    if hit:
        return f"x rests on {', '.join(hit)}, taken from defaults rather than read"
    return None


def _candidates(df: pd.DataFrame, term: str) -> pd.DataFrame:
    """Rows where the term was on (reserved > 0) and measured against its reserve."""
    rows = df[(df["term"] == term) & df["term_verdict"].isin(["under", "fits", "over"])]
    rows = rows[rows["reserved_mib"].fillna(0) > 0]
    return rows[rows["measured_mib"].notna()]


def _screen(row: pd.Series, key: str, derived: set[str]) -> str | None:
    """Why a measured row is not evidence for constant `key` (None: it is)."""
    if str(row["run_id"]) in derived:
        return f"not started: estimated from run {as_text(row.get('derived_from'))}'s ladder"
    if as_text(row.get("memory_kind"), "gpu") != "gpu":
        return "host memory (a CPU run), not GPU memory"
    return input_exclusion(row, key)


def _obs(row: pd.Series, x: float, measured: float | None = None, unit_floor: float | None = None) -> Obs:
    hidden = as_float(row.get("hidden_size"))
    return Obs(
        run_id=str(row["run_id"]),
        model=short_model(row),
        mode=as_text(row.get("mode"), "unknown"),
        x=x,
        measured=float(row["measured_mib"]) if measured is None else measured,
        reserved=float(row["reserved_mib"]),
        hidden=int(hidden) if hidden else None,
        tp=int(tp) if (tp := as_float(row.get("tp"))) else None,
        unit_floor=unit_floor,
        group=as_text(row.get("group")) or str(row["run_id"]),
        family=family(row),
        attention=as_text(row.get("attention_backend")),
        a2a=as_text(row.get("moe_a2a_backend")),
        rules=as_text(row.get("rules")),
        rule_sets=rule_sets_of(row),
    )


def observations(
    df: pd.DataFrame, slopes: dict[str, LadderSlope]
) -> tuple[dict[str, list[Obs]], dict[str, list[Excluded]]]:
    """The evidence for every fittable constant (see the module table), and the runs left out with why."""
    derived = derived_runs(df)
    out: dict[str, list[Obs]] = {k: [] for k in SPECS}
    excl: dict[str, list[Excluded]] = {k: [] for k in SPECS}

    def take(key: str, r: pd.Series) -> bool:
        why = _screen(r, key, derived)
        if why is not None:
            excl[key].append(Excluded(str(r["run_id"]), why))
        return why is None

    for key in ("activation", "parallel", "decode_graph"):
        for _, r in _candidates(df, key).iterrows():
            if not take(key, r):
                continue
            floor = None
            if key == "decode_graph" and (s := slopes.get(str(r["run_id"]))) and s.slope_mib_per_bs is not None:
                floor = s.slope_mib_per_bs
            out[key].append(_obs(r, float(r["reserved_mib"]) / _DIVISOR[key], unit_floor=floor))
    for _, r in _candidates(df, "prefill_graph").iterrows():
        key = "prefill_graph_mla" if is_mla(r, float(r["reserved_mib"])) else "prefill_graph"
        if take(key, r):
            x = 1.0 if key == "prefill_graph_mla" else float(r["reserved_mib"]) / _DIVISOR[key]
            out[key].append(_obs(r, x))
    for _, r in _candidates(df, "constant").iterrows():
        if take("constant", r):
            out["constant"].append(_obs(r, 1.0))
    for _, r in _candidates(df, "deepep_a2a").iterrows():
        if take("deepep_a2a", r):
            analytic = as_float(r.get("deepep_analytic_mib"))
            out["deepep_a2a"].append(_obs(r, analytic if analytic and analytic > 0 else 0.0))
    out["floor_topup"], excl["floor_topup"] = floor_observations(df[~df["run_id"].isin(derived)])
    return out, excl


def _reserved(terms: pd.DataFrame, names: Sequence[str]) -> float:
    """Today's reserve of these terms, joined rows ('decode_graph+dp_padding') included."""
    sel = terms[terms["term"].map(lambda t: any(n in names for n in str(t).split("+")))]
    return float(sel["reserved_mib"].fillna(0).sum())


def floor_observations(df: pd.DataFrame) -> tuple[list[Obs], list[Excluded]]:
    """What the pre-floor terms had to cover in runs the floor sized (its top-up was on), in capacity MiB.

    need = used after the KV pool − post-floor reserves (+ the activation reserve when no serving load was
    seen), scaled by gpu_total ÷ free_at_start because sglang applies the fraction to capacity but the
    worker only gets free_at_start × (1 − mfs).
    """
    out, excl = [], []
    by_run = run_terms(df)
    totals = df[(df["term"] == "total") & ~df["verdict"].isin(_BAD_RUN)]
    for _, t in totals.iterrows():
        terms = by_run.get(str(t["run_id"]))
        used = as_float(t.get("used_after_kv_mib"))
        if terms is None or used is None or as_text(t.get("memory_kind"), "gpu") != "gpu":
            continue
        if not (terms[terms["term"] == "floor_topup"]["reserved_mib"].fillna(0) > 0).any():
            continue  # the floor did not size this run: its terms were above it
        why = input_exclusion(t, "floor_topup")
        if why is not None:
            excl.append(Excluded(str(t["run_id"]), why))
            continue
        act = terms[terms["term"] == "activation"]
        seen = act["term_verdict"].isin(["under", "fits", "over"]).any()
        unseen_act = 0.0 if seen else float(act["reserved_mib"].fillna(0).sum())
        need = used - _reserved(terms, POST_FLOOR) + unseen_act
        gpu, start = as_float(t.get("gpu_total_mib")), as_float(t.get("free_at_start_mib"))
        if gpu and start:
            need *= gpu / start
        pre = max(_reserved(terms, PRE_FLOOR), FLOOR_MIB)
        row = t.copy()
        row["reserved_mib"] = pre
        out.append(_obs(row, 1.0, measured=need))
    return out, excl


# ---------------------------------------------------------------------------------------------------
# Fitting
# ---------------------------------------------------------------------------------------------------


def upper_quantile(values: Sequence[float], q: float) -> float:
    """The Q-quantile, taken at an observed value (numpy 'higher'): Q = 1 is the max, never interpolated down."""
    return float(np.quantile(np.asarray(values, dtype=float), q, method="higher"))


def _ratio(o: Obs, per_hidden: bool) -> float:
    r = o.measured / o.x
    if o.unit_floor is not None:
        r = max(r, o.unit_floor)
    return r / o.hidden if per_hidden and o.hidden else r


def fit_per_unit(obs: Sequence[Obs], q: float, margin: float) -> Fit:
    """MiB per unit of x: the Q-quantile of the per-run ratios (no margin: the slope scales)."""
    return Fit("per_unit", slope=upper_quantile([_ratio(o, False) for o in obs], q))


def fit_decode(obs: Sequence[Obs], q: float, margin: float) -> Fit:
    """MiB per bs, × hidden size when every run knows its hidden size and there are at least two of them."""
    if shape_supported(obs):
        return Fit("per_hidden", slope=upper_quantile([_ratio(o, True) for o in obs], q))
    return fit_per_unit(obs, q, margin)


def shape_supported(obs: Sequence[Obs]) -> bool:
    return bool(obs) and all(o.hidden for o in obs) and len({o.hidden for o in obs}) >= 2


def fit_flat(obs: Sequence[Obs], q: float, margin: float) -> Fit:
    """An absolute MiB: the Q-quantile of what was measured, plus the margin."""
    return Fit("flat", constant=upper_quantile([o.measured for o in obs], q) + margin)


def fit_deepep(obs: Sequence[Obs], q: float, margin: float) -> Fit:
    """reserve = analytic × (1 + overhead) + constant.

    Fewer than 3 runs or 2 distinct analytic sizes: overhead = Q-quantile(measured ÷ analytic) − 1 and the
    constant is the margin. Otherwise the overhead is the least-squares slope − 1 (not below 0) and the
    constant is the Q-quantile of what is left over, plus the margin. Runs with no analytic size: flat.
    """
    with_analytic = [o for o in obs if o.x > 0]
    if not with_analytic:
        return fit_flat(obs, q, margin)
    xs = np.array([o.x for o in with_analytic])
    ys = np.array([o.measured for o in with_analytic])
    if len(with_analytic) < 3 or len(set(xs.tolist())) < 2:
        return Fit("deepep", slope=upper_quantile((ys / xs).tolist(), q), constant=margin)
    slope = max(1.0, float(np.polyfit(xs, ys, 1)[0]))
    return Fit("deepep", slope=slope, constant=upper_quantile((ys - slope * xs).tolist(), q) + margin)


_FITTERS: dict[str, Callable[[Sequence[Obs], float, float], Fit]] = {
    "constant": fit_flat,
    "activation": fit_per_unit,
    "parallel": fit_per_unit,
    "decode_graph": fit_decode,
    "prefill_graph": fit_per_unit,
    "prefill_graph_mla": fit_flat,
    "floor_topup": fit_flat,
    "deepep_a2a": fit_deepep,
}


def envelope(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(fixed, slope) of the lowest line that covers every (x, measured) point: min Σ (fixed + slope·x − y)
    subject to every residual ≥ 0, fixed ≥ 0 and slope ≥ 0 — a two-variable linear programme, so the optimum
    is a line through two points, a line through the origin and one point, or a flat line at the largest y.
    Ties (one distinct x: nothing tells the fixed part from the slope) take the smallest slope: the whole
    run is fixed, so it is neither scaled up nor down for another bs.
    """
    xs = np.array([p[0] for p in points], dtype=float)
    ys = np.array([p[1] for p in points], dtype=float)
    cands = [(float(ys.max()), 0.0)]
    cands += [(0.0, float(y / x)) for x, y in zip(xs, ys, strict=True) if x > 0]
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            if xs[i] != xs[j]:
                s_ = float((ys[j] - ys[i]) / (xs[j] - xs[i]))
                cands.append((float(ys[i] - s_ * xs[i]), s_))
    tol = 1e-6 * max(1.0, float(np.abs(ys).max()))
    ok = [(float(np.sum(a + b * xs - ys)), b, a) for a, b in cands
          if a >= -tol and b >= -1e-12 and np.all(a + b * xs - ys >= -tol)]  # fmt: skip
    _, slope, fixed = min(ok)
    return max(0.0, fixed), max(0.0, slope)


def fit_affine(obs: Sequence[Obs], q: float, margin: float) -> Fit:
    """A fixed part plus a per-unit part: the lowest line covering every run (`envelope`); Q = 1 always."""
    fixed, slope = envelope([(o.x, o.measured) for o in obs])
    return Fit("affine", slope=slope, constant=fixed)


def fit_affine_scaled(obs: Sequence[Obs], q: float, margin: float) -> Fit:
    """A fixed part plus a per-bs part × hidden ÷ tp: the envelope over (bs · hidden ÷ tp, measured)."""
    fixed, slope = envelope([(o.x * (o.hidden or 0) / max(o.tp or 1, 1), o.measured) for o in obs])
    return Fit("affine_scaled", slope=slope, constant=fixed)


def fit_per_hidden(obs: Sequence[Obs], q: float, margin: float) -> Fit:
    return Fit("per_hidden", slope=upper_quantile([_ratio(o, True) for o in obs], q))


def scaled_supported(obs: Sequence[Obs]) -> bool:
    return bool(obs) and all(o.hidden for o in obs) and len({o.hidden / max(o.tp or 1, 1) for o in obs}) >= 2


#: The shapes a per-unit term may take, in the order ties are broken (today's shape first).
SHAPES: dict[str, tuple[str, Callable[[Sequence[Obs], float, float], Fit]]] = {
    "ratio": ("MiB per unit, the largest per-run ratio (today's shape)", fit_per_unit),
    "fixed + per unit": ("a fixed MiB plus MiB per unit (the lowest covering line)", fit_affine),
    "per unit × hidden": ("MiB per unit per unit of hidden size", fit_per_hidden),
    "fixed + per unit × hidden/tp": ("a fixed MiB plus MiB per unit × hidden ÷ tp (what a rank's graph holds)",
                                     fit_affine_scaled),
}  # fmt: skip
SHAPED = ("activation", "parallel", "decode_graph", "prefill_graph")


@dataclass(frozen=True, slots=True)
class Candidate:
    """One shape of a term, judged held out: each model (or, with one model, each worker start) left out."""

    shape: str
    fit: Fit
    held: HeldOut | None
    under: int  # held-out runs it under-reserves
    mean_abs_mib: float | None  # mean |held-out prediction − measured|
    worst_under_mib: float | None  # the largest held-out shortfall (MiB, ≥ 0)
    chosen: bool = False
    notes: tuple[str, ...] = ()


def shape_candidates(key: str, obs: Sequence[Obs], q: float, margin: float) -> tuple[tuple[Candidate, ...], str]:
    """Every shape the data supports, each held out, and the chosen one with why (fewest held-out runs
    under-reserved, then the smallest mean held-out error; ties keep the earlier shape, today's first)."""
    names = ["ratio", "fixed + per unit"]
    if key == "decode_graph" and shape_supported(obs):
        names.append("per unit × hidden")
    if key == "decode_graph" and scaled_supported(obs):
        names.append("fixed + per unit × hidden/tp")
    by = "model" if len({o.model for o in obs}) >= 2 else "worker start"
    out: list[Candidate] = []
    for n in names:
        fitter = SHAPES[n][1]
        h = held_out(key, obs, q, margin, by, fitter=fitter)
        res = [r for _, r in h.residuals] if h else []
        notes = []
        if n == "ratio" and any(o.unit_floor is not None and o.unit_floor > o.measured / o.x for o in obs):
            notes.append("ladder slope binds: a run's first capture costs more per bs than its whole term")
        out.append(Candidate(n, fitter(obs, q, margin), h, len(h.under) if h else 0,
                             float(np.mean(np.abs(res))) if res else None,
                             max([-r for r in res if r < 0], default=0.0) if res else None,
                             notes=tuple(notes)))  # fmt: skip
    judged = [c for c in out if c.held is not None]
    if not judged:
        why = "one model and one worker start: no shape can be judged held out; today's shape (ratio) kept"
        return tuple(replace(c, chosen=c.shape == "ratio") for c in out), why
    best = min(judged, key=lambda c: (c.under, c.mean_abs_mib if c.mean_abs_mib is not None else math.inf))
    others = [c for c in judged if c is not best]
    why = (f"{best.shape}: {best.under} held-out run(s) under-reserved, mean held-out error "
           f"{best.mean_abs_mib or 0:,.1f} MiB (leave-one-{by}-out)")  # fmt: skip
    if others:
        why += "; " + "; ".join(f"{c.shape}: {c.under} under, {c.mean_abs_mib or 0:,.1f} MiB" for c in others)
    return tuple(replace(c, chosen=c is best) for c in out), why


def _under(fit: Fit, o: Obs) -> bool:
    return o.measured > fit.predict(o) + TOLERANCE_MIB


def held_out(
    key: str,
    obs: Sequence[Obs],
    q: float,
    margin: float,
    by: str = "worker start",
    fitter: Callable[[Sequence[Obs], float, float], Fit] | None = None,
) -> HeldOut | None:
    """Each set of runs (one worker start, or one model) predicted by the fit on all the others.

    None when there are fewer than two sets: nothing can be held out.
    """
    fitter = fitter or _FITTERS[key]
    if key == "deepep_a2a":
        obs = [o for o in obs if o.x > 0] or list(obs)
    label = (lambda o: o.group) if by == "worker start" else (lambda o: o.model)
    sets = sorted({label(o) for o in obs})
    if len(sets) < 2:
        return None
    under: list[str] = []
    resid: list[tuple[str, float]] = []
    for g in sets:
        fit = fitter([o for o in obs if label(o) != g], q, margin)
        for o in obs:
            if label(o) == g:
                resid.append((o.run_id, fit.predict(o) - o.measured))
                if _under(fit, o):
                    under.append(o.run_id)
    return HeldOut(by, len(sets), len(resid), tuple(sorted(under)), tuple(resid))


def leave_one_out(key: str, obs: Sequence[Obs], q: float, margin: float) -> tuple[int, tuple[str, ...]]:
    """(runs tested, runs under-reserved) when each worker start's runs are predicted by the fit on the others."""
    h = held_out(key, obs, q, margin, "worker start")
    return (0, ()) if h is None else (h.tested, h.under)


def _formula(spec: Spec, fit: Fit) -> str:
    if fit.form == "per_unit":
        return f"{fit.slope:.4g} MiB/{spec.unit}"
    if fit.form == "per_hidden":
        return f"{fit.slope * 1024:.4g} MiB/{spec.unit} per 1024 of hidden size ({fit.slope:.4g} × bs × hidden)"
    if fit.form == "affine":
        return f"{fit.constant:.0f} MiB + {fit.slope:.4g} MiB/{spec.unit}"
    if fit.form == "affine_scaled":
        return f"{fit.constant:.0f} MiB + {fit.slope * 1024:.4g} MiB/{spec.unit} per 1024 of hidden ÷ tp"
    if fit.form == "deepep":
        over = f"overhead {fit.slope - 1:+.1%}"
        return f"deepep_total(T, hidden, experts, ranks) × {fit.slope:.4g} + {fit.constant:.0f} MiB ({over})"
    return f"{fit.constant:.0f} MiB"


def _fit_value(fit: Fit) -> float:
    """A fit as one number in its term's unit: the slope (per hidden: per 1024 of hidden size) or the MiB."""
    if fit.form in ("per_hidden", "affine_scaled"):
        return fit.slope * 1024
    return fit.slope if fit.form in ("per_unit", "deepep", "affine") else fit.constant


_DIMENSIONS: tuple[tuple[str, Callable[[Obs], str]], ...] = (
    ("model family", lambda o: o.family),
    ("attention backend", lambda o: o.attention),
    ("a2a backend", lambda o: o.a2a),
)


def _groups(key: str, obs: Sequence[Obs], q: float, margin: float) -> tuple[GroupFit, ...]:
    """The constant refitted per model family, attention backend and a2a backend, where the data supports it.

    A dimension is shown when at least two of its groups (known values) have `MIN_GROUP_RUNS` runs each; only
    those groups are fitted (smaller groups stay in the pooled fit only). The decode graph also shows the
    per-model (or per-hidden-size) ratios whenever two models are in the data, as a spread.
    """
    out: list[GroupFit] = []
    fitter = _FITTERS[key]
    for dim, label in _DIMENSIONS:
        by: dict[str, list[Obs]] = {}
        for o in obs:
            if label(o):
                by.setdefault(label(o), []).append(o)
        big = {g: v for g, v in by.items() if len(v) >= MIN_GROUP_RUNS}
        if len(big) >= 2:
            out += [GroupFit(dim, g, len(v), _fit_value(fitter(v, q, margin))) for g, v in sorted(big.items())]
    if key == "decode_graph":
        per: dict[str, list[Obs]] = {}
        for o in obs:
            per.setdefault(f"hidden {o.hidden}" if o.hidden else o.model, []).append(o)
        if len(per) >= 2:
            dim = "hidden size" if all(o.hidden for o in obs) else "model"
            out += [GroupFit(dim, g, len(v), upper_quantile([_ratio(o, False) for o in v], q))
                    for g, v in sorted(per.items())]  # fmt: skip
    return tuple(out)


def _form_note(key: str, obs: Sequence[Obs], fit: Fit) -> str:
    models = len({o.model for o in obs})
    if fit.form in ("affine", "affine_scaled"):
        return f"{'a fixed part plus a per-unit part' if fit.form == 'affine' else 'fixed + per bs × hidden ÷ tp'}" \
               f" ({models} model(s))"  # fmt: skip
    if key == "decode_graph":
        if fit.form == "per_hidden":
            return f"per hidden size: {len({o.hidden for o in obs})} hidden sizes across {models} models"
        why = "one model" if models < 2 else f"{models} models, hidden size not known for every run"
        floors = sum(o.unit_floor is not None for o in obs)
        return f"one constant ({why})" + (f"; {floors} run(s) with a ladder slope" if floors else "")
    if key == "deepep_a2a":
        if fit.form == "flat":
            return "flat: no analytic DeepEP size recorded beside the measurements"
        n = sum(o.x > 0 for o in obs)
        return "least-squares slope, constant from the residuals" if fit.constant != 0 and n >= 3 else "ratio form"
    return {"per_unit": "one constant", "flat": "absolute MiB (+ margin)"}.get(fit.form, fit.form)


def evaluate_term(
    key: str, obs: Sequence[Obs], q: float, margin: float, excluded: Sequence[Excluded] = ()
) -> TermResult:
    """Fit one constant and judge it: under-reserved runs today and fitted, residuals, LOO and LOMO."""
    spec = SPECS[key]
    src = SGLANG_TERM_SOURCE[spec.term]
    under_today = tuple(o.run_id for o in obs if o.measured > o.reserved + TOLERANCE_MIB)
    if not obs:
        formula = "no evidence from read inputs" if excluded else "not observable in these results"
        return TermResult(key, spec.term, src, spec.today, spec.unit, (), None, formula, "", (), (), 0, (),
                          excluded=tuple(excluded))  # fmt: skip
    fitter = _FITTERS[key]
    candidates: tuple[Candidate, ...] = ()
    shape_why = ""
    if key in SHAPED:
        candidates, shape_why = shape_candidates(key, obs, q, margin)
        chosen = next(c for c in candidates if c.chosen)
        fitter = SHAPES[chosen.shape][1]
    fit = fitter(obs, q, margin)
    notes: list[str] = []
    if key == "deepep_a2a" and any(o.x <= 0 for o in obs) and fit.form == "deepep":
        notes.append(f"{sum(o.x <= 0 for o in obs)} run(s) without an analytic size were left out of the fit")
        obs = [o for o in obs if o.x > 0]
    loo = held_out(key, obs, q, margin, "worker start", fitter=fitter)
    if loo is None:
        notes.append("one worker start: leave-one-out needs at least two")
    lomo = held_out(key, obs, q, margin, "model", fitter=fitter)
    if lomo is None:
        notes.append("one model: leave-one-model-out needs at least two")
    return TermResult(
        key=key, term=spec.term, sglang_source=src, today=spec.today, unit=spec.unit, observations=tuple(obs),
        fit=fit, formula=_formula(spec, fit), form_note=_form_note(key, obs, fit), under_today=under_today,
        under_fitted=tuple(o.run_id for o in obs if _under(fit, o)), loo_tested=loo.tested if loo else 0,
        loo_under=loo.under if loo else (), groups=_groups(key, obs, q, margin), notes=tuple(notes),
        excluded=tuple(excluded), lomo=lomo, loo=loo, residuals=tuple(fit.predict(o) - o.measured for o in obs),
        candidates=candidates, shape_why=shape_why,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# KV memory recovered
# ---------------------------------------------------------------------------------------------------


def kv_recovered(df: pd.DataFrame, fits: dict[str, Fit]) -> tuple[KvRecovered, ...]:
    """Per node type: the KV pool change if sglang reserved with the fitted constants.

    kv = free_at_start × mfs − weights and mfs = (gpu − reserved) ÷ gpu, so a reserve lower by Δ gives the pool
    free_at_start × Δ ÷ gpu more MiB (Δ itself when either is unknown); tokens via kv_bytes_per_token.
    Runs whose fraction the heuristic did not set (given by the user) are counted apart: changing the
    constants would not change their pool.
    """
    by_run = run_terms(df)
    acc: dict[str, dict[str, float]] = {}
    for _, t in df[df["term"] == "total"].iterrows():
        terms = by_run.get(str(t["run_id"]))
        if terms is None or as_text(t.get("memory_kind"), "gpu") != "gpu":
            continue  # no modelled reservation, or a CPU run (host memory has no KV fraction)
        mode = as_text(t.get("mode"), "unknown")
        a = acc.setdefault(mode, {"runs": 0, "given": 0, "mib": 0.0, "tokens": 0.0, "no_bpt": 0})
        if not heuristic_sized(t):
            a["given"] += 1
            continue
        today, new, _ = run_sum(terms, fits, floor_eligible(t, terms))
        delta = today - new
        gpu, start = as_float(t.get("gpu_total_mib")), as_float(t.get("free_at_start_mib"))
        if gpu and start:
            delta *= start / gpu
        a["runs"] += 1
        a["mib"] += delta
        bpt = as_float(t.get("kv_bytes_per_token"))
        if bpt:
            a["tokens"] += delta * 2**20 / bpt
        else:
            a["no_bpt"] += 1
    order = {"prefill": 0, "decode": 1, "null": 2}
    return tuple(
        KvRecovered(m, int(a["runs"]), int(a["given"]), a["mib"], a["mib"] / a["runs"] if a["runs"] else 0.0,
                    round(a["tokens"]) if a["runs"] > a["no_bpt"] else None, int(a["no_bpt"]))
        for m, a in sorted(acc.items(), key=lambda kv: (order.get(kv[0], 9), kv[0]))
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------

_NO_PHASE = {
    "dp_padding": "measured only together with decode_graph (one capture)",
    "prefill_bcg_deepep": "measured only together with prefill_graph (one capture)",
    "speculative": "no phase spends this term alone",
    "xpu": "no phase spends this term alone",
    "vlm_scaling": "multiplies the fraction; no phase spends it",
    **{
        name: "a part of the pre-0.5.3 fraction formulas (a table by TP size, a reserve by GPU band): no "
        "constant of memory_hook.py to fit; those releases' reserve is judged as a whole"
        for name in ("fraction_table", "band_base", "big_gpu", "dp_attention")
    },
}


def _unobservable(results: Sequence[TermResult], df: pd.DataFrame) -> tuple[tuple[str, str], ...]:
    fitted = {r.term for r in results if r.fit is not None}
    out = []
    for name in TERM_NAMES:
        if name in fitted:
            continue
        why = _NO_PHASE.get(name, "not observable in these results")
        joined = df[df["term"].fillna("").str.contains(rf"(?:^|\+){name}(?:\+|$)") & df["measured_mib"].notna()]
        joined = joined[joined["term"] != name]
        if len(joined):
            names = ", ".join(sorted(set(joined["term"])))
            why += f"; {joined['run_id'].nunique()} run(s) measured it joined as {names}"
        out.append((name, why))
    return tuple(out)


def calibrate(
    results: Sequence[str], quantile_q: float = 1.0, margin_mib: float = 256.0, models_dir: Path | None = None
) -> Calibration:
    """Fit every constant the results can support and judge it against today's."""
    if not 0.0 <= quantile_q <= 1.0:
        raise MemfracError(f"--quantile {quantile_q}: must be between 0 and 1 (1 = the largest per-run ratio)")
    if margin_mib < 0 or not math.isfinite(margin_mib):
        raise MemfracError(f"--margin {margin_mib}: must be a finite number of MiB ≥ 0")
    df, ladder, notes = load_dirs(results)
    derived = derived_runs(df)
    if derived:
        notes.append(
            f"{len(derived)} derived scenario(s) (estimated from another start's ladder) left out of the fits; "
            "KV recovered counts them"
        )
    slopes = ladder_slopes(ladder[~ladder["run_id"].isin(derived)])
    obs, excluded = observations(df, slopes)
    terms = tuple(evaluate_term(k, obs[k], quantile_q, margin_mib, excluded[k]) for k in SPECS)
    if "defaulted_inputs" not in df.columns and len(df):
        notes.append(
            "results.parquet has no defaulted_inputs column: whether the heuristic's inputs were read or defaulted "
            "is unknown, so only terms whose x rests on no input (constant, MLA prefill graph) are fitted"
        )
    fits = {t.key: t.fit for t in terms if t.fit is not None}

    def union(attr: str) -> tuple[str, ...]:
        return tuple(sorted({r for t in terms for r in getattr(t, attr)}))

    if not len(df):
        notes.append("the results hold no runs")
    examples: tuple[DeepEPExample, ...] = ()
    de = fits.get("deepep_a2a")
    if de is not None and de.form == "deepep":
        examples = tuple(
            DeepEPExample(e.model, e.hidden, e.experts, e.tokens, e.analytic_mib, e.heap_rounded_mib,
                          de.predict(Obs("", e.model, "", e.heap_rounded_mib, 0.0, 0.0)))
            for e in deepep_examples(models_dir or BUNDLED_MODELS)
        )  # fmt: skip
    held = held_out_reserve(df, obs, excluded, quantile_q, margin_mib, derived)
    return Calibration(
        held_out_reserve=held,
        results=tuple(str(r) for r in results), quantile=quantile_q, margin_mib=margin_mib,
        runs=int(df["run_id"].nunique()), terms=terms, unobservable=_unobservable(terms, df),
        scenarios_under_today=union("under_today"), scenarios_under_fitted=union("under_fitted"),
        scenarios_loo_under=union("loo_under"), kv=kv_recovered(df, fits), ladders=tuple(slopes.values()),
        deepep_examples=examples, notes=tuple(notes), rules=_most_common(df, terms, "rules") or DEFAULT_RULES.name,
        sglang_version=_most_common(df, terms, "sglang_version"),
    )  # fmt: skip


def held_out_reserve(
    df: pd.DataFrame,
    obs: dict[str, list[Obs]],
    excluded: dict[str, list[Excluded]],
    q: float,
    margin: float,
    derived: set[str] = frozenset(),  # type: ignore[assignment]
) -> Evaluation | None:
    """Leave-one-model-out at the level of the whole reserve: for each model, every term refitted without its
    runs, and its runs judged (`judge.judge_run`: new OOMs, OOMs avoided, KV gained) under those fits.

    None when fewer than two models are in the evidence: nothing can be held out.
    """
    models = sorted({o.model for v in obs.values() for o in v})
    if len(models) < 2:
        return None

    def fits_without(m: str | None) -> dict[str, Fit]:
        fits = {}
        for k in SPECS:
            rest = [o for o in obs[k] if o.model != m]
            if rest:
                t = evaluate_term(k, rest, q, margin, excluded[k])
                if t.fit is not None:
                    fits[k] = t.fit
        return fits

    cache = {m: fits_without(m) for m in models}
    everything = fits_without(None)
    by_run = run_terms(df)
    runs = [
        judge_run(t, by_run.get(str(t["run_id"])), cache.get(short_model(t), everything))
        for _, t in df[(df["term"] == "total") & ~df["run_id"].isin(derived)].iterrows()
    ]
    return summarise("leave-one-model-out", runs, [
        f"each of {len(models)} models judged under the fits without it; runs of models that are not evidence "
        "for any term under the fits on everything (held out already)"])  # fmt: skip


def _most_common(df: pd.DataFrame, terms: Sequence[TermResult], col: str) -> str | None:
    """The most common value of a run-level column over the runs the fits rest on (all runs when none)."""
    if col not in df.columns or not len(df):
        return None
    runs = {o.run_id for t in terms for o in t.observations}
    rows = df[df["run_id"].isin(runs)] if runs else df
    vals = rows.drop_duplicates("run_id")[col].dropna().astype(str)
    vals = vals[vals != ""]
    return str(vals.value_counts().sort_index().idxmax()) if len(vals) else None
