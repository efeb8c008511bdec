"""The state of one run while a log is read: its ranks, what it printed so far, the releases its text states.

Its own module so that the builder (which fills it) and identity (which finishes it) both import it, and not
each other.
"""

from __future__ import annotations

from typing import NamedTuple

from profiler.core.measurement import Measurement, Phase, Rank
from profiler.logs.failures import FailureState
from profiler.logs.gpu_evidence import GpuClue
from profiler.logs.launchcmd import LaunchCommand
from profiler.logs.prefixes import rank_numbers
from profiler.logs.serverargs import ServerArgsRepr


class VersionCue(NamedTuple):
    """A release the text states, and how. `trust`: 0 strongest (server_info) … 4 weakest (a pip command)."""

    version: str
    how: str
    trust: int
    dev: bool = False  # a dev/nightly image built from main after `version` (before the next release)
    at_least: bool = False  # "sglang>=X": a lower bound only


class _RankState:
    __slots__ = ("fs", "last_key", "last_n", "open", "pid", "rank", "tb")

    def __init__(self, label: str) -> None:
        self.rank = Rank(label=label, **rank_numbers(label))
        self.open: dict[str, Phase] = {}
        self.last_key: str | None = None  # "date hms" of the last phase line, to spot time going back
        self.fs: FailureState | None = None
        self.tb = False  # inside a traceback printed for this rank
        self.last_n: int | None = None  # tqdm counter of the last ladder point
        self.pid: int | None = None  # process id from the line prefix (journald, ray), when there is one


class _Run:
    __slots__ = (
        "arch_hint",
        "cmd",
        "cues",
        "fired_line",
        "first_line",
        "floating",
        "formats",
        "gpu_clues",
        "gpu_tagged",
        "index",
        "last_line",
        "m",
        "mode_hint",
        "model_hint",
        "quoted_args",
        "ranks",
        "ready_line",
        "resolved",
        "server_args",
        "server_pid",
        "serving",
        "serving_ranks",
    )

    def __init__(self, index: int, file_name: str, origin: str) -> None:
        self.index = index
        self.m = Measurement(id=f"{file_name}#{index}", source="log", origin=origin)
        self.ranks: dict[str, _RankState] = {}
        self.server_args: ServerArgsRepr | None = None
        self.cmd: LaunchCommand | None = None
        self.ready_line: int | None = None
        self.fired_line: int | None = None  # "The server is fired up and ready to roll!"
        self.first_line: int | None = None
        self.last_line: int | None = None
        self.floating: FailureState | None = None  # failure lines seen before any rank
        self.arch_hint: tuple[str, int] | None = None
        self.model_hint: tuple[str, int] | None = None
        self.resolved: dict[str, tuple[int, int]] = {}  # "dp_size" → (value, line) from sglang's own warnings
        self.server_pid: int | None = None  # uvicorn's "Started server process [PID]"
        self.formats: dict[str, int] = {}  # dated line formats seen (profiler.logs.formats) → first line
        self.cues: list[tuple[int, VersionCue]] = []  # releases the text states, with their lines
        self.serving: dict[str, object] = {}  # serving traffic: peaks, retractions (see _serve)
        self.serving_ranks: set[str] = set()
        self.mode_hint: tuple[str, int] | None = None  # PD role from a role-only message
        self.gpu_clues: list[GpuClue] = []  # lines naming its GPU or printing its capacity (gpu_evidence)
        self.quoted_args: dict[str, tuple[object, str]] = {}  # args an error message quotes → (value, where)
        self.gpu_tagged = False  # a 2024 "[gpu=N]" rank tag was read as TP N (said once in the notes)

    def has_phases(self) -> bool:
        return any(rs.rank.phases for rs in self.ranks.values())

    def failed_at(self) -> int | None:
        """Line of a definitive failure in this run (any rank, or not yet placed), else None."""
        states = [rs.fs for rs in self.ranks.values() if rs.fs is not None]
        if self.floating is not None:
            states.append(self.floating)
        lines = [fs.failure.line or 0 for fs in states if not fs.tentative]
        return min(lines) if lines else None

    def touch(self, line: int) -> None:
        if self.first_line is None:
            self.first_line = line
        self.last_line = line
