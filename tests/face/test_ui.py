"""The one table renderer and progress bar (profiler/core/ui.py): plain off a terminal, stable, and complete."""

from __future__ import annotations

import io

from profiler.core.ui import plain_status, progress, table


def test_plain_table_is_markdown_with_dashes_for_unknown():
    text = table(["run", "MiB"], [["a#0", 1.5], ["b#1", None]], title="runs", caption="MiB", right=[False, True],
                 rich_look=False)  # fmt: skip
    assert text.splitlines() == [
        "runs",
        "| run | MiB |",
        "|-----|-----|",
        "| a#0 | 1.5 |",
        "| b#1 |   — |",
        "MiB",
    ]


def test_rich_table_has_every_cell_and_no_markdown_pipes():
    text = table(["run", "MiB"], [["a#0", 1.5]], rich_look=True)
    assert "a#0" in text and "1.5" in text and "|" not in text


def test_plain_progress_prints_a_final_line_once():
    buf = io.StringIO()
    with progress(3, "runs", stream=buf, live=False) as bar:
        for i in range(3):
            bar.advance(1, note=f"r{i}")
    lines = buf.getvalue().splitlines()
    assert lines[-1].startswith("runs: 3/3 (100%)") and lines[-1].endswith("— r2")
    assert len(lines) == len(set(lines))


def test_plain_status_eta_from_rate():
    # 3 of 12 done in 120 s → 40 s each → 9 left × 40 s = 360 s = 6 min
    assert plain_status("runs", 3, 12, 120.0, "items") == "runs: 3/12 (25%), 2 min elapsed, ETA 6 min"
    assert plain_status("configurations", 4104, 1247616, 1.0, "items").startswith("configurations: 4,104/1,247,616 ")
    assert plain_status("ingest", 5e8, 1e9, 10.0, "bytes").startswith("ingest: 500 MB/1,000 MB (50%)")
