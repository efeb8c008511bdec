"""Which run a line outside any run's own records belongs to (a release cue, a GPU clue): one rule for both."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Protocol, TypeVar


class _Spans(Protocol):
    first_line: int | None
    last_line: int | None


R = TypeVar("R", bound=_Spans)


def run_holding(runs: Sequence[R], lineno: int) -> R | None:
    """The run whose lines `lineno` sits among, else the run it precedes (a header, an environment block or a
    command before the start), else the last run before it (an issue's environment after its log), else the first
    run; None without runs. `runs` are in file order."""
    seen = [r for r in runs if r.first_line is not None]
    starts = [r.first_line or 0 for r in seen]
    i = bisect.bisect_right(starts, lineno) - 1  # the last run starting at or before the line
    if i >= 0 and lineno <= (seen[i].last_line or seen[i].first_line or 0):
        return seen[i]
    if i + 1 < len(seen):
        return seen[i + 1]
    if i >= 0:
        return seen[i]
    return runs[0] if runs else None
