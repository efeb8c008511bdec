"""`memfrac ingest` outputs: one results schema whether --out names a directory or a .parquet file (issue 16.4),
and every reading a log prints as a field of the JSON rows (issue 19), each pinned to the hand-read figure
(GiB as printed × 1024 = MiB)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from profiler.ingest.core import run_ingest
from tests.conftest import LOG_FIXTURES

SOME = ["sglang-8538.log", "repo_unknown_dsv41-flash-dspark_3xspark.log", "gpustack-4761.log", "sglang-7691.log"]


def test_a_parquet_file_and_a_results_directory_have_one_schema(tmp_path: Path) -> None:
    logs = [str(LOG_FIXTURES / n) for n in SOME]
    assert run_ingest(logs, out=str(tmp_path / "R"), echo=lambda s: None) == 0
    assert run_ingest(logs, out=str(tmp_path / "x.parquet"), echo=lambda s: None) == 0
    d = pd.read_parquet(tmp_path / "R" / "results.parquet")
    f = pd.read_parquet(tmp_path / "x.parquet")
    assert list(d.columns) == list(f.columns) and dict(d.dtypes) == dict(f.dtypes)
    keep = [c for c in d.columns if c != "recorded_at"]  # the time each was written
    pd.testing.assert_frame_equal(d[keep].reset_index(drop=True), f[keep].reset_index(drop=True))
    # --format parquet with a file is the same table
    assert run_ingest(logs, fmt="parquet", out=str(tmp_path / "y.parquet"), echo=lambda s: None) == 0
    assert list(pd.read_parquet(tmp_path / "y.parquet").columns) == list(d.columns)


def _rows(name: str, per_rank: bool = False) -> list[dict]:
    out: list[str] = []
    assert run_ingest([str(LOG_FIXTURES / name)], fmt="json", per_rank=per_rank, echo=out.append) == 0
    return json.loads(out[0])


def _mib(gib: float) -> float:
    return gib * 1024


def test_speculative_draft_readings() -> None:
    """repo_unknown_dsv41-flash-dspark_3xspark.log: load begin 111.47 GB; draft load mem usage 2.80 GB; target
    verify capture begins at 8.20 GB; draft verify capture mem usage -0.01 GB (kept negative, as printed);
    ready line available_gpu_mem=7.68 GB."""
    (r,) = _rows("repo_unknown_dsv41-flash-dspark_3xspark.log")
    assert r["load_begin_free_mib"] == pytest.approx(_mib(111.47))
    assert r["weights_end_free_mib"] == pytest.approx(_mib(17.47))
    assert r["draft_weights_mib"] == pytest.approx(_mib(2.80))
    assert r["capture_begin_free_mib"] == pytest.approx(_mib(8.20))
    assert r["draft_graph_mib"] == pytest.approx(_mib(-0.01))
    assert r["ready_available_mib"] == pytest.approx(_mib(7.68))
    assert r["mfs"] is None and r["mfs_origin"] == "unknown"  # the draft's pool shares the budget
    assert r["rule_sets"] and r["rules"].startswith(r["rule_sets"][0])


def test_draft_kv_pool_per_rank() -> None:
    """club-3090-1261.log: each rank's second pool (the draft's) is K 1.08 + V 1.08 GB."""
    rows = _rows("club-3090-1261.log", per_rank=True)
    assert [r["rank"] for r in rows] == ["TP0", "TP1"]
    assert all(r["draft_kv_mib"] == pytest.approx(_mib(2.16)) for r in rows)


def test_ladder_low_point_per_rank() -> None:
    """sglang-pr11716.log: TP0's capture begins at 11.82 GB, its lowest tqdm reading is 10.21 GB; TP7's begins at
    12.01 GB; TP0's init used 1.96 GB and TP7's 1.77 GB (per-rank readings differ: each rank keeps its own)."""
    rows = {r["rank"]: r for r in _rows("sglang-pr11716.log", per_rank=True)}
    assert rows["TP0"]["capture_begin_free_mib"] == pytest.approx(_mib(11.82))
    assert rows["TP0"]["capture_min_free_mib"] == pytest.approx(_mib(10.21))
    assert rows["TP7"]["capture_begin_free_mib"] == pytest.approx(_mib(12.01))
    assert rows["TP0"]["init_mib"] == pytest.approx(_mib(1.96)) and rows["TP7"]["init_mib"] == pytest.approx(_mib(1.77))
    assert rows["TP7"]["load_begin_free_mib"] == pytest.approx(_mib(137.52))


def test_oom_numbers() -> None:
    """gpustack-4761.log (torch_npu, old format): 36.49 GiB reserved in total by PyTorch. mineru-3418.log: in use
    22.31 GiB − 21.51 GiB allocated − 303.36 MiB reserved but unallocated = 515.84 MiB outside PyTorch."""
    (npu,) = _rows("gpustack-4761.log")
    assert npu["oom_reserved_by_torch_mib"] == pytest.approx(_mib(36.49))
    assert npu["oom_tried_mib"] == pytest.approx(_mib(48.55)) and npu["failure_phase"] == "kv_pool"
    (cuda,) = _rows("mineru-3418.log")
    assert cuda["oom_in_use_mib"] == pytest.approx(_mib(22.31))
    assert cuda["oom_reserved_unallocated_mib"] == pytest.approx(303.36)
    assert cuda["oom_outside_torch_mib"] == pytest.approx(515.84)


def test_profiled_kv_tokens() -> None:
    """sglang-7691.log: 'max_total_tokens=131072 is larger than the profiled value -561981'."""
    (r,) = _rows("sglang-7691.log")
    assert r["profiled_kv_tokens"] == -561981 and r["state"] == "no_kv" and r["verdict"] == "oom_startup"
