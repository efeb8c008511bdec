#!/usr/bin/env python3
"""Record memfrac's user-visible outputs, and diff two recordings: proof that a restructuring changed no result.

    python scripts/outputs.py snapshot DIR     # run the commands below into DIR (through the `memfrac` CLI only)
    python scripts/outputs.py diff BEFORE AFTER

Recorded: `explain scenarios/default.toml --json`, `ingest tests/fixtures/logs --format json`, the report and
calibration of those logs ingested into a results directory, `sweep scenarios/default.toml --dry-run`,
`audit` on a small grid, and what `make run` writes (`sweep scenarios/default.toml --out …`: results.parquet,
ledger.parquet, ladder.parquet, report.md). Timestamps, durations, paths, versions and host names are masked.
On a CPU machine `make run`'s smoke worker measures host RSS, which moves between runs: its floats compare
within 25 % (every other output compares exactly).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = os.environ.get("LOGS", "tests/fixtures/logs")  # the before/after pair must read the same logs
MEMFRAC = os.environ.get("MEMFRAC", str(ROOT / ".venv" / "bin" / "memfrac"))
TIME = re.compile(
    r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:?\d\d|Z)?|\b\d+(\.\d+)? ?(s|ms|min|seconds)\b elapsed"
)
PATHS = re.compile(r"(/tmp|/work|/root|/home|/private)/[^\s\"',)\]]*")
MASK_KEYS = re.compile(
    r"(seed|time|_at$|^at$|started|finished|elapsed|duration|wall|host|pid|version|path|dir|file|_s$)"
)
NOISY = ("run/",)  # the CPU smoke worker's RSS readings move between runs


def sh(args: list[str], out: Path, **kw: object) -> None:
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"}, **kw)
    out.write_text(f"$ {' '.join(args[1:])}\nexit {p.returncode}\n--- stdout\n{p.stdout}--- stderr\n{p.stderr}")


def snapshot(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    m = MEMFRAC
    sh([m, "explain", "scenarios/default.toml", "--json"], d / "explain.txt")
    sh([m, "ingest", LOGS, "--format", "json"], d / "ingest.txt")
    sh([m, "ingest", LOGS, "--out", str(d / "ingested")], d / "ingest-out.txt")
    sh([m, "report", str(d / "ingested")], d / "report-ingested.txt")
    sh([m, "calibrate", str(d / "ingested"), "--out", str(d / "calibration.json")], d / "calibrate.txt")
    sh([m, "sweep", "scenarios/default.toml", "--dry-run"], d / "dry-run.txt")
    grid = ["--models", "meta-llama--Llama-3.1-8B-Instruct", "--gpus", "H100-80GB", "H200", "L40S"]
    sh([m, "audit", *grid, "--out", str(d / "audit")], d / "audit.txt")
    sh([m, "audit", *grid, "--calibration", str(d / "calibration.json")], d / "audit-calibrated.txt")
    sh([m, "explain", "scenarios/default.toml", "--calibration", str(d / "calibration.json")], d / "explain-cal.txt")
    sh([m, "sweep", "scenarios/default.toml", "--out", str(d / "run")], d / "make-run.txt")


STAMP = re.compile(r"@\d{8}T\d{6}")  # run ids carry their start time
LOGDIR = re.compile(r"(tests/fixtures|profiler/data)/logs\b")  # the same logs, read from either copy
MODULE = re.compile(r"\bprofiler(\.[a-z_]+)+")  # module names in prose move with a restructuring
SECONDS = re.compile(r"\(\d+ s\)|\b\d+(\.\d+)? ?s\b(?=[; ]| elapsed)")


def _mask_text(s: str) -> str:
    s = LOGDIR.sub("<logs>", STAMP.sub("@<time>", s))
    return MODULE.sub("profiler.<module>", SECONDS.sub("(<n> s)", PATHS.sub("<path>", TIME.sub("<time>", s))))


def _loose_text(s: str) -> str:
    """A noisy output's text: digits and table padding do not count (RSS moves, columns resize), nor which
    windows an RSS gap fell between (a gap of 0 MiB is not listed)."""
    s = re.sub(r"gap before .*", "gap before …", s)
    return re.sub(r"[\s\-:|]+", " ", re.sub(r"\d+", "#", s)).strip()


def _norm(obj: object, key: str = "") -> object:
    if isinstance(obj, dict):
        return {k: ("<masked>" if MASK_KEYS.search(k.lower()) else _norm(v, k)) for k, v in sorted(obj.items())}
    if isinstance(obj, list):
        return [_norm(v, key) for v in obj]
    if isinstance(obj, str):
        return _mask_text(obj)
    if isinstance(obj, float) and math.isnan(obj):
        return "NaN"
    return obj


def _load(p: Path) -> object:
    if p.suffix == ".parquet":
        import pandas as pd

        df = pd.read_parquet(p)
        df = df[sorted(df.columns)]
        return _norm(json.loads(df.to_json(orient="records", default_handler=str)))
    if p.suffix == ".json":
        return _norm(json.loads(p.read_text()))
    text = p.read_text(errors="replace")
    for line in text.splitlines():
        if line.startswith(("{", "[")):
            try:
                return _norm(json.loads(text[text.index(line) : text.index("--- stderr")]))
            except (ValueError, json.JSONDecodeError):
                break
    return [_mask_text(x) for x in text.splitlines()]


def _diff(a: object, b: object, where: str, loose: bool, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{where}.{k}: only in {'after' if k not in a else 'before'}")
            else:
                _diff(a[k], b[k], f"{where}.{k}", loose, out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{where}: {len(a)} items before, {len(b)} after")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _diff(x, y, f"{where}[{i}]", loose, out)
    elif isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool) and loose:
        if abs(a - b) > 0.25 * max(abs(a), abs(b), 1.0):
            out.append(f"{where}: {a} → {b}")
    elif isinstance(a, str) and isinstance(b, str) and loose and _loose_text(a) == _loose_text(b):
        return
    elif a != b:
        out.append(f"{where}: {str(a)[:200]!r} → {str(b)[:200]!r}")


def diff(before: Path, after: Path) -> int:
    def files(d: Path) -> dict[str, Path]:
        return {STAMP.sub("@<time>", p.relative_to(d).as_posix()): p for p in d.rglob("*") if p.is_file()}

    fb, fa = files(before), files(after)
    found = 0
    for name in sorted(set(fb) | set(fa)):
        if name.endswith((".png", ".html", ".log", ".jsonl")) or "/raw/" in name or name.startswith("run/raw"):
            continue
        a, b = fb.get(name, before / name), fa.get(name, after / name)
        if not (a.exists() and b.exists()):
            print(f"{name}: only {'before' if a.exists() else 'after'}")
            found += 1
            continue
        out: list[str] = []
        _diff(_load(a), _load(b), name, name.startswith(NOISY), out)
        for line in out[:40]:
            print(line)
        if len(out) > 40:
            print(f"{name}: … {len(out) - 40} more differences")
        found += len(out)
    print(f"{found} difference(s)" if found else "no differences")
    return 1 if found else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "snapshot":
        snapshot(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "diff":
        sys.exit(diff(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
