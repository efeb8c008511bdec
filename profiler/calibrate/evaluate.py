"""`memfrac calibrate --evaluate CAL.json R [R2 …]`: a calibration judged on results it was not fitted on.

Reads the calibration through the one codec (`codec.load_calibration`, `codec.fits`) and every results
directory (probe sweeps and ingested logs alike: `results.frames.load_dirs`), and judges each run with
`judge.judge_run`: per term today's and the calibrated MiB beside the measured one, the reserve and fraction
under each, the room each leaves after the KV pool against the run's measured need, new OOMs, OOMs avoided,
and the KV cache gained or lost. Runs that cannot be judged are listed with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

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
    return Evaluation(ev.by, ev.runs, ev.modes, tuple(notes)), doc


def run_evaluate(cal_path: str, results: Sequence[str], fmt: str = "table") -> int:
    if not results:
        raise MemfracError("--evaluate CAL.json needs at least one results directory to judge it on")
    ev, doc = evaluate(cal_path, results)
    if fmt == "json":
        d = ev.as_dict()
        d["summary"] |= {"calibration": cal_path, "calibration_rules": doc.get("rules"), "results": list(results)}
        print(json.dumps(d, indent=1))
        return 0
    title = (f"memfrac calibrate --evaluate {cal_path} (fitted on sglang {doc.get('rules')} rules) on "
             f"{len(results)} results dir(s): {len(ev.runs)} runs")  # fmt: skip
    print(render_evaluation(ev, title))
    terms = render_terms(ev)
    if terms:
        print("\n" + terms)
    return 0
