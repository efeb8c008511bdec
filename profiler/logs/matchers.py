"""Which lines the scanner hands over: memory keywords, and traffic lines that raise a field's maximum.

Three matchers give the same lines: "aho" (keywords with ahocorasick-rs, Rust's SIMD Teddy search, peaks with
hyperscan when it imports), "hyperscan" (both with hyperscan) and Python's `re` (always there; slower on
traffic-heavy logs). The fastest that imports is used; MEMFRAC_MATCHER=aho|hyperscan|re forces one.
A traffic peak is found with a threshold pattern ("a number above the maximum so far", `gt_pattern`),
recompiled when the maximum rises.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from typing import Any

from profiler.core.errors import MemfracError

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
    b"egmentation fault",  # a process killed by a signal (failures._SIGNAL): "Fatal Python error: Segmentation …"
    b"Segfault",  # sglang's own handler: "!!!!!!! Segfault encountered !!!!!!!"
    b"with signal SIG",  # torch.multiprocessing: "process 3 terminated with signal SIGSEGV"
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
    # the GPU named or sized by text around the log (logs.gpu_evidence): check_env, nvidia-smi, rocminfo, instances
    b"NVIDIA",
    b"Tesla",
    b"Quadro",
    b"Instinct",
    b"xlarge",
    b"gpu-",
    b"g2-standard",
    b"prefill size is adjusted",  # DP attention divided chunked_prefill_size (sglang's warning)
)
_REGEX_KEYWORDS = frozenset({rb"GB[^/]"})  # the others are literals


def keyword_patterns() -> list[bytes]:
    """KEYWORDS as regexes (literals escaped): what both matchers search for."""
    return [kw if kw in _REGEX_KEYWORDS else re.escape(kw) for kw in KEYWORDS]


# Traffic fields whose per-stretch maximum is kept: (literal before the number, decimals printed).
PEAK_FIELDS: tuple[tuple[bytes, int], ...] = ((b"#running-req: ", 0), (b"token usage: ", 2))
PEAK_RE_WINDOW = 256 << 10  # threshold search with `re` this far ahead before handing a long stretch to hyperscan

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
