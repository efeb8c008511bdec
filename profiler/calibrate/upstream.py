"""What a sglang maintainer carries upstream from a calibration: calibration.json, a patch, a calibrated reserve.

`memfrac calibrate R --out calibration.json` writes the fitted constants with their evidence:

    {"schema_version": 1,
     "rules": "0.5.23",              # the sglang rule set the evidence was sized with (its x recovered through)
     "sglang_version": "0.5.23",     # the release most of the evidence ran (null: not recorded)
     "results": [...], "quantile": 1.0, "margin_mib": 256.0,
     "terms": {"<term>": {"formula": "<text>", "params": {"<name>": number, ...}, "today": {same names},
                          "sglang_source": "<where it lives>", "evidence": {"<fit>": {...}}}},
     "not_fitted": {"<term>": "<why>"}}

Params per term (the names `memfrac audit --calibration` and `memfrac explain --calibration` read):

| term | params | today (0.5.23 memory_hook.py) |
|---|---|---|
| constant | constant_mib | `reserved_mem = 512` |
| activation | mib_per_token | `activation_tokens * 1.5` |
| parallel | mib_per_tp_pp | `tp_size * pp_size / 8 * 1024` (128 MiB per tp·pp) |
| decode_graph | mib_per_bs, or mib_per_bs_per_hidden (× bs × hidden size) | `max_bs * 2` |
| prefill_graph | mib_per_bucket (non-MLA) and/or mla_mib | `len(prefill bs) * 8`, `1.5 * 1024` |
| floor_topup | floor_mib | `max(reserved_mem, 10 * 1024)` |
| deepep_a2a | analytic_factor + constant_mib (DeepEP analytic MiB × factor + constant), or constant_mib | `2 * 1024` |

`evidence` is keyed by fit ("prefill_graph" and "prefill_graph_mla" are two fits of one term): runs, models,
worker starts, residuals (fitted − measured MiB, per run and min/max/mean), runs under-reserved today and
fitted, leave-one-out (by worker start) and leave-one-model-out, per-group fits, the runs excluded and why,
and whether the patch carries the constant (and why not).

`memfrac calibrate R --emit-patch FILE` writes a unified diff (difflib) against the installed sglang's
`sglang/srt/arg_groups/memory_hook.py` (paths `a/sglang/...`, apply with `patch -p1` in site-packages, or
`-p1 --directory=python` in a sglang checkout), replacing each constant the evidence justifies with a comment
citing it. Runs sized by another release's rules count for a term that release computes exactly as the
installed one does (`term_formula`: the decode graph has been 2 MiB × max_bs since 0.5.3); a term whose
formula differs is left as it is, with the reason.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import math
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from profiler.calibrate import SPECS, Calibration, HeldOut, TermResult, finite
from profiler.errors import MemfracError
from profiler.heuristic.rules import RULE_SETS, RuleSet
from profiler.logs.reserve import rule_sets_named

SCHEMA_VERSION = 1
#: A constant goes into the patch only when at least this many runs, from two worker starts, support it.
MIN_PATCH_RUNS = 2
HOOK_PATH = "sglang/srt/arg_groups/memory_hook.py"

#: fit key → the param names it writes (in calibration.json) and today's values.
_TODAY = {
    "constant": {"constant_mib": 512.0},
    "activation": {"mib_per_token": 1.5},
    "parallel": {"mib_per_tp_pp": 128.0},
    "decode_graph": {"mib_per_bs": 2.0},
    "prefill_graph": {"mib_per_bucket": 8.0},
    "prefill_graph_mla": {"mla_mib": 1536.0},
    "floor_topup": {"floor_mib": 10240.0},
    "deepep_a2a": {"constant_mib": 2048.0},
}


def ceil_sig(v: float, digits: int = 4) -> float:
    """Round up to `digits` significant digits: a constant written into sglang never under-reserves its fit."""
    if v <= 0 or not math.isfinite(v):
        return max(0.0, v) if math.isfinite(v) else v
    e = math.floor(math.log10(v)) - digits + 1
    m = 10.0**e
    return round(math.ceil(v / m - 1e-9) * m, max(0, -e))


def params(t: TermResult) -> dict[str, float]:
    """The fitted constant(s) of one fit under calibration.json's names."""
    f = t.fit
    if f is None:
        return {}
    if t.key == "decode_graph":
        return {"mib_per_bs_per_hidden": f.slope} if f.form == "per_hidden" else {"mib_per_bs": f.slope}
    if t.key == "deepep_a2a":
        return {"analytic_factor": f.slope, "constant_mib": f.constant} if f.form == "deepep" else {
            "constant_mib": f.constant}  # fmt: skip
    name = next(iter(_TODAY[t.key]))
    return {name: f.slope if f.form == "per_unit" else f.constant}


def patch_refusal(t: TermResult) -> str | None:
    """Why the patch leaves this constant as it is (None: it carries the fitted value)."""
    if t.fit is None:
        return "not fitted"
    if t.runs < MIN_PATCH_RUNS:
        return f"{t.runs} run(s): the patch needs at least {MIN_PATCH_RUNS}"
    if t.loo is None:
        return "one worker start: nothing tested it on a start it was not fitted on"
    if t.key == "deepep_a2a" and t.fit.form == "deepep":
        return "the fitted reserve scales with DeepEP's analytic buffer size, which memory_hook.py does not compute"
    lowers = any(t.fit.predict(o) < o.reserved for o in t.observations)
    held = sorted({r for h in (t.loo, t.lomo) if h is not None for r in h.under})
    if lowers and held:
        return (f"it would lower today's reserve, but held out it under-reserves {len(held)} run(s) "
                f"({', '.join(held[:3])}): not carried until more runs support it")  # fmt: skip
    return None


def _held(h: HeldOut | None) -> dict[str, Any] | None:
    if h is None:
        return None
    return {"sets": h.sets, "tested": h.tested, "under": list(h.under),
            "residuals_mib": {r: round(v, 3) for r, v in h.residuals}}  # fmt: skip


def evidence(t: TermResult) -> dict[str, Any]:
    res = [round(r, 3) for r in t.residuals]
    refusal = patch_refusal(t)
    return {
        "formula": t.formula,
        "form": None if t.fit is None else t.fit.form,
        "note": t.form_note,
        "runs": [o.run_id for o in t.observations],
        "models": list(t.models),
        "worker_starts": t.starts,
        "x": {o.run_id: o.x for o in t.observations},
        "measured_mib": {o.run_id: o.measured for o in t.observations},
        "residuals_mib": {
            "per_run": {o.run_id: r for o, r in zip(t.observations, res, strict=True)},
            "min": min(res) if res else None, "max": max(res) if res else None,
            "mean": round(sum(res) / len(res), 3) if res else None,
        },
        "under_today": list(t.under_today),
        "under_fitted": list(t.under_fitted),
        "loo": _held(t.loo),
        "lomo": _held(t.lomo),
        "groups": [{"by": g.dimension, "group": g.group, "runs": g.runs, "value": g.value} for g in t.groups],
        "excluded": [{"run_id": e.run_id, "why": e.why} for e in t.excluded],
        "notes": list(t.notes),
        "sized_by": sorted({o.rules for o in t.observations}),
        "patch": refusal is None,
        "patch_note": refusal or "carried by --emit-patch",
    }  # fmt: skip


def calibration_json(c: Calibration) -> dict[str, Any]:
    """calibration.json as a dict (see the module docstring)."""
    terms: dict[str, Any] = {}
    for t in c.terms:
        if t.fit is None:
            continue
        entry = terms.setdefault(t.term, {"formula": "", "params": {}, "today": {}, "sglang_source": t.sglang_source,
                                          "evidence": {}})  # fmt: skip
        entry["formula"] = "; ".join(x for x in (entry["formula"], t.formula) if x)
        entry["params"].update(params(t))
        today = dict(_TODAY[t.key])
        if t.key == "deepep_a2a" and t.fit.form == "deepep":
            today = {"analytic_factor": 0.0, "constant_mib": 2048.0}
        if t.key == "decode_graph" and t.fit.form == "per_hidden":
            today = {"mib_per_bs_per_hidden": None, "mib_per_bs": 2.0}
        entry["today"].update(today)
        entry["evidence"][t.key] = evidence(t)
    not_fitted = {}
    for t in c.terms:
        if t.fit is None and t.term not in terms:
            whys = "; ".join(sorted({e.why for e in t.excluded}))
            not_fitted[t.term] = f"{len(t.excluded)} run(s) measured it, none from read inputs: {whys}" if (
                t.excluded) else t.formula  # fmt: skip
    for name, why in c.unobservable:
        if name not in terms:
            not_fitted.setdefault(name, why)
    return finite({
        "schema_version": SCHEMA_VERSION, "rules": c.rules, "sglang_version": c.sglang_version,
        "results": list(c.results), "quantile": c.quantile, "margin_mib": c.margin_mib, "runs": c.runs,
        "terms": terms, "not_fitted": not_fitted, "notes": list(c.notes),
    })  # fmt: skip


def write_calibration(c: Calibration, path: str | Path) -> dict[str, Any]:
    d = calibration_json(c)
    p = Path(path)
    if p.parent and not p.parent.is_dir():
        raise MemfracError(f"--out {path}: directory {p.parent} does not exist")
    p.write_text(json.dumps(d, indent=1) + "\n")
    return d


def load_calibration(path: str | Path) -> dict[str, Any]:
    """A calibration.json, checked: one-line errors naming the file and the key."""
    try:
        d = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise MemfracError(f"--calibration {path}: no such file (write one with `memfrac calibrate R --out`)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise MemfracError(f"--calibration {path}: not JSON ({e})") from None
    if not isinstance(d, dict) or not isinstance(d.get("terms"), dict):
        raise MemfracError(f"--calibration {path}: no 'terms' object; not written by `memfrac calibrate --out`")
    if d.get("schema_version") != SCHEMA_VERSION:
        raise MemfracError(f"--calibration {path}: schema_version {d.get('schema_version')!r}; this memfrac reads 1")
    for term, entry in d["terms"].items():
        ps = entry.get("params") if isinstance(entry, dict) else None
        if not isinstance(ps, dict) or not all(isinstance(v, int | float) for v in ps.values()):
            raise MemfracError(f"--calibration {path}: terms.{term}.params must map names to numbers")
    return d


# ---------------------------------------------------------------------------------------------------
# The patch
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Edit:
    """One line of memory_hook.py a fitted constant replaces: found by its text, after an anchor line."""

    key: str
    function: str  # the def the line lives in
    old: str  # the line's stripped text
    after: str | None = None  # a stripped line it follows (for a text that occurs twice in the function)


EDITS = (
    Edit("constant", "handle_gpu_memory_settings", "reserved_mem = 512"),
    Edit("activation", "handle_gpu_memory_settings", "reserved_mem += activation_tokens * 1.5"),
    Edit("parallel", "handle_gpu_memory_settings", "reserved_mem += cfg.tp_size * cfg.pp_size / 8 * 1024",
         after="reserved_mem += activation_tokens * 1.5"),
    Edit("floor_topup", "handle_gpu_memory_settings", "reserved_mem = max(reserved_mem, 10 * 1024)"),
    Edit("decode_graph", "reserve_for_graph_mb", "reserved_mem += decode_cuda_graph_config.max_bs * 2"),
    Edit("prefill_graph", "reserve_for_graph_mb", "reserved_mem += len(prefill_cuda_graph_config.bs) * 8"),
    Edit("prefill_graph_mla", "reserve_for_graph_mb", "reserved_mem += 1.5 * 1024"),
    Edit("deepep_a2a", "reserve_for_deepep_a2a_mb", "return 2 * 1024"),
)  # fmt: skip


def _num(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e6 else f"{v:.0f}"


def _new_line(t: TermResult) -> str:
    f = t.fit
    assert f is not None
    if t.key == "decode_graph" and f.form == "per_hidden":
        return f"reserved_mem += decode_cuda_graph_config.max_bs * model_config_of(server_args).hidden_size * " \
               f"{ceil_sig(f.slope, 4)!r}"  # fmt: skip
    v = ceil_sig(f.slope if f.form == "per_unit" else f.constant, 4)
    return {
        "constant": f"reserved_mem = {_num(v)}",
        "activation": f"reserved_mem += activation_tokens * {_num(v)}",
        "parallel": f"reserved_mem += cfg.tp_size * cfg.pp_size * {_num(v)}",
        "floor_topup": f"reserved_mem = max(reserved_mem, {_num(v)})",
        "decode_graph": f"reserved_mem += decode_cuda_graph_config.max_bs * {_num(v)}",
        "prefill_graph": f"reserved_mem += len(prefill_cuda_graph_config.bs) * {_num(v)}",
        "prefill_graph_mla": f"reserved_mem += {_num(v)}",
        "deepep_a2a": f"return {_num(v)}",
    }[t.key]


def _comment(t: TermResult, c: Calibration, target: RuleSet) -> list[str]:
    lo = f"LOO {len(t.loo.under)}/{t.loo.tested} under" if t.loo else "no LOO"
    lomo = f"LOMO {len(t.lomo.under)}/{t.lomo.tested} under" if t.lomo else "one model (no LOMO)"
    res = f"{min(t.residuals):+.0f}…{max(t.residuals):+.0f}" if t.residuals else "—"
    q = "max" if c.quantile == 1.0 else f"{c.quantile:g}-quantile"
    today = SPECS[t.key].today
    labels = {o.rules for o in t.observations} - {target.name}
    named = {rs.name for lb in labels for rs in rule_sets_named(lb) if term_formula(rs, t.key)}
    sized = [n for n in RULE_SETS if n in named]  # in release order
    span = sized[0] if len(sized) == 1 else f"{sized[0]} … {sized[-1]}" if sized else ""
    return [
        f"memfrac calibrate ({q} of {t.runs} runs, {len(t.models)} model(s), {t.starts} worker start(s); "
        f"was {today:g}):",
        f"  {t.formula}; fitted − measured {res} MiB; {lo}; {lomo}.",
    ] + ([f"  {len(t.excluded)} run(s) excluded (defaulted/unknown inputs, estimates, host memory)."]
         if t.excluded else []) + (
        [f"  Runs sized by the sglang {span} rules ({len(labels)} label(s)): each computes the term as",
         f"  {target.name} does, {term_formula(target, t.key)}."]
        if sized else [])  # fmt: skip


def installed_hook(sglang_dir: Path | None = None) -> tuple[str, Path]:
    """(installed sglang version, path of its memory_hook.py)."""
    if sglang_dir is None:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise MemfracError("--emit-patch: sglang is not installed here (pip install 'memfrac[sglang]')")
        sglang_dir = Path(next(iter(spec.submodule_search_locations)))
    try:
        version = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        version = ""
    hook = sglang_dir / "srt" / "arg_groups" / "memory_hook.py"
    if not hook.is_file():
        raise MemfracError(f"--emit-patch: {hook} not found (sglang {version or '?'} has no arg_groups/memory_hook.py)")
    return version, hook


def _find(lines: list[str], e: Edit) -> int | None:
    """Index of the edit's line inside its function (after its anchor), or None."""
    start = next((i for i, ln in enumerate(lines) if ln.startswith(f"def {e.function}(")), None)
    if start is None:
        return None
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("def ", "class "))), len(lines))
    i = start
    if e.after is not None:
        i = next((j for j in range(start, end) if lines[j].strip() == e.after), end)
    return next((j for j in range(i, end) if lines[j].strip() == e.old), None)


@dataclass(frozen=True, slots=True)
class Patch:
    diff: str
    replaced: tuple[str, ...]  # fit keys carried
    left: tuple[tuple[str, str], ...]  # (fit key, why not)
    version: str
    hook: Path


def term_formula(rs: RuleSet, key: str) -> str | None:
    """How a rule set computes one fit's term, in words (None: the rule set has no such term). Two rule sets
    with the same words compute the term from the same x with the same constant, so a constant fitted on runs
    sized by one carries to the other's memory_hook.py; `heuristic/model.py` `evaluate` spells each out."""
    if rs.formula != "terms":
        return None  # pre-0.5.3rc2: a fraction table or a reserve by GPU band, not a sum of terms
    buckets = rs.pcg_term == "buckets"
    tokens = "decode nodes: running requests × draft tokens" if rs.role_aware else "chunked prefill size"
    return {
        "constant": "512 MiB",
        "activation": f"1.5 MiB × tokens ({tokens})",
        "parallel": "tp·pp / 8 GiB",
        "decode_graph": "2 MiB × decode max_bs",
        "prefill_graph": "8 MiB × prefill buckets" if buckets else None,
        "prefill_graph_mla": "1.5 GiB flat (MLA)" if buckets and rs.pcg_mla_flat else None,
        "floor_topup": "max(terms, 10 GiB) on GPUs > 60 GiB",
        "deepep_a2a": f"{rs.deepep_a2a_mib:g} MiB (DeepEP, after the floor)" if rs.deepep_a2a_mib else None,
    }[key]


def carry_refusal(t: TermResult, target: RuleSet) -> str | None:
    """Why a fitted constant does not carry to `target`'s memory_hook.py (None: every rule set its runs were
    sized with computes the term as `target` does, so the fitted constant means the same there)."""
    want = term_formula(target, t.key)
    if want is None:
        return f"the sglang {target.name} rules have no such term"
    for label in sorted({o.rules for o in t.observations}):
        sets = rule_sets_named(label)
        if not sets:
            return f"runs sized by unknown rules ({label or 'not recorded'})"
        found = {f for f in (term_formula(rs, t.key) for rs in sets) if f is not None}
        if not found:
            return f"runs sized by the {label} rules, which have no such term"
        other = sorted(found - {want})
        if other:
            return f"runs sized by the {label} rules, whose term is {other[0]}, not {want} as in {target.name}"
    return None


def make_patch(c: Calibration, sglang_dir: Path | None = None, version: str | None = None) -> Patch:
    """The unified diff of the installed memory_hook.py with every justified constant replaced (and cited).

    Runs sized by other rules than the installed release's still count for a term that those rules compute
    exactly as the installed release does (`carry_refusal`): sglang's decode-graph term has been 2 MiB × max_bs
    since 0.5.3, so a per-bs constant fitted on 0.5.9 logs is a per-bs constant of 0.5.23's memory_hook.py.
    """
    from profiler.heuristic import rules_for

    installed, hook = installed_hook(sglang_dir)
    installed = version if version is not None else installed
    if not installed:
        raise MemfracError("--emit-patch: the installed sglang's version is unknown; cannot check the release")
    target = rules_for(installed)
    text = hook.read_text()
    lines = text.splitlines(keepends=True)
    new = list(lines)
    by_key = {t.key: t for t in c.terms}
    replaced, left = [], []
    inserts: list[tuple[int, list[str]]] = []
    for e in EDITS:
        t = by_key.get(e.key)
        why = "not fitted" if t is None else patch_refusal(t) or carry_refusal(t, target)
        if why is None and t is not None:
            i = _find(lines, e)
            if i is None:
                raise MemfracError(
                    f"--emit-patch: {hook}: line {e.old!r} not found in {e.function}(); this memory_hook.py is not "
                    f"the {c.rules} one memfrac knows"
                )
            line = _new_line(t)
            if line == e.old:
                left.append((e.key, "the fitted value equals today's"))
                continue
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            new[i] = f"{indent}{line}\n"
            inserts.append((i, [f"{indent}# {x}\n" for x in _comment(t, c, target)]))
            replaced.append(e.key)
        else:
            left.append((e.key, why or "not fitted"))
    for i, block in sorted(inserts, reverse=True):
        new[i:i] = block
    if not replaced:
        why = "; ".join(f"{k}: {w}" for k, w in left)
        raise MemfracError(
            f"--emit-patch: no constant is justified by these results for the installed sglang {installed}'s "
            f"memory_hook.py ({why})"
        )
    diff = "".join(difflib.unified_diff(lines, new, f"a/{HOOK_PATH}", f"b/{HOOK_PATH}"))
    return Patch(diff, tuple(replaced), tuple(left), installed, hook)


# ---------------------------------------------------------------------------------------------------
# A calibrated reserve for one scenario (memfrac explain --calibration)
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CalibratedTerm:
    name: str
    today_mib: float
    calibrated_mib: float
    how: str  # which param, or "unchanged"


@dataclass(frozen=True, slots=True)
class CalibratedReserve:
    terms: tuple[CalibratedTerm, ...]
    today_mib: float
    calibrated_mib: float
    today_fraction: float
    calibrated_fraction: float
    notes: tuple[str, ...]


_PRE = ("constant", "activation", "parallel", "decode_graph", "dp_padding", "prefill_graph", "prefill_bcg_deepep")


def calibrated_reserve(scenario: Any, reservation: Any, cal: dict[str, Any]) -> CalibratedReserve:
    """sglang's sum with the calibrated constants: max(pre-floor terms, floor) + post-floor terms → fraction.

    Each term's x comes from today's MiB exactly as calibrate recovers it (tokens = MiB ÷ 1.5, bs = MiB ÷ 2,
    buckets = MiB ÷ 8, tp·pp = MiB ÷ 128); terms without calibrated params keep today's MiB.
    """
    p = {t: e.get("params", {}) for t, e in cal["terms"].items()}
    gpu = float(scenario.gpu.total_mib)
    notes: list[str] = []
    if cal.get("rules") and cal["rules"] != reservation.rules:
        notes.append(f"calibrated for sglang {cal['rules']} rules; explained with {reservation.rules}")
    out: list[CalibratedTerm] = []
    pre_today = pre_new = post_today = post_new = 0.0
    floor_new = float(p.get("floor_topup", {}).get("floor_mib", 10240.0))
    for t in reservation.terms:
        if t.name in ("floor_topup", "vlm_scaling"):
            continue
        today = float(t.mib) if t.on else 0.0
        new, how = today, "unchanged"
        tp = p.get(t.name, {})
        if t.on and today > 0:
            if t.name == "constant" and "constant_mib" in tp and today == 512.0:
                new, how = float(tp["constant_mib"]), "constant_mib"
            elif t.name == "activation" and "mib_per_token" in tp:
                new, how = today / 1.5 * tp["mib_per_token"], f"{today / 1.5:g} tokens × mib_per_token"
            elif t.name == "parallel" and "mib_per_tp_pp" in tp:
                new, how = today / 128.0 * tp["mib_per_tp_pp"], f"tp·pp {today / 128.0:g} × mib_per_tp_pp"
            elif t.name == "decode_graph" and "mib_per_bs" in tp:
                new, how = today / 2.0 * tp["mib_per_bs"], f"bs {today / 2.0:g} × mib_per_bs"
            elif t.name == "decode_graph" and "mib_per_bs_per_hidden" in tp:
                hidden = scenario.shape.hidden_size
                new = today / 2.0 * hidden * tp["mib_per_bs_per_hidden"]
                how = f"bs {today / 2.0:g} × hidden {hidden} × mib_per_bs_per_hidden"
            elif t.name == "prefill_graph" and scenario.shape.is_mla and "mla_mib" in tp:
                new, how = float(tp["mla_mib"]), "mla_mib"
            elif t.name == "prefill_graph" and not scenario.shape.is_mla and "mib_per_bucket" in tp:
                new, how = today / 8.0 * tp["mib_per_bucket"], f"{today / 8.0:g} buckets × mib_per_bucket"
            elif t.name == "deepep_a2a" and "analytic_factor" in tp:
                from profiler.sweep import deepep_sizes_mib

                analytic, _ = deepep_sizes_mib(scenario)
                if analytic is None:
                    notes.append("deepep_a2a: no analytic DeepEP size for this shape; today's 2 GiB kept")
                else:
                    new = analytic * tp["analytic_factor"] + tp.get("constant_mib", 0.0)
                    how = f"analytic {analytic:,.0f} MiB × analytic_factor + constant_mib"
            elif t.name == "deepep_a2a" and "constant_mib" in tp:
                new, how = float(tp["constant_mib"]), "constant_mib"
        out.append(CalibratedTerm(t.name, today, new, how))
        if t.name in _PRE:
            pre_today, pre_new = pre_today + today, pre_new + new
        else:
            post_today, post_new = post_today + today, post_new + new
    floor_on = gpu > 60 * 1024
    ft_today = max(0.0, 10240.0 - pre_today) if floor_on else 0.0
    ft_new = max(0.0, floor_new - pre_new) if floor_on else 0.0
    how = "floor_mib − pre-floor terms" if floor_on else "no floor (GPU ≤ 60 GiB)"
    out.insert(min(7, len(out)), CalibratedTerm("floor_topup", ft_today, ft_new, how))
    today_total = pre_today + ft_today + post_today
    new_total = pre_new + ft_new + post_new
    f_today = round((gpu - today_total) / gpu, 3)
    f_new = round((gpu - new_total) / gpu, 3)
    vlm = next((t for t in reservation.terms if t.name == "vlm_scaling" and t.on), None)
    if vlm is not None and f_today > 0:
        factor = (f_today - vlm.mib / gpu) / f_today
        f_today, f_new = f_today * factor, f_new * factor
        notes.append(f"multimodal: both fractions × {factor:.4f} (sglang's VLM scaling)")
    if abs(today_total - reservation.reserved_mib) > 1e-6 and vlm is None:
        notes.append(f"today's sum {today_total:g} MiB differs from the model's {reservation.reserved_mib:g} MiB")
    return CalibratedReserve(tuple(out), today_total, new_total, f_today, f_new, tuple(notes))
