"""Results directories read back as frames, and the cell readers every consumer of them shares.

The calibration, the report and the held-out evaluation read the same results.parquet / ladder.parquet: the
helpers that turn their cells into Python values (NA → None), name a run's model, find estimated runs and fit a
ladder's slope live here once, below all of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from profiler.core.errors import MemfracError
from profiler.results.store import load_ladder, load_results


def finite(v: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [finite(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


@dataclass(frozen=True, slots=True)
class LadderSlope:
    """The decode ladder of one run, in capture order (largest bs first, cumulative MiB after each size).

    sglang captures `reversed(capture_bs)` into one graph pool: the first, largest capture sets the pool's
    peak, every smaller one reuses it and adds only its own increment, so the cumulative MiB *falls* with bs
    along the ladder and a least-squares line through (bs, cumulative) has a negative slope. What one batch
    size costs is the first rung's MiB ÷ its bs (`slope_mib_per_bs`); the smaller captures' increments
    (`rest_mib` = whole capture − first rung) do not scale with max_bs.
    """

    run_id: str
    points: int
    max_bs: int
    max_used_mib: float  # the whole capture: the last rung's cumulative MiB
    slope_mib_per_bs: float | None  # first rung MiB ÷ its bs (None: no positive first rung)
    top_mib: float | None = None  # the first (largest-bs) rung's MiB
    rest_mib: float | None = None  # the smaller captures' increments together


def load_dirs(results: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """results.parquet and ladder.parquet of every directory, concatenated; a run seen twice counts once."""
    if not results:
        raise MemfracError("give at least one results directory")
    frames, ladders, notes = [], [], []
    for d in results:
        p = Path(d)
        if not p.is_dir():
            raise MemfracError(f"{d}: no such results directory")
        frames.append(load_results(p))
        ladders.append(load_ladder(p))
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    lad = pd.concat(ladders, ignore_index=True) if len(ladders) > 1 else ladders[0]
    dups = df.duplicated(subset=["run_id", "term"], keep="first")
    if dups.any():
        n = df.loc[dups, "run_id"].nunique()
        notes.append(f"{n} run(s) recorded in several directories were counted once (the first directory's rows)")
    df = df[~dups]
    lad = lad.drop_duplicates(subset=["run_id", "bs"], keep="first")
    return df.reset_index(drop=True), lad.reset_index(drop=True), notes


def as_float(v: Any) -> float | None:
    """A float, or None for NA/NaN (pandas gives both)."""
    if v is None or v is pd.NA:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def as_text(v: Any, default: str = "") -> str:
    return default if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else str(v)


def short_model(row: pd.Series) -> str:
    model = as_text(row.get("model"))
    return model.rstrip("/").rsplit("/", 1)[-1] if model else as_text(row.get("architecture"), "unknown model")


def ladder_slopes(ladder: pd.DataFrame) -> dict[str, LadderSlope]:
    """Per run with a ladder: MiB per bs of its first (largest) capture, read in capture order.

    Rows are taken in `capture_index` order (store.load_ladder gives it; a ladder without it is sorted
    largest bs first, as sglang captures); the first rung must be the largest bs, or the ladder is not a
    capture-order one and gets no slope.
    """
    out: dict[str, LadderSlope] = {}
    lad = ladder.dropna(subset=["bs", "used_mib"])
    for run_id, g in lad.groupby("run_id", sort=True):
        if "capture_index" in g.columns and g["capture_index"].notna().all():
            g = g.sort_values("capture_index", kind="stable")
        else:
            g = g.sort_values("bs", ascending=False, kind="stable")
        bs = g["bs"].astype(float).to_numpy()
        used = g["used_mib"].astype(float).to_numpy()
        top_bs, top = float(bs[0]), float(used[0])
        ok = top_bs == float(bs.max()) and top > 0 and top_bs > 0
        slope = top / top_bs if ok else None
        out[str(run_id)] = LadderSlope(str(run_id), len(g), int(bs.max()), float(used[-1]), slope,
                                       top if ok else None, float(used[-1]) - top if ok else None)  # fmt: skip
    return out


def derived_runs(df: pd.DataFrame) -> set[str]:
    """Scenarios a sweep did not start but estimated from another start's ladder (compare.derive_variant).

    Their graph memory is an estimate and their other figures are copies of the start they came from, so
    they are evidence of nothing new: the fits leave them out (KV recovered still counts them).
    """
    if "derived_from" not in df.columns:
        return set()
    est = df["derived_from"].notna() & (df["derived_from"].astype("string") != "")
    return set(df.loc[est, "run_id"].astype(str))


def rule_sets_of(row: pd.Series) -> tuple[str, ...]:
    """The rule sets a results row was sized with, in release order: its `rule_sets` list; for a directory written
    before that column existed, what its `rules` display label names (`logs.reserve.rule_sets_named`)."""
    v = row.get("rule_sets")
    if v is not None and not (isinstance(v, float) and math.isnan(v)) and v is not pd.NA:
        return tuple(str(x) for x in v)
    from profiler.logs.reserve import rule_sets_named

    return tuple(rs.name for rs in rule_sets_named(as_text(row.get("rules"))))
