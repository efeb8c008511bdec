"""Streaming line source: raw bytes in fixed-size chunks → the few lines worth parsing, with line numbers.

Why this shape: server logs run to gigabytes and are mostly request traffic. The scanner holds one chunk
(plus one bounded partial line), finds candidate lines with one multi-pattern pass over the raw bytes of the
chunk (no per-line Python work for the lines it skips) and decodes only the hits. Line numbers count
b"\\n" like `grep -n`/`wc -l`; a bare CR (tqdm redraws) splits a physical line into segments that share its
number. The consumer can ask for the next N lines unfiltered (`follow`) to join wrapped text. A plain file is
read in place (`scan_file`: line-aligned reads into one reused buffer).

Request traffic ("Decode batch, #running-req: 37, …, token usage: 0.41, …") is read without visiting every
line: between two keyword lines, only the traffic lines that raise a field above its maximum so far in that
stretch are yielded (a threshold pattern, recompiled when the maximum rises), so whoever takes the maximum
of what it is given gets the exact peak of every stretch, hence of every run.

The rest of the line source, by concept: `matchers` (which lines: keywords and traffic peaks, with aho,
hyperscan or `re`), `ranges` (one file on several cores: byte ranges scanned apart, replayed in order),
`prefixes` (what stands in front of sglang's record, learned per file).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator

from profiler.logs.matchers import PEAK_FIELDS, PEAK_RE_WINDOW, ReMatcher, default_matcher, field_values

CHUNK_BYTES = 4 << 20
MAX_LINE_BYTES = 1 << 20  # a longer "line" (no newline at all) is cut so memory stays bounded

# Rank tags of every line ("[… DP0 TP0 EP0] ", or 2024's "[gpu=N] " / "[gpu_id=N] ": prefixes.py), anywhere near
# a line's start: a rank that logs no memory line still exists (sglang-565: four "[gpu_id=N] Set cuda device." lines,
# nothing else); once RANK_DISCOVERY_BYTES in a row bring no new label, stop looking (speed).
_LABEL = re.compile(rb"\[(?:\d[\d\- :.,T]{7,29}?((?: [A-Z][A-Z_]*\d+)+) ?|(gpu(?:_id)?=\d+))\]")
RANK_DISCOVERY_BYTES = 4 << 20
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")

# ---- scanner --------------------------------------------------------------------------------------------------


_FRESH = tuple(-1 for _ in PEAK_FIELDS)  # no traffic value seen yet
_NO_LABELS: list[tuple[int, bytes]] = []  # shared, never appended to


class LineScanner:
    """Yields (line number, text) for candidate lines of a byte stream; see the module docstring."""

    def __init__(self, matcher: ReMatcher | None = None) -> None:
        self.follow = 0  # the consumer sets this to receive the next N lines whatever their content
        self.matcher = matcher or default_matcher()
        self._labels: set[bytes] = set()
        self._labels_done = False  # RANK_DISCOVERY_BYTES went by without a new label: stop looking
        self._offset = 0  # normalised bytes (CRLF → LF, ANSI codes removed) scanned before the current body
        self._last_new_label = 0  # stream offset of the last new rank label
        self._levels = _FRESH  # traffic maxima since the last keyword line
        self._hot = 0  # stream offset up to which maxima are still rising (see ReMatcher.above)
        self.lines = 0  # physical lines scanned so far (like `wc -l`, plus a last line without newline)
        self.normalised = False  # the current body had CRLFs or ANSI codes removed (its offsets moved)

    def scan(self, chunks: Iterable[bytes]) -> Iterator[tuple[int, str]]:
        for lineno, line, _end, _keyword, _labels in self._physical(chunks):
            yield from segments(lineno, line)

    def scan_file(
        self, path: str | os.PathLike[str], chunk: int = CHUNK_BYTES, progress: Callable[[int], None] | None = None
    ) -> Iterator[tuple[int, str]]:
        """`scan` for a plain file, read in place (`file_bodies`); lines up to max(chunk, MAX_LINE_BYTES) stay
        whole, longer ones are cut into MAX_LINE_BYTES pieces. `progress(n)`: bytes done."""
        window = max(chunk, MAX_LINE_BYTES + 1)
        lineno = 0
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            for data, n, pos, piece in file_bodies(f.fileno(), 0, size, window, cut_long=True):
                for ln, line, _end, _keyword, _labels in self._scan_body(data, lineno, n):
                    yield from segments(ln, line)
                if not piece:
                    lineno += count_newlines(data)
                    self.lines = lineno
                if progress is not None:
                    progress(min(pos + n, size))

    def _physical(self, chunks: Iterable[bytes]) -> Iterator[tuple[int, bytes, int, bool, list[tuple[int, bytes]]]]:
        lineno = 0
        tail = b""
        for chunk in chunks:
            if tail:
                chunk = tail + chunk
            cut = chunk.rfind(b"\n") + 1
            if cut == 0:
                if len(chunk) <= MAX_LINE_BYTES:
                    tail = chunk
                    continue
                # One over-long line: scan a bounded piece now; the physical line (and its number) goes on.
                yield from self._scan_body(chunk[:MAX_LINE_BYTES] + b"\n", lineno)
                tail = chunk[MAX_LINE_BYTES:]
                continue
            body, tail = (chunk[:cut], chunk[cut:]) if cut < len(chunk) else (chunk, b"")
            yield from self._scan_body(body, lineno)
            lineno += count_newlines(body)
            self.lines = lineno
        if tail:
            yield from self._scan_body(tail + b"\n", lineno)
            self.lines = lineno + 1

    def _scan_body(
        self, raw: bytes | bytearray, base: int, n: int | None = None
    ) -> Iterator[tuple[int, bytes, int, bool, list[tuple[int, bytes]]]]:
        """Lines to hand on from one body of whole lines (its first `n` bytes): (line number, bytes without the
        newline, offset of its newline in the normalised body, keyword line?, rank labels first seen in it as
        (body offset, label))."""
        n = len(raw) if n is None else n
        self.normalised = False
        clean = getattr(self.matcher, "clean_finder", None)  # keywords and "needs normalising" in one pass
        next_hit = clean(raw, n) if clean is not None else None
        if next_hit is None:
            if raw.find(b"\r", 0, n) >= 0:
                raw = raw[:n].replace(b"\r\n", b"\n")
                n, self.normalised = len(raw), True
            if raw.find(b"\x1b", 0, n) >= 0:
                raw = _ANSI.sub(b"", raw[:n])
                n, self.normalised = len(raw), True
            next_hit = self.matcher.finder(raw, n)
        offset = self._offset
        self._offset += n
        copy = bytes if type(raw) is not bytes else None  # lines out of a reused buffer are copied out
        above = self.matcher.above
        rfind, find, count = raw.rfind, raw.find, raw.count
        sightings = self._new_labels(raw, offset, n)
        pos = counted = 0
        lineno = base
        hit = peak = -2  # cached searches (valid while >= pos)
        peak_key: tuple[int, tuple[int, ...]] = (-1, self._levels)
        while pos < n:
            keyword = False
            if self.follow > 0:
                start = pos
                self.follow -= 1
            else:
                if hit != -1 and hit < pos:
                    hit = next_hit(pos)
                line_at = (rfind(b"\n", pos, hit) + 1 or pos) if hit >= 0 else n
                if peak_key != (line_at, self._levels) or (peak != -1 and peak < pos):
                    peak = above(raw, pos, line_at, self._levels, self._hot - offset) if pos < line_at else -1
                    peak_key = (line_at, self._levels)
                while sightings and sightings[-1][0] < pos:
                    sightings.pop()
                first = line_at
                if peak != -1 and peak < first:
                    first = peak
                if sightings and sightings[-1][0] < first:
                    first = sightings[-1][0]
                if first < line_at:
                    start = rfind(b"\n", pos, first) + 1 or pos
                elif hit >= 0:
                    start, keyword = line_at, True
                else:
                    break
            end = find(b"\n", start)
            lineno += count(b"\n", counted, start)
            counted = start
            line = raw[start:end] if copy is None else copy(raw[start:end])
            pos = end + 1
            if keyword:
                self._levels = _FRESH
                self._hot = offset + pos + PEAK_RE_WINDOW
            else:
                vals = field_values(line)
                if max(vals) >= 0:
                    levels = tuple(max(a, b) for a, b in zip(self._levels, vals, strict=True))
                    if levels != self._levels:
                        self._levels = levels
                        self._hot = offset + pos + PEAK_RE_WINDOW
            mine: list[tuple[int, bytes]] = _NO_LABELS
            if sightings and sightings[-1][0] <= end:
                mine = []
                while sightings and sightings[-1][0] <= end:
                    mine.append(sightings.pop())
            yield lineno + 1, line, end, keyword, mine

    def _new_labels(self, body: bytes | bytearray, offset: int, n: int) -> list[tuple[int, bytes]]:
        """(body offset, label) of the first occurrence of each rank label not seen before, last first.

        A line is looked at while its start is within RANK_DISCOVERY_BYTES (normalised stream bytes) of the
        last new label; the first line past that ends the search for good. Whole lines, so the result does not
        depend on where chunks (or byte ranges) begin."""
        if self._labels_done:
            return []
        found: list[tuple[int, bytes]] = []
        pos = 0
        while pos < n:
            lim = self._last_new_label + RANK_DISCOVERY_BYTES - offset
            if lim <= pos:
                self._labels_done = True
                break
            stop = n if lim >= n else (body.find(b"\n", lim - 1) + 1 or n)
            for m in _LABEL.finditer(body, pos, stop):
                lab = m.group(1) or m.group(2) or b""
                if lab not in self._labels:
                    self._labels.add(lab)
                    found.append((m.start(), lab))
                    self._last_new_label = offset + m.start()
            pos = stop
        found.reverse()
        return found


def segments(lineno: int, line: bytes) -> Iterator[tuple[int, str]]:
    """A physical line as text: the segments a bare CR (tqdm redraw) splits it into share its number."""
    text = line.decode("utf-8", "replace")
    if "\r" in text:
        for seg in text.split("\r"):
            if seg.strip():
                yield lineno, seg
    else:
        yield lineno, text


def count_newlines(data: bytes | bytearray) -> int:
    """b"\\n" in `data`. Deleting them finds each with memchr (vectorised), about 3× faster than
    bytes.count's byte-by-byte loop on log lines; the temporary copy costs less than the difference."""
    return len(data) - len(data.replace(b"\n", b""))


def chunks_of_file(path: str, size: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Read a file as fixed-size byte chunks (constant memory)."""
    with open(path, "rb") as f:
        while chunk := f.read(size):
            yield chunk


def chunks_of_lines(lines: Iterable[str | bytes], size: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Batch an iterable of lines (str or bytes, with or without line ends) into byte chunks."""
    buf: list[bytes] = []
    n = 0
    for item in lines:
        b = item if isinstance(item, bytes) else item.encode("utf-8", "replace")
        if not b.endswith(b"\n"):
            b += b"\n"
        buf.append(b)
        n += len(b)
        if n >= size:
            yield b"".join(buf)
            buf, n = [], 0
    if buf:
        yield b"".join(buf)


class Unsplittable(Exception):
    """A range could not be scanned on its own (a line longer than a chunk): read the file in one pass."""


def file_bodies(
    fd: int, start: int, end: int, chunk: int, *, cut_long: bool
) -> Iterator[tuple[bytes | bytearray, int, int, bool]]:
    """A plain file's [start, end) as bodies of whole lines: (buffer, n, file offset, piece) where the body is
    buffer[:n]. Reads begin at line starts into one reused buffer (no fresh pages per chunk, no copies); the
    buffer is overwritten by the next read. The last line without a newline gets one. A line longer than
    `chunk`: with `cut_long`, pieces of MAX_LINE_BYTES (piece=True, each given a newline, sharing the line's
    number); without, Unsplittable."""
    buf = bytearray(chunk)
    view = memoryview(buf)
    pos = start
    while pos < end:
        got = os.preadv(fd, [view[: min(chunk, end - pos)]], pos)
        if got <= 0:
            return
        data: bytes | bytearray = buf if got == chunk else bytes(view[:got])
        cut = data.rfind(b"\n", 0, got) + 1
        if cut > 0:
            yield data, cut, pos, False
            pos += cut
        elif pos + got >= end:  # the last line, without a newline
            yield bytes(view[:got]) + b"\n", got + 1, pos, False
            return
        elif not cut_long:
            raise Unsplittable(f"a line longer than {chunk:,} bytes at offset {pos:,}")
        else:
            k = min(MAX_LINE_BYTES, got)
            yield bytes(view[:k]) + b"\n", k + 1, pos, True
            pos += k
