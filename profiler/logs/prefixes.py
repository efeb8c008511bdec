"""What stands in front of sglang's record, per file.

`PrefixLearner` finds sglang's "[date time RANKS] " record wherever it starts in a line and learns, per file,
the leading shapes in front of it (docker/kubernetes timestamps, journald, compose "svc | ", "> " quotes, …)
so that untagged lines with the same shape (tracebacks, tqdm bars, commands) are stripped too.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

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
# A deployment's own Python logging format around sglang's ranks: "2025-07-24 17:23:00 INFO 4198 [ TP0 PP0
# model_runner.py:701] msg" (asctime, level, process id, then a bracket of the rank tags and the source file:line).
# The source location is what marks it as a logging record (a bracket of rank tags alone could be prose).
_LOGGING = re.compile(
    r"(?P<date>\d{4}-\d\d-\d\d)[ T](?P<hms>\d\d:\d\d:\d\d)(?:[.,]\d+)? +(?:[A-Z]{3,8} +)?(?:(?P<pid>\d+) +)?"
    r"\[(?P<ranks>(?: *[A-Z][A-Z_]*\d+)*) *[\w.-]+\.py:\d+ *\] ?"
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
    gpu_tag: str = ""  # a 2024 rank tag read into `label`: "[gpu=N]" (sglang 0.2.x) or "[gpu_id=N]" (0.1.x)


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
# sglang 0.1.x/0.2.x log with format "%(message)s" and start each worker's message with its GPU id:
# "[gpu_id=0] Load weight begin. …" (0.1.x: managers/controller/model_runner.py), "[gpu=0] …" (0.2.x:
# model_executor/model_runner.py, managers/tp_worker.py).
_GPU_TAG = re.compile(r"\[gpu(?:_id)?=(\d+)\] ?")


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
        """The line's record (wherever it starts) and message, with the prefix in front removed. A 2024 GPU tag
        at the message's start ("[gpu=N] ", "[gpu_id=N] ") is that worker's rank tag: label "TPN" (those
        releases give TP worker r the GPU base_gpu_id + r, base 0 with one data-parallel group)."""
        p = self._split(text)
        if p.msg[:4] == "[gpu" and not p.label and (g := _GPU_TAG.match(p.msg)) is not None:
            return p._replace(label=f"TP{g.group(1)}", msg=p.msg[g.end() :], gpu_tag=g.group().strip())
        return p

    def _split(self, text: str) -> Prefixed:
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
    """The sglang record in a line: the last of a run of adjacent records starting within MAX_LEAD (or a
    deployment's logging record around sglang's ranks, `_LOGGING`)."""
    if ".py:" in text[:MAX_LEAD]:
        g = _LOGGING.search(text, 0, MAX_LEAD + 80)
        if g is not None and g.start() < MAX_LEAD:
            return g
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
    pid = m.groupdict().get("pid")
    return Prefixed(m.group("date"), m.group("hms"), label, text[m.end() :], lead, int(pid) if pid else _pid(lead))


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
