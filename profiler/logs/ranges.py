"""One file on several cores: `split_ranges` cuts it at line starts, `scan_range` scans each range as a file of
its own (in worker processes: traffic maxima and rank discovery start afresh there), `RangeReplay` rebuilds
exactly the serial scan's lines from the pieces, in order, with the real maxima, line numbers and rank-label
rule, reading the lines the parser asks to follow from the file itself."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate, pairwise
from typing import NamedTuple

import profiler.logs.lines as _lines  # CHUNK_BYTES / RANK_DISCOVERY_BYTES read at call time (tests set them)
from profiler.logs.lines import (
    _ANSI,
    _FRESH,
    LineScanner,
    Unsplittable,
    count_newlines,
    file_bodies,
    segments,
)
from profiler.logs.matchers import PEAK_RE_WINDOW, ReMatcher, default_matcher, field_values

# ---- byte ranges: one file on several cores -------------------------------------------------------------------

RANGE_MIN_BYTES = 16 << 20  # a smaller file is read in one pass: ranges cost more in start-up than they save

Found = tuple[int, int, bool, bytes, int, tuple[tuple[int, bytes], ...]]


class RangeScan(NamedTuple):
    """What one byte range of a plain file holds for the scanner, scanned as if it were a file of its own.

    `found`: the lines a scan starting at the range would hand on, as (line index in the range, file offset
    after its newline, keyword line?, its bytes (normalised), normalised offset of its start, rank labels first
    seen in it as (normalised offset, label)). Peak and label state start afresh at the range, so these are a
    superset of what the whole file's scan hands on there; `RangeReplay` keeps exactly those."""

    start: int
    end: int
    lines: int  # physical lines in the range
    nbytes: int  # normalised bytes in the range (rank-label discovery counts these)
    found: list[Found]
    error: str | None = None  # why the range cannot be scanned on its own (then read the file whole)


def split_ranges(path: str | os.PathLike[str], parts: int, min_bytes: int = RANGE_MIN_BYTES) -> list[tuple[int, int]]:
    """[start, end) byte ranges of about equal size, each starting at a line start; at most size/min_bytes."""
    size = os.path.getsize(path)
    parts = max(1, min(parts, size // max(1, min_bytes)))
    cuts = [0]
    with open(path, "rb") as f:
        fd = f.fileno()
        for k in range(1, parts):
            at = max(size * k // parts, cuts[-1] + 1)
            nl = -1
            while nl < 0 and at < size:
                block = os.pread(fd, 1 << 16, at - 1)
                nl = block.find(b"\n")
                if nl < 0:
                    at += len(block)
            if nl < 0:
                break
            cut = at + nl  # just after the first newline at or after at - 1
            if cut >= size:
                break
            if cut > cuts[-1]:
                cuts.append(cut)
    cuts.append(size)
    return [(a, b) for a, b in pairwise(cuts) if b > a] or [(0, size)]


def scan_range(
    path: str | os.PathLike[str],
    start: int,
    end: int,
    matcher: ReMatcher | None = None,
    chunk: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> RangeScan:
    """Scan the lines starting in [start, end) of a plain file (start and end are line starts or the file's
    ends). Meant for worker processes; `progress(n)`: bytes of the range done. `chunk`: read size (default
    CHUNK_BYTES); a line longer than that makes the range unsplittable (`error`)."""
    chunk = chunk or _lines.CHUNK_BYTES
    sc = LineScanner(matcher)
    sc._hot = PEAK_RE_WINDOW  # maxima start rising at the range start
    found: list[Found] = []
    add = found.append
    lines = 0
    with open(path, "rb", buffering=0) as f:
        try:
            for data, n, pos, _piece in file_bodies(f.fileno(), start, end, chunk, cut_long=False):
                nbase = sc._offset
                ends: list[int] | None = None
                for ln, line, nl, keyword, labels in sc._scan_body(data, lines, n):
                    if sc.normalised:  # offsets moved (CRLF, ANSI codes): the line's raw end from its index
                        if ends is None:
                            ends = list(accumulate(len(x) + 1 for x in bytes(data[:n]).split(b"\n")))
                        raw_end = pos + ends[ln - 1 - lines]
                    else:
                        raw_end = pos + nl + 1
                    labs = tuple((nbase + o, b) for o, b in labels)
                    add((ln - 1, raw_end, keyword, line, nbase + nl - len(line), labs))
                lines += count_newlines(data)  # none after n: a body ends at the last newline read
                if progress is not None:
                    progress(min(pos + n, end) - start)
        except Unsplittable as e:
            return RangeScan(start, end, 0, 0, [], str(e))
    return RangeScan(start, end, lines, sc._offset, found)


class RangeReplay:
    """The lines the serial scanner hands on, rebuilt from the `RangeScan`s of consecutive ranges (in order).

    Why it is exact: each range was scanned with its traffic maxima reset at its start, i.e. with thresholds no
    higher than the whole file's at every line, so it found every line the serial scan keeps and some more;
    here the real thresholds (carried across ranges) drop the extra ones, line numbers add up the ranges' line
    counts, and rank labels follow the serial rule over the ranges' first sightings. Lines the consumer asks
    for with `follow` (wrapped text) are read from the file itself, after the line that asked."""

    def __init__(self, path: str | os.PathLike[str], matcher: ReMatcher | None = None) -> None:
        self.follow = 0
        self.lines = 0
        self._path = path
        self._matcher = matcher or default_matcher()
        self._levels = _FRESH
        self._labels: set[bytes] = set()
        self._labels_done = False
        self._last_new_label = 0

    def replay(self, scans: Iterable[RangeScan]) -> Iterator[tuple[int, str]]:
        m = self._matcher
        gt = ReMatcher.above  # `re` on one line: the same threshold patterns as the scan's
        with open(self._path, "rb") as f:
            reader = _LineReader(f.fileno())
            done_to = 0  # file offset: every line before it was handed on or passed over
            lbase = nbase = expect = 0
            for rs in scans:
                if rs.error is not None:
                    raise Unsplittable(f"{self._path}: {rs.error}")
                if rs.start != expect:
                    raise ValueError(f"{self._path}: range {rs.start}-{rs.end} follows one ending at {expect}")
                expect = rs.end
                for idx, raw_end, keyword, line, nstart, labels in rs.found:
                    new = False
                    if labels and not self._labels_done:
                        if nbase + nstart >= self._last_new_label + _lines.RANK_DISCOVERY_BYTES:
                            self._labels_done = True
                        else:
                            for o, lab in labels:
                                if lab not in self._labels:
                                    self._labels.add(lab)
                                    self._last_new_label = nbase + o
                                    new = True
                    if raw_end <= done_to:
                        continue  # already handed on as a followed line
                    if not (keyword or new) and gt(m, line + b"\n", 0, len(line) + 1, self._levels) < 0:
                        continue  # raises no maximum of the whole stretch
                    lineno = lbase + idx + 1
                    done_to = raw_end
                    self._take(line, keyword)
                    yield from segments(lineno, line)
                    while self.follow > 0:
                        got = reader.line(done_to)
                        if got is None:
                            break
                        line, done_to = got
                        self.follow -= 1
                        lineno += 1
                        self._take(line, False)
                        yield from segments(lineno, line)
                lbase += rs.lines
                nbase += rs.nbytes
        self.lines = lbase

    def _take(self, line: bytes, keyword: bool) -> None:
        if keyword:
            self._levels = _FRESH
            return
        vals = field_values(line)
        if max(vals) >= 0:
            self._levels = tuple(max(a, b) for a, b in zip(self._levels, vals, strict=True))


class _LineReader:
    """Physical lines of a file by offset (normalised like the scanner's bodies), from a cached block."""

    def __init__(self, fd: int) -> None:
        self._fd, self._at, self._buf = fd, 0, b""

    def line(self, off: int) -> tuple[bytes, int] | None:
        """The line starting at `off` (without its newline) and the offset after it; None at the end."""
        rel = off - self._at
        if rel < 0 or rel >= len(self._buf) or self._buf.find(b"\n", rel) < 0:
            size = 1 << 16
            while True:
                self._buf, self._at, rel = os.pread(self._fd, size, off), off, 0
                if b"\n" in self._buf or len(self._buf) < size:
                    break
                size *= 4
        if rel >= len(self._buf):
            return None
        nl = self._buf.find(b"\n", rel)
        if nl < 0:  # the file's last line, without a newline (offsets as scan_range gives them)
            raw, nxt = self._buf[rel:] + b"\n", self._at + len(self._buf) + 1
        else:
            raw, nxt = self._buf[rel : nl + 1], self._at + nl + 1
        if b"\r" in raw:
            raw = raw.replace(b"\r\n", b"\n")
        if b"\x1b" in raw:
            raw = _ANSI.sub(b"", raw)
        return raw[:-1], nxt


