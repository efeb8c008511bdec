"""The terminal face of every command: one table renderer and one progress bar, both from `rich`.

Why one module: tables and progress were hand-written three times over; here they are one code path with
two looks. On a terminal a table is a rich box table and progress is a live bar (count, bytes, ETA) on
stderr. Off a terminal (pipes, CI logs, `NO_COLOR`) the output is plain and stable: tables are Markdown
pipe tables (diffable, pasteable into an issue), progress is an occasional one-line status on stderr.
Machine formats (`--format json|csv|parquet`) never pass through here.

    print(table(["run", "verdict"], [["a#0", "ok"]], title="runs", right=[False, False]))
    with progress(total=12, what="runs") as bar:
        bar.advance(1, note="llama-decode: ok")
"""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich is imported where it draws: plain progress lines (pipes, CI) do not need it
    from rich.progress import Progress

#: Plain-mode progress prints at most this often (seconds), plus the final line.
PLAIN_EVERY_S = 2.0


def fancy(stream: IO[str] | None = None) -> bool:
    """True when `stream` is an interactive terminal and colour is allowed (NO_COLOR unset, TERM not dumb)."""
    s = stream if stream is not None else sys.stdout
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return bool(s.isatty())
    except (AttributeError, ValueError):
        return False


def _cell(v: Any) -> str:
    if v is None:
        return "—"
    return str(v)


def table(
    head: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    title: str | None = None,
    caption: str | None = None,
    right: Sequence[bool] | None = None,
    rich_look: bool | None = None,
) -> str:
    """`rows` under `head` as text. `right[i]` right-aligns column i (numbers); None cells print "—".

    `rich_look` None decides from stdout (a terminal → box table; otherwise a Markdown pipe table)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    look = fancy() if rich_look is None else rich_look
    t = Table(
        title=title if look else None,
        caption=caption if look else None,
        box=box.SIMPLE_HEAD if look else box.MARKDOWN,
        show_edge=not look,
        pad_edge=not look,
        header_style="bold" if look else "",
        title_justify="left",
        caption_justify="left",
        highlight=False,
    )
    for i, h in enumerate(head):
        t.add_column(str(h), justify="right" if right and i < len(right) and right[i] else "left", overflow="fold")
    for r in rows:
        t.add_row(*(_cell(v) for v in r))
    buf = io.StringIO()
    con = Console(
        file=buf,
        width=None if look else 100_000,
        force_terminal=look,
        no_color=not look,
        color_system="standard" if look else None,
        highlight=False,
        emoji=False,
        markup=False,
    )
    if look:
        con.size = (_term_width(), 10_000)
    con.print(t)
    text = buf.getvalue().rstrip("\n")
    if not look:
        text = "\n".join(line.rstrip() for line in text.splitlines() if line.strip())
        parts = [x for x in (title, text, caption) if x]
        return "\n".join(parts)
    return text


def _term_width() -> int:
    try:
        return max(60, os.get_terminal_size(sys.stdout.fileno()).columns)
    except (OSError, ValueError, AttributeError):
        return 160


class Bar:
    """A progress handle: `advance(n)`, `update(completed, note)`, `log(line)`. Live bar or plain lines."""

    def __init__(self, total: float | None, what: str, unit: str, stream: IO[str], live: bool) -> None:
        self.total, self.what, self.unit, self.done = total, what, unit, 0.0
        self._stream = stream
        self._note = ""
        self._t0 = time.monotonic()
        self._last = 0.0
        self._printed: tuple[float, str] | None = None
        self._progress: Progress | None = None
        self._task: Any = None
        if live:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                MofNCompleteColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            cols: list[Any] = [TextColumn("[bold]{task.description}"), BarColumn()]
            if unit == "bytes":
                cols += [DownloadColumn(), TransferSpeedColumn()]
            else:
                cols += [MofNCompleteColumn(), TaskProgressColumn()]
            cols += [TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[note]}")]
            self._progress = Progress(*cols, console=Console(file=stream), transient=False, refresh_per_second=4)
            self._task = self._progress.add_task(what, total=total, note="")

    def __enter__(self) -> Bar:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
        elif self.done:
            self._plain(final=True)

    def log(self, text: str) -> None:
        """A line of its own: above the live bar (which stays at the bottom), or a plain line off a terminal."""
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self._stream, flush=True)

    def advance(self, n: float = 1.0, note: str | None = None) -> None:
        self.update(self.done + n, note)

    def update(self, completed: float, note: str | None = None) -> None:
        self.done = completed
        if note is not None:
            self._note = note
        if self._progress is not None:
            self._progress.update(self._task, completed=completed, note=self._note)
        else:
            self._plain()

    def _plain(self, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self._last < PLAIN_EVERY_S and (self.total is None or self.done < self.total):
            return
        self._last = now
        if self._printed == (self.done, self._note):
            return
        self._printed = (self.done, self._note)
        print(plain_status(self.what, self.done, self.total, now - self._t0, self.unit, self._note),
              file=self._stream, flush=True)  # fmt: skip


def plain_status(what: str, done: float, total: float | None, elapsed_s: float, unit: str, note: str = "") -> str:
    """'runs: 3/12 (25%), 2 min elapsed, ETA 6 min — note' (bytes shown in MB)."""

    def amount(x: float) -> str:
        if unit == "bytes":
            return f"{x / 1e6:,.0f} MB"
        return f"{x:,.0f}" if float(x).is_integer() else f"{x:g}"  # 1,247,616 rather than 1.24762e+06

    head = f"{what}: {amount(done)}"
    if total:
        head += f"/{amount(total)} ({100 * done / total:.0f}%)"
    head += f", {_dur(elapsed_s)} elapsed"
    if total and done and done < total:
        head += f", ETA {_dur(elapsed_s / done * (total - done))}"
    return head + (f" — {note}" if note else "")


def _dur(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


@contextmanager
def progress(
    total: float | None, what: str, *, unit: str = "items", stream: IO[str] | None = None, live: bool | None = None
) -> Iterator[Bar]:
    """A progress bar on stderr (live on a terminal, plain lines otherwise); `unit="bytes"` shows sizes."""
    s = stream if stream is not None else sys.stderr
    with Bar(total, what, unit, s, fancy(s) if live is None else live) as bar:
        yield bar
