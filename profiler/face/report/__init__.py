"""`memfrac report`: a results directory as a page someone who has never seen memfrac can read.

One document model (sections of paragraphs, tables, images, notes and collapsible per-run blocks) is rendered
twice, so the two never disagree: to Markdown (pipe tables by pandas' `to_markdown`, i.e. tabulate) and to a
self-contained HTML page from the jinja2 template `profiler/face/templates/report.html` (plots embedded as data:
URIs, tables sortable by a few lines of inline JS, no network). The page opens with a summary (runs by verdict,
KV left unused per node type, terms under-reserved), then the per-run ledgers (`ledger.parquet`: where the
memory free at start went, line by line, and the residual), then the detail. Plots are PNGs written with
matplotlib's Agg canvas on `Figure` objects (no pyplot state), at 100 dpi and a bounded size. A plot with
nothing to draw is never written: its section says why instead.

The package: `document` (the model and its renderings, cell formatters), `plots` (the PNGs), `sections` (the
data behind each section and the section builders); this module writes the files.
"""

from __future__ import annotations

from pathlib import Path

from profiler.core.errors import MemfracError
from profiler.face.report.document import Image, Section, render_html, render_md
from profiler.face.report.plots import DPI, MAX_BARS, MAX_HEIGHT_IN, WIDTH_IN
from profiler.face.report.sections import SEVERITY, build

__all__ = ["DPI", "MAX_BARS", "MAX_HEIGHT_IN", "SEVERITY", "WIDTH_IN", "Section", "build", "run_report", "write_report"]


def write_report(results_dir: str | Path, html_out: bool = False, out: str | Path | None = None,
                 models_dir: Path | None = None) -> list[Path]:  # fmt: skip
    """Write report.md (and report.html) with their PNGs; return every path written."""
    root = Path(results_dir)
    if not root.is_dir():
        raise MemfracError(f"{root}: no such results directory")
    dest = Path(out) if out is not None else root
    if dest.exists() and not dest.is_dir():
        raise MemfracError(f"{dest} exists and is not a directory")
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("report_*.png"):
        old.unlink()  # a plot from an earlier report must not outlive its section
    sections = build(root, dest, models_dir)
    title = f"memfrac report: {root.resolve().name}"
    written = [dest / "report.md"]
    written[0].write_text(render_md(title, sections))
    if html_out:
        written.append(dest / "report.html")
        written[1].write_text(render_html(title, sections, dest))
    written += sorted(dest / b.file for s in sections for b in s.blocks if isinstance(b, Image))
    return written


def run_report(results_dir: str, html: bool = False, out: str | None = None) -> int:
    """The command: write the report and print the paths."""
    for p in write_report(results_dir, html, out):
        print(p)
    return 0
