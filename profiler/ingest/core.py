"""`memfrac ingest`: server logs → one row per run (or per rank) with its reservation and verdict.

Rows stream out file by file; a results directory (for `memfrac report`/`calibrate`) can be written too.
Inputs: files or directories (their *.log/.txt/.out/.err, rotated `.1`, and compressed `.gz/.xz/.bz2/.zst`
variants; compression is read from the magic bytes). Several files are parsed in parallel, one process per
core (`jobs`), and a big plain file is cut into byte ranges scanned side by side (`profiler.logs.lines`
`scan_range`/`RangeReplay`), behind one progress bar in bytes. A file with no server run gets one line on stderr
saying what it held; when no input holds a server run the command exits 2.
Every row names the rules it was judged with and why (`rules`, `rules_why`, `release`, `release_how`), the
fraction and where it comes from (`mfs_origin`: given | auto | implied | unknown, `mfs_how`), how far the
startup got (`state`), the failure's numbers, the serving evidence, and the notes that qualify a figure.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import io
import json
import os
import pickle
import select
import signal
import struct
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler.core.errors import MemfracError
from profiler.logs import LogFile, read_log, read_ranges
from profiler.logs.inputs import log_files as _discover
from profiler.logs.inputs import sniff
from profiler.logs.lines import CHUNK_BYTES, RANGE_MIN_BYTES, RangeScan, scan_range, split_ranges

if TYPE_CHECKING:  # imported where used: worker processes start before the parser and comparison are loaded
    from profiler.analyse.compare import Comparison
    from profiler.core.measurement import Measurement, Rank
    from profiler.logs.reserve import LogReservation
    from profiler.results.store import RunContext


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
    gpu_how: str
    mode: str | None
    tp: int | None
    dp: int | None
    ep: int | None
    release: str | None  # the sglang release, or the range the log's formats allow
    release_how: str
    rules: str  # the rule set(s) the reservation was computed with ("none" when none could be)
    rules_why: str
    mfs: float | None  # printed, implied or computed — never the heuristic's fallback (see mfs_how)
    mfs_origin: str  # given | auto | implied | unknown
    mfs_how: str
    heuristic_fraction: float | None  # what the headline rules would pick (None without the GPU size)
    heuristic_fraction_min: float | None  # over the candidate rule sets / capacities
    heuristic_fraction_max: float | None
    reserved_mib: float | None  # the heuristic's terms, total, of the headline rule set
    reserved_min_mib: float | None
    reserved_max_mib: float | None
    weights_mib: float | None
    kv_mib: float | None
    kv_tokens: int | None
    kv_tokens_from: str | None  # "KV pool line" | "ready line"
    graph_mib: float | None
    headroom_mib: float | None
    need_mib: float | None  # what runtime needs, the wasteful verdict's yardstick
    need_basis: str | None
    state: str | None  # finished | incomplete | aborted | no_kv
    state_seen: str
    verdict: str
    reason: str
    failure_kind: str | None
    failure_phase: str | None
    failure_rank: str | None
    failure_line: int | None
    oom_tried_mib: float | None
    oom_free_mib: float | None
    oom_capacity_mib: float | None
    oom_torch_allocated_mib: float | None
    oom_private_pools_mib: float | None
    oom_non_torch_mib: float | None
    serving_batches: int | None
    peak_running_req: int | None
    peak_token_usage: float | None
    retractions: int | None
    figures_from: str  # ranks other than the row's that a figure was read from
    qualifiers: str  # notes that qualify a figure: implied, lower bound, inferred, estimated
    unparsed_lines: int


@dataclass(frozen=True, slots=True)
class Judged:
    """What ingest adds to a comparison: the rules chosen (and candidates), the need, and the notes."""

    reservation: LogReservation
    need: tuple[float, str] | None
    notes: list[str]


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


def default_jobs() -> int:
    """Worker processes: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


PROGRESS_EVERY = 4 << 20  # bytes between a worker's progress messages
Task = tuple[Callable[..., Any], tuple[Any, ...]]  # fn(*args, progress=...) run in a worker process


def _read_task(path: str, progress: Callable[[int], None] | None = None) -> LogFile:
    return read_log(path, progress=progress)


def _scan_task(path: str, start: int, end: int, progress: Callable[[int], None] | None = None) -> RangeScan:
    return scan_range(path, start, end, progress=progress)


class _Forked:
    """`jobs` processes on the tasks: this one and jobs - 1 forked from it, each taking the next task index from
    one shared pipe; the forked ones send progress and pickled results back on a pipe of their own. Why not
    multiprocessing: importing it and concurrent.futures, starting their threads and one more process cost
    ~25 ms before the first task starts, a fixed cost that shows when the work is a second or less. This
    process takes tasks whenever it waits for a result (so it is never idle while there are some). Linux (fork)
    only; `_Executor` elsewhere."""

    _HEAD = struct.Struct("<BIQ")  # kind (1 progress, 2 result, 3 error), task, payload length or bytes done

    def __init__(self, jobs: int, tasks: list[Task]) -> None:
        import fcntl

        self._tasks = tasks
        self._got: dict[int, tuple[int, Any]] = {}
        self.done: dict[int, int] = {}  # task -> bytes done so far
        self._bufs: dict[int, bytearray] = {}
        self._pids: list[int] = []
        todo = b"".join(struct.pack("<I", k) for k in range(len(tasks)))
        r, w = os.pipe()
        for _ in range(min(jobs - 1, len(tasks) - 1)):
            pr, pw = os.pipe()
            with contextlib.suppress(OSError, AttributeError):  # room for big results while we are busy
                fcntl.fcntl(pw, fcntl.F_SETPIPE_SZ, 1 << 20)
            pid = os.fork()
            if pid == 0:  # the worker: never returns
                os.close(pr)
                os.close(w)
                for fd in self._bufs:
                    os.close(fd)
                self._work(r, pw)
            os.close(pw)
            self._bufs[pr] = bytearray()
            self._pids.append(pid)
        self._r = r  # this process takes tasks too
        self._todo, self._w = todo, w
        self._feed()

    def _take(self, tick: Callable[[], None]) -> bool:
        """Run the next task here, once every index is handed over (so reading one never blocks)."""
        if self._r < 0 or self._w >= 0:
            return False
        b = os.read(self._r, 4)
        if len(b) < 4:
            os.close(self._r)
            self._r = -1
            return False
        (k,) = struct.unpack("<I", b)

        def tell(n: int) -> None:
            self.done[k] = n
            tick()

        fn, args = self._tasks[k]
        try:
            self._got[k] = (2, fn(*args, progress=tell))
        except Exception as e:
            self._got[k] = (3, e)
        return True

    def _feed(self) -> None:
        """Hand the task indices over as the pipe takes them (never blocking: the workers' results may be
        waiting for us to read them)."""
        if self._w < 0:
            return
        os.set_blocking(self._w, False)
        try:
            while self._todo:
                n = os.write(self._w, self._todo[: 4 * (select.PIPE_BUF // 4)])
                self._todo = self._todo[n:]
        except BlockingIOError:
            return
        os.close(self._w)  # all handed over: a worker reading end-of-file has no more to do
        self._w = -1

    def _work(self, tasks_fd: int, out: int) -> None:
        gc.disable()  # records are trees without cycles (see profiler.logs._parse); and the parent's objects'
        # pages stay shared when no collection walks them
        code = 0
        try:
            while len(b := os.read(tasks_fd, 4)) == 4:
                (k,) = struct.unpack("<I", b)
                last = [0]

                def tell(n: int, k: int = k, last: list[int] = last) -> None:
                    if n - last[0] >= PROGRESS_EVERY:
                        _write_all(out, self._HEAD.pack(1, k, n))
                        last[0] = n

                fn, args = self._tasks[k]
                try:
                    kind, payload = 2, pickle.dumps(fn(*args, progress=tell), pickle.HIGHEST_PROTOCOL)
                except Exception as e:  # comes back where the result is asked for, with its message
                    kind, payload = 3, pickle.dumps(e if _picklable(e) else MemfracError(str(e)))
                _write_all(out, self._HEAD.pack(kind, k, len(payload)) + payload)
        except BaseException:
            code = 1
        finally:
            os._exit(code)

    def _pump(self, timeout: float) -> None:
        self._feed()
        if not self._bufs:
            return
        ready, _, _ = select.select(list(self._bufs), [], [], timeout)
        for fd in ready:
            chunk = os.read(fd, 1 << 20)
            buf = self._bufs[fd]
            if not chunk:
                del self._bufs[fd]
                os.close(fd)
                continue
            buf += chunk
            while len(buf) >= self._HEAD.size:
                kind, k, n = self._HEAD.unpack_from(buf)
                if kind == 1:
                    self.done[k] = max(self.done.get(k, 0), n)
                    del buf[: self._HEAD.size]
                    continue
                if len(buf) < self._HEAD.size + n:
                    break
                self._got[k] = (kind, pickle.loads(buf[self._HEAD.size : self._HEAD.size + n]))
                del buf[: self._HEAD.size + n]

    def result(self, k: int, tick: Callable[[], None]) -> Any:
        while k not in self._got:
            self._pump(0)
            if k in self._got or self._take(tick):
                continue
            if not self._bufs:
                raise MemfracError(f"a worker process ended without reading {self._tasks[k][1][0]} (killed?)")
            self._pump(0.25)
            tick()
        kind, got = self._got.pop(k)
        if kind == 3:
            raise got
        return got

    def close(self) -> None:
        for fd in self._bufs:
            os.close(fd)
        self._bufs.clear()
        for name in ("_w", "_r"):
            if getattr(self, name) >= 0:
                os.close(getattr(self, name))
                setattr(self, name, -1)
        for pid in self._pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)  # done ones have exited already; this stops abandoned work
            os.waitpid(pid, 0)
        self._pids.clear()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _picklable(e: Exception) -> bool:
    try:
        pickle.loads(pickle.dumps(e))
        return True
    except Exception:
        return False


_QUEUE: Any = None  # in an _Executor worker: where byte progress goes


def _executor_init(queue: Any) -> None:
    global _QUEUE
    _QUEUE = queue
    gc.disable()


def _executor_task(k: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    last = [0]

    def tell(n: int) -> None:
        if n - last[0] >= PROGRESS_EVERY:
            _QUEUE.put((k, n))
            last[0] = n

    return fn(*args, progress=tell)


class _Executor:
    """`_Forked`'s interface over concurrent.futures (platforms without fork, or where it is not the default)."""

    def __init__(self, jobs: int, tasks: list[Task]) -> None:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        self._tasks = tasks
        self.done: dict[int, int] = {}
        self._q = mp.Queue()
        self._ex = ProcessPoolExecutor(max_workers=jobs, initializer=_executor_init, initargs=(self._q,))
        self._futs = [self._ex.submit(_executor_task, k, fn, args) for k, (fn, args) in enumerate(tasks)]

    def result(self, k: int, tick: Callable[[], None]) -> Any:
        import queue as queue_mod
        from concurrent.futures import FIRST_COMPLETED, wait

        fut = self._futs[k]
        while True:
            with contextlib.suppress(queue_mod.Empty):
                while True:
                    j, n = self._q.get_nowait()
                    self.done[j] = max(self.done.get(j, 0), n)
            if fut.done():
                return fut.result()
            tick()
            wait([fut], timeout=0.25, return_when=FIRST_COMPLETED)

    def close(self) -> None:
        self._ex.shutdown(wait=True, cancel_futures=True)


def read_logs(
    files: list[Path],
    *,
    jobs: int | None = None,
    progress: Callable[[int], None] | None = None,
    range_bytes: int | None = None,
) -> Iterator[LogFile]:
    """Every file read, in input order; `jobs` > 1 reads them in that many processes at once (default: one per
    core, when there are RANGE_MIN_BYTES to read), and splits a plain file that is more than one process's share
    into byte ranges scanned side by side (`range_bytes`: their size; default: the file over `jobs`).
    `progress(n)` is told the bytes read so far over all files.
    The worker processes start at this call (before the first file is asked for), so whatever the caller
    does next runs while they read."""
    sizes = [f.stat().st_size for f in files]
    small = sum(sizes) < RANGE_MIN_BYTES and range_bytes is None  # starting processes would cost more
    if jobs is None:
        jobs = 1 if small else default_jobs()
    if jobs <= 1 or (len(files) <= 1 and small):
        return _read_serial(files, sizes, progress)
    return _read_parallel(files, sizes, jobs, progress, range_bytes)


def _read_serial(files: list[Path], sizes: list[int], progress: Callable[[int], None] | None) -> Iterator[LogFile]:
    base = 0
    for f, size in zip(files, sizes, strict=True):
        yield read_log(f, progress=(lambda n, b=base: progress(b + n)) if progress else None)
        base += size
        if progress:
            progress(base)


def _plan(
    files: list[Path], sizes: list[int], jobs: int, range_bytes: int | None
) -> list[list[tuple[int, int]] | None]:
    """Per file: the byte ranges to scan it in, or None to read it whole in one process."""
    total = sum(sizes)
    out: list[list[tuple[int, int]] | None] = []
    for f, size in zip(files, sizes, strict=True):
        if range_bytes is not None:
            big = size > range_bytes
            parts = -(-size // max(1, range_bytes))
        else:
            big = size >= RANGE_MIN_BYTES and size * jobs > total  # more than one process's share of the work
            parts = jobs
        spans = split_ranges(f, parts, min_bytes=1 if range_bytes is not None else CHUNK_BYTES) if big else []
        out.append(spans if len(spans) > 1 and sniff(f) == "text" else None)
    return out


def _read_parallel(
    files: list[Path], sizes: list[int], jobs: int, progress: Callable[[int], None] | None, range_bytes: int | None
) -> Iterator[LogFile]:
    from profiler.logs.lines import default_matcher

    plans = _plan(files, sizes, jobs, range_bytes)
    default_matcher()  # built once here (a few ms), inherited by every worker
    if any(p is None for p in plans):
        import profiler.logs.build  # noqa: F401  # whole files are parsed in the workers: load the parser once, here
    tasks: list[Task] = []
    owned: list[list[int]] = []  # per file, its tasks
    for f, spans in zip(files, plans, strict=True):
        first = len(tasks)
        if spans is None:
            tasks.append((_read_task, (str(f),)))
        else:
            tasks += [(_scan_task, (str(f), a, b)) for a, b in spans]
        owned.append(list(range(first, len(tasks))))
    sizes_of = [b - a for spans, size in zip(plans, sizes, strict=True) for a, b in (spans or [(0, size)])]
    pool = _Forked(jobs, tasks) if sys.platform == "linux" else _Executor(jobs, tasks)
    return _collect(pool, files, plans, owned, sizes_of, progress)


def _collect(
    pool: _Forked | _Executor,
    files: list[Path],
    plans: list[list[tuple[int, int]] | None],
    owned: list[list[int]],
    task_size: list[int],
    progress: Callable[[int], None] | None,
) -> Iterator[LogFile]:
    """The files in input order as their tasks finish: whole files as the workers parsed them, ranged files
    replayed here (in this process) from their ranges' scans."""
    finished: set[int] = set()

    def tick() -> None:
        if progress:
            progress(sum(size if k in finished else pool.done.get(k, 0) for k, size in enumerate(task_size)))

    def result(k: int) -> Any:
        got = pool.result(k, tick)
        finished.add(k)
        tick()
        return got

    try:
        for f, spans, mine in zip(files, plans, owned, strict=True):
            if spans is None:
                yield result(mine[0])
                continue
            lf = read_ranges(f, (result(k) for k in mine))
            if lf is None:  # a line longer than a chunk: the ranges cannot be replayed; one pass here
                for k in mine:
                    if k not in finished:
                        result(k)  # (scanned to no use; waited for so the file's tasks are all accounted)
                lf = read_log(f)
            yield lf
    finally:
        pool.close()


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


def judge(m: Measurement, *, margin_mib: float = 1024.0) -> tuple[Comparison, Judged]:
    """One logged run against the reservation of its release (or its candidates), with an honest verdict.

    The fraction reported is the run's own (printed, implied, or computed with the exact rules), never the
    heuristic's fallback; the wasteful yardstick is the largest activation reserve over the candidates."""
    from profiler.analyse.compare import compare, spare
    from profiler.analyse.verdict import run_verdict, runtime_need
    from profiler.logs.reserve import log_reservation

    lr = log_reservation(m)
    m.mfs, m.mfs_origin, m.mfs_how = lr.mfs, lr.mfs_origin, lr.mfs_how
    notes = [f"rules: {lr.rules} — {lr.rules_why}", *lr.notes]
    c = compare(m, lr.headline, margin_mib=margin_mib)
    served = runtime_need(m, None)
    need = served or lr.activation_mib()
    verdict, reason = run_verdict(m, c.headroom_mib, c.used_after_kv_mib, c.headroom_startup_mib, need)
    s = spare(verdict, c.headroom_mib, c.used_after_kv_mib, c.free_at_start_mib, need, served is not None,
              margin_mib, c.kv_bytes_per_token)  # fmt: skip
    fixes: dict[str, Any] = {"verdict": verdict, "reason": reason, "rules": lr.rules, "mfs": m.mfs,
                             "mfs_origin": m.mfs_origin, "kv_unused_mib": s.kv_unused_mib,
                             "wasted_kv_tokens": s.wasted_kv_tokens, "recommended_mfs": s.recommended_mfs}  # fmt: skip
    if m.mfs is None:
        fixes |= {"slack_mib": None, "recommended_mfs": None}  # they would rest on a fraction the log lacks
    return replace(c, **fixes), Judged(lr, need, notes)


def log_context(m: Measurement, c: Comparison) -> RunContext:
    """What a log says about the scenario (resolved args), for the store's grouping and calibration columns."""
    from profiler.results.store import RunContext

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
    if max_bs is None and isinstance(a.get("cuda_graph_max_bs"), int):
        max_bs = a["cuda_graph_max_bs"]
    return RunContext(
        group=m.id,
        moe_a2a_backend=str(a2a) if a2a else None,
        decode_max_bs=max_bs,
        chunked_prefill_size=num("chunked_prefill_size"),
        deepep_tokens=None,
        hidden_size=None,  # a log names the model, not its shapes
        num_experts=None,
    )


_FIGURES = ("weights_mib", "kv_mib", "kv_tokens", "graph_mib")


def rows_for(m: Measurement, c: Comparison, per_rank: bool = False, judged: Judged | None = None) -> list[IngestRow]:
    """The row of a run (its rank closest to OOM), or one row per rank. A figure the row's rank does not
    print is taken from the first rank that does, and `figures_from` says so."""
    from profiler.analyse.compare import rank_figures, worst_rank

    i = m.identity
    file, _, run = m.id.rpartition("#")
    lr = judged.reservation if judged is not None else None
    need = judged.need if judged is not None else None
    f = m.failure
    failing = next((r.label for r in m.ranks if r.failure is not None and r.failure is f), None)
    res_rng = lr.reserved_mib_range if lr else None
    frac_rng = lr.fraction_range if lr else None
    s = m.serving

    def row(r: Rank | None, headroom: float | None, borrow: bool) -> IngestRow:
        fig, taken = _figures(m, r, borrow)
        tokens, tokens_from = fig["kv_tokens"], "KV pool line" if fig["kv_tokens"] is not None else None
        if tokens is None:
            tokens, tokens_from = _ready_tokens(m, r)
        return IngestRow(
            file=file or m.id, run=run, rank=r.label if r else "", model=i.model, architecture=i.architecture,
            gpu=i.gpu_name, gpu_total_mib=i.gpu_total_mib, gpu_how=i.gpu_total_how, mode=i.mode, tp=i.tp,
            dp=i.dp if i.attn_dp is None else i.attn_dp, ep=i.ep,
            release=lr.release if lr else i.sglang_version, release_how=lr.release_how if lr else i.sglang_how,
            rules=lr.rules if lr else (c.rules or "none"), rules_why=lr.rules_why if lr else "",
            mfs=m.mfs, mfs_origin=m.mfs_origin, mfs_how=m.mfs_how, heuristic_fraction=c.heuristic_fraction,
            heuristic_fraction_min=frac_rng[0] if frac_rng else None,
            heuristic_fraction_max=frac_rng[1] if frac_rng else None, reserved_mib=c.reserved_terms_mib,
            reserved_min_mib=res_rng[0] if res_rng else None, reserved_max_mib=res_rng[1] if res_rng else None,
            weights_mib=fig["weights_mib"], kv_mib=fig["kv_mib"], kv_tokens=tokens, kv_tokens_from=tokens_from,
            graph_mib=fig["graph_mib"], headroom_mib=headroom, need_mib=need[0] if need else None,
            need_basis=need[1] if need else None, state=m.startup, state_seen=m.startup_seen,
            verdict=c.verdict, reason=c.reason,
            failure_kind=f.kind if f else None, failure_phase=f.phase if f else None, failure_rank=failing,
            failure_line=f.line if f else None, oom_tried_mib=f.tried_alloc_mib if f else None,
            oom_free_mib=f.free_mib if f else None, oom_capacity_mib=f.total_capacity_mib if f else None,
            oom_torch_allocated_mib=f.allocated_by_torch_mib if f else None,
            oom_private_pools_mib=f.private_pools_mib if f else None,
            oom_non_torch_mib=f.non_torch_mib if f else None,
            serving_batches=s.get("batches"), peak_running_req=s.get("peak_running_req"),
            peak_token_usage=s.get("peak_token_usage"), retractions=s.get("retractions"),
            figures_from="; ".join(taken), qualifiers="; ".join(qualifiers(m, c, lr, tokens_from)),
            unparsed_lines=m.unparsed_memory_lines,
        )  # fmt: skip

    if not per_rank:
        r = worst_rank(m)
        return [row(r, c.headroom_mib, borrow=True)]
    out = [row(r, rank_figures(r)["headroom_mib"], borrow=False) for r in m.ranks or []]
    return out or [row(None, c.headroom_mib, borrow=False)]


def _figures(m: Measurement, r: Rank | None, borrow: bool) -> tuple[dict[str, Any], list[str]]:
    from profiler.analyse.compare import rank_figures

    fig = rank_figures(r)
    taken: list[str] = []
    if not borrow:
        return fig, taken
    for key in _FIGURES:
        if fig[key] is not None:
            continue
        for other in m.ranks:
            if other is r:
                continue
            v = rank_figures(other)[key]
            if v is not None:
                fig[key] = v
                taken.append(f"{key.removesuffix('_mib')} from {other.label or 'the untagged lines'}")
                break
    return fig, taken


def _ready_tokens(m: Measurement, r: Rank | None) -> tuple[int | None, str | None]:
    for rank in ([r] if r is not None else []) + list(m.ranks):
        ready = rank.phase("ready")
        if ready is not None and isinstance(ready.details.get("max_total_num_tokens"), int):
            return ready.details["max_total_num_tokens"], "ready line"
    return None, None


def qualifiers(m: Measurement, c: Comparison, lr: LogReservation | None, tokens_from: str | None) -> list[str]:
    """The notes a reader needs before trusting a figure of this row."""
    from profiler.logs.patterns import GRAPH_PHASES

    q: list[str] = []
    if m.mfs_origin == "implied":
        bound = " (a lower bound)" if "a lower bound" in m.mfs_how else ""
        bound = " (an upper bound)" if "upper bound" in m.mfs_how else bound
        q.append("mfs implied from the KV budget" + bound)
    elif m.mfs_origin == "auto" and m.mfs_how.startswith("computed"):
        q.append("mfs computed with the release's rules (not printed)")
    if m.identity.gpu_total_how.startswith(("first avail", "avail mem after")):
        q.append(f"GPU inferred: {m.identity.gpu_total_how}")
    elif m.identity.gpu_total_how == "oom total capacity":
        q.append("GPU total is torch's (OOM message), ~0.6% under nvidia-smi's")
    if m.identity.gpu_candidates_mib and len(m.identity.gpu_candidates_mib) > 1:
        q.append("GPU capacity one of " + ", ".join(map(str, m.identity.gpu_candidates_mib)) + " MiB")
    for n in m.notes:
        if "inferred from rank tags" in n:
            q.append(n.split(";", 1)[0] + " (a lower bound)")
    if lr is not None and len({x.rule_set.name for x in lr.candidates}) > 1:
        q.append(f"reserved is one of {len(lr.candidates)} candidates (range in reserved_min/max)")
    if lr is not None and lr.candidates and all(x.fallback for x in lr.candidates):
        q.append("reserved computed without the GPU size (the heuristic's fallback defaults): an estimate")
    if tokens_from == "ready line":
        q.append("kv tokens from the ready line (the pool line does not print them)")
    if m.startup == "incomplete" and c.headroom_mib is not None:
        q.append("headroom is the last reading before the text ends, not the end of startup")
    elif m.startup == "finished" and any(p.name in GRAPH_PHASES and p.after is None for r in m.ranks for p in r.phases):
        q.append("a capture's end is not in the text: headroom is the last reading before it (an upper bound)")
    return q


COLUMNS = [f.name for f in fields(IngestRow)]


def _gib(x: float | None) -> str:
    return "—" if x is None else f"{x / 1024:.2f}"


def _reserved(r: IngestRow) -> str:
    lo, hi = r.reserved_min_mib, r.reserved_max_mib
    if lo is not None and hi is not None and hi - lo > 5:
        return f"{lo / 1024:.2f}–{hi / 1024:.2f}"
    return _gib(r.reserved_mib)


def render_table(rows: list[IngestRow]) -> str:
    """The terminal table (profiler.core.ui: rich on a TTY, Markdown off it); every column's notes in the caption."""
    from profiler.core.ui import table

    head = ["run", "rank", "model", "gpu", "mode", "tp/dp/ep", "release", "rules", "mfs", "reserved", "weights",
            "kv", "graph", "headroom", "need", "state", "verdict", "unparsed"]  # fmt: skip
    body = []
    for r in rows:
        par = "/".join("—" if x is None else str(x) for x in (r.tp, r.dp, r.ep))
        model = (r.model or r.architecture or "?").rsplit("/", 1)[-1][:28]
        gpu = r.gpu or (f"{r.gpu_total_mib / 1024:.0f}GiB?" if r.gpu_total_mib else "?")
        if r.gpu and r.gpu_how.startswith(("first avail", "avail mem after")):
            gpu += "?"  # inferred from the free memory at load, not named by the log
        mfs = "—" if r.mfs is None else f"{r.mfs:.3f} ({r.mfs_origin})"
        body.append([f"{r.file}#{r.run}", r.rank or "-", model, gpu, r.mode or "?", par, r.release or "?", r.rules,
                     mfs, _reserved(r), _gib(r.weights_mib), _gib(r.kv_mib), _gib(r.graph_mib), _gib(r.headroom_mib),
                     _gib(r.need_mib), r.state or "—", r.verdict, str(r.unparsed_lines)])  # fmt: skip
    right = [h in ("mfs", "reserved", "weights", "kv", "graph", "headroom", "need", "unparsed") for h in head]
    caption = ("sizes in GiB (sglang's 'GB'); release: stated, or the range the log's formats allow; reserved: the "
               "heuristic's terms under those rules (a range over candidates); headroom: free at the worst point; "
               "need: what runtime needs (activation reserve or measured peak). Why each row says what it says: "
               "--format json (rules_why, mfs_how, reason, qualifiers).")  # fmt: skip
    return table(head, body, title="memfrac ingest", caption=caption, right=right)


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


def _stderr(line: str) -> None:
    print(f"memfrac: {line}", file=sys.stderr)


def run_ingest(
    paths: list[str], *, fmt: str = "table", out: str | None = None, per_rank: bool = False, margin_mib: float = 1024.0,
    echo: Callable[[str], None] = print, jobs: int | None = None, warn: Callable[[str], None] = _stderr,
) -> int:  # fmt: skip
    """The command: print (or write) the rows; `out` without a file suffix is a results directory.
    Exit status 2 when no input holds a server run (each file's line says what it held)."""
    store = None
    if out is not None and (Path(out).is_dir() or not Path(out).suffix):
        from profiler.results.store import Store

        store = Store(out)
        store.init({"kind": "ingest", "inputs": [str(p) for p in paths]})
    elif fmt == "parquet" and out is None:
        raise MemfracError("--format parquet needs --out FILE.parquet")
    rows: list[IngestRow] = []
    batch: list[tuple[Measurement, Comparison, RunContext]] = []
    seen: list[LogFile] = []
    for m, c, judged in ingest(paths, margin_mib=margin_mib, jobs=jobs, warn=warn, seen=seen):
        m.notes.extend(n for n in judged.notes if n not in m.notes)
        rows += rows_for(m, c, per_rank, judged)
        if store is not None:
            ctx = replace(log_context(m, c), rules_why=judged.reservation.rules_why)
            batch.append((m, c, ctx))
    if not rows:
        warn(f"no server run in {len(seen)} file{'s' if len(seen) != 1 else ''} ({', '.join(paths)[:200]})")
        return 2
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
