"""Sweeps with a worker double (supervision only): failure isolation, hung runs, budget, resume, summary."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd

from profiler.sweep.sweep import parse_budget, run_sweep
from tests.conftest import FAKE_WORKER

FAKE = str(FAKE_WORKER)


def _file(tmp_path: Path, behaviours: list[str], startup: float = 20, startup_s: float = 0) -> Path:
    parts = []
    for b in behaviours:
        parts.append(
            f'[[scenario]]\nname = "{b}"\nmodel = "tiny-llama"\ngpu = "H100"\nmode = "decode"\n'
            f'env = {{ FAKE_BEHAVIOUR = "{b}", FAKE_STARTUP_S = "{startup_s}" }}\n'
            f"run = {{ startup_timeout_s = {startup}, load_timeout_s = 10, stop_grace_s = 2 }}\n"
        )
    p = tmp_path / "s.toml"
    p.write_text("\n".join(parts))
    return p


def _sweep(p: Path, out: Path, **kw) -> tuple[int, list[str]]:
    lines: list[str] = []
    rc = run_sweep(str(p), out=str(out), device="cpu", python=FAKE, say=lines.append, echo=lines.append, **kw)
    return rc, lines


def test_one_failing_and_one_hung_run_do_not_stop_the_others(tmp_path):
    p = _file(tmp_path, ["ok", "crash-startup", "hang"], startup=6)
    t0 = time.monotonic()
    rc, lines = _sweep(p, tmp_path / "r", parallel=3)
    assert time.monotonic() - t0 < 90
    assert rc == 1  # some failed
    df = pd.read_parquet(tmp_path / "r" / "results.parquet")
    verdicts = df.groupby("scenario")["verdict"].first().to_dict()
    assert verdicts["crash-startup"] == "failed" and verdicts["hang"] == "failed"
    assert verdicts["ok"] not in ("failed",)
    reasons = df.groupby("scenario")["reason"].first().to_dict()
    assert reasons["hang"].startswith("timeout") and reasons["crash-startup"].startswith("crash")
    man = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert man["runs"]["ok"]["status"] == "ok" and man["runs"]["hang"]["status"] == "failed"
    summary = "\n".join(lines)
    # one line per finished run, and the bar's plain status (profiler.core.ui) ending on 3/3
    assert sorted(x.split(":")[0].split()[1] for x in lines if x.startswith("[")) == ["crash-startup", "hang", "ok"]
    assert any(x.startswith("[3/3] ") for x in lines)
    assert any(x.startswith("sweep: 3/3 (100%)") for x in lines)
    assert "hang" in summary and "timeout" in summary  # the summary table
    assert "| scenario " in summary and "| status " in summary  # off a terminal: a Markdown table


def test_budget_interrupts_then_resume_finishes(tmp_path):
    p = _file(tmp_path, ["ok", "crash-startup"], startup_s=3)
    # a budget that lets the first run start and nothing after it (the first takes 3 s to get ready)
    _, lines = _sweep(p, tmp_path / "r", budget="1s")
    done = json.loads((tmp_path / "r" / "manifest.json").read_text())["runs"]
    assert {k: v["status"] for k, v in done.items()} == {"ok": "ok", "crash-startup": "not_started"}
    assert "budget" in done["crash-startup"]["reason"] and any("not started" in x for x in lines)
    _, lines = _sweep(p, tmp_path / "r", resume=True)
    assert any("resume: 1 run(s) already recorded" in x for x in lines)
    done = json.loads((tmp_path / "r" / "manifest.json").read_text())["runs"]
    assert set(done) == {"ok", "crash-startup"}
    df = pd.read_parquet(tmp_path / "r" / "results.parquet")
    assert set(df["scenario"]) == {"ok", "crash-startup"}  # appended, the first run kept


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path):
    p = _file(tmp_path, ["ok"])
    rc, lines = _sweep(p, tmp_path / "r", dry_run=True)
    assert rc == 0 and "1 scenarios → 1 worker starts" in lines[0] and not (tmp_path / "r").exists()


def test_budget_parsing():
    assert parse_budget("2h") == 7200 and parse_budget("1h30m") == 5400 and parse_budget("45s") == 45
    import pytest

    from profiler.core.errors import MemfracError

    with pytest.raises(MemfracError, match="like 2h"):
        parse_budget("soon")
