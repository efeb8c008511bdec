"""profiler.ingest rows: every output names the rules and why, carries the failure's numbers, the serving
evidence, and the notes that qualify a figure; the table goes through profiler.core.ui."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from profiler.ingest.core import run_ingest
from profiler.ingest.judge import judge
from profiler.ingest.output import COLUMNS, render, rows_for
from profiler.logs import parse_log
from tests.conftest import LOG_FIXTURES


def _rows(name: str, per_rank: bool = False):  # type: ignore[no-untyped-def]
    out = []
    for m in parse_log(LOG_FIXTURES / name):
        c, judged = judge(m)
        out += rows_for(m, c, per_rank, judged)
    return out


def test_columns_name_rules_release_fraction_state() -> None:
    for col in (
        "release",
        "release_how",
        "rules",
        "rules_why",
        "mfs",
        "mfs_origin",
        "mfs_how",
        "state",
        "state_seen",
        "reserved_min_mib",
        "reserved_max_mib",
        "need_mib",
        "need_basis",
        "qualifiers",
        "figures_from",
    ):
        assert col in COLUMNS  # fmt: skip


def test_oom_row_carries_the_failure_numbers() -> None:
    # repo_unknown_glm52-fp8_8xH200_hisparse_a1.log: "Tried to allocate 1.50 GiB. GPU 6 has a total capacity of
    # 139.80 GiB of which 488.19 MiB is free. … 134.73 GiB is allocated by PyTorch, and 297.40 MiB is reserved …"
    (r,) = _rows("repo_unknown_glm52-fp8_8xH200_hisparse_a1.log")
    assert r.verdict == "oom_during_capture" and r.failure_phase == "decode_graph"
    assert r.oom_tried_mib == pytest.approx(1.5 * 1024) and r.oom_free_mib == pytest.approx(488.19)
    assert r.oom_capacity_mib == pytest.approx(139.80 * 1024) and r.oom_torch_allocated_mib == pytest.approx(
        134.73 * 1024
    )
    assert "GPU total is torch's" in r.qualifiers


def test_kv_tokens_from_the_ready_line_when_the_pool_line_lacks_them() -> None:
    # repo_sglang-docs_send-request_llama31-8b_1gpu.log: "KV Cache is allocated. K size: 27.13 GB, V size: 27.13 GB."
    # (0.4.1 prints no #tokens) and "max_total_num_tokens=444500, …"
    (r,) = _rows("repo_sglang-docs_send-request_llama31-8b_1gpu.log")
    assert (r.kv_tokens, r.kv_tokens_from) == (444500, "ready line") and "kv tokens from the ready line" in r.qualifiers


def test_figures_from_other_ranks_are_attributed() -> None:
    # sglang-14700.log: the rank closest to OOM (DP2 TP2) prints no KV line; DP5 TP5's is used and named
    (r,) = _rows("sglang-14700.log")
    assert r.rank == "DP2 TP2" and r.kv_mib == pytest.approx(162.38 * 1024)
    assert "kv from DP5 TP5" in r.figures_from
    per_rank = _rows("sglang-14700.log", per_rank=True)
    assert {x.rank for x in per_rank} >= {"DP0 TP0", "DP2 TP2"} and all(x.figures_from == "" for x in per_rank)


def test_json_and_csv_carry_every_column() -> None:
    rows = _rows("repo_unknown_grok1_8xH100.log")
    (j,) = json.loads(render(rows, "json"))
    assert set(j) == set(COLUMNS) and j["state"] == "finished" and j["rules_why"]
    (c,) = list(csv.DictReader(io.StringIO(render(rows, "csv"))))
    assert c["release"] == j["release"] and c["mfs_origin"] == "implied"


def test_table_is_a_ui_table_with_its_caption() -> None:
    text = render(_rows("sglang-8538.log"), "table")  # off a terminal: a Markdown pipe table
    assert text.startswith("memfrac ingest\n| run ") and "| rules " in text and "| state " in text
    assert text.rstrip().splitlines()[-1].startswith("sizes in GiB (sglang's 'GB'); release: stated, or the range")


def test_results_directory_names_the_rules(tmp_path: Path) -> None:
    import pandas as pd

    out = tmp_path / "R"
    run_ingest([str(LOG_FIXTURES / "repo_unknown_grok1_8xH100.log")], out=str(out), echo=lambda s: None)
    df = pd.read_parquet(out / "results.parquet")
    total = df[df["term"] == "total"].iloc[0]
    assert total["rules_why"] and total["sglang_how"].startswith("log formats: 0.4.8.post1")
    assert total["decode_max_bs"] == 160  # the captured bs list, not a default


def test_unused_kv_of_a_startup_log_leaves_the_activation_reserve() -> None:
    """sglang-21395.log (wasteful): 21,596.16 MiB free at the end of startup, of which the 6,144 MiB activation
    reserve (0.5.9 rules) is still owed at runtime and 1,024 MiB is the margin → 14,428.16 MiB unused;
    at its pool's 147,639.5008 B/token that is floor(14,428.16 × 2^20 / 147,639.5008) = 102,472 tokens;
    recommended floor((1 − (583.68 + 6,144 + 1,024) / 45,230.08) × 1000)/1000 = floor(828.6) = 0.828."""
    (m,) = parse_log(LOG_FIXTURES / "sglang-21395.log")
    c, _ = judge(m)
    assert c.verdict == "wasteful"
    assert round(c.kv_unused_mib, 2) == 14428.16 and c.wasted_kv_tokens == 102472 and c.recommended_mfs == 0.828


def test_no_unused_kv_for_an_aborted_capture() -> None:
    """constructed_pip-install_aborted-capture.log: 44,503.04 MiB free when the capture aborted at its first
    batch size. Not a finished startup: no unused KV, no recommended fraction (it once said 648,787 tokens and
    0.969 — advice to give the KV pool memory a working capture needs)."""
    (m,) = parse_log(LOG_FIXTURES / "constructed_pip-install_aborted-capture.log")
    c, _ = judge(m)
    assert c.verdict == "failed" and c.headroom_mib == 44503.04
    assert (c.kv_unused_mib, c.wasted_kv_tokens, c.recommended_mfs) == (None, None, None)
