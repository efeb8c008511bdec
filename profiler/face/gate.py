"""`memfrac gate` and `memfrac baseline`: the nightly hardware-CI verdict on a results directory.

The gate judges each worker as a whole, as sglang sizes it: it fails when a run failed (OOM, crash, timeout, …),
when a worker's measured need exceeds the room its fraction leaves (run verdict `short`, or the `total` row: used
after the KV pool against free at start × (1 − mfs) less the request pools sglang builds out of it), or when a
scenario's measured memory regressed against a baseline beyond the threshold — reported in MiB and %. A term over
its own constant while the worker's room covers it (on GPUs above 60 GiB the 10 GiB floor tops the terms up first,
memory_hook.py:314-315) is a calibration finding: shown, passed. A term whose worst case the load never reached is
shown as not reached. Host-memory runs (CPU smoke runs) are reported and never gated: they hold no GPU numbers.
"""

from __future__ import annotations

import json
import math
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from profiler.core.errors import FieldError, MemfracError
from profiler.core.validate import in_range, json_object, writable_file
from profiler.results.store import load_results, read_manifest

BASELINE_VERSION = 1
FAILED_VERDICTS = ("oom_during_capture", "oom_startup", "oom_runtime", "failed", "short")


@dataclass(frozen=True, slots=True)
class Check:
    scenario: str
    name: str
    passed: bool
    message: str = ""
    skipped: bool = False


def parse_pct(text: str | float) -> float:
    """'5%' or '5' or 5.0 → 5.0 (percent)."""
    try:
        v = float(str(text).strip().rstrip("%"))
    except ValueError:
        raise MemfracError(f"--max-regression {text!r}: give a percentage like 5%") from None
    if not math.isfinite(v) or v < 0:
        raise FieldError("--max-regression", "", text, "a finite percentage ≥ 0, like 5%")
    return v


def _num(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) or x is pd.NA else float(x)


def _measured(df: pd.DataFrame) -> dict[str, dict[str, float]]:
    """scenario → term → measured MiB (rows where something was measured)."""
    out: dict[str, dict[str, float]] = {}
    for row in df.itertuples(index=False):
        v = _num(row.measured_mib)
        if v is None or row.memory_kind != "gpu":
            continue
        out.setdefault(str(row.scenario), {})[str(row.term)] = v
    return out


def write_baseline(results_dir: str | Path, out: str | Path) -> dict[str, Any]:
    """Record every measured term of every GPU scenario as the reference for later gates."""
    writable_file(out, "--out")
    df = load_results(results_dir)
    base = {
        "version": BASELINE_VERSION,
        "created_at": time.time(),
        "source": str(results_dir),
        "sglang_versions": sorted({str(v) for v in df["sglang_version"].dropna().unique()}),
        "scenarios": _measured(df),
    }
    if not base["scenarios"]:
        raise MemfracError(
            f"{results_dir}: no GPU measurements to baseline (host smoke runs and logs without numbers do not count)"
        )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(base, indent=1, sort_keys=True))
    return base


#: How far below zero a measured term may read (two of a log's 0.01 GB steps): more is not a measurement.
BASELINE_NOISE_MIB = 20.48


def load_baseline(path: str | Path) -> dict[str, Any]:
    """A baseline written by `memfrac baseline`, checked field by field (one line naming the field otherwise)."""
    if not Path(path).exists():
        raise MemfracError(f"baseline not found: {path} (write one with `memfrac baseline RESULTS --out {path}`)")
    b = json_object(path, "a memfrac baseline (a JSON object written by `memfrac baseline`)")
    v = b.get("version", 1)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise FieldError(path, "version", v, f"an integer 1..{BASELINE_VERSION}")
    if v > BASELINE_VERSION:
        raise MemfracError(f"{path}: baseline version {v} is newer than this memfrac")
    if "scenarios" not in b:
        raise FieldError(path, "scenarios", None, "an object: scenario → term → measured MiB (not a memfrac baseline)")
    scen = b["scenarios"]
    if not isinstance(scen, dict):
        raise FieldError(path, "scenarios", scen, "an object: scenario → term → measured MiB")
    for name, terms in scen.items():
        if not isinstance(terms, dict):
            raise FieldError(path, f"scenarios.{name}", terms, "an object: term → measured MiB")
        for term, mib in terms.items():
            # a measured term may read below zero by a log's resolution (a capture printed as −0.01 GB: −10.24 MiB)
            in_range(path, f"scenarios.{name}.{term}", mib, -BASELINE_NOISE_MIB, None, "MiB")
    return b


def gate(
    results_dir: str | Path,
    baseline: str | Path | None = None,
    max_regression_pct: float = 5.0,
    min_regression_mib: float = 32.0,
) -> list[Check]:
    """Every check, passed or not (the caller decides the exit status from them)."""
    df = load_results(results_dir)
    checks: list[Check] = []
    man_path = Path(results_dir) / "manifest.json"
    if man_path.exists():
        for key, run in read_manifest(man_path).get("runs", {}).items():
            if run.get("status") == "error":
                checks.append(Check(key, "run", False, f"could not run: {str(run.get('error'))[:300]}"))
            elif run.get("status") == "not_started":  # a nightly run that measured nothing must not pass
                checks.append(Check(key, "run", False, f"not started: {str(run.get('reason'))[:300]}"))
    for scen, g in df.groupby("scenario", sort=True):
        first = g.iloc[0]
        host = first["memory_kind"] != "gpu"
        verdict = str(first["verdict"])
        if verdict in FAILED_VERDICTS:
            checks.append(Check(str(scen), "run", False, f"{verdict}: {first['reason']}"))
        elif host:
            checks.append(Check(str(scen), "run", True, "host-memory run (CPU): reported, not gated", skipped=True))
            continue
        elif verdict == "incomplete":  # a log cut before its startup ended: nothing to gate on
            checks.append(Check(str(scen), "run", True, f"incomplete: {first['reason']}", skipped=True))
            continue
        else:
            checks.append(Check(str(scen), "run", True, f"{verdict}: {first['reason']}"))
        for row in g.itertuples(index=False):
            measured, reserved = _num(row.measured_mib), _num(row.reserved_mib)
            if row.term == "total":
                if row.term_verdict == "under":
                    checks.append(Check(str(scen), "worker room", False,
                                        f"needs {measured:,.0f} MiB after the KV pool where its fraction leaves "
                                        f"{reserved:,.0f} MiB ({row.observed_from})"))  # fmt: skip
                elif row.term_verdict == "fits":
                    checks.append(Check(str(scen), "worker room", True,
                                        f"needs {measured:,.0f} of {reserved:,.0f} MiB"))  # fmt: skip
            elif row.term_verdict == "under":
                finding = (f"calibration finding: measured {measured:,.0f} MiB > its constant {reserved:,.0f} MiB, "
                           f"covered by the worker's room ({row.observed_from})")
                checks.append(Check(str(scen), f"term {row.term}", True, finding))
            elif row.term_verdict == "not_reached":
                checks.append(Check(str(scen), f"term {row.term}", True,
                                    f"not reached: {measured:,.0f} MiB measured under a partial load "
                                    f"({row.observed_from})"))  # fmt: skip
            elif row.term_verdict in ("fits", "over"):
                checks.append(Check(str(scen), f"term {row.term}", True, f"{row.term_verdict}"))
    if baseline is not None:
        checks += _regressions(df, load_baseline(baseline), max_regression_pct, min_regression_mib)
    return checks


def _regressions(df: pd.DataFrame, base: dict[str, Any], pct: float, min_mib: float) -> list[Check]:
    now = _measured(df)
    out = []
    for scen, terms in sorted(base["scenarios"].items()):
        if scen not in now:
            out.append(Check(scen, "regression", False, "missing from these results (the baseline measured it)"))
            continue
        for term, old in sorted(terms.items()):
            new = now[scen].get(term)
            if new is None:
                continue
            delta = new - old
            rel = 100.0 * delta / old if old > 0 else (math.inf if delta > 0 else 0.0)
            bad = delta > min_mib and rel > pct
            msg = f"{old:.0f} → {new:.0f} MiB ({delta:+.0f} MiB, {rel:+.1f}%; limit {pct:g}% and {min_mib:g} MiB)"
            out.append(Check(scen, f"regression {term}", not bad, msg))
    return out


def write_junit(checks: list[Check], path: str | Path) -> None:
    """JUnit XML: one testcase per check, classname = scenario (what CI dashboards read)."""
    suite = ET.Element(
        "testsuite",
        name="memfrac gate",
        tests=str(len(checks)),
        failures=str(sum(not c.passed for c in checks)),
        skipped=str(sum(c.skipped for c in checks)),
    )
    for c in checks:
        tc = ET.SubElement(suite, "testcase", classname=c.scenario, name=c.name)
        if not c.passed:
            ET.SubElement(tc, "failure", message=c.message[:500]).text = c.message
        elif c.skipped:
            ET.SubElement(tc, "skipped", message=c.message)
        elif c.message:
            ET.SubElement(tc, "system-out").text = c.message
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def render(checks: list[Check]) -> str:
    """The verdict line, then the failed checks as a table (profiler.core.ui)."""
    from profiler.core import ui
    failed = [c for c in checks if not c.passed]
    scen = {c.scenario for c in checks}
    lines = [f"{'FAIL' if failed else 'PASS'}: {len(checks)} checks over {len(scen)} scenarios, {len(failed)} failed"]
    if failed:
        lines.append(
            ui.table(["scenario", "check", "why it failed"], [[c.scenario, c.name, c.message] for c in failed])
        )
    kinds = skipped_kinds(checks)
    if kinds:
        lines.append("(" + ", ".join(f"{n} {k}" for k, n in kinds.items()) + ": reported, not gated)")
    return "\n".join(lines)


def skipped_kinds(checks: list[Check]) -> dict[str, int]:
    """The checks reported but not gated, counted by why: host-memory runs apart from incomplete logs."""
    out: dict[str, int] = {}
    for c in checks:
        if c.skipped:
            kind = "incomplete logs" if c.message.startswith("incomplete") else "host-memory runs"
            out[kind] = out.get(kind, 0) + 1
    return out


def run_gate(results: str, baseline: str | None, max_regression: str, junit: str | None, min_mib: float = 32.0) -> int:
    if junit:
        writable_file(junit, "--junit")  # before the work: a directory or read-only path is one line, not lost work
    checks = gate(results, baseline, parse_pct(max_regression), min_mib)
    if junit:
        write_junit(checks, junit)
    print(render(checks))
    return 1 if any(not c.passed for c in checks) else 0
