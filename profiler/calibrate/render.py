"""`memfrac calibrate`'s text: the fitted constants beside today's, their evidence, residuals and held-out errors.

The numbers are `fit`'s; this module only lays them out (`render_text`), so a change of wording never touches a fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from profiler.calibrate.fit import (
    _DIMENSIONS,
    MIN_GROUP_RUNS,
    SPECS,
    Calibration,
    HeldOut,
    Obs,
    TermResult,
    _formula,
)
from profiler.calibrate.judge import render_evaluation
from profiler.core import ui


def _label(t: TermResult) -> str:
    return t.term + (" (MLA)" if t.key == "prefill_graph_mla" else "")


def _evidence_row(t: TermResult, o: Obs, resid: float) -> list[Any]:
    fitted = None if t.fit is None else f"{t.fit.predict(o):.1f}"
    loo = dict(t.loo.residuals) if t.loo else {}
    lomo = dict(t.lomo.residuals) if t.lomo else {}
    held = [None if r is None else f"{r:+.1f}" for r in (loo.get(o.run_id), lomo.get(o.run_id))]
    return [o.run_id[:52], o.model[:28], f"{o.x:g}", f"{o.measured:.1f}", f"{o.reserved:.1f}", fitted,
            f"{resid:+.1f}", *held]  # fmt: skip


def _today_text(t: TermResult) -> str:
    return f"{t.today:g} MiB" + (f"/{t.unit}" if t.unit else "")


def residual_range(values: Sequence[float]) -> str:
    """'+0.0 … +812.4' (fitted − measured MiB; negative: under-reserved)."""
    return "—" if not values else f"{min(values):+.1f} … {max(values):+.1f}"


def _held_text(h: HeldOut | None) -> str:
    return "n/a" if h is None else f"{len(h.under)}/{h.tested}"


def rules_span(c: Calibration) -> str:
    """The rule sets the evidence was sized with: one ("sglang 0.5.23 rules"), or the range over every run's rule
    sets in release order ("sglang 0.4.0 … 0.5.23 rules (12 rule sets)") — ingested logs span many releases, and
    naming only the most common one read as if all were sized by it."""
    from profiler.model.heuristic import RULE_SETS

    names = {n for t in c.terms for o in t.observations for n in o.rule_sets}
    order = [n for n in RULE_SETS if n in names] + sorted(names - set(RULE_SETS))
    if len(order) <= 1:
        return f"sglang {order[0] if order else c.rules} rules"
    return f"sglang {order[0]} … {order[-1]} rules ({len(order)} rule sets)"


def render_text(c: Calibration) -> str:
    """The calibration as a maintainer reads it: one line per sglang term, then the evidence (profiler.core.ui)."""
    q = "max" if c.quantile == 1.0 else f"{c.quantile:g}-quantile"
    lines = [
        f"memfrac calibrate: {c.runs} runs from {len(c.results)} results dir(s), sized by {rules_span(c)}; "
        f"constant = {q} of the per-run ratios; +{c.margin_mib:g} MiB margin on absolute constants",
        "",
    ]
    rows = []
    for t in c.terms:
        if t.fit is None:
            continue
        rows.append([_label(t), _today_text(t), t.formula, t.runs, len(t.models), len(t.excluded),
                     len(t.under_today), len(t.under_fitted), residual_range(t.residuals), _held_text(t.loo),
                     _held_text(t.lomo)])  # fmt: skip
    if rows:
        head = ["sglang term", "today", "fitted", "runs", "models", "excluded", "under today", "under fitted",
                "residual MiB", "LOO under", "LOMO under"]  # fmt: skip
        right = [False, False, False, True, True, True, True, True, True, True, True]
        lines.append(ui.table(head, rows, right=right, caption="residual = fitted − measured (negative: under); "
                              "LOO: each worker start held out; LOMO: each model held out"))  # fmt: skip
    else:
        lines.append("no constant can be fitted: no term is observable from read inputs in these results")
    lines += ["", "where each lives in sglang (memory_hook.py):"]
    for t in c.terms:
        if t.fit is not None and t.key != "prefill_graph_mla":
            lines.append(f"  {t.term}: {t.sglang_source}")
    lines += ["", "not fitted:"]
    for t in c.terms:
        if t.fit is None:
            why = (f"{len(t.excluded)} run(s) measured it, none from read inputs (see below)" if t.excluded
                   else f"not observable in these results (needs {SPECS[t.key].needs})")  # fmt: skip
            lines.append(f"  {_label(t)}: {why}")
    for name, why in c.unobservable:
        if name not in {t.term for t in c.terms}:
            lines.append(f"  {name}: {why}")
    for t in c.terms:
        if t.fit is not None:
            lines += ["", f"{_label(t)}: {t.form_note}; x = {SPECS[t.key].x_from}"]
            ev = [_evidence_row(t, o, r) for o, r in zip(t.observations, t.residuals, strict=True)]
            head = ["run", "model", "x", "measured", "today", "fitted", "residual", "LOO residual", "LOMO residual"]
            lines.append(ui.table(head, ev, right=[False, False, *([True] * 7)]))
            unit = f"MiB/{t.unit}" if t.unit else "MiB"
            grouped = {d for d, _ in _DIMENSIONS}
            for rows, title in (
                ([x for x in t.groups if x.dimension in grouped],
                 f"{_label(t)} fitted per group (≥ {MIN_GROUP_RUNS} runs a group)"),
                ([x for x in t.groups if x.dimension not in grouped],
                 f"{_label(t)} per model or hidden size: the spread of the runs' ratios (any number of runs)"),
            ):  # fmt: skip
                if rows:
                    g = [[x.dimension, x.group, x.runs, f"{x.value:.4g}"] for x in rows]
                    lines.append(ui.table(["by", "group", "runs", unit], g, right=[False, False, True, True],
                                          title=title))  # fmt: skip
            if t.candidates:
                by = next((c.held.by for c in t.candidates if c.held), None)
                cand = [[c.shape, _formula(SPECS[t.key], c.fit),
                         "n/a" if c.held is None else f"{c.under}/{c.held.tested}",
                         "—" if c.mean_abs_mib is None else f"{c.mean_abs_mib:,.1f}",
                         "—" if c.worst_under_mib is None else f"{c.worst_under_mib:,.1f}", "yes" if c.chosen else ""]
                        for c in t.candidates]  # fmt: skip
                lines.append(ui.table(
                    ["shape", "fitted on all", "held-out under", "mean |error| MiB", "worst under MiB", "chosen"], cand,
                    right=[False, False, True, True, True, False],
                    title=f"{_label(t)} shapes, each held out ({'leave-one-' + by + '-out' if by else 'not held out'})",
                    caption=f"chosen: {t.shape_why}" + (f"; not patched: the fit {t.thin}" if t.thin else ""),
                ))  # fmt: skip
            lines += [f"  note: {n}" for n in t.notes]
        if t.excluded:
            lines += ["", f"{_label(t)}: {len(t.excluded)} run(s) excluded from the fit:"]
            lines += [f"  {e.run_id}: {e.why}" for e in t.excluded]
    if c.ladders:
        lines += ["", "decode ladders (least-squares MiB per captured bs, cumulative capture memory):"]
        lines += [
            f"  {s.run_id}: {s.points} sizes up to bs {s.max_bs}, {s.max_used_mib:.0f} MiB, "
            + ("slope n/a" if s.slope_mib_per_bs is None else f"{s.slope_mib_per_bs:.3f} MiB/bs")
            for s in c.ladders
        ]
    if c.deepep_examples:
        lines += ["", "fitted DeepEP reserve for the bundled MoE models (8 ranks, mode auto) vs today's 2048 MiB:"]
        lines += [
            f"  {e.model} T={e.tokens}: device total {e.heap_rounded_mib:,.0f} MiB → fitted {e.fitted_mib or 0:,.0f}"
            for e in c.deepep_examples
        ]
    lines += [
        "",
        f"scenarios under-reserved: today {len(c.scenarios_under_today)}, with the fitted constants "
        f"{len(c.scenarios_under_fitted)}, leave-one-out {len(c.scenarios_loo_under)}",
    ]
    lines += [f"  fitted, under: {r}" for r in c.scenarios_under_fitted]
    lines += [f"  leave-one-out, under: {r}" for r in c.scenarios_loo_under]
    if c.held_out_reserve is not None:
        lines += ["", render_evaluation(c.held_out_reserve, "the whole reserve, leave-one-model-out (each model's runs "
                                        "judged under the fits without it)")]  # fmt: skip
    else:
        lines += ["", "the whole reserve, leave-one-model-out: n/a (fewer than two models in the evidence)"]
    lines += ["", "KV memory recovered with the fitted constants (negative: given up to stop under-reservation):"]
    kv = [[k.mode, k.runs, f"{k.mib:,.0f}", f"{k.mean_mib:,.0f}", None if k.tokens is None else f"{k.tokens:,}",
           k.runs_without_bytes_per_token, k.runs_given_mfs] for k in c.kv]  # fmt: skip
    head = ["node type", "runs", "MiB total", "MiB/run", "KV tokens", "runs w/o bytes/token", "mfs not heuristic's"]
    lines.append(ui.table(head, kv, right=[False, *([True] * 6)]))
    if c.kv:
        lines.append("(tokens over the runs whose KV bytes per token are known; MiB over all counted runs)")
    lines += [f"note: {n}" for n in c.notes]
    return "\n".join(lines)
