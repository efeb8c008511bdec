"""`memfrac ingest`: server logs → one row per run (or per rank) with its reservation and verdict.

Rows stream out file by file; a results directory (for `memfrac report`/`calibrate`) can be written too.
Inputs: files or directories (their *.log/.txt/.out/.err, rotated `.1`, and compressed `.gz/.xz/.bz2/.zst`
variants; compression is read from the magic bytes). Several files are parsed in parallel, one process per
core (`jobs`), and a big plain file is cut into byte ranges scanned side by side (`profiler.logs.ranges`
`scan_range`/`RangeReplay`), behind one progress bar in bytes. A file with no server run gets one line on stderr
saying what it held; when no input holds a server run the command exits 2.
Modules: `pool` (reading files in parallel), `judge` (a run against its reservation: the verdict, once),
`output` (the rows and their formats); this one is the command.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler.core.errors import MemfracError
from profiler.core.validate import writable_file
from profiler.ingest.judge import Judged, judge, log_context
from profiler.ingest.output import IngestRow, render, rows_for, write_results_parquet, write_rows
from profiler.ingest.pool import read_logs
from profiler.logs import LogFile
from profiler.logs.inputs import log_files as _discover

if TYPE_CHECKING:
    from profiler.analyse.compare import Comparison
    from profiler.core.measurement import Measurement
    from profiler.results.store import RunContext

__all__ = ["IngestRow", "Judged", "ingest", "judge", "log_context", "log_files", "run_ingest"]


def log_files(paths: Iterable[str | Path]) -> list[Path]:
    """The files to read: a directory stands for its log files (sorted, rotated and compressed ones included);
    missing paths are errors."""
    out = _discover(paths)
    if not out:
        raise MemfracError(
            "no log files found (a directory is read for *.log, *.txt, *.out, *.err, also rotated (.1) and "
            "compressed (.gz, .xz, .bz2, .zst))"
        )
    return out


def ingest(
    paths: Iterable[str | Path],
    *,
    margin_mib: float = 1024.0,
    progress: bool = True,
    jobs: int | None = None,
    warn: Callable[[str], None] | None = None,
    seen: list[LogFile] | None = None,
) -> Iterator[tuple[Measurement, Comparison, Judged]]:
    """Parse every log and judge each run against its release's reservation. A file without a server run is
    told to `warn` (one line: the file and what it held); `seen` collects every file read."""
    paths = list(paths)
    files = log_files(paths)
    total = sum(f.stat().st_size for f in files)
    show = progress and total > 50 * 2**20
    bars: list[Any] = []
    logs = read_logs(files, jobs=jobs, progress=(lambda n: bars[0].update(n) if bars else None) if show else None)
    from contextlib import nullcontext

    from profiler.analyse.compare import compare  # noqa: F401  loaded while the workers (if any) read
    from profiler.core.ui import progress as progress_bar

    bar_cm = progress_bar(total, "ingest", unit="bytes") if show else nullcontext()
    with bar_cm as bar:
        if bar is not None:
            bars.append(bar)
        for lf in logs:
            if seen is not None:
                seen.append(lf)
            if not lf.runs and warn is not None:
                warn(lf.summary())
            for m in lf.runs:
                c, judged = judge(m, margin_mib=margin_mib)
                yield m, c, judged


def _stderr(line: str) -> None:
    print(f"memfrac: {line}", file=sys.stderr)


def run_ingest(
    paths: list[str], *, fmt: str = "table", out: str | None = None, per_rank: bool = False, margin_mib: float = 1024.0,
    echo: Callable[[str], None] = print, jobs: int | None = None, warn: Callable[[str], None] = _stderr,
) -> int:  # fmt: skip
    """The command: print (or write) the rows; `out` without a file suffix is a results directory, a `.parquet`
    file (or `--format parquet`) gets the same results.parquet table that directory would hold (one schema).
    Exit status 2 when no input holds a server run (each file's line says what it held)."""
    store = None
    parquet = None
    if out is not None and (Path(out).is_dir() or not Path(out).suffix):
        from profiler.results.store import Store

        store = Store(out)
        store.init({"kind": "ingest", "inputs": [str(p) for p in paths]})
    elif out is not None and (fmt == "parquet" or Path(out).suffix == ".parquet"):
        parquet = writable_file(out, "--out")
    elif fmt == "parquet":
        raise MemfracError("--format parquet needs --out FILE.parquet (or --out DIR: a results directory)")
    if out is not None and store is None and parquet is None:
        writable_file(out, "--out")  # a .csv/.json file: checked before the logs are read
    rows: list[IngestRow] = []
    batch: list[tuple[Measurement, Comparison, RunContext]] = []
    seen: list[LogFile] = []
    for m, c, judged in ingest(paths, margin_mib=margin_mib, jobs=jobs, warn=warn, seen=seen):
        m.notes.extend(n for n in judged.notes if n not in m.notes)
        rows += rows_for(m, c, per_rank, judged)
        if store is not None or parquet is not None:
            ctx = replace(log_context(m, c), rules_why=judged.reservation.rules_why)
            batch.append((m, c, ctx))
    if not rows:
        warn(f"no server run in {len(seen)} file{'s' if len(seen) != 1 else ''} ({', '.join(paths)[:200]})")
        return 2
    if store is not None:
        store.add(batch, run_key="ingest", extra={"runs": len(batch)})
        echo(render(rows, fmt if fmt != "parquet" else "table"))
        echo(f"wrote {len(batch)} runs to {store.root} (results.parquet; `memfrac report {store.root}`)")
    elif parquet is not None:
        write_results_parquet(batch, parquet)
        echo(f"wrote {len(batch)} runs to {parquet} (the results.parquet table of a results directory)")
    elif out is not None:
        write_rows(rows, Path(out), fmt)
        echo(f"wrote {len(rows)} rows to {out}")
    else:
        echo(render(rows, fmt))
    return 0
