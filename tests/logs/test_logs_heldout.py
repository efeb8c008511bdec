"""The held-out logs (tests/fixtures/logs-heldout: real logs nobody tuned the parser to) and the scorer.

The held-out score may only go up: it is held against the latest score recorded in results/logs/heldout-*.json
(the newest by its `recorded` time). When logs are added, record a new score with
`python scripts/score_logs.py tests/fixtures/logs-heldout --json results/logs/heldout-<label>.json`.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import LOG_FIXTURES, ROOT
from tests.logs.scoring import CLASSES, index_classes, render, score_folder

HELDOUT = LOG_FIXTURES.parent / "logs-heldout"
RECORDS = ROOT / "results" / "logs"


@pytest.fixture(scope="module")
def heldout_score() -> dict:
    return score_folder(HELDOUT)


def _latest_record() -> dict:
    records = [json.loads(p.read_text()) for p in sorted(RECORDS.glob("heldout-*.json"))]
    assert records, f"no recorded held-out score in {RECORDS} (heldout-*.json)"
    return max(records, key=lambda r: r["recorded"])


def test_heldout_score_not_below_the_record(heldout_score: dict) -> None:
    rec = _latest_record()
    assert heldout_score["logs"] >= rec["logs"], "held-out logs were removed"
    assert heldout_score["values_pct"] >= rec["values_pct"], render(heldout_score)
    assert heldout_score["logs_fully_right"] >= rec["logs_fully_right"], render(heldout_score)


def test_per_class_report_lists_every_class(heldout_score: dict) -> None:
    assert list(heldout_score["per_class"]) == list(CLASSES)
    text = render(heldout_score)
    for c in CLASSES:
        assert f"    {c} " in text, c
    covered = {c for s in heldout_score["per_log"] for c in s["classes"]}
    assert {"2024-format", "amd", "pd-decode", "deepep", "speculative", "multi-node", "line-prefix"} <= covered


def test_heldout_set_is_complete() -> None:
    """Every log has its expectation and an INDEX row with known classes; no source repeats a tuned fixture's."""
    classes = index_classes(HELDOUT)
    assert classes is not None
    logs = {p.name for p in HELDOUT.glob("*.log")}
    expected = {json.loads(p.read_text())["file"] for p in (HELDOUT / "expected").glob("*.json")}
    assert logs == expected == set(classes), (logs ^ expected, logs ^ set(classes))
    assert len(logs) >= 25
    sources = [_source(line) for line in (HELDOUT / "INDEX.tsv").read_text().splitlines()[1:]]
    tuned = {_source(line) for line in (LOG_FIXTURES / "INDEX.tsv").read_text().splitlines()[1:]}
    assert len(set(sources)) == len(sources)
    assert not set(sources) & tuned


def _source(index_row: str) -> str:
    """An INDEX row's source: its URL, or the archive file id it names."""
    url = index_row.split("\t")[1]
    return url.split(" ")[0] if url.startswith("https://") else url


def _folder(tmp_path: Path, runs: list[dict]) -> Path:
    (tmp_path / "expected").mkdir(parents=True)
    shutil.copy(LOG_FIXTURES / "sglang-2931.log", tmp_path)
    (tmp_path / "expected" / "x.json").write_text(json.dumps({"file": "sglang-2931.log", "runs": runs}))
    return tmp_path


def test_each_value_counts_once_and_a_missing_run_costs_its_values(tmp_path: Path) -> None:
    """sglang-2931.log: one run, Phi3ForCausalLM, TP0/TP1, TP1's pool ends at 13.43 GB free, weights at 15.70."""
    run = {
        "architecture": "Phi3ForCausalLM",
        "tp": 4,  # wrong on purpose: the log is TP2
        "ranks": {"TP1": {"kv_pool": {"after_free_gib": 13.43}, "weights": {"after_free_gib": 15.70}}},
        "notes": "not a value",
    }
    s = score_folder(_folder(tmp_path, [run, {"architecture": "Phi3ForCausalLM"}]))
    # values: run 0 has 4 (3 found), run 1 has 1 (no parsed run left: 0 found), + the run count (2 != 1: missed)
    assert (s["values_found"], s["values_expected"], s["values_pct"]) == (3, 6, 50.0)
    assert (s["readings_found"], s["readings_expected"]) == (2, 2)
    assert s["logs_fully_right"] == 0
    assert s["per_log"][0]["misses"][:2] == ["runs: 1 parsed, 2 expected", "run 0: tp: got 2, expected 4"]


def test_expected_runs_pair_with_the_parsed_run_they_match_best(tmp_path: Path) -> None:
    """A phantom expected run before the real one does not shift every value onto the wrong run."""
    runs = [{"architecture": "NotInTheLog"}, {"architecture": "Phi3ForCausalLM", "tp": 2}]
    s = score_folder(_folder(tmp_path, runs))
    # the parsed run pairs with expected run 1 (2 values found); run 0 (1 value) and the run count miss
    assert (s["values_found"], s["values_expected"]) == (2, 4)


def test_unknown_class_in_index_is_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path, [{"architecture": "Phi3ForCausalLM"}])
    (folder / "INDEX.tsv").write_text("file\turl\tclasses\nsglang-2931.log\tx\tamd,gpu-from-mars\n")
    with pytest.raises(ValueError, match="gpu-from-mars"):
        score_folder(folder)


def _score_logs_script():
    spec = importlib.util.spec_from_file_location("score_logs", ROOT / "scripts" / "score_logs.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_score_logs_writes_json_and_refuses_a_folder_without_expectations(tmp_path: Path, capsys) -> None:
    main = _score_logs_script().main
    folder = _folder(tmp_path / "set", [{"architecture": "Phi3ForCausalLM"}])
    assert main([str(folder), "--json", str(tmp_path / "out.json")]) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert (out["values_found"], out["values_expected"], out["logs_fully_right"]) == (2, 2, 1)
    assert out["recorded"] and "per_class" in out
    capsys.readouterr()
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(tmp_path) in err and "expected/" in err
