"""calibration.json: the one codec that writes and reads it (calibrate writes; explain, audit and the patch read).

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
| activation | mib_per_token (+ fixed_mib) | `activation_tokens * ACTIVATION_MIB_PER_TOKEN` |
| parallel | mib_per_tp_pp (+ fixed_mib) | `tp_size * pp_size / 8 * 1024` (128 MiB per tp·pp) |
| decode_graph | mib_per_bs, mib_per_bs_per_hidden or mib_per_bs_per_hidden_over_tp (+ fixed_mib) | `max_bs * 2` |
| prefill_graph | mib_per_bucket (+ fixed_mib; non-MLA) and/or mla_mib | `len(prefill bs) * 8`, the MLA flat |
| floor_topup | floor_mib | `max(reserved_mem, FLOOR_MIB)` |
| deepep_a2a | analytic_factor + constant_mib (DeepEP analytic MiB × factor + constant), or constant_mib | `2 * 1024` |

`fits(doc)` turns the params back into the shapes every reader computes with
(`profiler.calibrate.shapes.Fit`, keyed by fit: prefill_graph_mla for mla_mib); a param name it does not know
is an error naming it, never a silent 0.

`evidence` is keyed by fit ("prefill_graph" and "prefill_graph_mla" are two fits of one term): runs, models,
worker starts, residuals (fitted − measured MiB, per run and min/max/mean), runs under-reserved today and
fitted, leave-one-out (by worker start) and leave-one-model-out, per-group fits, the runs excluded and why,
and whether the patch carries the constant (and why not).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from profiler.calibrate.fit import Calibration, HeldOut, TermResult, finite
from profiler.calibrate.shapes import Fit
from profiler.core.errors import FieldError, MemfracError
from profiler.core.validate import in_range, json_object
from profiler.model.heuristic.constants import (
    ACTIVATION_MIB_PER_TOKEN,
    CONSTANT_MIB,
    DECODE_GRAPH_MIB_PER_BS,
    DEEPEP_A2A_MIB,
    FLOOR_MIB,
    PARALLEL_MIB_PER_TP_PP,
    PREFILL_GRAPH_MIB_PER_BUCKET,
    PREFILL_GRAPH_MLA_MIB,
)

SCHEMA_VERSION = 1
#: A constant goes into the patch only when at least this many runs, from two worker starts, support it.
MIN_PATCH_RUNS = 2

#: fit key → the param names it writes (in calibration.json) and today's values.
_TODAY = {
    "constant": {"constant_mib": CONSTANT_MIB},
    "activation": {"mib_per_token": ACTIVATION_MIB_PER_TOKEN},
    "parallel": {"mib_per_tp_pp": PARALLEL_MIB_PER_TP_PP},
    "decode_graph": {"mib_per_bs": DECODE_GRAPH_MIB_PER_BS},
    "prefill_graph": {"mib_per_bucket": PREFILL_GRAPH_MIB_PER_BUCKET},
    "prefill_graph_mla": {"mla_mib": PREFILL_GRAPH_MLA_MIB},
    "floor_topup": {"floor_mib": FLOOR_MIB},
    "deepep_a2a": {"constant_mib": DEEPEP_A2A_MIB},
}
#: The per-unit param of each scaled term (its affine shape adds fixed_mib).
_PER_UNIT = {"activation": "mib_per_token", "parallel": "mib_per_tp_pp", "decode_graph": "mib_per_bs",
             "prefill_graph": "mib_per_bucket"}  # fmt: skip
#: Every param name a term may carry.
PARAM_NAMES = {
    "constant": {"constant_mib"}, "activation": {"mib_per_token", "fixed_mib"},
    "parallel": {"mib_per_tp_pp", "fixed_mib"},
    "decode_graph": {"mib_per_bs", "fixed_mib", "mib_per_bs_per_hidden", "mib_per_bs_per_hidden_over_tp"},
    "prefill_graph": {"mib_per_bucket", "fixed_mib", "mla_mib"}, "floor_topup": {"floor_mib"},
    "deepep_a2a": {"analytic_factor", "constant_mib"},
}  # fmt: skip


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
    if f.form == "per_hidden":
        return {"mib_per_bs_per_hidden": f.slope}
    if f.form == "affine_scaled":
        return {"fixed_mib": f.constant, "mib_per_bs_per_hidden_over_tp": f.slope}
    if f.form == "affine":
        return {"fixed_mib": f.constant, _PER_UNIT[t.key]: f.slope}
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
    if t.thin:
        return f"the fit {t.thin}: a constant fitted on one model is not carried upstream"
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
        "shape_why": t.shape_why,
        "candidates": [
            {"shape": c.shape, "form": c.fit.form, "slope": c.fit.slope, "constant": c.fit.constant,
             "held_out_by": None if c.held is None else c.held.by, "held_out_under": c.under,
             "held_out_mean_abs_mib": c.mean_abs_mib, "held_out_worst_under_mib": c.worst_under_mib,
             "chosen": c.chosen}
            for c in t.candidates
        ],
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
        entry.setdefault("shapes", {})[t.key] = t.fit.form
        if t.fit.form == "affine":
            today["fixed_mib"] = 0.0
        if t.fit.form == "affine_scaled":
            today = {"fixed_mib": 0.0, "mib_per_bs_per_hidden_over_tp": None, "mib_per_bs": DECODE_GRAPH_MIB_PER_BS}
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
        "held_out_reserve": None if c.held_out_reserve is None else c.held_out_reserve.as_dict(),
    })  # fmt: skip


def write_calibration(c: Calibration, path: str | Path) -> dict[str, Any]:
    d = calibration_json(c)
    p = Path(path)
    if p.parent and not p.parent.is_dir():
        raise MemfracError(f"--out {path}: directory {p.parent} does not exist")
    p.write_text(json.dumps(d, indent=1) + "\n")
    return d


def load_calibration(path: str | Path) -> dict[str, Any]:
    """A calibration.json, checked: one-line errors naming the file and the key. Every param is a finite number
    ≥ 0 (the fits are: `fit.affine` clamps both parts at 0), so a hand-edited −1280 never reaches a reserve."""
    if not Path(path).exists():
        raise MemfracError(f"--calibration {path}: no such file (write one with `memfrac calibrate R --out`)")
    d = json_object(path, "a calibration.json written by `memfrac calibrate --out` (a JSON object)")
    if not isinstance(d.get("terms"), dict):
        raise FieldError(path, "terms", d.get("terms"), "an object: term → {params: {name: number}} "
                         "(written by `memfrac calibrate --out`)")  # fmt: skip
    if d.get("schema_version") != SCHEMA_VERSION or isinstance(d.get("schema_version"), bool):
        raise FieldError(path, "schema_version", d.get("schema_version"), f"{SCHEMA_VERSION} (this memfrac reads 1)")
    for key in ("rules", "sglang_version"):
        if d.get(key) is not None and not isinstance(d[key], str):
            raise FieldError(path, key, d[key], "a release, e.g. \"0.5.23\" (a string)")
    for term, entry in d["terms"].items():
        if term not in PARAM_NAMES:
            raise FieldError(path, f"terms.{term}", term, f"a fitted term: {', '.join(PARAM_NAMES)}")
        ps = entry.get("params") if isinstance(entry, dict) else None
        if not isinstance(ps, dict):
            raise FieldError(path, f"terms.{term}.params", ps, "an object: name → number")
        bad = sorted(set(ps) - PARAM_NAMES[term])
        if bad:
            takes = ", ".join(sorted(PARAM_NAMES[term]))
            raise FieldError(path, f"terms.{term}.params.{bad[0]}", ps[bad[0]], f"a param {term} takes: {takes} "
                             "(written by `memfrac calibrate --out`)")  # fmt: skip
        for name, v in ps.items():
            in_range(path, f"terms.{term}.params.{name}", v, 0, None, "MiB or MiB per unit")
    fits(d, path)
    return d


def fits(d: dict[str, Any], path: str | Path = "calibration.json") -> dict[str, Fit]:
    """The calibration's shapes by fit key, read from the params (`load_calibration` checked the names)."""
    out: dict[str, Fit] = {}
    for term, entry in d["terms"].items():
        p = {k: float(v) for k, v in entry["params"].items()}
        fixed = p.get("fixed_mib")
        if term in ("constant", "floor_topup"):
            if p:
                out[term] = Fit("flat", constant=next(iter(p.values())))
        elif term == "deepep_a2a":
            if "analytic_factor" in p:
                out[term] = Fit("deepep", slope=p["analytic_factor"], constant=p.get("constant_mib", 0.0))
            elif "constant_mib" in p:
                out[term] = Fit("flat", constant=p["constant_mib"])
        elif term == "decode_graph" and "mib_per_bs_per_hidden_over_tp" in p:
            out[term] = Fit("affine_scaled", slope=p["mib_per_bs_per_hidden_over_tp"], constant=fixed or 0.0)
        elif term == "decode_graph" and "mib_per_bs_per_hidden" in p:
            out[term] = Fit("per_hidden", slope=p["mib_per_bs_per_hidden"])
        else:
            per = _PER_UNIT[term]
            if per in p:
                out[term] = Fit("per_unit", slope=p[per]) if fixed is None else Fit("affine", p[per], fixed)
            elif fixed is not None:
                raise MemfracError(f"--calibration {path}: terms.{term}.params: fixed_mib without {per}")
            if term == "prefill_graph" and "mla_mib" in p:
                out["prefill_graph_mla"] = Fit("flat", constant=p["mla_mib"])
    return out


def sized_by_note(d: dict[str, Any], rules: str) -> str | None:
    """The line readers print when the calibration's evidence was sized by other rules than the ones applied."""
    got = d.get("rules")
    if got and got != rules:
        return (f"calibration evidence sized by sglang {got} rules; applied with the {rules} rules "
                f"(--rules): each calibrated shape replaces the same term of {rules}")  # fmt: skip
    return None


# ---------------------------------------------------------------------------------------------------
# The patch
# ---------------------------------------------------------------------------------------------------
