"""Real SGLang server logs (2024–2026 formats) → `Measurement` records, one per server run.

    parse_log("server.log")            # a path (str or Path): streamed in chunks, any size, gz/xz/bz2/zst too
    parse_log(lines)                    # or an iterable of lines (str or bytes)
    read_log("x.log.gz")                # LogFile: the runs plus what the file held (for "no server run" lines)
    for m in iter_measurements(paths):  # many files (directories: their log files), lazily
    read_ranges(path, scans)            # a plain file from `ranges.scan_range` pieces (scanned on other cores)

Modules: `inputs` (opening: compression, encodings, file discovery), `lines` (chunked scanning), `matchers`
(which lines: keywords, traffic peaks), `ranges` (one file on several cores), `prefixes` (what stands in front
of sglang's record), `patterns` (line formats), `failures` and `oom` (how runs end), `serverargs` and
`launchcmd` (the args), `build` (runs, ranks, phases), `identity` (model, GPU, …).
"""

from __future__ import annotations

import gc
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from profiler.core.errors import MemfracError
from profiler.logs.inputs import LOG_SUFFIXES, content_kind, log_files, open_chunks, sniff
from profiler.logs.lines import CHUNK_BYTES, LineScanner, Unsplittable, chunks_of_lines
from profiler.logs.matchers import ReMatcher
from profiler.logs.prefixes import LEARN_BYTES
from profiler.logs.ranges import RangeReplay, RangeScan, scan_range, split_ranges

if TYPE_CHECKING:
    from profiler.core.measurement import Measurement

__all__ = ["LOG_SUFFIXES", "LogFile", "iter_measurements", "log_files", "parse_log", "read_log", "read_ranges"]

_ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")


class LogFile(NamedTuple):
    """One file read: its runs, and what it held (so "nothing found" can say why)."""

    path: str
    runs: list[Measurement]
    kind: str  # "text", "gzip-compressed text", "utf-16", "binary", "empty", …
    size: int  # bytes of the file itself
    lines: int  # text lines read (0 when not read)

    def summary(self) -> str:
        """One line naming the file and what was found in it."""
        if self.runs:
            return f"{self.path}: {len(self.runs)} server run{'s' if len(self.runs) > 1 else ''}"
        if self.kind == "empty":
            return f"{self.path}: empty file (0 bytes): no server run"
        if self.kind.endswith("binary"):
            return f"{self.path}: {self.kind} data, not a text log ({self.size:,} bytes): no server run"
        if self.kind.endswith("empty"):
            return f"{self.path}: {self.kind} (nothing inside): no server run"
        what = "" if self.kind == "text" else f", {self.kind}"
        lines = f"{self.lines:,} line{'' if self.lines == 1 else 's'}"
        return (f"{self.path}: {lines} of text{what}, none from an sglang server (no startup, memory or failure "
                "line): no server run")  # fmt: skip


def read_log(
    path: str | os.PathLike[str],
    *,
    name: str | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    progress: Callable[[int], None] | None = None,
    matcher: ReMatcher | None = None,
    range_bytes: int | None = None,
) -> LogFile:
    """Read one log file (plain or compressed, chosen by its first bytes); `progress(n)`: file bytes read.
    `range_bytes`: scan a plain file as byte ranges of about that size, one after another, and replay them (what
    `memfrac ingest` does on several cores; the same records as one pass, tested)."""
    p = Path(path)
    if p.is_dir():
        raise MemfracError(f"{p}: is a directory; use iter_measurements for a folder of logs")
    if not p.is_file():
        raise MemfracError(f"{p}: no such log file")
    try:
        size = p.stat().st_size
        kind = content_kind(p)
        if kind == "empty" or kind.endswith(("binary", "empty", "(damaged)")):
            if progress is not None:
                progress(size)
            if kind.endswith("(damaged)"):
                list(open_chunks(p, chunk_bytes))  # raises the MemfracError that says what is wrong
            return LogFile(str(p), [], kind, size, 0)
        if range_bytes is not None and kind == "text":
            spans = split_ranges(p, max(1, size // max(1, range_bytes)) + 1, min_bytes=1)
            got = read_ranges(p, (scan_range(p, a, b, matcher) for a, b in spans), name=name, matcher=matcher)
            if got is not None:
                if progress is not None:
                    progress(size)
                return got
        if kind == "text":  # read in place, line-aligned: no chunk copies
            runs, lines = _parse_file(p, name or p.name, chunk_bytes, progress, matcher)
        else:
            runs, lines = _parse(open_chunks(p, chunk_bytes, progress), name or p.name, str(p), matcher)
        return LogFile(str(p), runs, kind, size, lines)
    except PermissionError as e:
        raise MemfracError(f"{p}: cannot read the log ({e.strerror})") from e


def read_ranges(
    path: str | os.PathLike[str],
    scans: Iterable[RangeScan],
    *,
    name: str | None = None,
    matcher: ReMatcher | None = None,
) -> LogFile | None:
    """A plain text file from the `scan_range` results of consecutive ranges covering it, in order (they may
    still be arriving from other processes). None when a range could not be scanned on its own (a line longer
    than a chunk): read the file whole instead."""
    from profiler.logs.build import LogBuilder  # here, not at import: worker processes scan without it

    p = Path(path)
    with open(p, "rb") as f:
        head = f.read(LEARN_BYTES)
    replay = RangeReplay(p, matcher or ReMatcher())  # `re` checks one line at a time: nothing to compile
    builder = LogBuilder(name or p.name, str(p), replay)  # type: ignore[arg-type]  # same follow/lines surface
    builder.learn(_head_text(head))
    line = builder.line
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for lineno, text in replay.replay(scans):
            line(lineno, text)
        runs = builder.finish()
    except Unsplittable:
        return None
    finally:
        if gc_was_on:
            gc.enable()
    return LogFile(str(p), runs, "text", p.stat().st_size, replay.lines)


def parse_log(
    source: str | os.PathLike[str] | Iterable[str | bytes],
    *,
    name: str | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    progress: Callable[[int], None] | None = None,
    matcher: ReMatcher | None = None,
) -> list[Measurement]:
    """Every server run in one log. `source` is a path, or an iterable of lines (then `name` names it).
    Files are read `chunk_bytes` at a time; the result does not depend on it, nor on the matcher."""
    if isinstance(source, bytes | bytearray):
        raise MemfracError("parse_log takes a path or an iterable of lines, not raw bytes (use .splitlines())")
    if isinstance(source, str | os.PathLike):
        return read_log(source, name=name, chunk_bytes=chunk_bytes, progress=progress, matcher=matcher).runs
    file_name = name or "<lines>"
    return _parse(chunks_of_lines(source, chunk_bytes), file_name, file_name, matcher)[0]


def iter_measurements(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Measurement]:
    """The measurements of many logs, file by file; a directory stands for its log files (sorted)."""
    for f in log_files(paths):
        yield from read_log(f).runs


def _head(chunks: Iterator[bytes]) -> tuple[list[bytes], str]:
    """The first chunks up to LEARN_BYTES (kept, to be scanned) and that head as text."""
    kept: list[bytes] = []
    n = 0
    for c in chunks:
        kept.append(c)
        n += len(c)
        if n >= LEARN_BYTES:
            break
    return kept, _head_text(b"".join(kept)[:LEARN_BYTES])


def _head_text(head: bytes) -> str:
    """A file's first LEARN_BYTES as text for prefix learning, cut at a line end."""
    head = head[:LEARN_BYTES]
    head = head[: head.rfind(b"\n") + 1] if len(head) >= LEARN_BYTES else head
    if b"\x1b" in head:
        head = _ANSI.sub(b"", head)
    return head.decode("utf-8", "replace")


def _parse(
    chunks: Iterable[bytes], file_name: str, origin: str, matcher: ReMatcher | None = None
) -> tuple[list[Measurement], int]:
    from profiler.logs.build import LogBuilder

    it = iter(chunks)
    kept, head = _head(it)
    scanner = LineScanner(matcher)
    builder = LogBuilder(file_name, origin, scanner)
    builder.learn(head)
    line = builder.line

    def all_chunks() -> Iterator[bytes]:
        yield from kept
        yield from it

    # The records are trees without cycles: pausing the cyclic GC keeps ingest linear in the file size
    # (otherwise each collection re-walks every phase built so far).
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for lineno, text in scanner.scan(all_chunks()):
            line(lineno, text)
        return builder.finish(), scanner.lines
    finally:
        if gc_was_on:
            gc.enable()


def _parse_file(
    p: Path, file_name: str, chunk_bytes: int, progress: Callable[[int], None] | None, matcher: ReMatcher | None
) -> tuple[list[Measurement], int]:
    from profiler.logs.build import LogBuilder

    with open(p, "rb") as f:
        head = f.read(LEARN_BYTES)
    scanner = LineScanner(matcher)
    builder = LogBuilder(file_name, str(p), scanner)
    builder.learn(_head_text(head))
    line = builder.line
    gc_was_on = gc.isenabled()
    gc.disable()  # see _parse
    try:
        for lineno, text in scanner.scan_file(p, chunk_bytes, progress):
            line(lineno, text)
        return builder.finish(), scanner.lines
    finally:
        if gc_was_on:
            gc.enable()


def file_kind(path: str | os.PathLike[str]) -> str:
    """The container of a file, by magic bytes: gzip, xz, bz2, zstd, text, utf-16, empty or binary."""
    return sniff(path)
