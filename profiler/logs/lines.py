"""Streaming line source: raw bytes in fixed-size chunks → the few lines worth parsing, with line numbers.

Why this shape: server logs run to gigabytes and are mostly request traffic. The scanner holds one chunk
(plus one bounded partial line), finds candidate lines with one compiled keyword regex over the whole chunk
(C speed, no per-line Python work for the lines it skips) and decodes only the hits. Line numbers count
b"\\n" like `grep -n`/`wc -l`; a bare CR (tqdm redraws) splits a physical line into segments that share its
number. The consumer can ask for the next N lines unfiltered (`follow`) to join wrapped text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from functools import lru_cache
from typing import NamedTuple

CHUNK_BYTES = 1 << 20
MAX_LINE_BYTES = 1 << 20  # a longer "line" (no newline at all) is cut so memory stays bounded

# Every line a pattern reads contains one of these. Grouped by first letter, literals only: `re` then
# scans several times faster than with a flat alternation or a character class. Lowercase-first keywords
# are costly (common letters), so the few needed (launch commands, argparse errors, versions) are searched
# separately with str.find (_LITERALS).
_KEYWORDS = re.compile(
    r"G(?:B|iB)|MiB|KiB|KV |Captur|_(?:total_num_tokens=|size=)|Use sliding|Use Sliding|Post-capture|"
    r"Traceback|E(?:rror|xception)|CUDA |HIP out|OutOfMemory|Not enough memory|Loaded weights|"
    r"S(?:chedul|erverArgs\(|ubprocess)|Rank |Received sigquit|Registering |F(?:orC|ile \"|ound local HF)|"
    r"#(?:running-req|retracted)|\\\n"
)  # literals only: a character class anywhere in it makes `re` scan ~5x slower
# Rank tags of every line ("[… DP0 TP0 EP0] "), looked for near the start only: a rank that logs no memory
# line still exists; once RANK_DISCOVERY_BYTES in a row bring no new label, stop looking (speed).
_LABEL = re.compile(r"\n\[[\d\- :.,T]{8,30}?((?: [A-Z][A-Z_]*\d+)+)\]")
RANK_DISCOVERY_BYTES = 4 << 20
_LITERALS = (
    "sglang",
    "launch_server",
    "server_args={",
    "sgl-dev",  # rocm/sgl-dev:v0.5.8.post1-… image tags (the release that wrote the log)
    '"version"',  # server_info dumps
    "profiled value",  # "max_total_tokens=… is larger than the profiled value -561981": a negative KV budget
    "ready to roll",  # "The server is fired up and ready to roll!": startup finished
)  # lowercase keywords: found with str.find, cheaper than in the regex
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")

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
    """A line split into its sglang record prefix and message; `label` is None for untagged lines."""

    date: str | None
    hms: str | None
    label: str | None
    msg: str


class LineScanner:
    """Yields (line number, text) for candidate lines of a byte stream; see the module docstring."""

    def __init__(self) -> None:
        self.follow = 0  # the consumer sets this to receive the next N lines whatever their content
        self._labels: set[str] = set()
        self._quiet = 0  # characters scanned since the last new rank label

    def scan(self, chunks: Iterable[bytes]) -> Iterator[tuple[int, str]]:
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
            body, tail = chunk[:cut], chunk[cut:]
            yield from self._scan_body(body, lineno)
            lineno += body.count(b"\n")
        if tail:
            yield from self._scan_body(tail + b"\n", lineno)

    def _scan_body(self, raw: bytes, base: int) -> Iterator[tuple[int, str]]:
        body = raw.decode("utf-8", "replace")  # whole lines only: no character is split
        if "\r" in body:
            body = body.replace("\r\n", "\n")
        if "\x1b" in body:
            body = _ANSI.sub("", body)
        search, find, count = _KEYWORDS.search, body.find, body.count
        end_of_body = len(body)
        pos = counted = 0
        lineno = base
        nxt = [find(lit) for lit in _LITERALS]
        sightings = self._new_labels(body) if self._quiet < RANK_DISCOVERY_BYTES else []
        while pos < end_of_body:
            if self.follow > 0:
                start = pos
            else:
                m = search(body, pos)
                hit = m.start() if m is not None else -1
                for k, lit in enumerate(_LITERALS):
                    at = nxt[k]
                    if at != -1 and at < pos:
                        at = nxt[k] = find(lit, pos)
                    if at != -1 and (hit == -1 or at < hit):
                        hit = at
                while sightings and sightings[-1] < pos:
                    sightings.pop()
                if sightings and (hit == -1 or sightings[-1] < hit):
                    hit = sightings.pop()
                if hit == -1:
                    break
                start = body.rfind("\n", pos, hit) + 1 or pos
            end = find("\n", start)
            lineno += count("\n", counted, start)
            counted = start
            text = body[start:end]
            pos = end + 1
            if self.follow > 0:
                self.follow -= 1
            if "\r" in text:
                for seg in text.split("\r"):
                    if seg.strip():
                        yield lineno + 1, seg
            else:
                yield lineno + 1, text

    def _new_labels(self, body: str) -> list[int]:
        """Offsets (descending) of the first line of each rank label not seen before."""
        found: list[int] = []
        for m in _LABEL.finditer("\n" + body):
            lab = m.group(1)
            if lab not in self._labels:
                self._labels.add(lab)
                found.append(m.start())  # the "\n" we prepended maps offset k+1 back to k
        self._quiet = 0 if found else self._quiet + len(body)
        found.reverse()
        return found


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


def unquote(text: str) -> str:
    """Strip paste damage in front of a record: "> " quote marks and docker compose service prefixes."""
    if text.startswith(">"):
        text = _QUOTE.sub("", text)
    if " | " in text[:80]:
        text = _COMPOSE.sub("", text, count=1)
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
    """Split "[date time RANKS] msg"; a line without the prefix comes back whole, untagged."""
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
