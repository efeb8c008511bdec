"""Real SGLang server logs (2024–2026 formats) → `Measurement` records, one per server run.

    parse_log("server.log")            # a path (str or Path): streamed in chunks, any size
    parse_log(lines)                    # or an iterable of lines (str or bytes)
    for m in iter_measurements(paths):  # many files (directories: their *.log / *.txt), lazily

Modules: `lines` (chunked scanning, prefixes), `patterns` (line formats), `failures` and `oom` (how runs
end), `serverargs` and `launchcmd` (the args), `build` (runs, ranks, phases), `identity` (model, GPU, …).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from profiler.errors import MemfracError
from profiler.logs.build import LogBuilder
from profiler.logs.lines import CHUNK_BYTES, LineScanner, chunks_of_file, chunks_of_lines
from profiler.measurement import Measurement

__all__ = ["iter_measurements", "parse_log"]

LOG_SUFFIXES = (".log", ".txt", ".out", ".err")


def parse_log(
    source: str | os.PathLike[str] | Iterable[str | bytes],
    *,
    name: str | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    progress: Callable[[int], None] | None = None,
) -> list[Measurement]:
    """Every server run in one log. `source` is a path, or an iterable of lines (then `name` names it).
    Files are read `chunk_bytes` at a time; the result does not depend on it."""
    if isinstance(source, bytes | bytearray):
        raise MemfracError("parse_log takes a path or an iterable of lines, not raw bytes (use .splitlines())")
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if path.is_dir():
            raise MemfracError(f"{path}: is a directory; use iter_measurements for a folder of logs")
        if not path.is_file():
            raise MemfracError(f"{path}: no such log file")
        try:
            chunks = chunks_of_file(str(path), chunk_bytes)
            if progress is not None:
                chunks = _counting(chunks, progress)
            return _parse(chunks, name or path.name, str(path))
        except PermissionError as e:
            raise MemfracError(f"{path}: cannot read the log ({e.strerror})") from e
    file_name = name or "<lines>"
    return _parse(chunks_of_lines(source, chunk_bytes), file_name, file_name)


def _counting(chunks: Iterable[bytes], progress: Callable[[int], None]) -> Iterator[bytes]:
    """Report bytes read so far after each chunk (for progress on large files)."""
    done = 0
    for c in chunks:
        done += len(c)
        progress(done)
        yield c


def iter_measurements(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Measurement]:
    """The measurements of many logs, file by file; a directory stands for its log files (sorted)."""
    for p in paths:
        path = Path(p)
        if path.is_dir():
            for f in sorted(x for x in path.iterdir() if x.is_file() and x.suffix in LOG_SUFFIXES):
                yield from parse_log(f)
        else:
            yield from parse_log(path)


def _parse(chunks: Iterable[bytes], file_name: str, origin: str) -> list[Measurement]:
    scanner = LineScanner()
    builder = LogBuilder(file_name, origin, scanner)
    line = builder.line
    # The records are trees without cycles: pausing the cyclic GC keeps ingest linear in the file size
    # (otherwise each collection re-walks every phase built so far).
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for lineno, text in scanner.scan(chunks):
            line(lineno, text)
        return builder.finish()
    finally:
        if gc_was_on:
            gc.enable()
