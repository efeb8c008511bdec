"""report.html in a real browser: headless Chromium (Debian's `chromium`, installed by scripts/system-deps.sh)
renders the page; the page is not blank, every plot loaded, the sort works, and the summary says what
results.parquet says.

Chromium loads the page from a file:// URL with the network off (the page needs none: plots are data: URIs).
A copy of the page gets a probe script that, once the page has loaded, writes what a reader would see
(image sizes, the summary tables' cells, a column after clicking its header) into a <pre>; `--dump-dom`
returns the DOM after it ran. The screenshot is of the page itself, untouched.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

from profiler.face.report import write_report
from profiler.results.store import load_results
from tests.face.test_report import probe_results

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and os.environ.get("CI"):
    raise RuntimeError("CI must run the browser test: chromium is missing (scripts/system-deps.sh installs it)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--hide-scrollbars",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
PROBE = """<script>
window.addEventListener("load", function () {
  var out = {images: [], tables: {}, sorted: null};
  document.querySelectorAll("img").forEach(function (i) {
    out.images.push({title: i.title, complete: i.complete, naturalWidth: i.naturalWidth,
                     naturalHeight: i.naturalHeight});
  });
  document.querySelectorAll("table[id]").forEach(function (t) {
    out.tables[t.id] = Array.from(t.rows).map(function (r) {
      return Array.from(r.cells).map(function (c) { return c.textContent.trim(); }); });
  });
  var v = document.getElementById("summary-verdicts");
  v.tHead.rows[0].cells[1].click();
  out.sorted = Array.from(v.tBodies[0].rows).map(function (r) { return r.cells[1].textContent.trim(); });
  var pre = document.createElement("pre"); pre.id = "memfrac-probe"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"  # a fresh --user-data-dir per start
    cmd = [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory, ingested: Path) -> Path:
    """Real logs ingested plus two hand-built probe runs with their ledgers, reported with --html."""
    res = tmp_path_factory.mktemp("browser") / "res"
    shutil.copytree(ingested, res)
    probe_results(res)
    write_report(res, html_out=True)
    return res


def test_page_in_chromium(page: Path, tmp_path: Path) -> None:
    probed = tmp_path / "probed.html"
    probed.write_text((page / "report.html").read_text().replace("</body>", PROBE + "</body>"))
    dom = chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", probed.as_uri()).stdout
    m = re.search(r'<pre id="memfrac-probe">(.*?)</pre>', dom, re.S)
    assert m, "the probe script did not run: " + dom[-500:]
    seen = json.loads(html.unescape(m.group(1)))

    # every plot the report wrote is on the page and was decoded by the browser, at the PNG's own size
    pngs = sorted(page.glob("report_*.png"))
    assert sorted(i["title"] for i in seen["images"]) == [p.name for p in pngs] and len(pngs) == 6
    for i in seen["images"]:
        with PILImage.open(page / i["title"]) as im:
            assert i["complete"] and (i["naturalWidth"], i["naturalHeight"]) == im.size, i

    # the summary on the page equals results.parquet
    df = load_results(page)
    t = df[df["term"] == "total"]
    verdicts = {r[0]: int(r[1]) for r in seen["tables"]["summary-verdicts"][1:]}
    assert verdicts == t["verdict"].fillna("unknown").value_counts().to_dict()
    assert sum(verdicts.values()) == t["run_id"].nunique() > 30  # every run of the fixtures, none twice
    kv = seen["tables"]["summary-kv"]
    head = kv[0]
    for row in kv[1:]:
        g = t[t["mode"].fillna("unknown") == row[0]]
        assert int(row[head.index("runs")]) == len(g)
        tokens = g["wasted_kv_tokens"].dropna()
        assert row[head.index("wasted KV tokens")] == (f"{int(tokens.sum()):,}" if len(tokens) else "—")
        unused = g["kv_unused_mib"].dropna()
        assert int(row[head.index("judged")]) == len(unused)
        got = row[head.index("unused beyond margin and runtime need MiB")]
        assert got == (f"{unused.sum():,.0f}" if len(unused) else "—")
    # only judged runs leave KV unused: a failed, cut or unread startup has no such figure
    assert t[~t["verdict"].isin(["ok", "tight", "wasteful"])][["kv_unused_mib", "wasted_kv_tokens"]].isna().all().all()
    under = df[(df["term"] != "total") & (df["term_verdict"] == "under")]
    assert {r[0]: int(r[1]) for r in seen["tables"]["summary-under"][1:]} == under["term"].value_counts().to_dict()

    # clicking the "runs" header sorts the verdict table by that number
    assert seen["sorted"] == [str(n) for n in sorted(verdicts.values())]


def test_screenshot_is_not_blank(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "shot.png"
    chromium(tmp_path, "--window-size=1366,900", f"--screenshot={shot}", (page / "report.html").as_uri())
    with PILImage.open(shot) as im:
        assert im.size == (1366, 900)
        px = np.asarray(im.convert("RGB"), dtype=float)
    # a blank (or error) page is one flat colour; this one has a dark header, text and table rules
    background = np.all(np.abs(px - px[-1, -1]) < 8, axis=2)
    assert 0.05 < 1 - background.mean() < 0.9
    assert len(np.unique(px.reshape(-1, 3), axis=0)) > 50
    dark = (px.sum(axis=2) < 150).mean()  # the header bar and the text
    assert dark > 0.02


FIT = """<script>
window.addEventListener("load", function () {
  var t = document.getElementById("runs-table");
  var head = Array.from(t.tHead.rows[0].cells);
  var verdict = head.find(function (c) { return c.textContent.trim() === "verdict"; });
  var out = {table: t.scrollWidth, box: t.parentElement.clientWidth, page: document.documentElement.scrollWidth,
             window: window.innerWidth, verdictRight: verdict.getBoundingClientRect().right};
  var pre = document.createElement("pre"); pre.id = "memfrac-fit"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def test_runs_worst_first_fits_a_1400_pixel_screen(page: Path, tmp_path: Path) -> None:
    """Issue 23: the table was wider than a 1,400-pixel window: its verdict column sat behind a scrollbar."""
    probed = tmp_path / "fit.html"
    probed.write_text((page / "report.html").read_text().replace("</body>", FIT + "</body>"))
    dom = chromium(tmp_path, "--window-size=1400,900", "--virtual-time-budget=10000", "--dump-dom",
                   probed.as_uri()).stdout  # fmt: skip
    m = re.search(r'<pre id="memfrac-fit">(.*?)</pre>', dom, re.S)
    assert m, "the probe script did not run: " + dom[-500:]
    seen = json.loads(html.unescape(m.group(1)))
    assert seen["window"] == 1400, seen
    assert seen["table"] <= seen["box"] and seen["page"] <= seen["window"], seen  # no horizontal scrollbar
    assert seen["verdictRight"] <= seen["window"], seen
