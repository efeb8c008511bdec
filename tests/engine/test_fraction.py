"""The fraction every output shows is the one the worker runs with (issue 26.6): sglang's own resolved value where
its resolver ran, the model's beside it (profiler.engine.fraction.scenario_fraction).

The case: Llama-3.1-8B, pp 2, on an H100-80GB (81559 MiB), post-capture KV sizing on
(SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1), the breakable prefill graph asked for (pp > 1 disables it by default),
and `--enable-dynamic-chunking` in extra_args. The model does not read that flag: post-capture sizing planned,
reserve 1536 + tp·pp/8 × 1024 = 1536 + 256 = 1792 → (81559 − 1792)/81559 = 0.97803 → 0.978. sglang plans on
`max_prefill_buffer_tokens` = max(chunk 8192, max_prefill_tokens 16384, ⌈8192 × 1.25⌉ = 10240) = 16384 > the prefill
graph's largest bucket 8192 (`post_capture_kv_sizing_planned`, overrides.py), so it sizes classically:
  null:    512 + 8192 × 1.5 = 12288 + 256 + decode graph 256 × 2 = 512 + prefill graph 58 buckets × 8 = 464
           = 14032 → (81559 − 14032)/81559 = 0.82795 → 0.828
  prefill: the same without the decode graph = 13520 → (81559 − 13520)/81559 = 0.83423 → 0.834
(the issue quotes 0.833 for this family of cases; sglang 0.5.23 gives these two). With the prefill graph's
max_bs at 16384 the buffer is covered, sglang post-capture-sizes too, and both say 0.978.
"""

from __future__ import annotations

import json

import pytest

from profiler.analyse.compare import compare, reservation_for
from profiler.engine.fraction import scenario_fraction
from profiler.engine.oracle import OracleResult
from profiler.engine.validation import Validation, validate
from profiler.logs import parse_log
from profiler.model.heuristic import inputs_from_scenario, reserve, rules_for
from profiler.model.scenario import load_scenarios, single_scenario
from tests.conftest import needs_sglang

LLAMA = "meta-llama--Llama-3.1-8B-Instruct"
DYN = {"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "1"}


def _dyn(name: str = "dyn", mode: str = "null", max_bs: int | None = None, **kw):
    pg = {"backend": "breakable"} | ({"max_bs": max_bs} if max_bs else {})
    return single_scenario(LLAMA, "H100-80GB", name=name, mode=mode, pp=2, prefill_graph=pg, env=DYN,
                           extra_args=["--enable-dynamic-chunking"], **kw)  # fmt: skip


def _res(s):
    return reserve(inputs_from_scenario(s), rules_for("0.5.23"))


def _validated(s, mfs: float | None) -> Validation:
    return Validation("0.5.23", "installed", {s.name: OracleResult("0.5.23", s.gpu.total_mib, (), mfs)})


# --- the record, on hand-made resolver outcomes (no sglang needed) -------------------------------------------


def test_sglang_resolved_value_wins_and_the_model_stands_beside_it():
    s = _dyn()
    f = scenario_fraction(s, _res(s), _validated(s, 0.828))
    assert (f.value, f.model, f.sglang, f.release, f.differs) == (0.828, 0.978, 0.828, "0.5.23", True)
    assert f.source == "sglang 0.5.23 resolver" and f.from_sglang
    assert f.note == ("sglang 0.5.23 resolves 0.828, the model 0.978: extra flags --enable-dynamic-chunking change "
                      "it and the model does not interpret them")  # fmt: skip
    assert f.as_dict() == {"mem_fraction_static": 0.828, "mem_fraction_static_source": "sglang 0.5.23 resolver",
                           "mem_fraction_static_model": 0.978, "mem_fraction_static_differs": True,
                           "mem_fraction_static_note": f.note}  # fmt: skip
    assert f.label() == "0.828 (sglang 0.5.23 resolver; the model says 0.978)"


def test_agreement_given_and_unvalidated():
    s = _dyn()
    same = scenario_fraction(s, _res(s), _validated(s, 0.978))
    assert (same.value, same.differs, same.note) == (0.978, False, "")
    given = single_scenario(LLAMA, "H100-80GB", mem_fraction_static=0.7)
    g = scenario_fraction(given, _res(given), _validated(given, 0.7))
    assert (g.value, g.source, g.sglang) == (0.7, "given", None)
    off = scenario_fraction(s, _res(s), Validation(None, "", reason="--no-validate"))
    assert (off.value, off.source, off.from_sglang) == (0.978, "model (sglang 0.5.23 rules)", False)
    assert off.note == ("extra flags --enable-dynamic-chunking are not modelled and sglang's resolver did not run "
                        "(--no-validate): the fraction may differ")  # fmt: skip
    plain = single_scenario(LLAMA, "H100-80GB")
    assert scenario_fraction(plain, _res(plain)).note == ""  # no extra flags: nothing to warn about
    # a modelling gap without extra flags is named as one
    gap = scenario_fraction(plain, _res(plain), _validated(plain, 0.5))
    assert gap.value == 0.5 and "a modelling gap" in gap.note


def test_results_judge_with_sglangs_fraction_when_the_worker_does_not_say():
    """STARTUP (tests/logs/test_logs_build.py): free at start is 'Load weight begin. avail mem=23.10 GB' = 23.10 ×
    1024 = 23,654.4 MiB; with sglang's resolver's 0.5 the slack is 23,654.4 × (1 − 0.5) = 11,827.2 MiB."""
    from tests.logs.test_logs_build import STARTUP

    (m,) = parse_log(STARTUP, name="s.log")
    res = reservation_for(m)[0]
    c = compare(m, res, resolved_mfs=0.5)
    assert c.mfs == 0.5 and c.mfs_source == "sglang's resolver on the scenario"
    assert c.slack_mib == pytest.approx(11827.2) and c.mfs_reconstructed == res.mem_fraction_static
    assert "judged with sglang's 0.500" in c.mfs_finding
    plain = compare(m, res)
    assert plain.mfs == res.mem_fraction_static and plain.mfs_source.startswith("the model") and not plain.mfs_finding


# --- the real resolver -------------------------------------------------------------------------------------


@needs_sglang
def test_dynamic_chunking_at_pp2_real_resolver():
    ss = [_dyn("null"), _dyn("prefill", mode="prefill"), _dyn("covered", max_bs=16384)]
    v = validate(ss, use_cache=False)
    assert v.validated and not v.refused, v.summary()
    got = {s.name: scenario_fraction(s, _res(s), v) for s in ss}
    assert {n: (f.value, f.model, f.differs) for n, f in got.items()} == {
        "null": (0.828, 0.978, True), "prefill": (0.834, 0.978, True), "covered": (0.978, 0.978, False)}  # fmt: skip
    assert "--enable-dynamic-chunking" in got["null"].note


@needs_sglang
def test_explain_and_dry_run_show_sglangs_fraction(tmp_path, capsys):
    from profiler.face.cli import main
    from profiler.sweep.plan import make_plan, render_plan

    f = tmp_path / "dyn.toml"
    f.write_text(
        '[[scenario]]\nname = "dyn"\nmodel = "meta-llama--Llama-3.1-8B-Instruct"\ngpu = "H100-80GB"\npp = 2\n'
        'prefill_graph = { backend = "breakable" }\nenv = { SGLANG_ENABLE_POST_CAPTURE_KV_SIZING = "1" }\n'
        'extra_args = ["--enable-dynamic-chunking"]\n'
    )
    assert main(["explain", str(f), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["mem_fraction_static"], d["mem_fraction_static_model"], d["mem_fraction_static_differs"]) == (
        0.828, 0.978, True)  # fmt: skip
    assert d["mem_fraction_static_source"] == "sglang 0.5.23 resolver" and d["heuristic_fraction"] == 0.978
    # the KV budget is the worker's: 81559 × 0.828 − weights, not 81559 × 0.978 − weights
    assert d["kv"]["kv_budget_mib"] == pytest.approx(81559 * 0.828 - d["kv"]["weights_mib_estimate"], abs=0.2)
    assert main(["explain", str(f)]) == 0
    text = capsys.readouterr().out
    assert "mem_fraction_static = 0.828 (sglang 0.5.23's own resolver; the model says 0.978)" in text
    assert "× 0.828" in text
    (s,) = load_scenarios(str(f))
    plan = make_plan([s], [0, 1], validate=True)
    assert plan.fraction("dyn").value == 0.828
    out = render_plan(plan, per_term=False)
    row = [x for x in out.splitlines() if x.startswith("| dyn")][-1]  # the reservation table's, after the starts'

    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:5] == ["dyn", "null", "0.828", "sglang 0.5.23 resolver", "0.978 ≠"]
    assert "! dyn: sglang 0.5.23 resolves 0.828, the model 0.978" in out
