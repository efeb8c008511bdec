"""A fixture folder's score: how much of what was read by hand from each log the parser finds.

Each expectation (expected/<log>.json, the format of tests/logs/test_logs_fixtures.py) is split into its
single hand-read values — one run-level key, one `args`/`serving`/`args_from` entry, one rank's phase reading,
one tricky line — and each value is checked ALONE with the harness's own `_check_run`, so the comparison has one
definition (the fixture test's) and a miss costs one value, not the whole log. The run count is one more value.
When the parser finds more or fewer runs than expected, expected runs are paired with parsed ones in order so
that the most values match (a phantom run costs the run-count value, not every value after it).

Classes come from the folder's INDEX.tsv `classes` column (comma-separated names from `CLASSES`); a folder whose
INDEX has no such column reports every log as unclassified.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from profiler.core.measurement import Measurement
from profiler.logs import parse_log
from tests.logs.test_logs_fixtures import _check_run, tricky_line_error

#: The classes of log a held-out set is collected to cover (issue 24), and what each means.
CLASSES: dict[str, str] = {
    "2024-format": "sglang 0.1-0.3 formats (2024): [gpu_id=N] / [gpu=N] / [HH:MM:SS TPn] prefixes, old line wording",
    "amd": "AMD GPUs (ROCm, MI250/MI300/MI325/MI355)",
    "pd-decode": "a PD-disaggregated decode node",
    "pd-prefill": "a PD-disaggregated prefill node",
    "deepep": "DeepEP all-to-all MoE (moe_a2a_backend deepep / enable_deepep_moe)",
    "speculative": "speculative decoding (EAGLE, EAGLE3, MTP/NextN): a draft model beside the target",
    "multi-node": "one server over several nodes (nnodes > 1)",
    "dp-attention": "data-parallel attention (DPn ranks)",
    "line-prefix": "docker / docker-compose / kubectl / journald / ray text in front of sglang's record",
    "surrounding-text": "text that is not sglang's log: launch command, check_env, prose, quoted tracebacks",
    "oom": "a CUDA/HIP out-of-memory message",
    "crash": "a failure that is not out-of-memory (exception, segfault, NCCL error, timeout)",
    "capture": "CUDA-graph capture lines (begin/end, the bs ladder)",
}

#: Expectation keys that are notes, not values read from the log.
_NOT_VALUES = {"notes"}


@dataclass(slots=True)
class LogScore:
    """One log: values expected and found, and each miss (value name: why)."""

    log: str
    classes: list[str]
    expected: int
    found: int
    readings_expected: int  # the subset read per rank (memory figures, ready line, failure numbers)
    readings_found: int
    runs_expected: int
    runs_parsed: int
    misses: list[str] = field(default_factory=list)

    @property
    def fully_right(self) -> bool:
        return self.found == self.expected


def _leaves(want: dict[str, Any]) -> list[tuple[str, dict[str, Any] | str]]:
    """One run's expectation as single values: (name, a one-value expectation) or (name, tricky line)."""
    out: list[tuple[str, dict[str, Any] | str]] = []
    for key, val in want.items():
        if key in _NOT_VALUES:
            continue
        if key in ("args", "args_from", "serving"):
            out += [(f"{key}.{k}", {key: {k: v}}) for k, v in (val or {}).items()]
        elif key == "ranks":
            for label, phases in (val or {}).items():
                for phase, keys in phases.items():
                    out += [(f"{label}.{phase}.{k}", {"ranks": {label: {phase: {k: v}}}}) for k, v in keys.items()]
        elif key == "tricky_lines":
            out += [(f"tricky_line[{i}]", line) for i, line in enumerate(val or [])]
        else:
            out.append((key, {key: val}))
    return out


def _is_reading(name: str) -> bool:
    return name.count(".") == 2 and not name.startswith(("args.", "args_from.", "serving."))


def _misses(m: Measurement | None, leaves: list[tuple[str, dict[str, Any] | str]]) -> list[str]:
    """The values of `leaves` that run `m` (None: no parsed run paired) does not match, each with why."""
    out = []
    for name, sub in leaves:
        if isinstance(sub, str):
            err = tricky_line_error(sub)
        elif m is None:
            err = "no parsed run for this expected run"
        else:
            errs = [e.split(": ", 1)[1] if e.split(": ", 1)[0].replace("'", "") == name else e
                    for e in _check_run(m, sub)]  # fmt: skip
            err = "; ".join(errs) if errs else None
        if err:
            out.append(f"{name}: {err}")
    return out


def _pair(parsed: list[Measurement], wanted: list[list[tuple[str, Any]]]) -> list[list[str]]:
    """Each expected run's misses, expected and parsed runs paired in order so that the fewest values miss."""
    n, k = len(wanted), len(parsed)
    miss = [[_misses(parsed[j], wanted[i]) for j in range(k)] for i in range(n)]
    unpaired = [_misses(None, w) for w in wanted]
    # best[i][j]: fewest misses pairing expected runs i.. with parsed runs j.. (in order, either side may skip)
    best = [[0] * (k + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        best[i][k] = best[i + 1][k] + len(unpaired[i])
        for j in range(k - 1, -1, -1):
            best[i][j] = min(best[i][j + 1], best[i + 1][j] + len(unpaired[i]), best[i + 1][j + 1] + len(miss[i][j]))
    out: list[list[str]] = []
    i = j = 0
    while i < n:
        if j < k and best[i][j] == best[i + 1][j + 1] + len(miss[i][j]):
            out.append(miss[i][j])
            i, j = i + 1, j + 1
        elif j < k and best[i][j] == best[i][j + 1]:
            j += 1
        else:
            out.append(unpaired[i])
            i += 1
    return out


def index_classes(folder: Path) -> dict[str, list[str]] | None:
    """log file name → its classes, from INDEX.tsv's `classes` column (None: no such column)."""
    index = folder / "INDEX.tsv"
    if not index.is_file():
        return None
    with index.open(newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows or "classes" not in rows[0]:
        return None
    out = {}
    for row in rows:
        names = [c.strip() for c in (row["classes"] or "").split(",") if c.strip()]
        unknown = [c for c in names if c not in CLASSES]
        if unknown:
            raise ValueError(f"{index}: {row['file']}: unknown class {unknown} (known: {', '.join(CLASSES)})")
        out[row["file"]] = names
    return out


def score_log(folder: Path, expected_file: Path, classes: list[str]) -> LogScore:
    """One expectation file against the parser's reading of its log."""
    want = json.loads(expected_file.read_text())
    parsed = parse_log(folder / want["file"])
    wanted = [_leaves(w) for w in want["runs"]]
    misses = [f"run {i}: {x}" for i, ms in enumerate(_pair(parsed, wanted)) for x in ms]
    if len(parsed) != len(want["runs"]):
        misses.insert(0, f"runs: {len(parsed)} parsed, {len(want['runs'])} expected")
    names = [name for w in wanted for name, _ in w]
    readings = sum(_is_reading(n) for n in names)
    missed_readings = sum(_is_reading(x.split(": ", 2)[1]) for x in misses if x.startswith("run "))
    return LogScore(
        log=want["file"],
        classes=classes,
        expected=len(names) + 1,
        found=len(names) + 1 - len(misses),
        readings_expected=readings,
        readings_found=readings - missed_readings,
        runs_expected=len(want["runs"]),
        runs_parsed=len(parsed),
        misses=misses,
    )


def score_folder(folder: Path) -> dict[str, Any]:
    """The folder's score: values found/expected, logs fully right, per class coverage and fully right, per log."""
    classes = index_classes(folder)
    logs = [
        score_log(folder, p, (classes or {}).get(json.loads(p.read_text())["file"], []))
        for p in sorted((folder / "expected").glob("*.json"))
    ]
    expected, found = sum(s.expected for s in logs), sum(s.found for s in logs)
    r_exp, r_found = sum(s.readings_expected for s in logs), sum(s.readings_found for s in logs)
    per_class = {
        c: {
            "logs": sum(c in s.classes for s in logs),
            "fully_right": sum(c in s.classes and s.fully_right for s in logs),
            "values_expected": sum(s.expected for s in logs if c in s.classes),
            "values_found": sum(s.found for s in logs if c in s.classes),
        }
        for c in CLASSES
    }
    return {
        "folder": str(folder),
        "classes_from": "INDEX.tsv classes column" if classes is not None else "none (INDEX.tsv has no classes column)",
        "values_expected": expected,
        "values_found": found,
        "values_pct": round(100.0 * found / expected, 1) if expected else None,
        "readings_expected": r_exp,
        "readings_found": r_found,
        "readings_pct": round(100.0 * r_found / r_exp, 1) if r_exp else None,
        "logs": len(logs),
        "logs_fully_right": sum(s.fully_right for s in logs),
        "per_class": per_class,
        "per_log": [{**asdict(s), "fully_right": s.fully_right} for s in logs],
    }


def render(score: dict[str, Any]) -> str:
    """The score as text: headline, per class, then each log's misses."""
    lines = [
        f"{score['folder']}: {score['logs']} logs",
        f"  values found/expected: {score['values_found']}/{score['values_expected']} ({score['values_pct']}%)"
        "  [every hand-read value, one each; + 1 per log for the run count]",
        f"  per-rank readings found/expected: {score['readings_found']}/{score['readings_expected']}"
        f" ({score['readings_pct']}%)",
        f"  logs fully right: {score['logs_fully_right']}/{score['logs']}",
        f"  per class (classes from {score['classes_from']}): logs covering it, fully right, values found/expected",
    ]
    for c, v in score["per_class"].items():
        lines.append(f"    {c:17} {v['logs']:3} logs  {v['fully_right']:3} fully right  "
                     f"{v['values_found']}/{v['values_expected']} values")  # fmt: skip
    for s in score["per_log"]:
        mark = "ok " if s["fully_right"] else "MISS"
        lines.append(f"  {mark} {s['log']}: {s['found']}/{s['expected']}  [{', '.join(s['classes'])}]")
        lines += [f"         {x[:220]}" for x in s["misses"]]
    return "\n".join(lines)
