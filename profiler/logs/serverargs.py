"""The server_args line → a dict of sglang args, without eval.

Two forms: `server_args=ServerArgs(k=v, …)` (a dataclass repr, ≤ 0.5.22) and `server_args={'k': v, …}`
(0.5.23 prints its resolved dict).

Values are Python reprs: strings with escaped or mixed quotes, numbers, True/False/None, nested lists,
dicts and tuples, enum reprs (`<Backend.FULL: 'full'>`) and other objects. Each field's text is delimited
by scanning brackets and quotes, then read with `ast.literal_eval` (literals only, never code); what it
cannot read stays the raw text. Pasted lines are often cut: the field being cut is dropped, not guessed,
and `complete` says so.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any, NamedTuple

_KEY = re.compile(r"\s*([A-Za-z_]\w*)=")
_ENUM = re.compile(r"^<[\w.]+: (.*)>$")
_OPEN = {"(": ")", "[": "]", "{": "}"}
_MAX_VALUE_CHARS = 200_000


class ServerArgsRepr(NamedTuple):
    """The fields read from one repr; `complete` is False when the text was cut before its closing paren."""

    args: dict[str, Any]
    complete: bool
    cut_at: str | None  # the field (or key fragment) where the text stopped, when not complete


@lru_cache(maxsize=8)
def parse_server_args(text: str) -> ServerArgsRepr | None:
    """Read the ServerArgs repr (or dict) in `text`; None if there is none. Cached: treat it as read-only."""
    start = text.find("ServerArgs(")
    if start >= 0:
        return _fields(text, start + len("ServerArgs("), ")", _repr_key)
    start = text.find("server_args={")
    if start < 0:
        return None
    pos = start + len("server_args={")
    whole = _value_end(text, pos, closers=",}")
    if whole is not None and text[whole : whole + 1] == "}":  # complete: read it as one literal
        try:
            d = ast.literal_eval("{" + text[pos : whole + 1])
            if isinstance(d, dict):
                return ServerArgsRepr({str(k): v for k, v in d.items()}, True, None)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    return _fields(text, pos, "}", _dict_key)


def _repr_key(text: str, pos: int) -> tuple[str, int] | None:
    """`name=` of a dataclass repr → (name, index of its value)."""
    m = _KEY.match(text, pos)
    return None if m is None else (m.group(1), m.end())


def _dict_key(text: str, pos: int) -> tuple[str, int] | None:
    """`'name':` of a dict → (name, index of its value)."""
    if text[pos] not in "'\"":
        return None
    kend = _string_end(text, pos)
    colon = text.find(":", kend) if kend >= 0 else -1
    return None if colon < 0 else (text[pos + 1 : kend - 1], colon + 1)


def _fields(text: str, pos: int, close: str, read_key: Callable[[str, int], tuple[str, int] | None]) -> ServerArgsRepr:
    """Field by field up to `close`; a cut-off text keeps the fields read so far and says where it stopped."""
    args: dict[str, Any] = {}
    n = len(text)
    while True:
        while pos < n and text[pos] in " ,\t":
            pos += 1
        if pos >= n:
            return ServerArgsRepr(args, False, None)
        if text[pos] == close:
            return ServerArgsRepr(args, True, None)
        k = read_key(text, pos)
        if k is None:
            return ServerArgsRepr(args, False, text[pos : pos + 40].strip())
        key, vstart = k
        end = _value_end(text, vstart, closers="," + close)
        if end is None:
            return ServerArgsRepr(args, False, key)
        args[key] = literal(text[vstart:end].strip())
        pos = end


def _value_end(text: str, pos: int, closers: str = ",)") -> int | None:
    """Index just past one value (at a top-level closer), or None if the text ends inside it."""
    stack: list[str] = []
    enum = text.startswith("<", pos)
    i, n = pos, len(text)
    while i < n:
        c = text[i]
        if c in "'\"":
            i = _string_end(text, i)
            if i < 0:
                return None
            continue
        if c in _OPEN:
            stack.append(_OPEN[c])
        elif stack and c == stack[-1]:
            stack.pop()
        elif enum and c == ">" and not stack:
            enum = False
        elif not stack and not enum and c in closers:
            return i
        i += 1
    return None


def _string_end(text: str, i: int) -> int:
    """Index past the string literal starting at i (backslash escapes honoured), -1 if unterminated."""
    q = text[i]
    j = i + 1
    n = len(text)
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == q:
            return j + 1
        j += 1
    return -1


def literal(raw: str) -> Any:
    """A repr's value: Python literal if it is one, enum reprs unwrapped to their value, else the text."""
    if not raw or len(raw) > _MAX_VALUE_CHARS:
        return raw
    if raw in ("inf", "-inf", "nan"):
        return float(raw)
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    m = _ENUM.match(raw)
    if m is not None:
        return literal(m.group(1))
    return raw
