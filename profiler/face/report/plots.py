"""The report's plots: PNGs written with matplotlib's Agg canvas on `Figure` objects (no pyplot state), at 100 dpi
and a bounded size. A plot with nothing to draw is never written: its section says why instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from profiler.analyse.verdict import TIGHT_MIB
from profiler.face.report.document import count, ledger_order, rank_text, short
from profiler.model.deepep import HEURISTIC_RESERVE_BYTES, MIB
from profiler.results.frames import as_float

DPI = 100
WIDTH_IN = 10.0
MAX_HEIGHT_IN = 40.0
MAX_BARS = 80  # term bars per plot; more are listed in the table only
DEEPEP_RESERVE_MIB = HEURISTIC_RESERVE_BYTES / MIB
_COLOR = {"under": "#d62728", "measured": "#1f77b4", "reserved": "#9e9e9e", "analytic": "#ff7f0e"}
_VERDICT_COLOR = {
    "failed": "#8c564b", "short": "#d62728", "tight": "#ff7f0e", "wasteful": "#9467bd", "ok": "#2ca02c",
    "incomplete": "#c7c7c7", "unknown": "#9e9e9e",
}  # fmt: skip


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
# Plots
# ---------------------------------------------------------------------------------------------------


_LEDGER_COLOR = {"weights": "#4c72b0", "kv_pool": "#55a868", "unattributed": "#c44e52", "headroom": "#dddddd"}
_TERM_PALETTE = ("#dd8452", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd", "#e17c05", "#6f4e7c")


def ledger_extent(runs: list[tuple[str, str, pd.DataFrame, float | None, float | None, bool]]) -> tuple[float, float]:
    """The x range the ledger bars need: from the leftmost to the rightmost edge of any bar (lines, the hatched
    residual, the free-at-start mark), 2 % padding on the right — never an autoscaled axis past the data."""
    lo = hi = 0.0
    for _, _, g, free, resid, _ in runs:
        left = 0.0
        for w in g["mib"].astype(float):
            if np.isfinite(w):
                left += w
                lo, hi = min(lo, left), max(hi, left)
        if resid is not None and np.isfinite(resid):
            lo, hi = min(lo, left + resid), max(hi, left + resid)
        if free is not None and np.isfinite(free):
            hi = max(hi, free)
    return lo, (hi * 1.02 if hi > 0 else 1.0)


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
            if not np.isfinite(w):
                continue
            c = colors.setdefault(line, _LEDGER_COLOR.get(line) or _TERM_PALETTE[len(colors) % len(_TERM_PALETTE)])
            ax.barh(y, w, left=left, height=0.6, color=c, edgecolor="white", linewidth=0.5)
            left += w
        if resid is not None and np.isfinite(resid) and resid:
            ax.barh(y, resid, left=left, height=0.6, color="none", edgecolor="k", hatch="///", linewidth=0.8)
        if free:
            ax.plot([free, free], [y - 0.4, y + 0.4], color="k", lw=1.5)
    ax.set_xlim(*ledger_extent(runs))
    ax.set_yticks(range(n), [f"{short(r, 40)} ({rank_text(k)})" for r, k, *_ in runs], fontsize=8)
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
