"""memfrac report: the document, its tables and its plots, on real ingested logs and on hand-built probe runs."""

from __future__ import annotations

import base64
import re
import shutil
from pathlib import Path

import matplotlib.image
import pytest
from PIL import Image as PILImage

from profiler.analyse.compare import TermComparison
from profiler.core.errors import MemfracError
from profiler.face.report import DPI, MAX_HEIGHT_IN, SEVERITY, WIDTH_IN, run_report, write_report
from profiler.logs import iter_measurements
from profiler.results.store import RunContext, Store, load_results
from tests.conftest import FIXTURES
from tests.fixtures.results.handmade import store_run, write_frame, write_ledger

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RULE = re.compile(r"^\|(?::?-+:?\|)+$", re.M)  # a pipe table's rule row (tabulate writes |:----|----:|)
SECTIONS = [
    "## Summary",
    "## What sglang reserves, and what was measured",
    "## Runs, worst first",
    "## Where the memory went, per run (ledger)",
    "## Reserved vs measured, per term",
    "## Decode-graph memory vs batch size",
    "## DeepEP: measured vs analytic vs the 2 GiB reserve",
    "## KV cache left unused, or the OOM margin",
    "## Ingested logs: headroom at the end of startup vs the heuristic's slack",
]


def check_png(path: Path, height_in: float | None = None) -> tuple[int, int]:
    """A real PNG, readable by PIL and matplotlib, 1000 px wide, of a bounded (or the expected) height."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > 5_000, path  # a blank 1000 px canvas compresses below this; a drawn plot does not
    with PILImage.open(path) as im:
        im.verify()
    with PILImage.open(path) as im:
        w, h = im.size
    assert w == int(WIDTH_IN * DPI)
    assert 3 * DPI <= h <= MAX_HEIGHT_IN * DPI
    if height_in is not None:
        assert h == round(min(max(height_in, 3.0), MAX_HEIGHT_IN) * DPI)
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (h, w)
    assert pixels.std() > 0.01  # not one flat colour
    return w, h


def md_table_after(md: str, heading: str) -> list[list[str]]:
    """The cells of the first pipe table under a heading (header row, rule row, body rows)."""
    section = md.split(heading, 1)[1].split("\n## ", 1)[0].splitlines()
    start = next(i for i, ln in enumerate(section) if ln.startswith("|"))
    block = []
    for ln in section[start:]:
        if not ln.startswith("|"):
            break
        block.append([c.strip() for c in re.split(r"(?<!\\)\|", ln)[1:-1]])
    return block


# ------------------------------------------------------------------------------------------- real logs


def test_report_on_ingested_logs(ingested: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    paths = write_report(ingested, html_out=True, out=out)
    md = (out / "report.md").read_text()
    # every section, in order
    pos = [md.index(s) for s in SECTIONS]
    assert pos == sorted(pos)
    # observability said per source
    assert "Ingested server logs" in md and "Probe runs" in md
    n = sum(1 for _ in iter_measurements([FIXTURES / "logs"]))  # every fixture run (49 with issue 10's logs)
    assert f"These results: {n} runs ({n} from logs, 0 from probe runs)" in md
    # logs have no ladder: said, and no plot
    assert "No decode ladder in these results" in md
    assert not (out / "report_ladder.png").exists()
    # no DeepEP measured in logs: analytic sizes of the bundled models, labelled as such
    assert "No DeepEP buffer was measured" in md and "DeepSeek-V3" in md
    assert (out / "report_deepep.png").exists()
    # every written image is a sane PNG; the term plot's height follows its bar count (6 observed rows here)
    df = load_results(ingested)
    n_obs = int(((df["term"] != "total") & df["term_verdict"].isin(["under", "fits", "over"])).sum())
    check_png(out / "report_terms.png", 1.4 + 0.42 * n_obs)
    pngs = sorted(out.glob("*.png"))
    # logs have ledgers too (more left unattributed): one stacked bar per run
    assert {p.name for p in pngs} == {"report_terms.png", "report_deepep.png", "report_kv.png", "report_startup.png",
                                      "report_ledger.png"}  # fmt: skip
    for p in pngs:
        check_png(p)
    assert sorted(paths) == sorted([out / "report.md", out / "report.html", *pngs])
    # the page embeds exactly these images (data: URIs holding the very bytes of each PNG): self-contained
    page = (out / "report.html").read_text()
    embedded = dict(
        (f, src) for src, f in re.findall(r'<img src="data:image/png;base64,([^"]+)" alt="[^"]*" title="([^"]+)"', page)
    )
    assert sorted(embedded) == [p.name for p in pngs]
    for name, data in embedded.items():
        assert base64.b64decode(data) == (out / name).read_bytes()
    assert "http://" not in page and "https://" not in page  # nothing fetched from anywhere
    assert page.count("<table") == len(RULE.findall(md)) > 0  # one HTML table per Markdown table


def test_run_table_is_worst_first(ingested: Path, tmp_path: Path) -> None:
    write_report(ingested, out=tmp_path)
    md = (tmp_path / "report.md").read_text()
    rows = md_table_after(md, "## Runs, worst first")
    head, body = rows[0], rows[2:]
    verdicts = [r[head.index("verdict")] for r in body if len(r) == len(head)]
    assert len(verdicts) == sum(1 for _ in iter_measurements([FIXTURES / "logs"]))
    ranks = [SEVERITY.index(v) for v in verdicts]
    assert ranks == sorted(ranks)
    assert verdicts[0] == "oom_during_capture"
    for col in ("model", "GPU", "mode", "parallelism", "mfs (origin)", "slack MiB", "used after KV MiB",
                "headroom MiB", "wasted KV tokens", "recommended mfs", "reason"):  # fmt: skip
        assert col in head


def test_startup_headroom_vs_slack_from_logs(ingested: Path, tmp_path: Path) -> None:
    write_report(ingested, out=tmp_path)
    md = (tmp_path / "report.md").read_text()
    rows = md_table_after(md, "## Ingested logs: headroom")
    head = rows[0]
    df = load_results(ingested)
    t = df[(df["term"] == "total") & df["slack_total_mib"].notna() & df["headroom_startup_mib"].notna()]
    # each log with both numbers: headroom ÷ slack as printed, recomputed from the results
    for _, r in t.iterrows():
        row = next(x for x in rows if x[0] == r["run_id"])
        assert row[head.index("headroom ÷ slack")] == f"{r['headroom_startup_mib'] / r['slack_total_mib']:.0%}"
    check_png(tmp_path / "report_startup.png", 1.6 + 0.5 * len(t))


# ------------------------------------------------------------------------------ hand-built probe runs


def probe_results(root: Path) -> Path:
    """Two probe runs through Store.add: one with a decode ladder and a DeepEP buffer, one with a hostile id."""
    dg = TermComparison("decode_graph", 512.0, 700.0, "under", "decode capture Δ")
    de = TermComparison("deepep_a2a", 2048.0, 3100.0, "under", "DeepEP buffer creation Δ (driver)")
    ctx = RunContext(group="dsv3", decode_max_bs=256, deepep_tokens=128, hidden_size=7168, num_experts=256)
    # ladder: (bs, cumulative MiB since the capture began), largest captured first
    ladder = ((1, 700.0), (8, 640.0), (64, 520.0), (256, 400.0))
    store_run(root, "dsv3-decode", [dg, de], model="deepseek-ai/DeepSeek-V3", ctx=ctx, ladder=ladder,
              deepep_analytic_mib=2172.0, headroom_mib=3000.0, used_after_kv_mib=4000.0, verdict="ok")  # fmt: skip
    act = TermComparison("activation", 3072.0, 1000.0, "over", "runtime peak above the post-startup baseline")
    store_run(root, 'evil<b>|"run', [act], headroom_mib=600.0, verdict="tight", reason="600 MiB <free>")
    return write_ledger(root)


def test_report_with_probe_runs(tmp_path: Path) -> None:
    res = probe_results(tmp_path / "res")
    write_report(res, html_out=True)  # default: into the results directory
    md = (res / "report.md").read_text()
    # ladder: table and plot; slope by hand: least squares over (1,700) (8,640) (64,520) (256,400)
    assert "No decode ladder" not in md
    lad = md_table_after(md, "## Decode-graph memory vs batch size")
    assert lad[2][lad[0].index("sizes captured")] == "4"
    assert lad[2][lad[0].index("largest bs")] == "256"
    assert lad[2][lad[0].index("heuristic at largest bs MiB")] == "512"
    check_png(res / "report_ladder.png", 6.0)
    # DeepEP measured: 3100 ÷ 2172 = 1.43, T = 128, and no "analytic only" plot
    de = md_table_after(md, "## DeepEP: measured vs analytic")
    assert de[2][de[0].index("measured ÷ analytic")] == "1.43"
    assert de[2][de[0].index("dispatch tokens T")] == "128"
    assert "No DeepEP buffer was measured" not in md
    check_png(res / "report_deepep.png", 1.6 + 0.6 * 1)
    # two probe runs: the tight one first
    runs = md_table_after(md, "## Runs, worst first")
    assert [r[runs[0].index("verdict")] for r in runs[2:]] == ["tight", "ok"]
    # escaping: the hostile run id and reason are text in both documents, never markup
    page = (res / "report.html").read_text()
    assert "evil<b>" not in page
    assert "&lt;free&gt;" in page and "evil&lt;b&gt;|&#34;run" in page
    assert "evil&lt;b>\\|" in md or "evil&lt;b&gt;\\|" in md
    assert "evil<b>" not in md


def test_ledger_per_run(tmp_path: Path) -> None:
    """The hand-made ledgers (tests/fixtures/results/handmade.py: LEDGERS): lines in book order, shares of free
    at start, the residual said, and one stacked bar per run."""
    res = probe_results(tmp_path / "res")
    write_report(res, html_out=True)
    md = (res / "report.md").read_text()
    sec = md.split("## Where the memory went, per run (ledger)", 1)[1].split("\n## ", 1)[0]
    assert "### dsv3-decode (rank 0): closes" in sec
    assert '### evil&lt;b>\\|"run (rank 3): residual 500 MiB' in sec  # a heading, escaped like a cell
    assert "Lines sum to 140,000 MiB of 140,000 MiB free at start; residual 0 MiB (the books close)." in sec
    # the evil run: 16,000 + 45,000 + 1,000 + 500 + 7,000 = 69,500 of 70,000 → 500 MiB unexplained
    assert "residual 500 MiB (the books do not close)" in sec and "Lines sum to 69,500 MiB of 70,000 MiB" in sec
    rows = md_table_after(md, "### dsv3-decode (rank 0)")
    head, body = rows[0], rows[2:]
    assert [r[0] for r in body] == ["weights", "kv_pool", "decode_graph", "deepep_a2a", "unattributed", "headroom"]
    # shares: 80,000 / 140,000 = 57.1%, 50,000 → 35.7%, 700 → 0.5%, 3,100 → 2.2%, 1,200 → 0.9%, 5,000 → 3.6%
    share = head.index("share of free at start")
    assert [r[share] for r in body] == ["57.1%", "35.7%", "0.5%", "2.2%", "0.9%", "3.6%"]
    assert [r[head.index("how")] for r in body] == ["read", "read", "read", "read", "implied", "read"]
    check_png(res / "report_ledger.png", 1.8 + 0.55 * 2)
    page = (res / "report.html").read_text()
    assert page.count("<details") == 2 and "<details open><summary>evil&lt;b&gt;" in page  # open: it does not close


def test_no_ledger_yet(ingested: Path, tmp_path: Path) -> None:
    """A results directory written before the ledger existed (no ledger.parquet) says so."""
    old = tmp_path / "old"
    shutil.copytree(ingested, old)
    (old / "ledger.parquet").unlink()
    write_report(old, out=tmp_path)
    assert "No ledger in these results (no ledger.parquet)" in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "report_ledger.png").exists()


def test_run_report_prints_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = probe_results(tmp_path / "res")
    assert run_report(str(res)) == 0
    printed = capsys.readouterr().out.split()
    assert printed[0] == str(res / "report.md")
    assert all(Path(p).is_file() for p in printed)
    assert not (res / "report.html").exists()  # only with --html


def test_stale_plot_is_removed(ingested: Path, tmp_path: Path) -> None:
    """A ladder plot from an earlier report must not survive a report whose results have no ladder."""
    res = tmp_path / "copy"
    shutil.copytree(ingested, res)
    (res / "report_ladder.png").write_bytes(PNG_SIGNATURE + b"stale")
    write_report(res)
    assert not (res / "report_ladder.png").exists()
    assert "No decode ladder" in (res / "report.md").read_text()


# ---------------------------------------------------------------------------------------- degenerate


def test_empty_results(tmp_path: Path) -> None:
    res = write_frame(tmp_path / "empty", [])
    paths = write_report(res, html_out=True, models_dir=tmp_path / "no-models")
    md = (res / "report.md").read_text()
    assert "No runs in these results." in md
    assert "No decode ladder" in md
    assert "No MoE model config" in md
    assert "No run has a free-memory reading" in md
    assert "No ingested log" in md
    assert not list(res.glob("*.png"))
    assert sorted(p.name for p in paths) == ["report.html", "report.md"]


def test_missing_or_bare_directory(tmp_path: Path) -> None:
    with pytest.raises(MemfracError, match="no such results directory"):
        write_report(tmp_path / "missing")
    (tmp_path / "bare").mkdir()
    with pytest.raises(MemfracError, match=r"no results\.parquet"):
        write_report(tmp_path / "bare")


def test_runs_that_measured_nothing(tmp_path: Path) -> None:
    """A sweep's runs that never started or could not run have no results row; the summary lists them from
    manifest.json (as sweep.record writes them), and a run that did measure is not listed."""
    res = probe_results(tmp_path / "res")
    store = Store(res)
    store.add([], run_key="qwen-tp2", status="not_started", extra={"reason": "waited 600 s for GPU 1: busy"})
    store.add([], run_key="dsv3-ep8", status="error", extra={"error": "ray: node lost"})
    write_report(res, html_out=True)
    md = (res / "report.md").read_text()
    summary = md.split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert "Runs that measured nothing (2;" in summary
    rows = md_table_after(md, "## Summary")
    assert rows[0] == ["run", "status", "why"]
    assert rows[2:] == [
        ["dsv3-ep8", "error", "ray: node lost"],
        ["qwen-tp2", "not_started", "waited 600 s for GPU 1: busy"],
    ]
    assert 'id="summary-unmeasured"' in (res / "report.html").read_text()


def test_unmeasured_only(tmp_path: Path) -> None:
    """Every run of a sweep failed to start: the report says which and why, not only 'No runs'."""
    res = write_frame(tmp_path / "none", [])
    Store(res).add([], run_key="only", status="not_started", extra={})
    write_report(res, models_dir=tmp_path / "no-models")
    md = (res / "report.md").read_text()
    assert "Runs that measured nothing (1;" in md and "No runs in these results." in md
    assert md_table_after(md, "## Summary")[2] == ["only", "not_started", "no reason recorded"]


def test_unlabelled_ranks_and_the_ledger_axis() -> None:
    """Issue 23: an unlabelled rank read "(rank ): closes"; the ledger plot's axis ran past the largest bar."""
    import pandas as pd

    from profiler.face.report.document import rank_text
    from profiler.face.report.plots import ledger_extent

    assert (rank_text("TP0"), rank_text(""), rank_text(None)) == ("rank TP0", "unlabelled rank", "unlabelled rank")
    # lines 100 + 300 + 50 = 450 MiB, free at start 460 (a residual of +10 hatched): the axis ends at 460 × 1.02
    g = pd.DataFrame({"line": ["weights", "kv_pool", "headroom"], "mib": [100.0, 300.0, 50.0]})
    assert ledger_extent([("a", "", g, 460.0, 10.0, False)]) == (0.0, pytest.approx(469.2))
    # books over free at start (residual −40): the bars end at 450, the mark at 410
    assert ledger_extent([("a", "", g, 410.0, -40.0, False)]) == (0.0, pytest.approx(459.0))
    # a negative line (a window that gave memory back) pulls the left edge below 0
    g2 = pd.DataFrame({"line": ["weights", "unattributed"], "mib": [100.0, -150.0]})
    assert ledger_extent([("b", "TP0", g2, None, None, True)]) == (-50.0, pytest.approx(102.0))
