"""A results directory: what every later stage (report, calibrate, gate) reads.

    RESULTS/
      results.parquet     one row per run × term (plus a `total` row per run), typed, schema-versioned
      ladder.parquet      decode-graph memory per captured batch size, one row per run × bs, in capture order
      ledger.parquet      the books of each run's ranks at their worst point (profiler.analyse.ledger), one row per line
      measurements/       the Measurement records (JSON), one per run
      raw/                artifacts of runs (sglang log, probe JSONL, server_info, …), one folder per run
      environment.json    GPU model and count, driver, CUDA, torch, sglang, deep_ep, PYTORCH_CUDA_ALLOC_CONF
      manifest.json       schema version and the runs recorded (for --resume)

Writes are atomic (temp file + rename); adding a run replaces an earlier row of the same run_id, so a
re-run sweep appends and a resumed one can skip finished runs. `load_results` gives pandas frames with
the documented dtypes.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from profiler import __version__
from profiler.analyse.compare import Comparison
from profiler.core.errors import FieldError, MemfracError
from profiler.core.measurement import Measurement
from profiler.core.provenance import defaulted_inputs
from profiler.core.validate import finite, json_object
from profiler.measure.machine import gpu_inventory

SCHEMA_VERSION = 1

#: results.parquet columns and their pandas dtypes (documented in README).
RESULT_COLUMNS: dict[str, str] = {
    "schema_version": "int64",
    "run_id": "string",
    "scenario": "string",
    "group": "string",  # the sweep run that measured it (several scenarios can share one worker start)
    "source": "string",  # probe | log
    "origin": "string",  # artifacts dir or log file
    "memory_kind": "string",  # gpu | host
    "model": "string",
    "architecture": "string",
    "gpu_name": "string",
    "gpu_total_mib": "float64",
    "gpu_total_origin": "string",  # read | estimated | unknown (Identity.gpu_total_origin)
    "gpu_total_how": "string",  # where the capacity comes from (estimated: the free-memory bound and the GPUs it fits)
    "mode": "string",
    "tp": "Int64",
    "pp": "Int64",
    "dp": "Int64",
    "attn_dp": "Int64",
    "ep": "Int64",
    "moe_a2a_backend": "string",
    "sglang_version": "string",
    "sglang_how": "string",  # how the release is known: a stated cue, or the range the log's formats allow
    "rules": "string",
    "rule_sets": "object",  # a list: every rule set `rules` names (one, or a log's candidates), in release order
    "rules_why": "string",  # which rule set(s) and why (logs: release cue, format range, candidates)
    "mfs": "float64",
    "mfs_origin": "string",
    "mfs_source": "string",  # where mfs comes from: the worker (/server_info), sglang's resolver, the log, the model
    "mfs_model": "float64",  # the model's fraction for the scenario beside it (profiler.engine.fraction)
    "heuristic_fraction": "float64",
    "term": "string",  # a heuristic term, two joined by '+', or 'total'
    "reserved_mib": "float64",
    "measured_mib": "float64",
    "slack_mib": "float64",
    "term_verdict": "string",  # under | fits | over | not_reached | unobservable | off
    "observed_from": "string",
    "verdict": "string",  # run level: oom_* | failed | incomplete | short | tight | ok | wasteful | unknown
    "reason": "string",
    "failure_kind": "string",
    "free_at_start_mib": "float64",
    # where free_at_start_mib comes from: the judged rank's reading, or "estimated from rank TP1: the judged rank …"
    "free_at_start_how": "string",
    "slack_total_mib": "float64",
    "reserved_terms_mib": "float64",
    "used_after_kv_mib": "float64",
    "headroom_startup_mib": "float64",
    "headroom_mib": "float64",
    "wasted_kv_tokens": "Int64",
    "kv_unused_mib": "float64",  # headroom beyond the margin and the runtime need still to come (judged runs)
    "kv_bytes_per_token": "float64",
    "kv_tokens": "Int64",
    "kv_pool_mib": "float64",
    "weights_mib": "float64",
    "recommended_mfs": "float64",
    "recommended_basis": "string",  # how recommended_mfs was reached (sglang's sizing replayed, a partial load, …)
    "margin_mib": "float64",
    "request_pools_mib": "float64",  # req_to_token + allocator index: built out of the slack (read from sglang)
    "room_mib": "float64",  # what the fraction leaves the worker: free_at_start × (1 − mfs) − the request pools
    "need_mib": "float64",  # what the worker measured it needs of that room: used after the KV pool
    "pending_mib": "float64",  # runtime need beyond the worst point seen (an unreached activation reserve)
    "load_reached": "boolean",  # the load ran every worst case the role's reserve is for (NA: unknown)
    "load": "string",  # per worst case: the largest batch seen of the target ("; "-joined)
    "decode_max_bs": "Int64",
    "chunked_prefill_size": "Int64",
    "deepep_tokens": "Int64",
    "deepep_analytic_mib": "float64",  # DeepEP buffers as sized (NVL + RDMA + workspace), profiler.model.deepep
    "deepep_device_mib": "float64",  # the same with RDMA rounded to NVSHMEM's 512 MiB heap granules
    "derived_from": "string",  # set when a sweep did not start this scenario but estimated it from that run's ladder
    "hidden_size": "Int64",
    "num_experts": "Int64",
    # heuristic inputs taken from defaults rather than read (comma-separated; "" = all read; NA = unknown):
    # calibration fits a term only from runs whose inputs for that term were read
    "defaulted_inputs": "string",
    # what post-capture KV sizing (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING) would have changed (profiler.model.postcapture)
    "post_capture_kv_tokens": "Int64",  # KV tokens gained (negative: lost)
    "post_capture_oom_avoided": "boolean",
    "post_capture_how": "string",
    "ledger_closes": "boolean",  # the judged rank's books close (NA: they could not be opened)
    "ledger_residual_mib": "float64",
    "recorded_at": "float64",
}
LADDER_COLUMNS: dict[str, str] = {
    "schema_version": "int64",
    "run_id": "string",
    "scenario": "string",
    "model": "string",
    "gpu_name": "string",
    "mode": "string",
    "tp": "Int64",
    "bs": "Int64",
    "capture_index": "Int64",  # 0 = captured first (the largest bs: sglang captures reversed(capture_bs))
    "used_mib": "float64",  # cumulative since the capture began: falls with bs
    "reserved_mib": "float64",  # the heuristic's line: 2 MiB × bs
}
LEDGER_COLUMNS: dict[str, str] = {
    "schema_version": "int64",
    "run_id": "string",
    "rank": "string",
    "judged": "boolean",  # the rank the run's verdict is about (closest to OOM)
    "order": "Int64",  # line order: weights, kv_pool, terms…, unattributed, headroom
    "line": "string",
    "mib": "float64",
    "how": "string",  # read | implied | estimated
    "source": "string",
    "worst_point": "string",
    "free_at_start_mib": "float64",  # NA when the record shows no reading before the weights
    "opening_mib": "float64",  # where the books open: free_at_start, or the first reading there is
    "opens_at": "string",
    "residual_mib": "float64",  # opening − Σ lines
    "closes": "boolean",
    "after_worst": "string",  # lines charged after the worst point (not held there), "name MiB; …"
}


@dataclass(frozen=True, slots=True)
class RunContext:
    """What the store needs besides the comparison: which sweep run, and scenario facts for grouping."""

    group: str = ""
    moe_a2a_backend: str | None = None
    decode_max_bs: int | None = None
    chunked_prefill_size: int | None = None
    deepep_tokens: int | None = None
    hidden_size: int | None = None
    num_experts: int | None = None
    deepep_device_mib: float | None = None
    derived_from: str | None = None
    defaulted_inputs: str | None = None  # see RESULT_COLUMNS; None = unknown
    post_capture_kv_tokens: int | None = None
    post_capture_oom_avoided: bool | None = None
    post_capture_how: str | None = None
    rules_why: str | None = None


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _atomic_json(path: Path, obj: Any) -> None:
    _atomic_write_bytes(path, json.dumps(obj, indent=1, default=str).encode())


def _atomic_parquet(path: Path, df: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    df.to_parquet(tmp, index=False)
    tmp.replace(path)


def _typed(rows: list[dict[str, Any]], columns: dict[str, str]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(columns))
    return df.astype(columns)


def result_rows(m: Measurement, c: Comparison, ctx: RunContext = RunContext()) -> list[dict[str, Any]]:
    """One row per term plus a `total` row, every run-level column repeated (a flat, filterable table)."""
    i = m.identity
    base: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "run_id": m.id,
        "scenario": m.scenario or m.id,
        "group": ctx.group or m.scenario or m.id,
        "source": m.source,
        "origin": m.origin,
        "memory_kind": m.memory_kind,
        "model": i.model,
        "architecture": i.architecture,
        "gpu_name": i.gpu_name,
        "gpu_total_mib": i.gpu_total_mib,
        "gpu_total_origin": i.gpu_total_origin,
        "gpu_total_how": i.gpu_total_how,
        "mode": i.mode,
        "tp": i.tp,
        "pp": i.pp,
        "dp": i.dp,
        "attn_dp": i.attn_dp,
        "ep": i.ep,
        "moe_a2a_backend": ctx.moe_a2a_backend,
        "sglang_version": i.sglang_version,
        "sglang_how": i.sglang_how,
        "rules": c.rules,
        "rule_sets": list(c.rule_sets),
        "rules_why": ctx.rules_why,
        "mfs": c.mfs,
        "mfs_origin": c.mfs_origin,
        "mfs_source": c.mfs_source,
        "mfs_model": c.mfs_reconstructed,
        "heuristic_fraction": c.heuristic_fraction,
        "verdict": c.verdict,
        "reason": c.reason,
        "failure_kind": c.failure_kind,
        "free_at_start_mib": c.free_at_start_mib,
        "free_at_start_how": c.free_at_start_how,
        "slack_total_mib": c.slack_mib,
        "reserved_terms_mib": c.reserved_terms_mib,
        "used_after_kv_mib": c.used_after_kv_mib,
        "headroom_startup_mib": c.headroom_startup_mib,
        "headroom_mib": c.headroom_mib,
        "wasted_kv_tokens": c.wasted_kv_tokens,
        "kv_unused_mib": c.kv_unused_mib,
        "kv_bytes_per_token": c.kv_bytes_per_token,
        "kv_tokens": c.kv_tokens,
        "kv_pool_mib": c.kv_pool_mib,
        "weights_mib": c.weights_mib,
        "recommended_mfs": c.recommended_mfs,
        "recommended_basis": c.recommended_basis,
        "margin_mib": c.margin_mib,
        "request_pools_mib": c.request_pools_mib,
        "room_mib": c.room_mib,
        "need_mib": c.need_mib,
        "pending_mib": c.pending_mib,
        "load_reached": c.load_reached,
        "load": "; ".join(c.load),
        "decode_max_bs": ctx.decode_max_bs,
        "chunked_prefill_size": ctx.chunked_prefill_size,
        "deepep_tokens": ctx.deepep_tokens,
        "deepep_analytic_mib": c.deepep_analytic_mib,
        "deepep_device_mib": ctx.deepep_device_mib,
        "derived_from": ctx.derived_from,
        "hidden_size": ctx.hidden_size,
        "num_experts": ctx.num_experts,
        "defaulted_inputs": ctx.defaulted_inputs if ctx.defaulted_inputs is not None else defaulted_inputs(m),
        "post_capture_kv_tokens": ctx.post_capture_kv_tokens,
        "post_capture_oom_avoided": ctx.post_capture_oom_avoided,
        "post_capture_how": ctx.post_capture_how,
        "ledger_closes": None if c.ledger is None else c.ledger.closes,
        "ledger_residual_mib": None if c.ledger is None else c.ledger.residual_mib,
        "recorded_at": time.time(),
    }
    rows = []
    for t in c.terms:
        rows.append(
            base
            | {
                "term": t.term,
                "reserved_mib": t.reserved_mib,
                "measured_mib": t.measured_mib,
                "slack_mib": t.slack_mib,
                "term_verdict": t.verdict,
                "observed_from": t.observed_from,
            }
        )
    # the worker as a whole: what it measured it needs after the KV pool against the room its fraction leaves (the
    # slack less the request pools sglang builds out of it); an unreached reserve moves the recommendation only
    room = c.room_mib if c.room_mib is not None else c.slack_mib
    need = c.need_mib if c.need_mib is not None else c.used_after_kv_mib
    total_verdict = "unobservable"
    if room is not None and need is not None and c.memory_kind == "gpu":
        total_verdict = "under" if need > room else "fits"
    rows.append(
        base
        | {
            "term": "total",
            "reserved_mib": room,
            "measured_mib": need,
            "slack_mib": c.headroom_mib,
            "term_verdict": total_verdict,
            "observed_from": "used after the KV pool, vs free_at_start × (1 − mfs) − the request pools",
        }
    )
    return rows


def ladder_rows(m: Measurement, c: Comparison) -> list[dict[str, Any]]:
    i = m.identity
    return [
        {
            "schema_version": SCHEMA_VERSION,
            "run_id": m.id,
            "scenario": m.scenario or m.id,
            "model": i.model,
            "gpu_name": i.gpu_name,
            "mode": i.mode,
            "tp": i.tp,
            "bs": bs,
            "capture_index": k,
            "used_mib": used,
            "reserved_mib": 2.0 * bs,
        }
        for k, (bs, used) in enumerate(c.ladder)
    ]


def ledger_rows(m: Measurement, c: Comparison) -> list[dict[str, Any]]:
    """Every rank's books, one row per line (the judged rank flagged)."""
    rows = []
    judged = c.ledger.rank if c.ledger is not None else None
    for L in c.ledgers:
        after = "; ".join(f"{x.name} {x.mib:.0f}" for x in L.after_worst)
        for k, ln in enumerate(L.lines):
            rows.append(
                {
                    "schema_version": SCHEMA_VERSION,
                    "run_id": m.id,
                    "rank": L.rank,
                    "judged": L.rank == judged,
                    "order": k,
                    "line": ln.name,
                    "mib": ln.mib,
                    "how": ln.how,
                    "source": ln.source,
                    "worst_point": L.worst_point,
                    "free_at_start_mib": L.free_at_start_mib,
                    "opening_mib": L.opening_mib,
                    "opens_at": L.opens_at,
                    "residual_mib": L.residual_mib,
                    "closes": L.closes,
                    "after_worst": after,
                }
            )
    return rows


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"memfrac": __version__, "python": platform.python_version()}
    for dist in (
        "torch",
        "sglang",
        "sgl-deep-ep",
        "sglang-kernel",
        "nvidia-ml-py",
        "mooncake-transfer-engine-non-cuda",
    ):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def environment() -> dict[str, Any]:
    """GPU model and count, driver, CUDA, package versions and allocator settings of this machine."""
    env: dict[str, Any] = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "versions": _versions(),
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    env.update(gpu_inventory())
    env["gpu_count"] = len(env["gpus"])
    return env


class Store:
    """One results directory. Not shared between processes writing at once (the sweep driver owns it)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise MemfracError(f"{self.root} exists and is not a directory; give a results directory")

    # paths
    @property
    def results_path(self) -> Path:
        return self.root / "results.parquet"

    @property
    def ladder_path(self) -> Path:
        return self.root / "ladder.parquet"

    @property
    def ledger_path(self) -> Path:
        return self.root / "ledger.parquet"

    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def raw_dir(self, run_key: str) -> Path:
        return self.root / "raw" / _safe(run_key)

    def init(self, sweep: dict[str, Any] | None = None) -> None:
        """Create the directory, write environment.json and the manifest (kept on re-runs)."""
        (self.root / "measurements").mkdir(parents=True, exist_ok=True)
        (self.root / "raw").mkdir(exist_ok=True)
        _atomic_json(self.root / "environment.json", environment())
        man = self.manifest()
        man.setdefault("schema_version", SCHEMA_VERSION)
        man.setdefault("created_at", time.time())
        if sweep:
            man["sweep"] = sweep
        _atomic_json(self.manifest_path, man)

    def manifest(self) -> dict[str, Any]:
        if not self.manifest_path.exists():
            return {"schema_version": SCHEMA_VERSION, "runs": {}}
        man = read_manifest(self.manifest_path)
        v = man.get("schema_version", SCHEMA_VERSION)
        if v > SCHEMA_VERSION:
            raise MemfracError(
                f"{self.root}: results schema {v} is newer than this memfrac ({SCHEMA_VERSION}); upgrade"
            )
        man.setdefault("runs", {})
        return man

    def finished(self) -> dict[str, dict[str, Any]]:
        """Run key → what was recorded (status, measurement ids): the runs --resume skips."""
        return dict(self.manifest().get("runs", {}))

    def add(
        self,
        items: Iterable[tuple[Measurement, Comparison, RunContext]],
        *,
        run_key: str | None = None,
        status: str = "ok",
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Record measurements and their comparisons (replacing earlier rows of the same run_id)."""
        items = list(items)
        rows, lrows, grows = [], [], []
        for m, c, ctx in items:
            m.save(self.root / "measurements" / f"{_safe(m.id)}.json")
            rows += result_rows(m, c, ctx)
            lrows += ladder_rows(m, c)
            grows += ledger_rows(m, c)
        ids = {m.id for m, _, _ in items}
        self._append(self.results_path, rows, RESULT_COLUMNS, ids)
        self._append(self.ladder_path, lrows, LADDER_COLUMNS, ids)
        self._append(self.ledger_path, grows, LEDGER_COLUMNS, ids)
        if run_key is not None:
            man = self.manifest()
            man["runs"][run_key] = {"status": status, "ids": sorted(ids), "at": time.time(), **(extra or {})}
            _atomic_json(self.manifest_path, man)

    def _append(self, path: Path, rows: list[dict[str, Any]], columns: dict[str, str], ids: set[str]) -> None:
        new = _typed(rows, columns)
        if path.exists():
            old = read_parquet(path)
            old = old[~old["run_id"].isin(ids)]
            for col in columns:  # a directory written before a column existed: NA there
                if col not in old.columns:
                    old[col] = None
            old = old[list(columns)]
            new = pd.concat([old.astype(columns), new], ignore_index=True) if len(old) else new
        _atomic_parquet(path, new)


#: Columns that hold a size or a count: finite and ≥ 0 where present (NA is "not known" and allowed).
NON_NEGATIVE = frozenset({
    "gpu_total_mib", "reserved_mib", "free_at_start_mib", "kv_bytes_per_token", "kv_tokens", "kv_pool_mib",
    "weights_mib", "margin_mib", "decode_max_bs", "deepep_tokens", "deepep_analytic_mib", "deepep_device_mib",
    "hidden_size", "num_experts", "request_pools_mib", "tp", "pp", "dp", "attn_dp", "ep", "bs", "capture_index",
})  # fmt: skip


def typed_table(path: Path, df: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """`df` cast to the documented dtypes column by column, every number finite and every size ≥ 0: a column
    of another type, an infinite or a negative size is one line naming the file, the column and the value."""
    df = df.copy()
    for col, dtype in columns.items():
        if col not in df.columns:
            continue
        try:
            df[col] = df[col].astype(dtype)
        except (ValueError, TypeError, OverflowError):
            raise FieldError(path, f"column {col}", _first_bad(df[col], dtype), f"{dtype} values") from None
        if dtype in ("float64", "Int64", "int64"):
            vals = pd.to_numeric(df[col], errors="coerce").astype("float64")
            bad = vals[vals.notna() & ~vals.abs().lt(float("inf"))]
            if len(bad):
                raise FieldError(path, f"column {col}", bad.iloc[0], "finite numbers (or NA: not known)")
            if col in NON_NEGATIVE and (vals < 0).any():
                raise FieldError(path, f"column {col}", vals[vals < 0].iloc[0], "numbers ≥ 0 (a size or a count)")
    if "mfs" in df.columns and ((df["mfs"] <= 0) | (df["mfs"] >= 1)).fillna(False).any():
        bad = df["mfs"][((df["mfs"] <= 0) | (df["mfs"] >= 1)).fillna(False)].iloc[0]
        raise FieldError(path, "column mfs", bad, "a fraction strictly between 0 and 1 (or NA)")
    return df


def _first_bad(col: pd.Series, dtype: str) -> Any:
    """The first value of a column that does not cast to `dtype` (for the message)."""
    for v in col:
        try:
            pd.Series([v]).astype(dtype)
        except (ValueError, TypeError, OverflowError):
            return v
    return col.iloc[0] if len(col) else None


def read_parquet(path: Path) -> pd.DataFrame:
    """A results table, or one line naming the file and what is wrong with it (truncated, not parquet, …)."""
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError; a truncated file an OSError too
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MemfracError(
            f"{path}: not a readable parquet table ({why}); restore it, or write the directory again "
            "(`memfrac sweep … --resume` or `memfrac ingest … --out DIR`)"
        ) from None


#: manifest.json run fields memfrac reads, and the type each must have.
_RUN_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "status": ((str,), "a string (ok | failed | error | not_started | skipped …)"),
    "ids": ((list,), "a list of measurement ids (strings)"),
    "pair": ((bool,), "true (the run is a PD pair)"),
    "at": ((int, float), "a time in seconds since the epoch"),
    "out_dir": ((str,), "a directory path (a string)"),
    "transfer": ((dict,), "an object (the pair's transfer backend)"),
}


def read_manifest(path: Path) -> dict[str, Any]:
    """manifest.json, checked field by field, or one line naming the file, the field and what is wrong with it."""
    if not path.exists():
        raise MemfracError(f"{path}: no such file")
    man = json_object(path, "a memfrac manifest.json (a JSON object with 'runs'); restore or remove it")
    v = man.get("schema_version", SCHEMA_VERSION)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise FieldError(path, "schema_version", v, f"an integer ≥ 1 (this memfrac writes {SCHEMA_VERSION})")
    runs = man.get("runs", {})
    if not isinstance(runs, dict):
        raise FieldError(path, "runs", runs, "an object: run key → what was recorded")
    for key, run in runs.items():
        if not isinstance(run, dict):
            raise FieldError(path, f"runs.{key}", run, "an object (status, ids, …)")
        for name, (types, allowed) in _RUN_FIELDS.items():
            x = run.get(name)
            if x is not None and ((isinstance(x, bool) and bool not in types) or not isinstance(x, types)):
                raise FieldError(path, f"runs.{key}.{name}", x, allowed)
        if "at" in run and run["at"] is not None:
            finite(path, f"runs.{key}.at", run["at"], "a finite time in seconds")
        if any(not isinstance(i, str) for i in run.get("ids") or []):
            raise FieldError(path, f"runs.{key}.ids", run["ids"], "a list of measurement ids (strings)")
    sweep = man.get("sweep")
    if sweep is not None and not isinstance(sweep, dict):
        raise FieldError(path, "sweep", sweep, "an object (the sweep's settings)")
    return man


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_.=+@" else "_" for ch in name)[:180]


def load_results(root: str | Path) -> pd.DataFrame:
    """results.parquet as a typed DataFrame (raises a clear error when it is missing or newer)."""
    p = Path(root) / "results.parquet"
    if not p.exists():
        raise MemfracError(
            f"{root}: no results.parquet (create one with `memfrac sweep` or `memfrac ingest ... --out DIR`)"
        )
    df = read_parquet(p)
    missing = [c for c in ("schema_version", "run_id", "term", "verdict") if c not in df.columns]
    if missing:
        raise MemfracError(f"{p}: not a memfrac results table (no {', '.join(missing)} column)")
    df = typed_table(p, df, RESULT_COLUMNS)
    if len(df) and df["schema_version"].max() > SCHEMA_VERSION:
        raise MemfracError(f"{p}: schema {int(df['schema_version'].max())} is newer than this memfrac; upgrade")
    return df


def _load_optional(root: str | Path, name: str, columns: dict[str, str]) -> pd.DataFrame:
    """A table that older results directories may lack: an empty typed frame then; columns added since are NA."""
    p = Path(root) / name
    if not p.exists():
        return _typed([], columns)
    df = read_parquet(p)
    for col in columns:
        if col not in df.columns:
            df[col] = None
    return typed_table(p, df[list(columns)], columns)


def load_ladder(root: str | Path) -> pd.DataFrame:
    """ladder.parquet in capture order (largest bs first) per run."""
    df = _load_optional(root, "ladder.parquet", LADDER_COLUMNS)
    if df["capture_index"].isna().all() and len(df):  # schema before capture_index: rows were ascending bs
        df = df.sort_values(["run_id", "bs"], ascending=[True, False], kind="stable")
        df["capture_index"] = df.groupby("run_id").cumcount().astype("Int64")
    return df.reset_index(drop=True)


def load_ledger(root: str | Path) -> pd.DataFrame:
    """ledger.parquet (empty for results written before the ledger existed)."""
    return _load_optional(root, "ledger.parquet", LEDGER_COLUMNS)


def load_measurements(root: str | Path) -> list[Measurement]:
    out = []
    for p in sorted((Path(root) / "measurements").glob("*.json")):
        try:
            out.append(Measurement.load(p))
        except (ValueError, TypeError, KeyError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
            why = f"{type(e).__name__}: {e}"
            raise MemfracError(f"{p}: not a readable measurement ({why}); restore or remove it") from None
    return out
