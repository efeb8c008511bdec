"""Streaming line source: raw bytes in fixed-size chunks → the few lines worth parsing, with line numbers.

Why this shape: server logs run to gigabytes and are mostly request traffic. The scanner holds one chunk
(plus one bounded partial line), finds candidate lines with one multi-pattern pass over the raw bytes of the
chunk (no per-line Python work for the lines it skips) and decodes only the hits. Line numbers count
b"\\n" like `grep -n`/`wc -l`; a bare CR (tqdm redraws) splits a physical line into segments that share its
number. The consumer can ask for the next N lines unfiltered (`follow`) to join wrapped text. A plain file is
read in place (`scan_file`: line-aligned reads into one reused buffer).

Three matchers give the same lines: "aho" (keywords with ahocorasick-rs, Rust's SIMD Teddy search, peaks with
hyperscan when it imports), "hyperscan" (both with hyperscan) and Python's `re` (always there; slower on
traffic-heavy logs). The fastest that imports is used; MEMFRAC_MATCHER=aho|hyperscan|re forces one.

One file on several cores: `split_ranges` cuts it at line starts, `scan_range` scans each range as a file of
its own (in worker processes), `RangeReplay` rebuilds exactly the serial scan's lines from the pieces, in order.

Request traffic ("Decode batch, #running-req: 37, …, token usage: 0.41, …") is read without visiting every
line: between two keyword lines, only the traffic lines that raise a field above its maximum so far in that
stretch are yielded (a threshold pattern, recompiled when the maximum rises), so whoever takes the maximum
of what it is given gets the exact peak of every stretch, hence of every run.

Prefixes: `PrefixLearner` finds sglang's "[date time RANKS] " record wherever it starts in a line and learns,
per file, the leading shapes in front of it (docker/kubernetes timestamps, journald, compose "svc | ", "> "
quotes, …) so that untagged lines with the same shape (tracebacks, tqdm bars, commands) are stripped too.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable, Iterator
from functools import lru_cache
from itertools import accumulate, pairwise
from typing import Any, NamedTuple

from profiler.core.errors import MemfracError

CHUNK_BYTES = 4 << 20
MAX_LINE_BYTES = 1 << 20  # a longer "line" (no newline at all) is cut so memory stays bounded

# Every line a pattern reads contains one of these (byte regexes; all but one are literals). Runtime evidence
# from traffic (KV pool full / retractions, runtime OOM) is covered by "KV " / "etract" / "out of memory"
# words; uvicorn's "Started server process [PID]" tells a new process.
KEYWORDS: tuple[bytes, ...] = (
    rb"GB[^/]",  # "avail mem=1.46 GB"; not "GB/s" (decode-line bandwidth with --enable-mfu-metrics)
    b"GiB",
    b"MiB",
    b"KiB",
    b"KV ",
    b"Captur",
    b"_total_num_tokens=",
    b"_size=",
    b"Use sliding",
    b"Use Sliding",
    b"Post-capture",
    b"Traceback",
    b"Error",
    b"Exception",
    b"CUDA ",
    b"HIP out",
    b"OutOfMemory",
    b"OutOfResources",  # triton: "triton.runtime.errors.OutOfResources: out of resource: shared memory"
    b"out of memory",
    b"Not enough memory",
    b"Loaded weights",
    b"Schedul",
    b"ServerArgs(",
    b"Subprocess",
    b"Rank ",
    b"Received sigquit",
    b"ForC",
    b'File "',
    b"Found local HF",
    b"Started server process",
    b"etract",  # KV retractions ("#retracted-req", "KV cache pool is full. Retract requests")
    b"Registering ",  # "Registering 0 cuda graph addresses": a capture that aborted
    b"sgl-dev",  # rocm/sgl-dev:v0.5.8.post1-… image tags (the release that wrote the log)
    b'"version"',  # server_info dumps
    b"profiled value",  # "max_total_tokens=… is larger than the profiled value -561981": a negative KV budget
    b"ready to roll",  # "The server is fired up and ready to roll!": startup finished
    b"\\\n",  # a backslash continuation (launch command)
    b"sglang",
    b"launch_server",
    b"server_args={",
)
_REGEX_KEYWORDS = frozenset({rb"GB[^/]"})  # the others are literals


def keyword_patterns() -> list[bytes]:
    """KEYWORDS as regexes (literals escaped): what both matchers search for."""
    return [kw if kw in _REGEX_KEYWORDS else re.escape(kw) for kw in KEYWORDS]


# Traffic fields whose per-stretch maximum is kept: (literal before the number, decimals printed).
PEAK_FIELDS: tuple[tuple[bytes, int], ...] = ((b"#running-req: ", 0), (b"token usage: ", 2))
PEAK_RE_WINDOW = 256 << 10  # threshold search with `re` this far ahead before handing a long stretch to hyperscan

# Rank tags of every line ("[… DP0 TP0 EP0] "), anywhere near a line's start: a rank that logs no memory
# line still exists; once RANK_DISCOVERY_BYTES in a row bring no new label, stop looking (speed).
_LABEL = re.compile(rb"\[\d[\d\- :.,T]{7,29}?((?: [A-Z][A-Z_]*\d+)+) ?\]")
RANK_DISCOVERY_BYTES = 4 << 20
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")

# "> " quotes (GitHub issues), docker compose "service-1  | " prefixes.
_QUOTE = re.compile(r"^(?:> ?)+")
_COMPOSE = re.compile(r"^[A-Za-z0-9][\w.-]*\s+\| ")
# A tqdm stats block "[00:03<00:00,  1.07it/s]" glued to the next record (no newline between them).
_TQDM_END = re.compile(r"\d+/\d+ \[[^\]\[]*(?:it/s|s/it)\]")

# "[2026-05-07 13:39:14 DP0 TP0 EP0] msg", "[23:17:01 TP7] msg", "[2025-01-23 19:34:55.123] msg".
_PREFIX = re.compile(
    r"\[(?P<ts>(?P<date>\d{4}-\d\d-\d\d)?[ T]?(?P<hms>\d\d:\d\d:\d\d)(?:[.,]\d+)?)"
    r"(?P<ranks>(?: +[A-Z][A-Z_]*\d+)*) *\] ?"
)
_RANK_TOKEN = re.compile(r"([A-Z][A-Z_]*?)(\d+)$")


class Prefixed(NamedTuple):
    """A line split into its sglang record prefix and message; `label` is None for untagged lines.
    `lead` is what stood before the record (a docker/journald/compose prefix), `pid` a process id in it."""

    date: str | None
    hms: str | None
    label: str | None
    msg: str
    lead: str = ""
    pid: int | None = None


# ---- matchers ----------------------------------------------------------------------------------------------


def _gt_int(p: int) -> str:
    """Regex for a decimal integer (no leading zeros) greater than p (p = -1: any)."""
    if p < 0:
        return r"\d+"
    s = str(p)
    alts = [rf"[1-9]\d{{{len(s)},}}"]
    for i, ch in enumerate(s):
        if ch != "9":
            lo = int(ch) + 1
            rest = len(s) - i - 1
            alts.append(s[:i] + (f"[{lo}-9]" if lo < 9 else "9") + (rf"\d{{{rest}}}" if rest else ""))
    return "(?:" + "|".join(alts) + ")"


def _gt_fixed(f: str) -> str | None:
    """Regex for a fixed-width digit string greater than f, or None if f is all nines."""
    alts = []
    for i, ch in enumerate(f):
        if ch != "9":
            lo = int(ch) + 1
            rest = len(f) - i - 1
            alts.append(f[:i] + (f"[{lo}-9]" if lo < 9 else "9") + (rf"\d{{{rest}}}" if rest else ""))
    return "(?:" + "|".join(alts) + ")" if alts else None


def gt_pattern(literal: bytes, decimals: int, scaled: int) -> bytes:
    """`literal` followed by a number printed with `decimals` places whose value ×10**decimals exceeds
    `scaled` (−1: any number), then a non-digit. The same text for `re` and hyperscan."""
    lit = re.escape(literal.decode())
    if decimals == 0:
        return f"{lit}{_gt_int(scaled)}[^0-9]".encode()
    frac = rf"\.\d{{{decimals}}}"
    if scaled < 0:
        return f"{lit}\\d+{frac}[^0-9]".encode()
    whole, part = divmod(scaled, 10**decimals)
    alts = [f"{_gt_int(whole)}{frac}"]
    g = _gt_fixed(str(part).zfill(decimals))
    if g is not None:
        alts.append(rf"{whole}\.{g}")
    return f"{lit}(?:{'|'.join(alts)})[^0-9]".encode()


_FIELD_VALUE = [
    re.compile(re.escape(lit) + (rb"(\d+)" if dec == 0 else rb"(\d+)\.(\d{%d})(?!\d)" % dec))
    for lit, dec in PEAK_FIELDS
]


def field_values(line: bytes) -> tuple[int, ...]:
    """The largest value (×10**decimals) of each peak field on one line, −1 where absent."""
    out = []
    for (_, dec), rx in zip(PEAK_FIELDS, _FIELD_VALUE, strict=True):
        if dec == 0:
            vals = [int(v) for v in rx.findall(line)]
        else:
            vals = [int(w + f) for w, f in rx.findall(line)]
        out.append(max(vals, default=-1))
    return tuple(out)


class ReMatcher:
    """Keyword and threshold search with Python's `re` (the reference; always available)."""

    name = kind = "re"

    def __init__(self) -> None:
        self._rx: re.Pattern[bytes] | None = None  # compiled on first use (hyperscan users never need it)
        self._lower = [kw for kw in KEYWORDS if kw[:1].islower()]
        self._gt: dict[tuple[int, int], re.Pattern[bytes]] = {}

    def _keyword_regex(self) -> re.Pattern[bytes]:
        upper: dict[bytes, list[bytes]] = {}
        for kw in KEYWORDS:
            first = kw[:1]
            if not first.islower():  # lowercase-first ones: str.find is far cheaper than a regex branch
                upper.setdefault(first, []).append(kw[1:] if kw in _REGEX_KEYWORDS else re.escape(kw[1:]))
        # Grouped by first byte, literal tails: `re` then skips non-candidate positions quickly.
        alts = [re.escape(f) + b"(?:" + b"|".join(tails) + b")" for f, tails in upper.items()]
        return re.compile(b"|".join(alts))

    def finder(self, body: bytes | bytearray, n: int | None = None) -> Callable[[int], int]:
        """next_hit(pos): an offset inside the first keyword line at or after pos (below n), or −1."""
        if self._rx is None:
            self._rx = self._keyword_regex()
        n = len(body) if n is None else n
        search, find = self._rx.search, body.find
        lower = self._lower
        nxt = [find(lit, 0, n) for lit in lower]

        def next_hit(pos: int) -> int:
            m = search(body, pos, n)
            hit = m.start() if m is not None else -1
            for k, lit in enumerate(lower):
                at = nxt[k]
                if at != -1 and at < pos:
                    at = nxt[k] = find(lit, pos, n)
                if at != -1 and (hit == -1 or at < hit):
                    hit = at
            return hit

        return next_hit

    def above(self, body: bytes, start: int, end: int, levels: tuple[int, ...], hot: int = 0) -> int:
        """Offset of the first peak field in [start, end) whose value exceeds its level, or −1. (`hot`: up to
        where the maxima are still rising; a compiled matcher uses `re` there and itself beyond.)"""
        best = -1
        for k, ((lit, dec), lev) in enumerate(zip(PEAK_FIELDS, levels, strict=True)):
            rx = self._gt.get((k, lev))
            if rx is None:
                if len(self._gt) > 512:
                    self._gt.clear()
                rx = self._gt[(k, lev)] = re.compile(gt_pattern(lit, dec, lev))
            m = rx.search(body, start, end if best < 0 else best)
            if m is not None:
                best = m.start()
        return best


class HyperscanMatcher(ReMatcher):
    """Keyword search in one hyperscan pass per chunk; threshold search over long stretches too.
    Gives the same lines as ReMatcher (same patterns), several times faster on traffic-heavy logs."""

    name = kind = "hyperscan"

    def __init__(self) -> None:
        super().__init__()
        import hyperscan

        self._hs = hyperscan
        self._db: Any = None  # the keyword database, compiled on first use (AhoMatcher uses only the peaks)
        self._gt_db: dict[tuple[int, int], Any] = {}

    def _compile(self, patterns: list[bytes]) -> Any:
        db = self._hs.Database(mode=self._hs.HS_MODE_BLOCK)
        db.compile(expressions=patterns, ids=list(range(len(patterns))), elements=len(patterns))
        return db

    def finder(self, body: bytes | bytearray, n: int | None = None) -> Callable[[int], int]:
        hits: list[int] = []
        add = hits.append

        def on_match(_id: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
            add(to - 1)  # the match's last byte: inside the line (for "\\\n", its newline)

        if self._db is None:
            self._db = self._compile(keyword_patterns())
        self._db.scan(body if n is None or n == len(body) else memoryview(body)[:n], match_event_handler=on_match)
        hits.sort()
        return _walker(hits)

    def above(self, body: bytes, start: int, end: int, levels: tuple[int, ...], hot: int = 0) -> int:
        near = min(end, max(start, hot))
        if near > start:
            hit = super().above(body, start, near, levels)  # maxima rise in bursts: `re` handles those cheaply
            if hit >= 0 or near >= end:
                return hit
        found = [-1]

        def on_match(_id: int, _from: int, to: int, _flags: int, _ctx: object) -> bool:
            found[0] = near + to - 1
            return True  # the first one is enough

        piece = memoryview(body)[near:end]  # no copy: hyperscan reads the buffer in place
        for k, ((lit, dec), lev) in enumerate(zip(PEAK_FIELDS, levels, strict=True)):
            db = self._gt_db.get((k, lev))  # one database per field: two small scans beat one combined
            if db is None:
                if len(self._gt_db) > 512:
                    self._gt_db.clear()
                db = self._gt_db[(k, lev)] = self._compile([gt_pattern(lit, dec, lev)])
            if found[0] >= 0:
                piece = piece[: found[0] - near]
            with contextlib.suppress(self._hs.ScanTerminated):
                db.scan(piece, match_event_handler=on_match)
        return found[0]


def _walker(hits: list[int]) -> Callable[[int], int]:
    """next_hit(pos) over sorted hit offsets, for positions that only move forward."""
    state = [0]

    def next_hit(pos: int) -> int:
        i = state[0]
        while i < len(hits) and hits[i] < pos:
            i += 1
        state[0] = i
        return hits[i] if i < len(hits) else -1

    return next_hit


class AhoMatcher(ReMatcher):
    """Keywords with ahocorasick-rs (Rust's aho-corasick: a SIMD "Teddy" prefilter over all keywords at once,
    about twice hyperscan's speed on request traffic); peak thresholds with hyperscan when it imports, else
    `re`. The same lines as ReMatcher: the keywords are literals but "GB[^/]", found as "GB" and dropped when a
    "/" follows (no keyword starts inside "GB", so leftmost-first matches miss no line)."""

    kind = "aho"

    def __init__(self) -> None:
        super().__init__()
        import ahocorasick_rs

        if _REGEX_KEYWORDS - {rb"GB[^/]"}:
            raise ImportError("AhoMatcher finds literals; a keyword regex it does not know was added")
        lits = [b"GB" if kw == rb"GB[^/]" else kw for kw in KEYWORDS]
        # Two more patterns tell, in the same pass, whether the body needs normalising (CRLF, ANSI codes): no
        # keyword starts with "\n" or "[", so they hide none (two bytes each: a one-byte pattern would slow it).
        short = [b"GB", b"\r\n", b"\x1b[", *(kw for kw in lits if len(kw) <= 3 and kw != b"GB")]
        # Two automata, not one: Teddy fingerprints as many bytes as the shortest pattern has, so the literals
        # of 4+ bytes apart scan at 3-4x the speed of all together (and the short ones are few: fast as well).
        self._short = ahocorasick_rs.BytesAhoCorasick(short, matchkind=ahocorasick_rs.MATCHKIND_LEFTMOST_FIRST)
        self._long = ahocorasick_rs.BytesAhoCorasick(
            [kw for kw in lits if len(kw) > 3], matchkind=ahocorasick_rs.MATCHKIND_LEFTMOST_FIRST
        )
        self._peaks: ReMatcher | None
        try:
            self._peaks = HyperscanMatcher()
        except ImportError:
            self._peaks = None
        self.name = "aho+hyperscan" if self._peaks is not None else "aho+re"

    def clean_finder(self, body: bytes | bytearray, n: int) -> Callable[[int], int] | None:
        """`finder`, or None when the body holds a CRLF or an ANSI code (normalise it, then call `finder`)."""
        view = body if n == len(body) else memoryview(body)[:n]
        hits = []
        for k, at, end in self._short.find_matches_as_indexes(view):
            if k == 0:
                if end < n and body[end] != 47:  # "GB" then "/": "GB/s", not a keyword (nor "GB" at the end)
                    hits.append(at)
            elif k <= 2:
                return None
            else:
                hits.append(at)
        return _walker(self._merge(hits, view))

    def finder(self, body: bytes | bytearray, n: int | None = None) -> Callable[[int], int]:
        n = len(body) if n is None else n
        view = body if n == len(body) else memoryview(body)[:n]
        found = self._short.find_matches_as_indexes(view)
        hits = [at for k, at, end in found if k > 2 or (k == 0 and end < n and body[end] != 47)]
        return _walker(self._merge(hits, view))

    def _merge(self, hits: list[int], view: bytes | bytearray | memoryview) -> list[int]:
        more = self._long.find_matches_as_indexes(view)
        if not more:
            return hits
        hits += [at for _, at, _ in more]
        hits.sort()
        return hits

    def above(self, body: bytes, start: int, end: int, levels: tuple[int, ...], hot: int = 0) -> int:
        if self._peaks is None:
            return super().above(body, start, end, levels, hot)
        return self._peaks.above(body, start, end, levels, hot)


MATCHERS: dict[str, type[ReMatcher]] = {"aho": AhoMatcher, "hyperscan": HyperscanMatcher, "re": ReMatcher}
_MATCHER: ReMatcher | None = None


def default_matcher() -> ReMatcher:
    """The fastest matcher that imports (aho, then hyperscan, then `re`), or MEMFRAC_MATCHER's choice ("aho",
    "hyperscan", "re"); built once per process."""
    global _MATCHER
    want = os.environ.get("MEMFRAC_MATCHER", "")
    if _MATCHER is not None and (not want or want == _MATCHER.kind):
        return _MATCHER
    if want and want not in MATCHERS:
        raise MemfracError(f"MEMFRAC_MATCHER={want!r}: not a matcher (allowed: {', '.join(MATCHERS)})")
    m: ReMatcher | None = None
    for kind in [want] if want else list(MATCHERS):
        try:
            m = MATCHERS[kind]()
            break
        except ImportError:
            if want:
                raise
    _MATCHER = m or ReMatcher()
    return _MATCHER


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
                lab = m.group(1)
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
    chunk = chunk or CHUNK_BYTES
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
                        if nbase + nstart >= self._last_new_label + RANK_DISCOVERY_BYTES:
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


# ---- prefixes ----------------------------------------------------------------------------------------------------

MAX_LEAD = 200  # a record starting further into a line is not behind a prefix
LEARN_BYTES = 256 << 10  # the head of a file read for prefix shapes before parsing starts
_SHAPE_TOKEN = re.compile(r"\d+|\s+|[^\d\s]+")
# Messages that start untagged lines (no record of their own): where one starts after a prefix that looks like
# one (it has a digit, "|" or ">"), that prefix is evidence of the file's shape too.
_KNOWN_HEAD = re.compile(r"Capturing |Loading safetensors|Traceback \(most recent|torch\.OutOfMemoryError|File \"/")
_PREFIXISH = re.compile(r"[\d|>]")
# A timestamp-like lead (digits and date/time punctuation, up to three tokens) that most lines of a file start
# with: learned by repetition alone, for files without a complete sglang record (a pasted command, a traceback).
_NUMERIC_LEAD = re.compile(r"(?:\d[\dTZ:.,+\-/]*\s+){1,4}(?:[|:>-]\s+)?")
_FENCE = re.compile(r"```[\w+-]*[ \t]*")  # a markdown fence glued to the first line of a pasted block
_PID = re.compile(r"\[(\d{2,})\]|\bpid[=: ](\d+)")


def shape(lead: str) -> str:
    """A prefix's shape: digit runs → "\\d+", whitespace runs → "\\s+", everything else as written (host,
    pod, unit and service names stay: they repeat within a file, timestamps and process ids do not)."""
    out = []
    for tok in _SHAPE_TOKEN.findall(lead):
        c = tok[0]
        out.append(r"\d+" if c.isdigit() else r"\s+" if c.isspace() else re.escape(tok))
    return "".join(out)


@lru_cache(maxsize=64)
def _shape_regex(sh: str) -> re.Pattern[str]:
    return re.compile(sh)


class PrefixLearner:
    """Per file: where each line's sglang record starts, and the leading shapes seen in front of records.

    A shape becomes a known prefix once it has been seen twice (before a record, or before a message known to
    start untagged lines); lines without a record that start with a known prefix lose it. Whitespace in front
    (indented pastes) always goes."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._known: list[tuple[str, re.Pattern[str]]] = []

    def learn_text(self, head: str) -> None:
        """Learn shapes from a block of text (the file's head), before its lines are parsed."""
        leads: dict[str, int] = {}
        n = 0
        for text in head.splitlines():
            n += 1
            self._observe(text)
            m = _NUMERIC_LEAD.match(unquote(text.lstrip(" \t")))
            if m is not None:
                sh = shape(m.group())
                leads[sh] = leads.get(sh, 0) + 1
        for sh, c in leads.items():
            while c >= 3 and c * 3 >= n and self.counts.get(sh, 0) < 2:
                self._count_shape(sh)

    def _observe(self, text: str) -> None:
        if not text or text[0] == "[":
            return
        m = _find_record(text)
        at = m.start() if m is not None else -1
        if at < 0:
            k = _KNOWN_HEAD.search(text, 0, MAX_LEAD)
            at = k.start() if k is not None and _PREFIXISH.search(text, 0, k.start()) else -1
        if at > 0:
            self._count(text[:at])

    def _count(self, lead: str) -> None:
        if not lead.strip():
            return  # indentation: always removed, nothing to learn
        self._count_shape(shape(lead))

    def _count_shape(self, sh: str) -> None:
        n = self.counts.get(sh, 0) + 1
        if n > 1000:
            return
        self.counts[sh] = n
        if n == 2 and len(self._known) < 32:
            self._known.append((sh, _shape_regex(sh)))
            self._known.sort(key=lambda kv: (-len(kv[0]), kv[0]))  # the longest shape first (most specific)

    def split(self, text: str) -> Prefixed:
        """The line's record (wherever it starts) and message, with the prefix in front removed."""
        if text[:1] == "[":
            p = split_prefix(text)
            if p.hms is not None and p.msg[:1] != "[":
                return p
        m = _find_record(text)
        if m is not None:
            lead = text[: m.start()]
            self._count(lead)
            return _prefixed(m, text, lead)
        body = text
        learned = False
        for _ in range(4):  # layers: "> " quotes around a docker prefix around an indented line, …
            before = body
            if body[:1] in (" ", "\t"):
                body = body.lstrip(" \t")
            if body[:3] == "```":
                f = _FENCE.match(body)
                if f is not None:
                    body = body[f.end() :]
            if not learned:
                for _sh, rx in self._known:
                    k = rx.match(body)
                    if k is not None and k.end() > 0:
                        body = body[k.end() :]
                        learned = True
                        break
            if body[:1] == ">" or " | " in body[:80]:
                body = unquote(body)
            if body == before:
                break
        if not learned:
            k2 = _KNOWN_HEAD.search(body, 0, MAX_LEAD)
            if k2 is not None and k2.start() > 0 and _PREFIXISH.search(body, 0, k2.start()):
                self._count(body[: k2.start()])
        lead = text[: len(text) - len(body)] if text.endswith(body) else ""
        return Prefixed(None, None, None, body, lead, _pid(lead))


def _find_record(text: str) -> re.Match[str] | None:
    """The sglang record in a line: the last of a run of adjacent records starting within MAX_LEAD."""
    i = text.find("[", 0, MAX_LEAD)
    while i >= 0:
        m = _PREFIX.match(text, i)
        if m is not None:
            while True:
                nxt = _PREFIX.match(text, m.end())
                if nxt is None:
                    return m
                m = nxt
        i = text.find("[", i + 1, MAX_LEAD)
    return None


def _prefixed(m: re.Match[str], text: str, lead: str) -> Prefixed:
    ranks = m.group("ranks")
    label = " ".join(ranks.split()) if ranks else ""
    return Prefixed(m.group("date"), m.group("hms"), label, text[m.end() :], lead, _pid(lead))


def _pid(lead: str) -> int | None:
    if not lead or ("[" not in lead and "pid" not in lead):
        return None
    m = _PID.search(lead)
    return int(m.group(1) or m.group(2)) if m is not None else None


def unquote(text: str) -> str:
    """Strip paste damage in front of a record: "> " quote marks and docker compose service prefixes."""
    for _ in range(4):  # nested: "> " quotes around compose output, compose around compose
        before = text
        if text.startswith(">"):
            text = _QUOTE.sub("", text)
        if " | " in text[:80]:
            text = _COMPOSE.sub("", text, count=1)
        if text == before:
            break
    return text


def split_glued(text: str) -> list[str]:
    """Split a tqdm bar from a record written right after it on the same line."""
    if "it/s]" not in text and "s/it]" not in text:
        return [text]
    out: list[str] = []
    pos = 0
    for m in _TQDM_END.finditer(text):
        if text[m.end() :].strip():
            out.append(text[pos : m.end()])
            pos = m.end()
    out.append(text[pos:])
    return out


_HEADS: dict[str, tuple[str | None, str | None, str | None, int] | None] = {}


def split_prefix(text: str) -> Prefixed:
    """Split "[date time RANKS] msg" at the start of a line; a line without it comes back whole, untagged."""
    if text[:1] != "[":
        return Prefixed(None, None, None, text)
    end = text.find("] ", 1, 72) + 2
    head = text[:end] if end > 1 else text[:72]
    parsed = _HEADS.get(head, _NO)
    if parsed is _NO:
        parsed = _parse_head(head)
        if len(_HEADS) > 4096:
            _HEADS.clear()
        _HEADS[head] = parsed
    if parsed is None:
        return Prefixed(None, None, None, text)
    date, hms, label, n = parsed
    return Prefixed(date, hms, label, text[n:])


_NO: tuple[str | None, str | None, str | None, int] = (None, None, None, -1)


def _parse_head(head: str) -> tuple[str | None, str | None, str | None, int] | None:
    m = _PREFIX.match(head)
    if m is None:
        return None
    ranks = m.group("ranks")
    return m.group("date"), m.group("hms"), " ".join(ranks.split()) if ranks else "", m.end()


@lru_cache(maxsize=1024)
def rank_numbers(label: str) -> dict[str, int]:
    """{"tp": 3, "dp": 0, ...} from a label such as "DP0 TP3 EP3" (other tags are kept only in the label).
    Cached: treat the result as read-only."""
    out: dict[str, int] = {}
    for tok in label.split():
        m = _RANK_TOKEN.match(tok)
        if m and m.group(1) in ("TP", "DP", "PP", "EP"):
            out[m.group(1).lower()] = int(m.group(2))
    return out
