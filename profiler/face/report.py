"""`memfrac report`: a results directory as a page someone who has never seen memfrac can read.

One document model (sections of paragraphs, tables, images, notes and collapsible per-run blocks) is rendered
twice, so the two never disagree: to Markdown (pipe tables by pandas' `to_markdown`, i.e. tabulate) and to a
self-contained HTML page from the jinja2 template `profiler/face/templates/report.html` (plots embedded as data:
URIs, tables sortable by a few lines of inline JS, no network). The page opens with a summary (runs by verdict,
KV left unused per node type, terms under-reserved), then the per-run ledgers (`ledger.parquet`: where the
memory free at start went, line by line, and the residual), then the detail. Plots are PNGs written with
matplotlib's Agg canvas on `Figure` objects (no pyplot state), at 100 dpi and a bounded size. A plot with
nothing to draw is never written: its section says why instead.
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pandas as pd
from markupsafe import Markup
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from profiler.analyse.verdict import TIGHT_MIB
from profiler.core.errors import MemfracError
from profiler.model.deepep import HEURISTIC_RESERVE_BYTES, MIB, deepep_examples
from profiler.model.scenario import BUNDLED_MODELS
from profiler.results.frames import as_float, as_text, derived_runs, ladder_slopes, short_model
from profiler.results.store import Store, load_ladder, load_ledger, load_results

DPI = 100
WIDTH_IN = 10.0
MAX_HEIGHT_IN = 40.0
MAX_BARS = 80  # term bars per plot; more are listed in the table only
DEEPEP_RESERVE_MIB = HEURISTIC_RESERVE_BYTES / MIB
#: Worst first: crashes, then one allocation from a crash, then paid-for KV never used, then fine, then unknown.
SEVERITY = (
    "oom_during_capture", "oom_startup", "oom_runtime", "failed", "tight", "wasteful", "ok", "incomplete", "unknown",
)  # fmt: skip
_COLOR = {"under": "#d62728", "measured": "#1f77b4", "reserved": "#9e9e9e", "analytic": "#ff7f0e"}
_VERDICT_COLOR = {
    "failed": "#8c564b", "tight": "#ff7f0e", "wasteful": "#9467bd", "ok": "#2ca02c", "incomplete": "#c7c7c7",
    "unknown": "#9e9e9e",
}  # fmt: skip
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


def _figure(height_in: float) -> Figure:
    fig = Figure(figsize=(WIDTH_IN, min(max(height_in, 3.0), MAX_HEIGHT_IN)), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _legend(fig: Figure, handles: list[Any]) -> None:
    """Below the axes, never over the bars."""
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 3), fontsize=8, frameon=False)


def _finish(fig: Figure, ax: Any, path: Path, xlabel: str, title: str, handles: list[Any]) -> Path:
    """Label, legend, grid, save: the same tail for every horizontal-bar plot."""
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    _legend(fig, handles)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def _split(flags: np.ndarray, within: str, above: str, within_color: str) -> list[Any]:
    """Legend entries for bars coloured by whether they exceed a limit (only the kinds present)."""
    out: list[Any] = [Patch(color=within_color, label=within)] if not flags.all() else []
    return out + ([Patch(color=_COLOR["under"], label=above)] if flags.any() else [])


def _reserve_line(ax: Any, label: str) -> Any:
    ax.axvline(DEEPEP_RESERVE_MIB, color="k", ls="--", lw=1)
    return Line2D([], [], color="k", ls="--", lw=1, label=label)


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI, format="png")
    return path


# ---------------------------------------------------------------------------------------------------
# Data behind each section
# ---------------------------------------------------------------------------------------------------


#: Ledger lines in book order (terms in TERM_NAMES order between the pool and the unattributed rest).
_LEDGER_FIRST, _LEDGER_LAST = ("weights", "kv_pool"), ("unattributed", "headroom")


def ledger_order(line: str) -> int:
    from profiler.model.heuristic.record import TERM_NAMES

    if line in _LEDGER_FIRST:
        return _LEDGER_FIRST.index(line)
    if line in _LEDGER_LAST:
        return 100 + _LEDGER_LAST.index(line)
    return 2 + (TERM_NAMES.index(line) if line in TERM_NAMES else len(TERM_NAMES))


def verdict_counts(t: pd.DataFrame) -> pd.DataFrame:
    """Runs per verdict, worst verdict first (the summary's first table)."""
    counts = t["verdict"].fillna("unknown").value_counts()
    order = sorted(counts.index, key=lambda v: (SEVERITY.index(v) if v in SEVERITY else len(SEVERITY), v))
    return pd.DataFrame([{"verdict": v, "runs": str(int(counts[v]))} for v in order])


def kv_unused_by_mode(t: pd.DataFrame) -> pd.DataFrame:
    """Per node type: runs, runs judged (a finished startup whose runtime need is known), MiB those left beyond
    the margin and what runtime still needs (`compare.spare`), and that as KV tokens. A failed, cut or unread
    startup counts as a run, never as unused KV."""
    rows = []
    for mode, g in t.groupby(t["mode"].fillna("unknown"), sort=True):
        unused = g["kv_unused_mib"].astype(float).dropna() if "kv_unused_mib" in g else pd.Series(dtype=float)
        tokens = g["wasted_kv_tokens"].dropna()
        rows.append({
            "node type": str(mode), "runs": str(len(g)), "judged": str(len(unused)),
            "unused beyond margin and runtime need MiB": mib(unused.sum()) if len(unused) else _DASH,
            "wasted KV tokens": count(tokens.sum()) if len(tokens) else _DASH,
        })  # fmt: skip
    return pd.DataFrame(rows)


def under_by_term(df: pd.DataFrame) -> pd.DataFrame:
    """Per term that was ever under-reserved: runs under, runs judged, the largest shortfall."""
    judged = df[(df["term"] != "total") & df["term_verdict"].isin(["under", "fits", "over"])]
    rows = []
    for term, g in judged.groupby("term", sort=True):
        under = g[g["term_verdict"] == "under"]
        if not len(under):
            continue
        short = (under["measured_mib"].astype(float) - under["reserved_mib"].astype(float)).max()
        rows.append({"term": str(term), "runs under": str(len(under)), "runs judged": str(len(g)),
                     "largest shortfall MiB": mib(short)})  # fmt: skip
    return pd.DataFrame(rows)


def totals(df: pd.DataFrame) -> pd.DataFrame:
    """One row per run (the `total` rows), worst first: by verdict severity, then the smallest headroom."""
    t = df[df["term"] == "total"].copy()
    t["_sev"] = t["verdict"].map(lambda v: SEVERITY.index(v) if v in SEVERITY else len(SEVERITY))
    t["_head"] = t["headroom_mib"].astype(float)
    t.loc[t["verdict"] == "wasteful", "_head"] *= -1  # the most wasteful first among the wasteful
    return t.sort_values(["_sev", "_head", "run_id"], na_position="last").drop(columns=["_sev", "_head"])


def run_table(t: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, r in t.iterrows():
        run = str(r["run_id"])
        scen = as_text(r.get("scenario"))
        mfs = frac(r.get("mfs"))
        if mfs != _DASH:
            mfs += f" ({as_text(r.get('mfs_origin'), 'unknown')})"
        rows.append({
            "run": run if not scen or scen == run else f"{scen} ({run})",
            "model": short_model(r), "GPU": gpu_label(r), "mode": as_text(r.get("mode"), _DASH),
            "parallelism": parallelism(r), "rules": as_text(r.get("rules"), _DASH), "mfs (origin)": mfs,
            "slack MiB": mib(r.get("slack_total_mib")),
            "used after KV MiB": mib(r.get("used_after_kv_mib")), "headroom MiB": mib(r.get("headroom_mib")),
            "wasted KV tokens": count(r.get("wasted_kv_tokens")), "recommended mfs": frac(r.get("recommended_mfs")),
            "verdict": as_text(r.get("verdict"), "unknown"), "reason": as_text(r.get("reason")),
        })  # fmt: skip
    return pd.DataFrame(rows)


def observed_terms(df: pd.DataFrame) -> pd.DataFrame:
    """Term rows with a measurement set against a reserve (under | fits | over), most under-reserved first."""
    obs = df[(df["term"] != "total") & df["term_verdict"].isin(["under", "fits", "over"])].copy()
    obs["_slack"] = obs["reserved_mib"].astype(float) - obs["measured_mib"].astype(float)
    return obs.sort_values(["_slack", "run_id"]).drop(columns=["_slack"])


def term_table(obs: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"run": str(r["run_id"]), "term": r["term"], "reserved MiB": mib(r["reserved_mib"]),
             "measured MiB": mib(r["measured_mib"]), "reserved − measured MiB": mib(r["slack_mib"]),
             "verdict": r["term_verdict"], "measured as": as_text(r.get("observed_from"))}
            for _, r in obs.iterrows()
        ]
    )  # fmt: skip


def term_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per term: in how many runs it was under, fitting, over, unobservable or off."""
    rows = df[df["term"] != "total"]
    if not len(rows):
        return pd.DataFrame()
    tab = pd.crosstab(rows["term"], rows["term_verdict"])
    for v in ("under", "fits", "over", "unobservable", "off"):
        if v not in tab.columns:
            tab[v] = 0
    tab = tab[["under", "fits", "over", "unobservable", "off"]].reset_index()
    return tab.astype({c: str for c in tab.columns})


def ladder_table(ladder: pd.DataFrame) -> pd.DataFrame:
    slopes = ladder_slopes(ladder)
    rows = []
    for run_id, s in slopes.items():
        g = ladder[ladder["run_id"] == run_id]
        rows.append({
            "run": run_id, "model": short_model(g.iloc[0]), "sizes captured": str(s.points),
            "largest bs": str(s.max_bs), "capture MiB (max)": mib(s.max_used_mib),
            "heuristic at largest bs MiB": mib(2.0 * s.max_bs),
            "slope MiB/bs": _DASH if s.slope_mib_per_bs is None else f"{s.slope_mib_per_bs:.3f}",
        })  # fmt: skip
    return pd.DataFrame(rows)


def deepep_measured(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["term"] == "deepep_a2a") & df["measured_mib"].notna()]


def deepep_table(d: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, r in d.iterrows():
        an, me = as_float(r.get("deepep_analytic_mib")), as_float(r.get("measured_mib"))
        rows.append({
            "run": str(r["run_id"]), "model": short_model(r), "dispatch tokens T": count(r.get("deepep_tokens")),
            "hidden": count(r.get("hidden_size")), "experts": count(r.get("num_experts")),
            "reserved MiB": mib(r.get("reserved_mib")), "analytic device total MiB": mib(an), "measured MiB": mib(me),
            "measured ÷ analytic": _DASH if not an or me is None else f"{me / an:.2f}",
            "verdict": as_text(r.get("term_verdict")),
        })  # fmt: skip
    return pd.DataFrame(rows)


def analytic_table(models_dir: Path) -> pd.DataFrame:
    """profiler.model.deepep sizes of the MoE model configs under `models_dir`, T = 128 and 256 (mode auto, 8 ranks)."""
    return pd.DataFrame(
        [
            {"model": e.model, "hidden": e.hidden, "experts": e.experts, "T": e.tokens, "analytic MiB": e.analytic_mib,
             "with NVSHMEM 512 MiB granules MiB": e.heap_rounded_mib, "sglang reserve MiB": DEEPEP_RESERVE_MIB}
            for e in deepep_examples(models_dir)
        ]
    )  # fmt: skip


def kv_table(t: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, r in t.iterrows():
        v = as_text(r.get("verdict"), "unknown")
        head, margin = as_float(r.get("headroom_mib")), as_float(r.get("margin_mib"))
        rows.append({
            "run": str(r["run_id"]), "verdict": v, "headroom (OOM margin) MiB": mib(head),
            "safety margin kept MiB": mib(margin),
            "unused beyond the margin MiB": mib(None if head is None or margin is None else max(0.0, head - margin)),
            "KV bytes/token": count(r.get("kv_bytes_per_token")), "wasted KV tokens": count(r.get("wasted_kv_tokens")),
            "note": as_text(r.get("reason")) if v.startswith("oom") or v == "failed" else "",
        })  # fmt: skip
    return pd.DataFrame(rows)


def startup_rows(t: pd.DataFrame) -> pd.DataFrame:
    """Ingested logs with a headroom at the end of startup or a slack to compare it with."""
    logs = t[t["source"] == "log"]
    return logs[logs["headroom_startup_mib"].notna() | logs["slack_total_mib"].notna()]


def startup_table(s: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, r in s.iterrows():
        slack, head = as_float(r.get("slack_total_mib")), as_float(r.get("headroom_startup_mib"))
        rows.append({
            "run": str(r["run_id"]), "mfs": frac(r.get("mfs")), "free at start MiB": mib(r.get("free_at_start_mib")),
            "slack = free × (1 − mfs) MiB": mib(slack), "used after KV MiB": mib(r.get("used_after_kv_mib")),
            "headroom at end of startup MiB": mib(head),
            "headroom ÷ slack": _DASH if not slack or head is None else f"{head / slack:.0%}",
        })  # fmt: skip
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------------


_LEDGER_COLOR = {"weights": "#4c72b0", "kv_pool": "#55a868", "unattributed": "#c44e52", "headroom": "#dddddd"}
_TERM_PALETTE = ("#dd8452", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd", "#e17c05", "#6f4e7c")


def plot_ledger(runs: list[tuple[str, str, pd.DataFrame, float | None, float | None, bool]], path: Path) -> Path:
    """One horizontal stacked bar per run: its ledger lines left to right, the residual hatched, free at start |."""
    runs = runs[:MAX_BARS][::-1]
    n = len(runs)
    fig = _figure(1.8 + 0.55 * n)
    ax = fig.add_subplot()
    colors: dict[str, str] = {}
    for y, (_, _, g, free, resid, _) in enumerate(runs):
        left = 0.0
        for _, r in g.iterrows():
            line, w = str(r["line"]), float(r["mib"])
            c = colors.setdefault(line, _LEDGER_COLOR.get(line) or _TERM_PALETTE[len(colors) % len(_TERM_PALETTE)])
            ax.barh(y, w, left=left, height=0.6, color=c, edgecolor="white", linewidth=0.5)
            left += w
        if resid:
            ax.barh(y, resid, left=left, height=0.6, color="none", edgecolor="k", hatch="///", linewidth=0.8)
        if free:
            ax.plot([free, free], [y - 0.4, y + 0.4], color="k", lw=1.5)
    ax.set_yticks(range(n), [f"{short(r, 40)} (rank {k})" for r, k, *_ in runs], fontsize=8)
    handles: list[Any] = [
        Patch(color=c, label=line) for line, c in sorted(colors.items(), key=lambda x: ledger_order(x[0]))
    ]
    handles.append(Patch(facecolor="none", edgecolor="k", hatch="///", label="residual (unexplained)"))
    handles.append(Line2D([], [], color="k", lw=1.5, label="free at start"))
    return _finish(fig, ax, path, "MiB", "Where the memory free at start went, per run", handles)


def plot_terms(obs: pd.DataFrame, path: Path) -> Path:
    """Reserved vs measured per run × term, horizontal bars; measured in red where it exceeds the reserve."""
    obs = obs.head(MAX_BARS).iloc[::-1]
    n = len(obs)
    fig = _figure(1.4 + 0.42 * n)
    ax = fig.add_subplot()
    y = np.arange(n)
    reserved = obs["reserved_mib"].astype(float).to_numpy()
    measured = obs["measured_mib"].astype(float).to_numpy()
    under = (obs["term_verdict"] == "under").to_numpy()
    ax.barh(y + 0.2, reserved, height=0.38, color=_COLOR["reserved"])
    ax.barh(y - 0.2, measured, height=0.38, color=[_COLOR["under"] if u else _COLOR["measured"] for u in under])
    for yi, m in zip(y, measured, strict=True):
        ax.text(m, yi - 0.2, f" {m:,.0f}", va="center", fontsize=7)
    est = obs["derived_from"].notna().to_numpy() if "derived_from" in obs else np.zeros(n, dtype=bool)
    labels = [f"{short(str(r), 40)} · {t}" + (" (estimated)" if e else "")
              for r, t, e in zip(obs["run_id"], obs["term"], est, strict=True)]  # fmt: skip
    ax.set_yticks(y, labels, fontsize=8)
    handles = [Patch(color=_COLOR["reserved"], label="reserved by the heuristic")]
    handles += _split(under, "measured, within the reserve", "measured, under-reserved", _COLOR["measured"])
    return _finish(fig, ax, path, "MiB", "Reserved vs measured, per run and term", handles)


def plot_ladder(ladder: pd.DataFrame, path: Path) -> Path:
    """Cumulative decode-graph capture memory per batch size, one curve per run, and the 2 MiB × bs line."""
    fig = _figure(6.0)
    ax = fig.add_subplot()
    for run_id, g in ladder.dropna(subset=["bs", "used_mib"]).groupby("run_id", sort=True):
        g = g.sort_values("bs")
        ax.plot(g["bs"].astype(float), g["used_mib"].astype(float), marker="o", ms=3, label=short(str(run_id), 40))
    top = float(ladder["bs"].astype(float).max())
    ax.plot([0, top], [0, 2.0 * top], "k--", label="heuristic: 2 MiB × bs")
    ax.set_xlabel("decode batch size captured")
    ax.set_ylabel("MiB used by the capture so far")
    ax.set_title("Decode CUDA-graph memory vs batch size")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_deepep_measured(d: pd.DataFrame, path: Path) -> Path:
    """Per run with a DeepEP measurement: reserved, analytic and measured MiB."""
    n = len(d)
    fig = _figure(1.6 + 0.6 * n)
    ax = fig.add_subplot()
    y = np.arange(n)
    labels = [f"{short(str(r['run_id']), 34)} · T={count(r.get('deepep_tokens'))}" for _, r in d.iterrows()]
    analytic = d["deepep_analytic_mib"].astype(float).fillna(0).to_numpy()
    measured = d["measured_mib"].astype(float).to_numpy()
    over = measured > d["reserved_mib"].astype(float).to_numpy()
    ax.barh(y + 0.27, d["reserved_mib"].astype(float), height=0.26, color=_COLOR["reserved"])
    ax.barh(y, analytic, height=0.26, color=_COLOR["analytic"])  # the store's deepep_analytic_mib
    ax.barh(y - 0.27, measured, height=0.26, color=[_COLOR["under"] if o else _COLOR["measured"] for o in over])
    line = _reserve_line(ax, "sglang's 2 GiB")
    ax.set_yticks(y, labels, fontsize=8)
    handles = [Patch(color=_COLOR["reserved"], label="reserved"),
               Patch(color=_COLOR["analytic"], label="analytic buffers (profiler.model.deepep)")]  # fmt: skip
    handles += [*_split(over, "measured", "measured, above the reserve", _COLOR["measured"]), line]
    return _finish(fig, ax, path, "MiB per GPU", "DeepEP buffers: measured vs analytic vs the 2 GiB reserve", handles)


def plot_deepep_analytic(ex: pd.DataFrame, path: Path) -> Path:
    """Analytic DeepEP sizes of the bundled MoE models at each T against 2 GiB (no measurement behind them)."""
    ex = ex.iloc[::-1]
    n = len(ex)
    fig = _figure(1.6 + 0.4 * n)
    ax = fig.add_subplot()
    y = np.arange(n)
    analytic = ex["analytic MiB"].to_numpy(dtype=float)
    over = analytic > DEEPEP_RESERVE_MIB
    ax.barh(y, analytic, height=0.6, color=[_COLOR["under"] if o else _COLOR["analytic"] for o in over])
    line = _reserve_line(ax, "sglang's 2 GiB reserve")
    ax.set_yticks(y, [f"{m} · T={t}" for m, t in zip(ex["model"], ex["T"], strict=True)], fontsize=8)
    handles = [*_split(over, "analytic size, within 2 GiB", "analytic size, above 2 GiB", _COLOR["analytic"]), line]
    title = "DeepEP buffers — analytic only (no DeepEP buffer measured in these results)"
    return _finish(fig, ax, path, "MiB per GPU (8 ranks, mode auto)", title, handles)


def plot_kv(t: pd.DataFrame, path: Path) -> Path:
    """Headroom at the worst point per run (the OOM margin); runs that ran out of memory marked at zero."""
    t = t.iloc[::-1]
    n = len(t)
    fig = _figure(1.4 + 0.36 * n)
    ax = fig.add_subplot()
    y = np.arange(n)
    head = t["headroom_mib"].astype(float).fillna(0).to_numpy()
    verdicts = t["verdict"].fillna("unknown").tolist()
    colors = [_COLOR["under"] if v.startswith("oom") else _VERDICT_COLOR.get(v, "#9e9e9e") for v in verdicts]
    ax.barh(y, head, height=0.6, color=colors)
    for yi, h, v, w in zip(y, head, verdicts, t["wasted_kv_tokens"], strict=True):
        if v.startswith("oom"):
            ax.text(0, yi, " OOM", va="center", color=_COLOR["under"], fontsize=8, fontweight="bold")
        elif as_float(w):
            ax.text(h, yi, f" {int(w):,} KV tokens unused", va="center", fontsize=7)
    ax.axvline(TIGHT_MIB, color="k", ls=":", lw=1)
    handles: list[Any] = [Patch(color=c, label=v) for v, c in _VERDICT_COLOR.items() if v in verdicts]
    handles += (
        [Patch(color=_COLOR["under"], label="out of memory")] if any(v.startswith("oom") for v in verdicts) else []
    )
    handles.append(Line2D([], [], color="k", ls=":", lw=1, label=f"tight below {TIGHT_MIB:.0f} MiB"))
    ax.set_yticks(y, [f"{short(str(r), 40)} ({v})" for r, v in zip(t["run_id"], verdicts, strict=True)], fontsize=8)
    xlabel = "MiB free at the worst point after the KV pool"
    return _finish(fig, ax, path, xlabel, "OOM margin and KV cache left unused, per run", handles)


def plot_startup(s: pd.DataFrame, path: Path) -> Path:
    """Slack the heuristic left vs what was still free at the end of startup, per ingested log."""
    s = s.iloc[::-1]
    n = len(s)
    fig = _figure(1.6 + 0.5 * n)
    ax = fig.add_subplot()
    y = np.arange(n)
    ax.barh(y + 0.2, s["slack_total_mib"].astype(float).fillna(0), height=0.38, color=_COLOR["reserved"],
            label="slack: free_at_start × (1 − mfs)")  # fmt: skip
    ax.barh(y - 0.2, s["headroom_startup_mib"].astype(float).fillna(0), height=0.38, color=_COLOR["measured"],
            label="free at the end of startup")  # fmt: skip
    ax.set_yticks(y, [short(str(r), 44) for r in s["run_id"]], fontsize=8)
    title = "Ingested logs: headroom at the end of startup vs the heuristic's slack"
    return _finish(fig, ax, path, "MiB", title, ax.get_legend_handles_labels()[0])


# ---------------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------------

_VERDICT_WORDS = (
    ("oom_during_capture", "CUDA out of memory while capturing a CUDA graph: the slack was too small."),
    ("oom_startup", "out of memory while loading weights, allocating pools or warming up."),
    ("oom_runtime", "out of memory while serving."),
    ("failed", "the run failed for another reason (the reason column says which)."),
    ("tight", f"less than {TIGHT_MIB:.0f} MiB free at the worst point: one allocation away from an OOM."),
    (
        "wasteful",
        "more than twice what runtime needs (the measured runtime peak, else the heuristic's own "
        "activation reserve) left free: KV cache paid for, never used.",
    ),
    ("ok", "positive headroom, not more than twice what runtime needs (or that need is unknown)."),
    ("incomplete", "the log does not show the startup to its end (cut mid-capture or earlier): not judged."),
    ("unknown", "the source has no free-memory reading after the KV pool (or it is a CPU run)."),
)
_TERM_WORDS = (
    ("under", "measured more than reserved (beyond the reading's resolution): this term alone can cause an OOM."),
    ("fits", "measured at most the reserve, and the reserve is not wildly larger."),
    ("over", "reserved more than max(512 MiB, half the reserve) above what was measured."),
    ("unobservable", "this source cannot see the phase that spends the term (see below)."),
    ("off", "the heuristic did not apply the term to this configuration."),
)


def unmeasured_runs(manifest: dict[str, Any]) -> pd.DataFrame:
    """Runs the sweep recorded in manifest.json that left no measurement (not started, or the executor failed):
    they have no row in results.parquet, and a report that left them out would read as a complete sweep."""
    rows = [
        {"run": str(key), "status": str(run.get("status")),
         "why": (as_text(run.get("reason") or run.get("error")) or "no reason recorded")[:300]}
        for key, run in sorted(manifest.get("runs", {}).items())
        if run.get("status") in ("not_started", "error") and not run.get("ids")
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=["run", "status", "why"])


def summary_section(df: pd.DataFrame, t: pd.DataFrame, missing: pd.DataFrame | None = None) -> Section:
    """What a reader needs first: how the runs ended, KV paid for and never used, terms that were too small,
    and the runs that measured nothing."""
    s = Section("Summary")
    if missing is not None and len(missing):
        s.blocks += [
            Para(f"Runs that measured nothing ({len(missing)}; recorded in manifest.json, absent from every table "
                 "below; `memfrac sweep --resume` starts them again):"),
            Table(missing, "summary-unmeasured"),
        ]  # fmt: skip
    if not len(t):
        s.blocks.append(Note("No runs in these results."))
        return s
    s.blocks += [Para(f"Runs by verdict ({len(t)} runs; worst first):"), Table(verdict_counts(t), "summary-verdicts")]
    s.blocks += [
        Para("KV cache left unused, per node type: what the worst point left beyond the safety margin and what "
             "runtime still needs (the measured serving peak is inside the worst point; a startup log still owes "
             "the activation reserve), over the runs judged (ok, tight, wasteful), as MiB and as KV tokens:"),
        Table(kv_unused_by_mode(t), "summary-kv"),
    ]
    under = under_by_term(df)
    if len(under):
        s.blocks += [Para("Terms under-reserved (measured above the reserve):"), Table(under, "summary-under")]
    else:
        s.blocks.append(Note("No term was under-reserved in these results (or none could be judged)."))
    return s


def ledger_section(ledger: pd.DataFrame, out: Path) -> Section:
    """Per run (its worst rank): where the free memory at start went, line by line, and what is left unexplained."""
    s = Section("Where the memory went, per run (ledger)")
    if not len(ledger):
        s.blocks.append(
            Note(
                "No ledger in these results (no ledger.parquet): the per-run books — weights, KV pool, each term, "
                "unattributed, headroom, summing to the memory free at start — come from probe runs recorded by a "
                "memfrac that writes them."
            )
        )
        return s
    s.blocks.append(
        Para(
            "Every MiB free at start (after NCCL init) is attributed once: weights, the KV pool, each term, what no "
            "phase accounts for (unattributed) and what was still free at the worst point (headroom). The lines "
            "sum to free at start; a residual the books cannot explain is shown, never hidden. how: read (from "
            "the probe or the log), implied (arithmetic on readings), estimated."
        )
    )
    runs = []
    judged = ledger[ledger["judged"].fillna(True).astype(bool)]
    for (run, rank), g in judged.groupby(["run_id", "rank"], sort=True):
        g = g.assign(_o=g["line"].map(ledger_order)).sort_values(["_o", "line"])
        free, resid = as_float(g["free_at_start_mib"].iloc[0]), as_float(g["residual_mib"].iloc[0])
        opening = as_float(g["opening_mib"].iloc[0]) if free is None else free
        closes = not pd.isna(g["closes"].iloc[0]) and bool(g["closes"].iloc[0])
        total = float(g["mib"].astype(float).sum())
        runs.append((str(run), str(rank), g, opening, resid, closes))
        table = pd.DataFrame([
            {"line": str(r["line"]), "MiB": mib(r["mib"]),
             "share of free at start": _DASH if not free else f"{float(r['mib']) / free:.1%}",
             "how": as_text(r["how"]), "source": as_text(r["source"]), "worst point": as_text(r["worst_point"])}
            for _, r in g.iterrows()
        ])  # fmt: skip
        where = (
            f"{mib(free)} MiB free at start"
            if free is not None
            else (f"{mib(opening)} MiB at {as_text(g['opens_at'].iloc[0])} (free at start unknown)")
        )
        books = (f"Lines sum to {mib(total)} MiB of {where}; residual {mib(resid)} MiB "
                 f"({'the books close' if closes else 'the books do not close'}).")  # fmt: skip
        after = as_text(g["after_worst"].iloc[0])
        if after:
            books += f" Charged after the worst point (not held there): {after} MiB."
        label = f"{run} (rank {rank}): {'closes' if closes else f'residual {mib(resid)} MiB'}"
        s.blocks.append(Details(label, (Para(books), Table(table)), open=not closes))
    s.blocks.append(Image(plot_ledger(runs, out / "report_ledger.png").name, "ledger per run: stacked MiB"))
    return s


def intro(df: pd.DataFrame, t: pd.DataFrame, env: dict[str, Any] | None) -> Section:
    by_source = t["source"].value_counts().to_dict() if len(t) else {}
    logs, probes = int(by_source.get("log", 0)), int(by_source.get("probe", 0))
    s = Section("What sglang reserves, and what was measured")
    s.blocks += [
        Para(
            "SGLang gives most of a GPU to the KV cache. At startup it picks `mem_fraction_static` (mfs): the KV "
            "pool gets `free_at_start × mfs − weights`, where free_at_start is the free memory after NCCL init. "
            "Everything a worker needs after the pool — CUDA-graph captures, activations while serving, DeepEP "
            "buffers, NCCL and custom all-reduce buffers, attention workspaces — must fit in the rest, the slack "
            "`free_at_start × (1 − mfs)`. Unless the user gives mfs, sglang derives it by adding up fixed "
            "reservations (terms): 512 MiB constant, 1.5 MiB per activation token, 2 MiB per decode-graph batch "
            "size, 8 MiB per prefill-graph bucket (1.5 GiB for MLA models), tp·pp/8 GiB for parallelism, a 10 GiB "
            "floor on GPUs above 60 GiB and 2 GiB for DeepEP after the floor."
        ),
        Para(
            "memfrac measured what workers really used of the slack and set each term against the phase that "
            "spends it. Reserving too little ends in an out-of-memory error (often during CUDA-graph capture); "
            "reserving too much is KV cache that was paid for and never used."
        ),
        Para(
            "What each source can see. Ingested server logs: the free memory sglang prints — the KV pool, "
            "CUDA-graph capture and the free memory at the end of startup (headroom); the activation, constant, "
            "parallel and DeepEP terms are unobservable from a log. Probe runs (`memfrac run` / `memfrac sweep`): "
            "every phase, with driver and allocator snapshots, the decode ladder per batch size, DeepEP buffer "
            "creation and the runtime peak under load."
        ),
        Para(
            f"These results: {len(t)} runs ({logs} from logs, {probes} from probe runs), "
            f"{int((df['term'] != 'total').sum())} term rows."
        ),
    ]
    if probes and env:
        names = ", ".join(sorted({g.get("name", "?") for g in env.get("gpus", [])}))
        gpus = f"{env.get('gpu_count', 0)} GPU(s) ({names})" if names else "no GPU (CPU runs: host memory)"
        v = env.get("versions", {})
        s.blocks.append(
            Para(
                f"Probe machine: {gpus}, driver {env.get('driver') or '?'}, "
                f"CUDA {env.get('cuda') or '?'}, torch {v.get('torch') or '?'}, sglang {v.get('sglang') or '?'}, "
                f"PYTORCH_CUDA_ALLOC_CONF {env.get('PYTORCH_CUDA_ALLOC_CONF') or 'unset'}."
            )
        )
    s.blocks += [
        Para("How to read a run verdict:"),
        Table(pd.DataFrame(_VERDICT_WORDS, columns=["verdict", "meaning"])),
        Para("How to read a term verdict:"),
        Table(pd.DataFrame(_TERM_WORDS, columns=["term verdict", "meaning"])),
    ]
    return s


def runs_section(t: pd.DataFrame) -> Section:
    s = Section("Runs, worst first")
    if not len(t):
        s.blocks.append(Note("No runs in these results."))
        return s
    s.blocks += [
        Para(
            "Slack = free_at_start × (1 − mfs); used after KV = free right after the KV pool minus the lowest free "
            "seen afterwards; headroom = the lowest free (the OOM margin); wasted KV tokens = what the headroom "
            "beyond the safety margin and the runtime need still to come would hold; recommended mfs = the fraction "
            "that would leave exactly that (both only for judged runs: ok, tight, wasteful). "
            f"{_DASH} = the source does not say."
        ),
        Table(run_table(t)),
    ]
    return s


def terms_section(df: pd.DataFrame, out: Path) -> Section:
    s = Section("Reserved vs measured, per term")
    obs = observed_terms(df)
    summary = term_summary(df)
    if len(summary):
        s.blocks += [Para("Runs per term verdict: how often each term could be judged at all."), Table(summary)]
    if not len(obs):
        s.blocks.append(Note("No term was observable in these results: no plot drawn."))
        return s
    if "derived_from" in obs and obs["derived_from"].notna().any():
        s.blocks.append(
            Para(
                "Rows marked (estimated) belong to scenarios a sweep did not start: their decode "
                "graph is estimated from another start's ladder (same model and role, smaller max_bs)."
            )
        )
    s.blocks.append(Table(term_table(obs)))
    img = plot_terms(obs, out / "report_terms.png")
    s.blocks.append(Image(img.name, "reserved vs measured per run and term"))
    if len(obs) > MAX_BARS:
        s.blocks.append(
            Note(f"The plot shows the {MAX_BARS} most under-reserved of {len(obs)} rows; the table has all.")
        )
    return s


def ladder_section(df: pd.DataFrame, ladder: pd.DataFrame, out: Path) -> Section:
    s = Section("Decode-graph memory vs batch size")
    derived = derived_runs(df)
    lad = ladder.dropna(subset=["bs", "used_mib"])
    lad = lad[~lad["run_id"].isin(derived)]
    if not len(lad):
        s.blocks.append(
            Note(
                "No decode ladder in these results (ladder.parquet is empty): the per-batch-size curve comes only "
                "from probe runs (a log's progress bar prints before each size is captured, so it cannot be "
                "attributed). No plot drawn."
            )
        )
        return s
    s.blocks += [
        Para(
            "Memory used by the decode capture so far, right after each batch size, against the heuristic's "
            "2 MiB × bs. sglang captures the largest size first, so the curve usually falls towards small sizes: "
            "the first capture allocates the shared graph pool, each smaller one adds its own graph. Slope: "
            "least-squares MiB per bs over the ladder."
        ),
        Table(ladder_table(lad)),
        Image(plot_ladder(lad, out / "report_ladder.png").name, "decode graph memory vs batch size"),
    ]
    if derived:
        s.blocks.append(Note(f"{len(derived)} derived scenario(s) share their start's ladder and are not drawn again."))
    return s


def deepep_section(df: pd.DataFrame, out: Path, models_dir: Path) -> Section:
    s = Section("DeepEP: measured vs analytic vs the 2 GiB reserve")
    d = deepep_measured(df)
    ex = analytic_table(models_dir)
    if len(d):
        s.blocks += [
            Para(
                "DeepEP buffer creation as the probe measured it (driver Δ), beside profiler.model.deepep's size for "
                "the "
                "run's shape: NVL buffer + metadata + workspace + the RDMA buffer in NVSHMEM's 512 MiB granules."
            ),
            Table(deepep_table(d)),
            Image(plot_deepep_measured(d, out / "report_deepep.png").name, "DeepEP measured vs analytic"),
        ]
    else:
        s.blocks.append(
            Note(
                "No DeepEP buffer was measured in these results (no log prints its size; only probe runs with "
                "moe_a2a_backend deepep measure it). Below: analytic sizes only."
            )
        )
    if len(ex):
        shown = ex.assign(**{c: ex[c].map(mib) for c in ex.columns if c.endswith("MiB")})
        shown = shown.astype(str)
        s.blocks += [
            Para(
                "Analytic sizes (profiler.model.deepep, sgl-deep-ep 0.1.2.post1 formulas) for the bundled MoE models, "
                "8 ranks, deepep mode auto, at T = 128 and 256 dispatch tokens per rank. NVSHMEM's own overhead "
                "beyond its 512 MiB heap granules is not counted (DeepEP issue #510 measured ≈ 3.1 GiB for a 2 GiB "
                "buffer)."
            ),
            Table(shown),
        ]
        if not len(d):
            s.blocks.append(Image(plot_deepep_analytic(ex, out / "report_deepep.png").name, "DeepEP analytic only"))
    elif not len(d):
        s.blocks.append(Note(f"No MoE model config under {models_dir}: no analytic sizes, no plot drawn."))
    return s


def kv_section(t: pd.DataFrame, out: Path) -> Section:
    s = Section("KV cache left unused, or the OOM margin")
    shown = t[t["headroom_mib"].notna() | t["verdict"].fillna("").str.startswith("oom")]
    if not len(shown):
        s.blocks.append(Note("No run has a free-memory reading after the KV pool or an OOM: no plot drawn."))
        return s
    s.blocks += [
        Para(
            "Headroom = free memory at the worst point after the KV pool. Beyond the safety margin it is memory the "
            "KV pool could have had (shown as tokens via the pool's bytes per token); near zero it is the margin "
            "to an OOM."
        ),
        Table(kv_table(shown)),
        Image(plot_kv(shown, out / "report_kv.png").name, "OOM margin and unused KV per run"),
    ]
    missing = len(t) - len(shown)
    if missing:
        s.blocks.append(Note(f"{missing} run(s) have no reading after the KV pool and are not shown."))
    if "post_capture_how" in t.columns:
        pc = t[t["post_capture_how"].notna()]
        if len(pc):
            s.blocks += [
                Para(
                    "With post-capture KV sizing (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING, sglang PR #30157) the pool "
                    "is sized after graph capture from what is really left: what each measured run would have "
                    "gained in KV tokens (negative: lost), or the OOM it would have avoided."
                ),
                Table(
                    pd.DataFrame(
                        [
                            {
                                "run": short(str(r["run_id"])),
                                "mode": as_text(r["mode"]),
                                "KV tokens gained": count(r["post_capture_kv_tokens"]),
                                "OOM avoided": "yes" if r["post_capture_oom_avoided"] is True else "no",
                                "arithmetic": as_text(r["post_capture_how"]),
                            }
                            for _, r in pc.iterrows()
                        ]
                    )
                ),
            ]
    return s


def startup_section(t: pd.DataFrame, out: Path) -> Section:
    s = Section("Ingested logs: headroom at the end of startup vs the heuristic's slack")
    rows = startup_rows(t)
    if not len(rows):
        s.blocks.append(Note("No ingested log in these results has a startup headroom or a slack: no plot drawn."))
        return s
    s.blocks += [
        Para(
            "Slack is what the heuristic's mfs leaves outside the KV pool at runtime; the headroom at the end of "
            "startup is what was still free once graphs were captured. Serving activations must fit in it."
        ),
        Table(startup_table(rows)),
    ]
    both = rows[rows["slack_total_mib"].notna() & rows["headroom_startup_mib"].notna()]
    if len(both):
        s.blocks.append(Image(plot_startup(both, out / "report_startup.png").name, "startup headroom vs slack"))
    else:
        s.blocks.append(Note("No log gives both a slack (mfs and free_at_start) and a startup headroom: no plot."))
    return s


def build(results_dir: Path, out: Path, models_dir: Path | None = None) -> list[Section]:
    """Read the results, write the plots into `out`, return the document."""
    df = load_results(results_dir)
    ladder = load_ladder(results_dir)
    env_path = results_dir / "environment.json"
    env = json.loads(env_path.read_text()) if env_path.exists() else None
    t = totals(df)
    return [
        summary_section(df, t, unmeasured_runs(Store(results_dir).manifest())),
        intro(df, t, env),
        runs_section(t),
        ledger_section(load_ledger(results_dir), out),
        terms_section(df, out),
        ladder_section(df, ladder, out),
        deepep_section(df, out, models_dir or BUNDLED_MODELS),
        kv_section(t, out),
        startup_section(t, out),
    ]


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
