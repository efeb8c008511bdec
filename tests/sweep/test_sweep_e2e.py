"""Sweeps with REAL CPU sglang workers: the CPU fallback of the main job, and the Ray executor on a real
local Ray cluster that advertises fake GPU resources (the same CPU worker path as the other e2e tests)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from profiler.face.fallback import sweep_command
from profiler.sweep.sweep import run_sweep
from tests.conftest import ROOT, needs_sglang

pytestmark = [pytest.mark.e2e, needs_sglang]


def test_main_job_fallback_without_cuda(tmp_path, monkeypatch):
    """What `make run` does on a machine without a GPU: one line saying so, the plan with the heuristic per term,
    one real CPU worker, the bundled logs, the report."""
    monkeypatch.setattr("profiler.face.fallback.cuda_machine", lambda: False)
    out: list[str] = []
    rc = sweep_command(str(ROOT / "scenarios/default.toml"), out=str(tmp_path / "r"), say=out.append, echo=out.append)
    text = "\n".join(out)
    assert rc == 0, text[-3000:]
    assert out[0].startswith("no CUDA device here: measuring nothing on a GPU")
    assert "18 scenarios → 9 worker starts" in text and "3 skipped: predicted not to load" in text
    assert "floor_topup" in text
    man = json.loads((tmp_path / "r" / "manifest.json").read_text())["runs"]
    skipped = {k: v for k, v in man.items() if v["status"] == "skipped"}
    assert len(skipped) == 3 and all("not" in v["reason"] and "load" in v["reason"] for v in skipped.values())
    df = pd.read_parquet(tmp_path / "r" / "results.parquet")
    smoke = df[df["scenario"] == "cpu-smoke-decode"]
    assert len(smoke) and set(smoke["memory_kind"]) == {"host"} and set(smoke["source"]) == {"probe"}
    assert (df["source"] == "log").sum() > 0  # the bundled real logs, as evidence
    assert (tmp_path / "r" / "report.md").exists() and (tmp_path / "r" / "environment.json").exists()
    raw = tmp_path / "r" / "raw" / "cpu-smoke-decode"
    assert (raw / "sglang.log").exists() and list((raw / "probe").glob("probe-*.jsonl"))


def test_ray_executor_on_a_local_cluster_with_fake_gpus(tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'memfrac[ray]'")
    f = tmp_path / "s.toml"
    f.write_text(
        '[[scenario]]\nname = "ray-tiny"\nmodel = "tiny-llama"\ngpu = "H100"\n'
        'run = { startup_timeout_s = 400, load_timeout_s = 120 }\n[scenario.matrix]\nmode = ["null", "decode"]\n'
    )
    ray.init(num_gpus=2, num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert ray.cluster_resources()["GPU"] == 2
        out: list[str] = []
        rc = run_sweep(str(f), executor="ray", device="cpu", out=str(tmp_path / "r"), say=out.append, echo=out.append)
    finally:
        ray.shutdown()
    assert rc == 0, "\n".join(out)[-3000:]
    man = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert {k: v["status"] for k, v in man["runs"].items()} == {"ray-tiny-null": "ok", "ray-tiny-decode": "ok"}
    for key in ("ray-tiny-null", "ray-tiny-decode"):
        raw = tmp_path / "r" / "raw" / key
        where = json.loads((raw / "ray.json").read_text())
        assert where["cuda_visible_devices"] in ("0", "1")  # Ray handed each task one (fake) GPU
        assert (raw / "measurement.json").exists() and (raw / "sglang.log").stat().st_size > 0
    df = pd.read_parquet(tmp_path / "r" / "results.parquet")
    assert set(df["scenario"]) == {"ray-tiny-null", "ray-tiny-decode"}
