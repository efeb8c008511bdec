"""A damaged results directory is one line naming the file and what is wrong with it (exit 2), never a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from profiler.face.cli import main


@pytest.fixture
def results(tmp_path: Path, ingested: Path) -> Path:
    d = tmp_path / "r"
    shutil.copytree(ingested, d)
    return d


def _one_line_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_truncated_results_parquet(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = results / "results.parquet"
    p.write_bytes(p.read_bytes()[:1000])
    err = _one_line_error(capsys, "report", str(results))
    assert "results.parquet: not a readable parquet table" in err


def test_manifest_that_is_not_json(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (results / "manifest.json").write_text('{"runs": {"a": ')
    err = _one_line_error(capsys, "report", str(results))
    assert "manifest.json: not JSON" in err and "line 1" in err


def test_manifest_that_is_not_an_object(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (results / "manifest.json").write_text("[1, 2]")
    assert "manifest.json: (top level): bad value [1, 2]; allowed: a memfrac manifest.json (a JSON object" in \
        _one_line_error(capsys, "gate", str(results))


def test_a_parquet_that_is_not_results(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(results / "ladder.parquet", results / "results.parquet")
    assert "not a memfrac results table" in _one_line_error(capsys, "report", str(results))


def test_truncated_ledger(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (results / "ledger.parquet").write_bytes(b"PAR1 not really")
    assert "ledger.parquet: not a readable parquet table" in _one_line_error(capsys, "report", str(results))
