"""The reading side of `memfrac ingest`: log files read in parallel, one process per core.

Several files are parsed side by side, and a big plain file is cut into byte ranges scanned side by side
(`profiler.logs.ranges` `scan_range`, replayed in order by `profiler.logs.read_ranges`), behind one progress
count in bytes. The worker processes are forked directly (`_Forked`: a pipe of task numbers, a result pipe
each; no multiprocessing start-up) and this process takes tasks too while it waits; `_Executor` is the same
over concurrent.futures where fork is not the default.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import select
import signal
import struct
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from profiler.core.errors import MemfracError
from profiler.logs import LogFile, read_log, read_ranges
from profiler.logs.inputs import sniff
from profiler.logs.lines import CHUNK_BYTES
from profiler.logs.ranges import RANGE_MIN_BYTES, RangeScan, scan_range, split_ranges


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
    from profiler.logs.matchers import default_matcher

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
