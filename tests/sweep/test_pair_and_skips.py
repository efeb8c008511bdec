"""PD pairs in the schema and the plan; runs predicted not to load skipped (and recorded) unless asked for;
runs for another GPU than the node's recorded in the manifest."""

from __future__ import annotations

import json

import pytest

from profiler.core.errors import ScenarioError
from profiler.model.scenario import BUNDLED_MODELS, load_scenarios, scenarios_from_doc
from profiler.sweep.plan import load_refusal, make_plan, render_plan
from profiler.sweep.sweep import run_sweep
from tests.conftest import ROOT


def _pair(**keys):
    doc = {"name": "pd", "model": "meta-llama--Llama-3.1-8B-Instruct", "gpu": "H200", "mode": "pd", **keys}
    return scenarios_from_doc(doc, "<t>", BUNDLED_MODELS)


def test_mode_pd_expands_into_one_scenario_per_role_with_overrides():
    pre, dec = _pair(tp=2, prefill={"chunked_prefill_size": 4096}, decode={"max_running_requests": 64})
    assert (pre.name, pre.mode, pre.pair) == ("pd-prefill", "prefill", "pd")
    assert (dec.name, dec.mode, dec.pair) == ("pd-decode", "decode", "pd")
    assert pre.chunked_prefill_size == 4096 and dec.chunked_prefill_size is None
    assert dec.max_running_requests == 64 and pre.max_running_requests is None
    assert pre.tp == dec.tp == 2 and pre.router == "rust" and pre.transfer_backend is None


def test_pair_keys_are_checked():
    with pytest.raises(ScenarioError, match="router"):
        _pair(router="nginx")
    with pytest.raises(ScenarioError, match="only with mode"):
        scenarios_from_doc({"name": "x", "model": "tiny-llama", "gpu": "H200", "mode": "decode",
                            "prefill": {"tp": 2}}, "<t>", BUNDLED_MODELS)  # fmt: skip
    with pytest.raises(ScenarioError, match=r"prefill\.mode"):
        _pair(prefill={"mode": "decode"})


def test_a_pair_is_one_run_on_gpus_for_both_roles():
    plan = make_plan(_pair(tp=2), list(range(8)))
    (run,) = plan.runs
    assert run.key == "pd" and run.peer is not None and run.peer.mode == "decode"
    assert run.gpus_needed == 4 and run.derived == () and plan.starts_saved == 0
    assert "pair: prefill + decode + router" in render_plan(plan)


def test_the_bundled_cpu_pair_scenario():
    pre, dec = load_scenarios(ROOT / "scenarios" / "cpu-pd-pair.toml")
    assert pre.pair == dec.pair == "cpu-pd-tiny-llama" and pre.transfer_backend == "mooncake_tcp"
    assert pre.chunked_prefill_size == 1024 and dec.chunked_prefill_size is None


def test_dsv3_on_h100_is_skipped_with_the_reason_unless_asked():
    ss = load_scenarios(ROOT / "scenarios" / "default.toml")
    plan = make_plan(ss, list(range(8)))
    dsv3 = {k for k in plan.skipped if k.startswith("dsv3-deepep-H100-80GB")}
    assert len(dsv3) == 3 and set(plan.skipped) == dsv3
    why = plan.skipped["dsv3-deepep-H100-80GB-decode"]
    assert "78.4 GiB/GPU" in why and "81559 MiB" in why and "--start-unloadable" in why
    text = render_plan(plan)
    assert text.count("SKIPPED") == 3 and "3 skipped: predicted not to load" in text
    forced = make_plan(ss, list(range(8)), start_unloadable=True)
    assert forced.skipped == {} and forced.unloadable == plan.unloadable
    assert "SKIPPED" not in render_plan(forced) and "started anyway (--start-unloadable)" in render_plan(forced)


def test_a_model_that_fits_is_not_refused():
    plan = make_plan(_pair(), [0, 1])
    assert plan.skipped == {}
    s = plan.scenarios[0]
    assert load_refusal(s, plan.reservations[s.name]) is None


def _only_dsv3_h100(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('name = "big"\nmodel = "deepseek-ai--DeepSeek-V3"\ngpu = "H100-80GB"\ntp = 8\nmode = "decode"\n')
    return p


def test_a_skipped_run_is_in_the_manifest_with_its_reason(tmp_path):
    lines: list[str] = []
    rc = run_sweep(str(_only_dsv3_h100(tmp_path)), out=str(tmp_path / "r"), device="cpu", validate=False,
                   say=lines.append, echo=lines.append)  # fmt: skip
    assert rc == 0
    runs = json.loads((tmp_path / "r" / "manifest.json").read_text())["runs"]
    assert runs["big"]["status"] == "skipped" and "predicted not to load" in runs["big"]["reason"]
    assert runs["big"]["scenarios"] == ["big"]
    assert any("big: skipped — predicted not to load" in x for x in lines)


def test_a_run_for_another_gpu_is_recorded_not_dropped(tmp_path, monkeypatch):
    import profiler.sweep.sweep as sw

    p = tmp_path / "s.toml"
    p.write_text('name = "h200"\nmodel = "tiny-llama"\ngpu = "H200"\nmode = "decode"\n')
    monkeypatch.setattr(sw, "node_gpu_mib", lambda: 81559.0)  # the node's nvidia-smi answer: an H100-80GB
    lines: list[str] = []
    rc = run_sweep(str(p), out=str(tmp_path / "r"), device="cuda", validate=False, gpus=[0],
                   say=lines.append, echo=lines.append)  # fmt: skip
    assert rc == 0
    runs = json.loads((tmp_path / "r" / "manifest.json").read_text())["runs"]
    assert runs["h200"]["status"] == "skipped" and "this node has H100-80GB (81559 MiB)" in runs["h200"]["reason"]


def test_the_report_lists_a_skipped_run_with_its_reason(tmp_path):
    from profiler.face.report import write_report

    run_sweep(str(_only_dsv3_h100(tmp_path)), out=str(tmp_path / "r"), device="cpu", validate=False,
              say=lambda _m: None, echo=lambda _m: None)  # fmt: skip
    write_report(tmp_path / "r")
    md = (tmp_path / "r" / "report.md").read_text()
    assert "Runs that measured nothing (1;" in md and "| big " in md and "predicted not to load" in md
