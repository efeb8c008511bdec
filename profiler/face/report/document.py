"""The report's document model and its two renderings (Markdown, self-contained HTML), and the cell formatters.

One document (sections of paragraphs, tables, images, notes and collapsible per-run blocks) is rendered twice,
so the two never disagree: to Markdown (pipe tables by pandas' `to_markdown`, i.e. tabulate) and to HTML from
the jinja2 template `profiler/face/templates/report.html` (plots embedded as data: URIs, sortable tables).
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
from markupsafe import Markup

from profiler.results.frames import as_float, as_text

_DASH = "—"


# ---------------------------------------------------------------------------------------------------
# The document
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Para:
    text: str


@dataclass(frozen=True, slots=True)
class Note:
    text: str


@dataclass(frozen=True, slots=True)
class Table:
    frame: pd.DataFrame  # cells already formatted as text
    key: str = ""  # an id for the HTML table (the summary tables: what the browser test reads)


@dataclass(frozen=True, slots=True)
class Image:
    file: str  # relative to the report
    alt: str


@dataclass(frozen=True, slots=True)
class Details:
    """A block of its own per run: a ### heading in Markdown, a collapsible <details> on the page."""

    summary: str
    blocks: tuple[Para | Note | Table | Image, ...]
    open: bool = False


Block = Para | Note | Table | Image | Details


@dataclass(slots=True)
class Section:
    title: str
    blocks: list[Block] = field(default_factory=list)


def _md_cell(v: Any) -> str:
    """A table cell: pipes escaped, and '<' too, so text from a run id can never become markup."""
    return str(v).replace("&", "&amp;").replace("<", "&lt;").replace("|", "\\|").replace("\n", " ")


def md_table(df: pd.DataFrame) -> str:
    """A pipe table (pandas' to_markdown, i.e. tabulate; cells kept as written, never re-parsed as numbers)."""
    cells = df.map(_md_cell) if len(df.columns) else df
    cells.columns = [_md_cell(c) for c in df.columns]
    return cells.to_markdown(index=False, tablefmt="pipe", disable_numparse=True)


def _md_blocks(blocks: Sequence[Block]) -> list[str]:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Para):
            out += [b.text, ""]
        elif isinstance(b, Note):
            out += [f"> {b.text}", ""]
        elif isinstance(b, Table):
            out += [md_table(b.frame), ""]
        elif isinstance(b, Details):
            out += [f"### {_md_cell(b.summary)}", "", *_md_blocks(b.blocks)]
        else:
            out += [f"![{_md_cell(b.alt)}]({b.file})", ""]
    return out


def render_md(title: str, sections: Sequence[Section]) -> str:
    out = [f"# {title}", ""]
    for s in sections:
        out += [f"## {s.title}", "", *_md_blocks(s.blocks)]
    return "\n".join(out)


def _html_text(text: str) -> Markup:
    """Escape, then turn `code` spans back into <code> (the only markup the report's prose uses)."""
    parts = html.escape(text).split("`")
    return Markup("".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts)))


_NUMBER = re.compile(r"^[−+-]?[\d,]*\.?\d+%?( \(.*\))?$")


def _html_block(b: Block, root: Path) -> dict[str, Any]:
    """A block as the template reads it: text marked up, tables as rows of cells, images as data: URIs."""
    if isinstance(b, Para | Note):
        return {"kind": "para" if isinstance(b, Para) else "note", "html": _html_text(b.text)}
    if isinstance(b, Table):
        rows = [[str(v) for v in r] for r in b.frame.itertuples(index=False)]
        num = [bool(rows) and all(_NUMBER.match(r[i]) or r[i] in (_DASH, "") for r in rows)
               for i in range(len(b.frame.columns))]  # fmt: skip
        return {"kind": "table", "key": b.key, "head": [str(c) for c in b.frame.columns], "rows": rows, "num": num}
    if isinstance(b, Details):
        return {"kind": "details", "summary": b.summary, "open": b.open,
                "blocks": [_html_block(x, root) for x in b.blocks]}  # fmt: skip
    data = base64.b64encode((root / b.file).read_bytes()).decode("ascii")
    return {"kind": "image", "src": f"data:image/png;base64,{data}", "alt": b.alt, "file": b.file}


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def render_html(title: str, sections: Sequence[Section], root: Path) -> str:
    """The page: profiler/face/templates/report.html filled in; every plot under `root` embedded."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("profiler.face", "templates"), autoescape=True, undefined=jinja2.StrictUndefined
    )
    doc = []
    for s in sections:
        blocks = [_html_block(b, root) for b in s.blocks]
        cards: list[list[dict[str, Any]]] = []  # the summary: one card per caption and its table
        for b in blocks:
            if b["kind"] in ("para", "note") or not cards:
                cards.append([])
            cards[-1].append(b)
        doc.append({"title": s.title, "id": _anchor(s.title), "blocks": blocks, "cards": cards})
    return env.get_template("report.html").render(title=title, sections=doc)


# ---------------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------------


def mib(v: Any) -> str:
    f = as_float(v)
    return _DASH if f is None else f"{f:,.0f}"


def count(v: Any) -> str:
    f = as_float(v)
    return _DASH if f is None else f"{int(f):,}"


def frac(v: Any) -> str:
    f = as_float(v)
    return _DASH if f is None else f"{f:.3f}"


def gpu_label(row: pd.Series) -> str:
    if as_text(row.get("memory_kind")) == "host":
        return "CPU run (host RSS)"
    name = as_text(row.get("gpu_name"))
    total = as_float(row.get("gpu_total_mib"))
    if name:
        return name
    return _DASH if total is None else f"{total / 1024:.0f} GiB (name unknown)"


def parallelism(row: pd.Series) -> str:
    parts = []
    for col, label in (("tp", "TP"), ("pp", "PP"), ("dp", "DP"), ("attn_dp", "attn-DP"), ("ep", "EP")):
        v = as_float(row.get(col))
        if v is not None and (v > 1 or col == "tp"):
            parts.append(f"{label}{int(v)}")
    a2a = as_text(row.get("moe_a2a_backend"))
    if a2a and a2a != "none":
        parts.append(a2a)
    return " ".join(parts) or _DASH


def short(label: str, n: int = 44) -> str:
    """Shorten from the middle: the file name's start and the '#run' end both identify a run."""
    return label if len(label) <= n else label[: n // 2 - 1] + "…" + label[-(n // 2) :]


#: Ledger lines in book order (terms in TERM_NAMES order between the pool and the unattributed rest).
_LEDGER_FIRST, _LEDGER_LAST = ("weights", "kv_pool"), ("unattributed", "headroom")


def ledger_order(line: str) -> int:
    from profiler.model.heuristic.record import TERM_NAMES

    if line in _LEDGER_FIRST:
        return _LEDGER_FIRST.index(line)
    if line in _LEDGER_LAST:
        return 100 + _LEDGER_LAST.index(line)
    return 2 + (TERM_NAMES.index(line) if line in TERM_NAMES else len(TERM_NAMES))


def rank_text(rank: object) -> str:
    """A rank as the report names it: "rank TP0", or "unlabelled rank" where the log printed no prefix."""
    label = "" if rank is None or (isinstance(rank, float) and rank != rank) else str(rank).strip()
    return f"rank {label}" if label else "unlabelled rank"
