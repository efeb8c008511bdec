"""`memfrac calibrate --evaluate CAL.json R [R2 …]`: a calibration judged on results it was not fitted on.

Reads the calibration through the one codec (`codec.load_calibration`, `codec.fits`) and every results
directory (probe sweeps and ingested logs alike: `results.frames.load_dirs`), and judges each run with
`judge.judge_run`: per term today's and the calibrated MiB beside the measured one, the reserve and fraction
under each, the room each leaves after the KV pool against the run's measured need, new OOMs, OOMs avoided,
and the KV cache gained or lost. Runs that cannot be judged are listed with the reason.

A log's GPU capacity is read (printed, or a named GPU's) or estimated (the smallest GPU the free memory at start
fits: `Identity.gpu_total_origin`); runs are judged on either, and the ones judged on an estimate are named, each
with its bound (`gpu_capacity`), since a capacity one GPU class off moves both fractions.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pandas as pd

from profiler.calibrate.codec import fits, load_calibration
from profiler.calibrate.judge import Evaluation, judge, render_evaluation, render_terms
from profiler.core.errors import MemfracError
from profiler.results.frames import load_dirs


def evaluate(cal_path: str, results: Sequence[str]) -> tuple[Evaluation, dict[str, Any]]:
    doc = load_calibration(cal_path)
    df, _, notes = load_dirs(results)
    fitted_on = {str(r) for r in doc.get("results") or []}
    again = sorted(fitted_on & {str(r) for r in results})
    if again:
        notes.append(f"{', '.join(again)}: the calibration was fitted on this directory: not held out")
    ev = judge(df, fits(doc, cal_path))
    cap = gpu_capacity(df, {r.run_id for r in ev.judged})
    if cap["estimated"]:
        listed = "; ".join(f"{e['run_id']}: {e['gpu_total_how']}" for e in cap["estimated"])
        notes.append(f"{len(cap['estimated'])} of {len(ev.judged)} judged run(s) rest on an estimated GPU capacity "
                     f"(bounded by the free memory the log shows; neither printed nor named): {listed}")  # fmt: skip
    return Evaluation(ev.by, ev.runs, ev.modes, (*notes, *ev.notes)), doc


def gpu_capacity(df: pd.DataFrame, judged: set[str]) -> dict[str, Any]:
    """How the GPU capacity of each judged run is known: counts per origin (read | estimated | not recorded, for
    results written before the column existed) and the estimated runs with the capacity and its bound."""
    tot = df[df["term"] == "total"].drop_duplicates("run_id")
    tot = tot[tot["run_id"].astype(str).isin(judged)]
    origin = tot["gpu_total_origin"] if "gpu_total_origin" in tot.columns else pd.Series(pd.NA, index=tot.index)
    how = tot["gpu_total_how"] if "gpu_total_how" in tot.columns else pd.Series("", index=tot.index)
    origin = origin.fillna("not recorded").astype(str)
    est = tot[origin == "estimated"]
    return {
        "read": int((origin == "read").sum()),
        "estimated": [{"run_id": str(r), "gpu_total_mib": float(g), "gpu_total_how": str(h)}
                      for r, g, h in zip(est["run_id"], est["gpu_total_mib"], how[est.index], strict=True)],
        "not_recorded": int((origin == "not recorded").sum()),
    }  # fmt: skip


def run_evaluate(cal_path: str, results: Sequence[str], fmt: str = "table") -> int:
    if not results:
        raise MemfracError("--evaluate CAL.json needs at least one results directory to judge it on")
    ev, doc = evaluate(cal_path, results)
    if fmt == "json":
        d = ev.as_dict()
        df, _, _ = load_dirs(results)
        d["summary"] |= {"calibration": cal_path, "calibration_rules": doc.get("rules"), "results": list(results),
                         "gpu_capacity": gpu_capacity(df, {r.run_id for r in ev.judged})}  # fmt: skip
        print(json.dumps(d, indent=1))
        return 0
    title = (f"memfrac calibrate --evaluate {cal_path} (fitted on sglang {doc.get('rules')} rules) on "
             f"{len(results)} results dir(s): {len(ev.runs)} runs")  # fmt: skip
    print(render_evaluation(ev, title))
    terms = render_terms(ev)
    if terms:
        print("\n" + terms)
    return 0
