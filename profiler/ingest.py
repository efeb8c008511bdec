"""`memfrac ingest`: server logs → one row per run (or per rank) with its reservation and verdict.

Rows stream out file by file; a results directory (for `memfrac report`/`calibrate`) can be written too.
"""

from __future__ import annotations

import csv
import io
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from profiler.compare import Comparison, compare, rank_figures, reservation_for
from profiler.errors import MemfracError
from profiler.logs import LOG_SUFFIXES, parse_log
from profiler.measurement import Measurement
from profiler.store import RunContext


@dataclass(frozen=True, slots=True)
class IngestRow:
    """One run (or one rank of it) as the table shows it. Sizes in MiB; None = the log does not say."""

    file: str
    run: str
    rank: str
    model: str | None
    architecture: str | None
    gpu: str | None
    gpu_total_mib: float | None
    mode: str | None
    tp: int | None
    dp: int | None
    ep: int | None
    mfs: float | None
    mfs_origin: str
    reserved_mib: float | None  # the heuristic's terms, total (None when the release is not modelled)
    weights_mib: float | None
    kv_mib: float | None
    kv_tokens: int | None
    graph_mib: float | None
    headroom_mib: float | None
    verdict: str
    reason: str
    unparsed_lines: int


def log_files(paths: Iterable[str | Path]) -> list[Path]:
    """The files to read: a directory stands for its log files (sorted); missing paths are errors."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(x for x in p.iterdir() if x.is_file() and x.suffix in LOG_SUFFIXES)
        elif p.is_file():
            out.append(p)
        else:
            raise MemfracError(f"{p}: no such file or directory")
    if not out:
        raise MemfracError("no log files found (a directory is read for *.log, *.txt, *.out, *.err)")
    return out


class _Progress:
    """'ingest: 120/200 MB (60%)' on stderr, at most every 2 s, only for large inputs."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled = total, enabled and total > 50 * 2**20
        self.done_files = 0
        self.last = 0.0

    def update(self, done_in_file: int) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.last < 2:
            return
        self.last = now
        done = self.done_files + done_in_file
        print(
            f"ingest: {done / 2**20:,.0f}/{self.total / 2**20:,.0f} MB ({100 * done / self.total:.0f}%)",
            file=sys.stderr,
        )


def ingest(
    paths: Iterable[str | Path], *, margin_mib: float = 1024.0, progress: bool = True
) -> Iterator[tuple[Measurement, Comparison, list[str]]]:
    """Parse every log and compare each run with its reservation."""
    files = log_files(paths)
    prog = _Progress(sum(f.stat().st_size for f in files), progress)
    for f in files:
        for m in parse_log(f, progress=prog.update):
            res, notes = reservation_for(m)
            yield m, compare(m, res, margin_mib=margin_mib), notes
        prog.done_files += f.stat().st_size


def log_context(m: Measurement, c: Comparison) -> RunContext:
    """What a log says about the scenario (resolved args), for the store's grouping and calibration columns."""
    a = m.args

    def num(*keys: str) -> int | None:
        for k in keys:
            v = a.get(k)
            if isinstance(v, int | float) and not isinstance(v, bool):
                return int(v)
        return None

    graph = a.get("cuda_graph_config")
    dec = graph.get("decode", {}) if isinstance(graph, dict) else {}
    max_bs = num("cuda_graph_max_bs_decode", "cuda_graph_max_bs")
    if max_bs is None and isinstance(dec, dict) and isinstance(dec.get("max_bs"), int):
        max_bs = dec["max_bs"]
    a2a = a.get("moe_a2a_backend") or ("deepep" if a.get("enable_deepep_moe") else None)
    return RunContext(
        group=m.id,
        moe_a2a_backend=str(a2a) if a2a else None,
        decode_max_bs=max_bs,
        chunked_prefill_size=num("chunked_prefill_size"),
        deepep_tokens=None,
        hidden_size=None,  # a log names the model, not its shapes
        num_experts=None,
    )


def rows_for(m: Measurement, c: Comparison, per_rank: bool = False) -> list[IngestRow]:
    i = m.identity
    file, _, run = m.id.rpartition("#")

    def row(rank: str, fig: dict[str, float | None], headroom: float | None) -> IngestRow:
        return IngestRow(
            file=file or m.id, run=run, rank=rank, model=i.model, architecture=i.architecture, gpu=i.gpu_name,
            gpu_total_mib=i.gpu_total_mib, mode=i.mode, tp=i.tp, dp=i.dp if i.attn_dp is None else i.attn_dp, ep=i.ep,
            mfs=c.mfs, mfs_origin=c.mfs_origin, reserved_mib=c.reserved_terms_mib, weights_mib=fig["weights_mib"],
            kv_mib=fig["kv_mib"], kv_tokens=fig["kv_tokens"], graph_mib=fig["graph_mib"], headroom_mib=headroom,  # type: ignore[arg-type]
            verdict=c.verdict, reason=c.reason, unparsed_lines=m.unparsed_memory_lines,
        )  # fmt: skip

    if not per_rank:
        from profiler.compare import worst_rank

        r = worst_rank(m)
        return [row(r.label if r else "", rank_figures(r), c.headroom_mib)]
    out = []
    for r in m.ranks or []:
        fig = rank_figures(r)
        out.append(row(r.label, fig, fig["headroom_mib"]))
    return out or [row("", rank_figures(None), c.headroom_mib)]


COLUMNS = [f.name for f in fields(IngestRow)]


def _gib(x: float | None) -> str:
    return "—" if x is None else f"{x / 1024:.2f}"


def render_table(rows: list[IngestRow]) -> str:
    head = ["run", "rank", "model", "gpu", "mode", "tp/dp/ep", "mfs", "reserved", "weights", "kv", "graph",
            "headroom", "verdict", "unparsed"]  # fmt: skip
    body = []
    for r in rows:
        par = "/".join("—" if x is None else str(x) for x in (r.tp, r.dp, r.ep))
        model = (r.model or r.architecture or "?").rsplit("/", 1)[-1][:28]
        gpu = r.gpu or (f"{r.gpu_total_mib / 1024:.0f}GiB?" if r.gpu_total_mib else "?")
        mfs = "—" if r.mfs is None else f"{r.mfs:.3f}" + ("" if r.mfs_origin == "unknown" else f" ({r.mfs_origin})")
        body.append([f"{r.file}#{r.run}"[:48], r.rank or "-", model, gpu, r.mode or "?", par, mfs, _gib(r.reserved_mib),
                     _gib(r.weights_mib), _gib(r.kv_mib), _gib(r.graph_mib), _gib(r.headroom_mib), r.verdict,
                     str(r.unparsed_lines)])  # fmt: skip
    widths = [max(len(h), *(len(b[k]) for b in body)) for k, h in enumerate(head)] if body else [len(h) for h in head]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)) for b in body]
    lines.append("sizes in GiB (sglang's 'GB'); reserved = the heuristic's terms; headroom = free at the worst point")
    return "\n".join(lines)


def render(rows: list[IngestRow], fmt: str) -> str:
    if fmt == "json":
        return json.dumps([asdict(r) for r in rows], indent=1)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r))
        return buf.getvalue()
    return render_table(rows)


def write_rows(rows: list[IngestRow], path: Path, fmt: str) -> None:
    if fmt == "parquet" or path.suffix == ".parquet":
        import pandas as pd

        pd.DataFrame([asdict(r) for r in rows], columns=COLUMNS).to_parquet(path, index=False)
    else:
        path.write_text(render(rows, fmt))


def run_ingest(
    paths: list[str], *, fmt: str = "table", out: str | None = None, per_rank: bool = False, margin_mib: float = 1024.0,
    echo: Callable[[str], None] = print,
) -> int:  # fmt: skip
    """The command: print (or write) the rows; `out` without a file suffix is a results directory."""
    store = None
    if out is not None and (Path(out).is_dir() or not Path(out).suffix):
        from profiler.store import Store

        store = Store(out)
        store.init({"kind": "ingest", "inputs": [str(p) for p in paths]})
    elif fmt == "parquet" and out is None:
        raise MemfracError("--format parquet needs --out FILE.parquet")
    rows: list[IngestRow] = []
    batch: list[tuple[Measurement, Comparison, RunContext]] = []
    for m, c, notes in ingest(paths, margin_mib=margin_mib):
        m.notes.extend(n for n in notes if n not in m.notes)
        rows += rows_for(m, c, per_rank)
        if store is not None:
            batch.append((m, c, log_context(m, c)))
    if store is not None:
        store.add(batch, run_key="ingest", extra={"runs": len(batch)})
        echo(render(rows, fmt if fmt != "parquet" else "table"))
        echo(f"wrote {len(batch)} runs to {store.root} (results.parquet; `memfrac report {store.root}`)")
    elif out is not None:
        write_rows(rows, Path(out), fmt)
        echo(f"wrote {len(rows)} rows to {out}")
    else:
        echo(render(rows, fmt))
    return 0
