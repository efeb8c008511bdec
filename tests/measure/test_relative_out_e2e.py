"""A relative output directory records the probe (issue 23.1), with the REAL sglang 0.5.23 CPU worker.

The worker starts in its run directory; before every path it was handed was made absolute, a relative `--out`
left PYTHONPATH and MEMFRAC_PROBE_DIR pointing nowhere, the probe never loaded and the run still said ok. Both
ways in are checked: `memfrac run` with a relative --out, and `make run`'s CPU smoke run (face/fallback.py), whose
recorded probe `memfrac judge` then re-judges. The smoke scenario's load is cut to a few requests (what is
checked is where the probe wrote, not the load).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from profiler.face import fallback
from profiler.face.cli import main
from tests.conftest import ROOT, needs_sglang

pytestmark = [pytest.mark.e2e, needs_sglang]


def _smoke(tmp_path):
    """scenarios/cpu-smoke-decode.toml with a short load."""
    text = (ROOT / "scenarios" / "cpu-smoke-decode.toml").read_text()
    text = text.replace("run = { startup_timeout_s = 300, load_timeout_s = 120 }",
                        "run = { startup_timeout_s = 600, load_timeout_s = 300, load_requests = 4 }")  # fmt: skip
    assert "load_requests = 4" in text
    f = tmp_path / "cpu-smoke-decode.toml"
    f.write_text(text)
    return f


def _probe_ranks(m: dict) -> list[dict]:
    return [r for r in m["ranks"] if any(p["source"] == "probe" for p in r["phases"])]


def test_memfrac_run_with_a_relative_out_records_the_probe(tmp_path):
    f = _smoke(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "profiler.face.cli", "run", str(f), "--out", "results/runs/rel", "--no-validate"]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    run = tmp_path / "results/runs/rel"
    assert out.returncode == 0, out.stderr[-3000:]
    starts = [json.loads(f.read_text().splitlines()[0]) for f in (run / "probe").glob("probe-*.jsonl")]
    assert len(starts) == 1 and starts[0]["type"] == "start"
    m = json.loads((run / "measurement.json").read_text())
    (rank,) = m["ranks"]
    names = [p["name"] for p in rank["phases"]]
    assert {"baseline", "weights", "kv_pool", "ready"} <= set(names) and len(names) > 4  # beyond `ready`
    assert rank["pid"] == starts[0]["pid"]
    cmd_env = json.loads((run / "command.json").read_text())["env"]
    assert cmd_env["MEMFRAC_PROBE_DIR"] == str(run / "probe")
    assert all(os.path.isabs(e) for e in cmd_env["PYTHONPATH"].split(os.pathsep))


def test_the_fallback_smoke_run_records_its_probe_and_judge_rejudges_it(tmp_path, monkeypatch, capsys):
    """`make run` without CUDA (relative `results/default`); then `--resume` re-runs nothing (issue 23.2)."""
    f = _smoke(tmp_path)
    monkeypatch.setattr(fallback, "CPU_SMOKE", f)
    monkeypatch.setattr(fallback, "cuda_machine", lambda: False)
    monkeypatch.chdir(tmp_path)
    lines: list[str] = []
    kw = {"out": "results/default", "say": lines.append, "echo": lines.append}
    rc = fallback.sweep_command(str(ROOT / "scenarios/cpu-smoke.toml"), validate=False, **kw)
    assert rc == 0, "\n".join(lines)[-3000:]
    assert any(x.startswith("cpu-smoke-decode: starting… ") or "ready after" in x for x in lines), \
        "the smoke run shows the worker's progress as `memfrac run` does"  # fmt: skip
    raw = tmp_path / "results/default/raw/cpu-smoke-decode"
    assert list((raw / "probe").glob("probe-*.jsonl"))
    m = json.loads((raw / "measurement.json").read_text())
    assert len(_probe_ranks(m)) == 1 and m["failure"] is None
    before = pd.read_parquet(tmp_path / "results/default/results.parquet")

    capsys.readouterr()
    rc = main(["judge", "results/default/raw/cpu-smoke-decode/probe", "--scenario", str(f)])
    text = capsys.readouterr().out
    assert rc in (0, 1) and "weights" in text, text[-2000:]  # re-judged from the recorded probe

    lines.clear()
    rc = fallback.sweep_command(str(ROOT / "scenarios/cpu-smoke.toml"), validate=False, resume=True, **kw)
    assert rc == 0 and any("resume: 1 smoke run(s) already recorded" in x for x in lines), "\n".join(lines)
    assert any("bundled real logs are already ingested" in x for x in lines)
    after = pd.read_parquet(tmp_path / "results/default/results.parquet")
    assert len(after) == len(before) and after["run_id"].nunique() == before["run_id"].nunique()
