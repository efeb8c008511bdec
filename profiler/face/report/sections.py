"""The report's sections: the data behind each (tables from results.parquet, ledger.parquet, the ladder and the
manifest) and the section builders, in page order (`build`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from profiler.analyse.compare import OTHER_RANK_START, other_rank_start
from profiler.analyse.verdict import TIGHT_MIB
from profiler.face.report.document import (
    _DASH,
    Details,
    Image,
    Note,
    Para,
    Section,
    Table,
    count,
    frac,
    gpu_label,
    ledger_order,
    mib,
    parallelism,
    rank_text,
    short,
)
from profiler.face.report.plots import (
    DEEPEP_RESERVE_MIB,
    MAX_BARS,
    plot_deepep_analytic,
    plot_deepep_measured,
    plot_kv,
    plot_ladder,
    plot_ledger,
    plot_startup,
    plot_terms,
)
from profiler.model.deepep import deepep_examples
from profiler.model.scenario import BUNDLED_MODELS
from profiler.results.frames import as_float, as_text, derived_runs, ladder_slopes, short_model
from profiler.results.store import Store, load_ladder, load_ledger, load_results

#: Worst first: crashes, then one allocation from a crash, then paid-for KV never used, then fine, then unknown.
SEVERITY = (
    "oom_during_capture", "oom_startup", "oom_runtime", "failed", "short", "tight", "wasteful", "ok", "incomplete",
    "unknown",
)  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# Data behind each section
# ---------------------------------------------------------------------------------------------------


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
            "verdict": as_text(r.get("verdict"), "unknown"),  # second: never behind a scrollbar
            "model": short_model(r), "GPU": gpu_label(r), "mode": as_text(r.get("mode"), _DASH),
            "parallelism": parallelism(r), "rules": as_text(r.get("rules"), _DASH), "mfs (origin)": mfs,
            "slack MiB": mib(r.get("slack_total_mib")),
            "used after KV MiB": mib(r.get("used_after_kv_mib")), "headroom MiB": mib(r.get("headroom_mib")),
            "wasted KV tokens": count(r.get("wasted_kv_tokens")), "recommended mfs": frac(r.get("recommended_mfs")),
            "reason": as_text(r.get("reason")),
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
    for v in ("under", "fits", "over", "not_reached", "unobservable", "off"):
        if v not in tab.columns:
            tab[v] = 0
    tab = tab[["under", "fits", "over", "not_reached", "unobservable", "off"]].reset_index()
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
        start, how = mib(r.get("free_at_start_mib")), as_text(r.get("free_at_start_how"))
        if other_rank_start(how):  # the judged rank printed none: another rank's, said so
            start += f" (rank {how.removeprefix(OTHER_RANK_START).split(':')[0].strip()}'s)"
        rows.append({
            "run": str(r["run_id"]), "mfs": frac(r.get("mfs")), "free at start MiB": start,
            "slack = free × (1 − mfs) MiB": mib(slack), "used after KV MiB": mib(r.get("used_after_kv_mib")),
            "headroom at end of startup MiB": mib(head),
            "headroom ÷ slack": _DASH if not slack or head is None else f"{head / slack:.0%}",
        })  # fmt: skip
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------------

_VERDICT_WORDS = (
    ("oom_during_capture", "CUDA out of memory while capturing a CUDA graph: the slack was too small."),
    ("oom_startup", "out of memory while loading weights, allocating pools or warming up."),
    ("oom_runtime", "out of memory while serving."),
    ("failed", "the run failed for another reason (the reason column says which)."),
    ("short", "the worker needs more than the room its fraction leaves (the worst point seen, less what runtime "
              "still needs beyond it): it would run out of memory."),
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
    ("under", "measured more than its own constant (beyond the reading's resolution): a calibration finding; the "
              "worker fails only when its whole need exceeds its room (run verdict `short`)."),
    ("fits", "measured at most the reserve, and the reserve is not wildly larger."),
    ("over", "reserved more than max(512 MiB, half the reserve) above what was measured."),
    ("not_reached", "the load never ran the forward this reserve is for (the admitted requests at once, a chunk): "
                    "what was measured is shown, not judged."),
    ("unobservable", "this source cannot see the phase that spends the term (see below)."),
    ("off", "the heuristic did not apply the term to this configuration."),
)


def unmeasured_runs(manifest: dict[str, Any]) -> pd.DataFrame:
    """Runs the sweep recorded in manifest.json that left no measurement (not started, skipped — predicted not to
    load, or for another GPU — or the executor failed):
    they have no row in results.parquet, and a report that left them out would read as a complete sweep."""
    rows = [
        {"run": str(key), "status": str(run.get("status")),
         "why": (as_text(run.get("reason") or run.get("error")) or "no reason recorded")[:300]}
        for key, run in sorted(manifest.get("runs", {}).items())
        if run.get("status") in ("not_started", "error", "skipped") and not run.get("ids")
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=["run", "status", "why"])


def summary_section(df: pd.DataFrame, t: pd.DataFrame, missing: pd.DataFrame | None = None) -> Section:
    """What a reader needs first: how the runs ended, KV paid for and never used, terms that were too small,
    and the runs that measured nothing."""
    s = Section("Summary")
    if missing is not None and len(missing):
        s.blocks += [
            Para(f"Runs that measured nothing ({len(missing)}; recorded in manifest.json, absent from every table "
                 "below; `memfrac sweep --resume` starts those not started or failed again, `--start-unloadable` "
                 "those skipped as predicted not to load):"),
            Table(missing, "summary-unmeasured"),
        ]  # fmt: skip
    if not len(t):
        s.blocks.append(Note("No runs in these results."))
        return s
    s.blocks += [Para(f"Runs by verdict ({len(t)} runs; worst first):"), Table(verdict_counts(t), "summary-verdicts")]
    s.blocks += [
        Para(
            "KV cache left unused, per node type: what the worst point left beyond the safety margin and what "
            "runtime still needs (the measured serving peak is inside the worst point; a startup log still owes "
            "the activation reserve), over the runs judged (ok, tight, wasteful), as MiB and as KV tokens:"
        ),
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
        label = f"{run} ({rank_text(rank)}): {'closes' if closes else f'residual {mib(resid)} MiB'}"
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
        Table(run_table(t), "runs-table"),
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


def pair_runs(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The PD pairs of a sweep (manifest runs recorded with `pair`: profiler.sweep.sweep.record_pair)."""
    return {str(k): v for k, v in sorted(manifest.get("runs", {}).items()) if v.get("pair")}


def _transfer_window(out_dir: Path, role: str) -> tuple[float | None, str]:
    """The transfer engine's own window on one node: the probe's `disaggregation_init` phase (Scheduler.
    init_disaggregation: the KV manager, its registered buffers and the bootstrap server / receiver threads),
    from that worker's measurement.json."""
    from profiler.core.measurement import Measurement

    path = out_dir / role / "measurement.json"
    try:
        m = Measurement.load(path)
    except (OSError, ValueError, KeyError, TypeError):
        return None, f"{path}: not readable"
    ph = m.primary.phase("disaggregation_init") if m.ranks else None
    if ph is None:
        return None, "no disaggregation_init window in the probe"
    unit = "host RSS" if m.memory_kind == "host" else "GPU"
    return ph.used_mib, f"probe window disaggregation_init ({unit})"


def _mib1(v: Any) -> str:
    f = as_float(v)
    return _DASH if f is None else f"{f:,.1f}"


def pair_table(df: pd.DataFrame, key: str, run: dict[str, Any]) -> pd.DataFrame:
    """One pair, its two roles side by side: each term reserved and measured, the fraction, the transfer engine's
    window on each node, and the per-request proof of transfer."""
    g = df[df["group"].astype("string") == key] if "group" in df else df.iloc[0:0]
    roles = {str(m): r for m, r in g.groupby(g["mode"].fillna("?"))}
    cols = [c for c in ("prefill", "decode") if c in roles]
    rows: list[dict[str, str]] = []

    def add(what: str, per: dict[str, str], source: str) -> None:
        rows.append({"": what, **{c: per.get(c, _DASH) for c in cols}, "from": source})

    first = {c: roles[c].iloc[0] for c in cols}
    src = {str(first[c].get("mfs_source")) for c in cols if isinstance(first[c].get("mfs_source"), str)}
    src_text = "; ".join(sorted(s for s in src if s)) or "the heuristic (sglang rules), or given"
    add("mem_fraction_static", {c: frac(first[c].get("mfs")) for c in cols}, src_text)
    if "mfs_model" in g:
        add("mem_fraction_static (the model's)", {c: frac(first[c].get("mfs_model")) for c in cols},
            "profiler.model.heuristic for the scenario")
    terms = [t for t in dict.fromkeys(g["term"].astype(str)) if t != "total"]
    for t in terms:
        per = {}
        for c in cols:
            r = roles[c][roles[c]["term"].astype(str) == t]
            if len(r):
                per[c] = f"{mib(r.iloc[0]['reserved_mib'])} / {mib(r.iloc[0]['measured_mib'])}"
        add(f"{t}: reserved / measured MiB", per, "results.parquet (compare)")
    out_dir = Path(str(run.get("out_dir") or ""))
    win = {c: _transfer_window(out_dir, c) for c in cols}
    add("transfer engine (disaggregation_init) MiB", {c: _mib1(win[c][0]) for c in cols},
        "; ".join(sorted({w[1] for w in win.values()})) + " — charged to the constant term")  # fmt: skip
    add("verdict", {c: str(first[c].get("verdict")) for c in cols}, "compare")
    t = run.get("transfer") or {}
    rows.append({"": "KV transfer proven", **{c: f"{t.get('proven')}/{t.get('of')} requests" for c in cols},
                 "from": f"transfer.json: {t.get('how') or 'per-request KV hashes'}; kinds "
                         f"{', '.join(t.get('kinds_proven') or []) or _DASH}; negative control all zeros: "
                         f"{t.get('negative_control_zero')}"})  # fmt: skip
    return pd.DataFrame(rows, columns=["", *cols, "from"])


def pair_section(df: pd.DataFrame, manifest: dict[str, Any]) -> Section | None:
    """Each PD pair with its roles side by side (None: no pair in these results)."""
    pairs = pair_runs(manifest)
    if not pairs:
        return None
    s = Section("PD pairs: prefill and decode side by side")
    s.blocks.append(Para(
        "Each pair ran a prefill and a decode worker with a real transfer backend behind sglang's router; every "
        "request's KV cache crossed from one to the other. Per role: what the heuristic reserved for each term "
        "beside what that node used, and the transfer engine's own window (its buffers, bootstrap server and "
        "threads), which the heuristic leaves to the constant term on both roles."
    ))  # fmt: skip
    for key, run in pairs.items():
        s.blocks += [Para(f"Pair {key} ({run.get('status')}" + (f": {run.get('failure')}" if run.get("failure")
                                                               else "") + "):"),
                     Table(pair_table(df, key, run), f"pair-{key}")]  # fmt: skip
    return s


def build(results_dir: Path, out: Path, models_dir: Path | None = None) -> list[Section]:
    """Read the results, write the plots into `out`, return the document."""
    df = load_results(results_dir)
    ladder = load_ladder(results_dir)
    env_path = results_dir / "environment.json"
    env = json.loads(env_path.read_text()) if env_path.exists() else None
    t = totals(df)
    manifest = Store(results_dir).manifest()
    pairs = pair_section(df, manifest)
    return [
        summary_section(df, t, unmeasured_runs(manifest)),
        intro(df, t, env),
        runs_section(t),
        *([pairs] if pairs is not None else []),
        ledger_section(load_ledger(results_dir), out),
        terms_section(df, out),
        ladder_section(df, ladder, out),
        deepep_section(df, out, models_dir or BUNDLED_MODELS),
        kv_section(t, out),
        startup_section(t, out),
    ]
