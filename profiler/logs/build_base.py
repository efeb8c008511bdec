"""State shared by the parts of `LogBuilder` (build.py): the builder's fields and its unit helpers."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from profiler.core.units import MIB_PER_GIB
from profiler.logs.launchcmd import is_launch_command
from profiler.logs.prefixes import Prefixed, shape
from profiler.logs.serverargs import ServerArgsRepr, parse_server_args

if TYPE_CHECKING:
    from profiler.logs.failures import ExceptionDetail, OomWindow
    from profiler.logs.lines import LineScanner
    from profiler.logs.prefixes import PrefixLearner
    from profiler.logs.run import VersionCue, _RankState, _Run

GIB = MIB_PER_GIB  # sglang's "GB" is GiB (profiler.core.units)
RESOLUTION_MIB = 10.24  # sglang prints GiB with two decimals: ±0.005 GiB, a step of 10.24 MiB
MAX_FRAME_HINT_LINES = 200  # a traceback's frames name the phase of a failure line at most this far below them
MAX_ARGS_LINES = 400  # a server_args repr wrapped by a terminal, or split by docker/CRI at 16 KiB
MAX_ARGS_CHARS = 400_000
MEMORY_BACK_MIB = 1024.0  # a new weight load with this much more free than the last phase left: a new process


class BuilderState:
    """The fields every part of the builder reads and writes (set in `LogBuilder.__init__`)."""

    _file: str
    _origin: str
    _scanner: LineScanner
    _runs: list[_Run]
    _run: _Run
    _last_label: str | None
    _window: OomWindow | None
    _detail: ExceptionDetail | None
    _cont: list[tuple[int, str, Prefixed]]
    _args: _ArgsWindow | None
    _prefixes: PrefixLearner
    _pid: int | None
    _ts_cache: dict[str, float | None]
    _last_arch: tuple[str, int] | None
    _cues: list[tuple[int, VersionCue]]
    _frame_hint: tuple[int, str] | None
    _orphans: list[tuple[_Run, _RankState]]
    _wrap: tuple[int, str] | None


def _mib_key(key: str) -> str:
    return key[:-4] + "_mib" if key.endswith("_gib") else key


def _mib(gib_value: float | None) -> float | None:
    return None if gib_value is None else gib_value * GIB


class _ArgsWindow:
    """The lines after a server_args repr that was cut at its line end, joined back until it closes."""

    __slots__ = ("chars", "first", "lead", "line", "parts", "text")

    def __init__(self, line: int, text: str, first: ServerArgsRepr) -> None:
        self.line, self.first = line, first
        self.parts: list[tuple[int, str, Prefixed]] = []
        # What stood before "server_args=" on its line (a prefix the file's head was too short to learn): the same
        # shape in front of a continuation line is that prefix again, not repr text.
        at = text.find("server_args=")
        lead = text[:at] if at > 0 else ""
        self.lead = re.compile(shape(lead)) if lead.strip() else None
        self.text = text[len(lead) :] if self.lead is not None else text
        self.chars = len(text)

    def take(self, lineno: int, text: str, p: Prefixed) -> bool:
        msg = p.msg
        if p.hms is not None or not msg.strip() or is_launch_command(msg):
            return False  # a new record, a blank line, a command: the repr ended (cut) before it
        if self.lead is not None and (k := self.lead.match(msg)) is not None and k.end() > 0:
            msg = msg[k.end() :]
            p = p._replace(msg=msg)
        if len(self.parts) >= MAX_ARGS_LINES or self.chars + len(msg) > MAX_ARGS_CHARS:
            return False
        self.parts.append((lineno, text, p))
        self.chars += len(msg)
        return True

    def joined(self) -> str:
        # Terminals and docker's 16 KiB split cut anywhere: the pieces join without a separator.
        return self.text + "".join(p.msg for _, _, p in self.parts)

    def complete(self) -> bool:
        sa = parse_server_args(self.joined())
        return sa is not None and sa.complete
