"""memfrac calibrate: every fitted constant below is worked out by hand in the comments.

Conventions (profiler/calibrate/fit.py): x is recovered from today's reserve (decode max_bs = reserved ÷ 2,
tokens = reserved ÷ 1.5, buckets = reserved ÷ 8); Q = 1 takes the largest per-run ratio; the margin
(256 MiB by default) is added only to absolute constants.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiler.analyse.compare import TermComparison
from profiler.calibrate.command import run_calibrate
from profiler.calibrate.fit import (
    Calibration,
    Obs,
    TermResult,
    calibrate,
    evaluate_term,
    fit_deepep,
)
from profiler.calibrate.render import render_text
from profiler.core.errors import MemfracError
from profiler.results.store import RunContext, load_results
from tests.fixtures.results.handmade import mark_defaulted, run_rows, store_run, write_frame


def term(cal: Calibration, key: str) -> TermResult:
    return next(t for t in cal.terms if t.key == key)


# ------------------------------------------------------------------------------------- decode graph


def decode_runs(tmp_path: Path, measured_bs: list[tuple[float, int]], **run: object) -> Path:
    rows = []
    for i, (measured, bs) in enumerate(measured_bs):
        # today's reserve is 2 MiB × bs; the verdict is what compare would say (measured above it: under)
        verdict = "under" if measured > 2 * bs else "fits"
        rows += run_rows(f"run{i}", {"decode_graph": (2.0 * bs, measured, verdict)}, **run)
    return write_frame(tmp_path / "res", rows)


def test_decode_constant_from_three_runs(tmp_path: Path) -> None:
    # 600/256 = 1200/512 = 1800/768 = 2.34375 MiB per bs: one constant, all three runs agree
    cal = calibrate([str(decode_runs(tmp_path, [(600, 256), (1200, 512), (1800, 768)]))])
    t = term(cal, "decode_graph")
    assert t.fit is not None and t.fit.form == "per_unit"
    assert t.fit.slope == pytest.approx(2.34375)
    assert t.formula == "2.344 MiB/bs"
    assert t.runs == 3
    # today: 600 > 512, 1200 > 1024, 1800 > 1536 → all three under-reserved; fitted: none
    assert t.under_today == ("run0", "run1", "run2")
    assert t.under_fitted == ()
    # LOO: fitting on any two gives 2.34375 again, which covers the third exactly
    assert (t.loo_tested, t.loo_under) == (3, ())
    assert "one constant (one model)" in t.form_note


def test_decode_quantile_and_leave_one_out(tmp_path: Path) -> None:
    # ratios 300/100 = 3, 1200/200 = 6, 2400/300 = 8 MiB/bs
    d = str(decode_runs(tmp_path, [(300, 100), (1200, 200), (2400, 300)]))
    t = term(calibrate([d]), "decode_graph")
    assert t.fit.slope == 8.0  # Q = 1: the max
    assert t.under_fitted == ()
    # LOO: without run2 the constant is 6 → 6 × 300 = 1800 < 2400 (under); without run0 or run1 it stays 8
    assert t.loo_under == ("run2",)
    # Q = 0.4: position 0.4 × 2 = 0.8 between 3 and 6; numpy 'higher' takes the observed 6 (linear would say
    # 5.4) → 6 MiB/bs; run2 needs 8 → under-reserved with it
    t5 = term(calibrate([d], quantile_q=0.4), "decode_graph")
    assert t5.fit.slope == 6.0
    assert t5.under_fitted == ("run2",)


#: A probe ladder as sglang captures it (tests/fakes/sim_worker.py DECODE_RUNGS): largest bs first, each rung
#: the pool growth of that capture; stored cumulative (ladder.parquet), in capture order.
SIM_RUNGS = [(256, 900.0), (128, 20.0), (64, 10.0), (32, 6.0), (16, 4.0), (8, 2.0), (4, 2.0), (2, 2.0), (1, 2.0)]


def capture_order_ladder(run_id: str) -> list[dict[str, object]]:
    out, cum = [], 0.0
    for k, (bs, grow) in enumerate(SIM_RUNGS):
        cum += grow
        out.append({"run_id": run_id, "scenario": run_id, "bs": bs, "capture_index": k, "used_mib": cum})
    return out


def test_ladder_slope_of_a_capture_order_ladder(tmp_path: Path) -> None:
    # cumulative in capture order: 900, 920, 930, 936, 940, 942, 944, 946, 948 at bs 256 … 1. A least-squares
    # line through (bs, cumulative) falls: −0.179 MiB/bs (issue 17 item 6). The first, largest capture sets the
    # pool: 900 MiB ÷ 256 = 3.515625 MiB/bs; the smaller captures add 948 − 900 = 48 MiB.
    # The run's decode term measured 700 MiB at max_bs 256 (2.734 MiB/bs): the ladder slope binds → 3.515625.
    rows = run_rows("lad", {"decode_graph": (512.0, 700.0, "under")})
    cal = calibrate([str(write_frame(tmp_path / "res", rows, capture_order_ladder("lad")))])
    (s,) = cal.ladders
    assert (s.run_id, s.points, s.max_bs, s.max_used_mib) == ("lad", 9, 256, 948.0)
    assert s.slope_mib_per_bs == pytest.approx(3.515625) and (s.top_mib, s.rest_mib) == (900.0, 48.0)
    t = term(cal, "decode_graph")
    ratio = next(c for c in t.candidates if c.shape == "ratio")
    assert ratio.fit.slope == pytest.approx(3.515625)
    assert "ladder slope" in t.form_note or any("ladder" in n for n in ratio.notes)


def test_decode_per_hidden_size_with_two_shapes(tmp_path: Path) -> None:
    # hidden 2048: 1024 MiB at bs 256 → 4 MiB/bs → 4 / 2048 = 0.001953125 MiB per bs per unit of hidden
    # hidden 4096: 4096 MiB at bs 256 → 16 MiB/bs → 16 / 4096 = 0.00390625 (the max)
    rows = run_rows("small", {"decode_graph": (512.0, 1024.0, "under")}, model="a/small", hidden_size=2048)
    rows += run_rows("large", {"decode_graph": (512.0, 4096.0, "under")}, model="b/large", hidden_size=4096)
    t = term(calibrate([str(write_frame(tmp_path / "res", rows))]), "decode_graph")
    assert t.fit.form == "per_hidden"
    assert t.fit.slope == pytest.approx(0.00390625)
    # small predicted: 0.00390625 × 256 × 2048 = 2048 ≥ 1024; large: 0.00390625 × 256 × 4096 = 4096 = measured
    assert [round(t.fit.predict(o)) for o in t.observations] == [2048, 4096]
    assert t.under_fitted == ()
    assert [(g.group, g.value) for g in t.groups] == [("hidden 2048", 4.0), ("hidden 4096", 16.0)]
    assert t.formula.startswith("4 MiB/bs per 1024 of hidden size")  # 0.00390625 × 1024 = 4


def test_decode_one_constant_when_hidden_unknown(tmp_path: Path) -> None:
    # two models, no hidden sizes: one constant (the max of 4 and 16), per-model constants listed beside it
    rows = run_rows("small", {"decode_graph": (512.0, 1024.0, "under")}, model="a/small")
    rows += run_rows("large", {"decode_graph": (512.0, 4096.0, "under")}, model="b/large")
    t = term(calibrate([str(write_frame(tmp_path / "res", rows))]), "decode_graph")
    assert (t.fit.form, t.fit.slope) == ("per_unit", 16.0)
    assert "2 models, hidden size not known for every run" in t.form_note
    assert {g.group: g.value for g in t.groups} == {"small": 4.0, "large": 16.0}


def test_leave_one_out_leaves_the_whole_start_out(tmp_path: Path) -> None:
    # a and b were measured by one worker start (group g1), both 8 MiB/bs; c by another start, 3 MiB/bs.
    # Leaving out only a would keep its twin b (8) and hide the miss; leaving out g1 fits on c alone:
    # 3 × 100 = 300 < 800 → a and b both under. Leaving out g2 fits 8 → c covered.
    rows = run_rows("a", {"decode_graph": (200.0, 800.0, "under")}, group="g1")
    rows += run_rows("b", {"decode_graph": (200.0, 800.0, "under")}, group="g1")
    rows += run_rows("c", {"decode_graph": (200.0, 300.0, "under")}, group="g2")
    t = term(calibrate([str(write_frame(tmp_path / "res", rows))]), "decode_graph")
    assert (t.loo_tested, t.loo_under) == (3, ("a", "b"))


def test_derived_scenarios_are_not_evidence(tmp_path: Path) -> None:
    # "launch" measured 600 MiB at bs 256 (2.34375 MiB/bs); "launch>small" was not started: its decode graph
    # is an estimate from launch's ladder (compare.derive_variant) and must not move the constant
    rows = run_rows("launch", {"decode_graph": (512.0, 600.0, "under")}, group="g")
    rows += run_rows("launch>small", {"decode_graph": (16.0, 300.0, "under")}, group="g", derived_from="launch")
    cal = calibrate([str(write_frame(tmp_path / "res", rows))])
    t = term(cal, "decode_graph")
    assert [o.run_id for o in t.observations] == ["launch"]
    assert t.fit.slope == pytest.approx(2.34375)  # not 300 / 8 = 37.5
    assert any("1 derived scenario(s)" in n for n in cal.notes)


# --------------------------------------------------------------------- read inputs only, LOMO, groups


def test_only_read_inputs_are_evidence(tmp_path: Path) -> None:
    # run "read": 600 MiB at bs 256 → 2.34375 MiB/bs. "dflt": its bs came from defaults, "na": unknown.
    # Both would have set the constant to 1200 ÷ 64 = 18.75 if they counted; neither does.
    rows = run_rows("read", {"decode_graph": (512.0, 600.0, "under"), "constant": (512.0, 700.0, "under")})
    rows += run_rows("dflt", {"decode_graph": (128.0, 1200.0, "under"), "constant": (512.0, 800.0, "under")},
                     defaulted_inputs="decode_max_bs,chunked_prefill_size")  # fmt: skip
    rows += run_rows("na", {"decode_graph": (128.0, 1200.0, "under"), "constant": (512.0, 900.0, "under")},
                     defaulted_inputs=None)  # fmt: skip
    rows += run_rows("other", {"decode_graph": (128.0, 100.0, "fits")}, defaulted_inputs="chunked_prefill_size")
    cal = calibrate([str(write_frame(tmp_path / "res", rows))])
    dg = term(cal, "decode_graph")
    # "other" defaulted only chunked_prefill_size, which the decode graph's x does not rest on: 100 ÷ 64 < 2.34
    assert [o.run_id for o in dg.observations] == ["read", "other"]
    assert dg.fit.slope == pytest.approx(2.34375)
    assert {e.run_id: e.why for e in dg.excluded} == {
        "dflt": "x rests on decode_max_bs, taken from defaults rather than read",
        "na": "unknown whether decode_max_bs, decode_bs, decode_backend, … were read (defaulted_inputs is NA)",
    }
    # the constant's x is 1 whatever the inputs: every run is evidence → 900 + 256 margin
    c = term(cal, "constant")
    assert (c.runs, c.excluded, c.fit.constant) == (3, (), 1156.0)


def test_leave_one_model_out_and_residuals(tmp_path: Path) -> None:
    # model A: two starts, 4 and 5 MiB/bs at bs 100 (400, 500 MiB); model B: one start, 8 MiB/bs (800 MiB).
    # pooled Q=1 fit: 8 MiB/bs → predictions 800, 800, 800 → residuals +400, +300, 0
    rows = run_rows("a1", {"decode_graph": (200.0, 400.0, "under")}, model="x/A", group="s1")
    rows += run_rows("a2", {"decode_graph": (200.0, 500.0, "under")}, model="x/A", group="s2")
    rows += run_rows("b1", {"decode_graph": (200.0, 800.0, "under")}, model="x/B", group="s3")
    t = term(calibrate([str(write_frame(tmp_path / "res", rows))]), "decode_graph")
    assert t.residuals == (400.0, 300.0, 0.0)
    # LOMO: A held out → fit on B = 8 → a1 +400, a2 +300; B held out → fit on A = 5 → 500 − 800 = −300 (under)
    assert (t.lomo.sets, t.lomo.tested, t.lomo.under) == (2, 3, ("b1",))
    assert dict(t.lomo.residuals) == {"a1": 400.0, "a2": 300.0, "b1": -300.0}
    # LOO (by start): s1 out → 8 → +400; s2 out → 8 → +300; s3 out → 5 → −300
    assert (t.loo.sets, t.loo.under, dict(t.loo.residuals)) == (3, ("b1",), {"a1": 400.0, "a2": 300.0, "b1": -300.0})
    text = render_text(calibrate([str(tmp_path / "res")]))
    assert "+0.0 … +400.0" in text  # the residual range in the summary table
    assert "runs from 1 results dir(s), sized by sglang 0.5.23 rules;" in text  # one rule set: named alone


def test_groups_need_the_minimum_count(tmp_path: Path) -> None:
    # Llama: 3 runs at 2, 3, 4 MiB/bs (bs 100) → 4; Qwen3: 3 runs at 6, 6, 7 → 7; DeepseekV3: 1 run (too few)
    rows = []
    for i, m in enumerate((200.0, 300.0, 400.0)):
        rows += run_rows(f"l{i}", {"decode_graph": (200.0, m, "under")}, architecture="LlamaForCausalLM",
                         model="org/llama")  # fmt: skip
    for i, m in enumerate((600.0, 600.0, 700.0)):
        rows += run_rows(f"q{i}", {"decode_graph": (200.0, m, "under")}, architecture="Qwen3ForCausalLM",
                         model="org/qwen3")  # fmt: skip
    rows += run_rows("d0", {"decode_graph": (200.0, 900.0, "under")}, architecture="DeepseekV3ForCausalLM",
                     model="org/dsv3")  # fmt: skip
    c = calibrate([str(write_frame(tmp_path / "res", rows))])
    t = term(c, "decode_graph")
    fam = [(g.group, g.runs, g.value) for g in t.groups if g.dimension == "model family"]
    assert fam == [("Llama", 3, 4.0), ("Qwen3", 3, 7.0)]
    assert t.fit.slope == 9.0  # pooled: every run, DeepseekV3 included
    # one a2a backend only (all null): no a2a grouping
    assert not [g for g in t.groups if g.dimension == "a2a backend"]
    # printed: the groups under the minimum's title, the one-run model only in the spread's table
    text = render_text(c)
    grouped = text.split("fitted per group (≥ 3 runs a group)", 1)[1].split("\n\n", 1)[0]
    assert "Llama" in grouped and "Deepseek" not in grouped
    spread = text.split("the spread of the runs' ratios (any number of runs)", 1)[1].split("\n\n", 1)[0]
    cells = [[c.strip() for c in ln.split("|")[2:5]] for ln in spread.splitlines() if "| model" in ln]
    # each model's largest ratio, the one-run model too: 900/100, 400/100, 700/100
    assert cells == [["dsv3", "1", "9"], ["llama", "3", "4"], ["qwen3", "3", "7"]]
    # the parts of the pre-0.5.3 formulas are not "unobservable": memory_hook.py has no constant for them
    assert "  band_base: a part of the pre-0.5.3 fraction formulas" in text


# ------------------------------------------------------------------------------ the other terms


def test_activation_per_token(tmp_path: Path) -> None:
    # run a: reserved 12288 → 8192 tokens, measured 4096 → 0.5 MiB/token
    # run b: reserved 3072 → 2048 tokens, measured 2048 → 1.0 MiB/token
    # One model, two worker starts: the shape is chosen leave-one-start-out.
    #   ratio: a by b's 1.0 → 8192 (+4096); b by a's 0.5 → 1024 (−1024, under): 1 under, mean |err| 2560
    #   fixed + per token: one point left, so all of it is fixed: a by 2048 (−2048, under), b by 4096 (+2048):
    #   1 under, mean |err| 2048 → chosen. On both: the line through (2048, 2048) and (8192, 4096):
    #   slope 2048 / 6144 = 1/3 MiB/token, fixed 2048 − 2048/3 = 1365.33 MiB; it covers both exactly.
    rows = run_rows("a", {"activation": (12288.0, 4096.0, "over")})
    rows += run_rows("b", {"activation": (3072.0, 2048.0, "fits")})
    t = term(calibrate([str(write_frame(tmp_path / "res", rows))]), "activation")
    ratio, affine = t.candidates
    assert (ratio.shape, ratio.fit.slope, ratio.under, ratio.mean_abs_mib) == ("ratio", 1.0, 1, 2560.0)
    assert (affine.shape, affine.under, affine.mean_abs_mib, affine.chosen) == ("fixed + per unit", 1, 2048.0, True)
    assert t.fit.form == "affine"
    assert (t.fit.slope, t.fit.constant) == (pytest.approx(1 / 3), pytest.approx(4096 / 3))
    assert t.formula == "1365 MiB + 0.3333 MiB/token"
    assert t.under_today == () and t.residuals == (pytest.approx(0.0, abs=1e-9), pytest.approx(0.0, abs=1e-9))
    assert (t.loo_tested, t.loo_under) == (2, ("a",))
    assert "fixed + per unit: 1 held-out run(s) under-reserved, mean held-out error 2,048.0 MiB" in t.shape_why
    assert t.thin == "rests on one model (model)"


def test_prefill_buckets_and_mla_flat(tmp_path: Path) -> None:
    # non-MLA: reserved 600 → 75 buckets, measured 900 → 12 MiB/bucket
    # MLA (DeepseekV3ForCausalLM): flat, measured 1000 → 1000 + 256 margin = 1256 MiB
    rows = run_rows("dense", {"prefill_graph": (600.0, 900.0, "under")}, architecture="LlamaForCausalLM")
    rows += run_rows("mla", {"prefill_graph": (1536.0, 1000.0, "over")}, architecture="DeepseekV3ForCausalLM")
    cal = calibrate([str(write_frame(tmp_path / "res", rows))])
    dense, mla = term(cal, "prefill_graph"), term(cal, "prefill_graph_mla")
    assert (dense.fit.slope, dense.runs, dense.under_today) == (12.0, 1, ("dense",))
    assert (mla.fit.form, mla.fit.constant, mla.runs) == ("flat", 1256.0, 1)
    assert mla.term == "prefill_graph"
    assert "one worker start: leave-one-out needs at least two" in dense.notes


def test_margin_only_on_absolute_constants(tmp_path: Path) -> None:
    # constant: measured 700 and 900 → 900 + margin; parallel: reserved 1024 (tp·pp 8), measured 400 → 50 MiB
    rows = run_rows("a", {"constant": (512.0, 700.0, "under"), "parallel": (1024.0, 400.0, "over")})
    rows += run_rows("b", {"constant": (512.0, 900.0, "under")})
    cal = calibrate([str(write_frame(tmp_path / "res", rows))], margin_mib=100.0)
    assert term(cal, "constant").fit.constant == 1000.0
    assert term(cal, "parallel").fit.slope == 50.0  # no margin on a slope


def test_deepep_affine_fit(tmp_path: Path) -> None:
    # analytic 1000/2000/3000, measured 1500/2600/3700: exactly 1.1 × analytic + 400 → least squares gives
    # slope 1.1 (overhead +10%), residuals all 400 → constant 400 + 256 margin = 656
    rows = []
    for i, (an, me) in enumerate(((1000, 1500), (2000, 2600), (3000, 3700))):
        rows += run_rows(f"ep{i}", {"deepep_a2a": (2048.0, float(me), "fits")}, deepep_analytic_mib=float(an))
    cal = calibrate([str(write_frame(tmp_path / "res", rows))], models_dir=Path("scenarios/models"))
    t = term(cal, "deepep_a2a")
    assert t.fit.form == "deepep"
    assert t.fit.slope == pytest.approx(1.1) and t.fit.constant == pytest.approx(656.0)
    assert "overhead +10.0%" in t.formula
    # today: 2600 > 2048 and 3700 > 2048 are under; fitted: none
    assert t.under_today == ("ep1", "ep2") and t.under_fitted == ()
    # the fitted reserve of a bundled model: DeepSeek-V3 at T=128 → its device total × 1.1 + 656 (the store's
    # deepep_analytic_mib is that total: NVL + metadata + workspace + RDMA in 512 MiB NVSHMEM granules)
    v3 = next(e for e in cal.deepep_examples if e.model == "deepseek-ai/DeepSeek-V3" and e.tokens == 128)
    assert v3.fitted_mib == pytest.approx(v3.heap_rounded_mib * 1.1 + 656.0)


def test_deepep_ratio_form_with_two_runs() -> None:
    # two runs: overhead = max(1500/1000, 2600/2000) − 1 = 0.5, constant = the margin
    obs = [Obs("a", "m", "decode", 1000.0, 1500.0, 2048.0), Obs("b", "m", "decode", 2000.0, 2600.0, 2048.0)]
    f = fit_deepep(obs, 1.0, 256.0)
    assert (f.form, f.slope, f.constant) == ("deepep", 1.5, 256.0)
    assert f.predict(obs[1]) == 1.5 * 2000 + 256  # 3256 ≥ 2600


def test_floor_from_totals(tmp_path: Path) -> None:
    # run f1: floor on, no serving load seen → need = used 9000 + activation reserve 3072 (unseen) = 12072,
    #         scaled by gpu ÷ free_at_start = 140000 ÷ 140000 = 1
    # run f2: floor on, activation measured → need = used 2000 × (143360 ÷ 71680 = 2) = 4000
    # fitted floor = max(12072, 4000) + 256 = 12328 MiB
    common = {"floor_topup": (5000.0, None, "unobservable")}
    rows = run_rows("f1", common | {"activation": (3072.0, None, "unobservable")}, gpu_total_mib=140000.0,
                    free_at_start_mib=140000.0, used_after_kv_mib=9000.0)  # fmt: skip
    rows += run_rows("f2", common | {"activation": (3072.0, 1000.0, "fits")}, gpu_total_mib=143360.0,
                     free_at_start_mib=71680.0, used_after_kv_mib=2000.0)  # fmt: skip
    # run f3: its terms were above the floor (top-up off): it does not say what the floor should be
    rows += run_rows("f3", {"floor_topup": (0.0, None, "off")}, gpu_total_mib=143360.0, free_at_start_mib=140000.0,
                     used_after_kv_mib=50000.0)  # fmt: skip
    t = term(calibrate([str(write_frame(tmp_path / "res", rows))]), "floor_topup")
    assert sorted((o.run_id, o.measured) for o in t.observations) == [("f1", 12072.0), ("f2", 4000.0)]
    assert t.fit.constant == 12328.0
    # today the pre-floor reserve of both is the 10240 floor: f1 needed 12072 → under today
    assert t.under_today == ("f1",) and t.under_fitted == ()


# -------------------------------------------------------------------------------------- KV recovered


def test_kv_recovered_per_node_type(tmp_path: Path) -> None:
    # decode run: decode graph 320 reserved (bs 160), 480 measured → 3 MiB/bs → new 480: Δ = −160 MiB,
    #   GPU size unknown → unscaled; 131072 B/token → −160 × 2^20 / 131072 = −1280 tokens
    # prefill run: prefill graph 800 reserved (100 buckets), 400 measured → 4 MiB/bucket → new 400: Δ = +400
    #   on a 50000 MiB GPU (no floor) with 40000 free at start → 400 × 0.8 = +320 MiB; 65536 B/token → +5120
    # null runs: the user gave mfs → the constants do not move its pool: counted apart
    rows = run_rows("dec", {"decode_graph": (320.0, 480.0, "under")}, mode="decode", kv_bytes_per_token=131072.0)
    pre = {"mode": "prefill", "gpu_total_mib": 50000.0, "free_at_start_mib": 40000.0, "kv_bytes_per_token": 65536.0}
    rows += run_rows("pre", {"prefill_graph": (800.0, 400.0, "fits")}, architecture="LlamaForCausalLM", **pre)
    rows += run_rows("given", {"decode_graph": (320.0, 100.0, "fits")}, mode="null", mfs_origin="given")
    # origin unknown, but on a known GPU the heuristic would say 0.9, and 0.6 ran: not the heuristic's either
    rows += run_rows("odd", {"decode_graph": (320.0, 100.0, "fits")}, mode="null", mfs_origin="unknown", mfs=0.6,
                     heuristic_fraction=0.9, gpu_total_mib=50000.0)  # fmt: skip
    cal = calibrate([str(write_frame(tmp_path / "res", rows))])
    kv = {k.mode: k for k in cal.kv}
    assert (kv["decode"].runs, kv["decode"].mib, kv["decode"].tokens) == (1, pytest.approx(-160.0), -1280)
    assert (kv["prefill"].runs, kv["prefill"].mib, kv["prefill"].tokens) == (1, pytest.approx(320.0), 5120)
    assert (kv["null"].runs, kv["null"].runs_given_mfs) == (0, 2)
    assert [k.mode for k in cal.kv] == ["prefill", "decode", "null"]


def test_kv_recovered_respects_the_floor(tmp_path: Path) -> None:
    # H200-sized GPU, terms 512 + 320 (decode) < 10240: the floor sizes the run today and with the fitted
    # decode constant (3 × 160 = 480 → 992 < 10240): nothing recovered, nothing given up
    terms = {"constant": (512.0, None, "unobservable"), "decode_graph": (320.0, 480.0, "under"),
             "floor_topup": (9408.0, None, "unobservable")}  # fmt: skip
    rows = run_rows("h200", terms, gpu_total_mib=143771.0, free_at_start_mib=140000.0, kv_bytes_per_token=65536.0)
    kv = calibrate([str(write_frame(tmp_path / "res", rows))]).kv
    assert [(k.mode, k.runs, k.mib) for k in kv] == [("null", 1, 0.0)]


# ------------------------------------------------------------------------- real logs, degenerate input


def test_ingested_logs_fit_only_from_inputs_they_printed(ingested: Path) -> None:
    """ingest records which heuristic inputs each log left to defaults (profiler/core/provenance.py): a run is decode-
    graph evidence only if it printed its decode max_bs / bs list (a capture line listing the batch sizes counts:
    sglang-pr8258.log prints no cuda_graph_max_bs, but its capture line lists bs up to 512) and its graph ran."""
    from profiler.calibrate.fit import X_INPUTS

    df = load_results(ingested)
    assert "defaulted_inputs" in df.columns
    total = df[df["term"] == "total"].set_index("run_id")["defaulted_inputs"]
    cal = calibrate([str(ingested)])
    t = term(cal, "decode_graph")
    excluded = {e.run_id for e in t.excluded}
    # sglang-pr8258.log prints no cuda_graph_max_bs but its capture line lists bs up to 512: read, so evidence
    assert "sglang-pr8258.log#0" not in excluded
    for e in t.excluded:  # every exclusion names an input of the term, or says the provenance is unknown
        d = total.get(e.run_id)
        assert pd.isna(d) or set(str(d).split(",")) & set(X_INPUTS["decode_graph"]), e
    dg = df[(df["term"] == "decode_graph") & df["term_verdict"].isin(["under", "fits", "over"])]
    kept = set(dg["run_id"]) - excluded
    for run in kept:
        assert not (set(str(total[run]).split(",")) & set(X_INPUTS["decode_graph"]))
    assert t.runs == len(kept)


def test_ingested_logs_a_defaulted_bs_list_is_not_evidence(ingested: Path, tmp_path: Path) -> None:
    """sglang-pr8258.log prints no cuda_graph_max_bs, but its capture line lists bs up to 512: the log's own list
    beats the default (160), so its decode graph is judged at 512 × 2 = 1,024 MiB reserved and 7,536.64 MiB
    measured → 7,536.64 ÷ 512 = 14.72 MiB/bs (the old 47.1 was 7,536.6 ÷ 160, an artefact of the default).
    Marked defaulted by hand, it leaves the fit with its reason; the fit is the largest remaining ratio."""
    res = tmp_path / "ing"
    shutil.copytree(ingested, res)
    df = load_results(res)
    dg = df[(df["term"] == "decode_graph") & df["term_verdict"].isin(["under", "fits", "over"])]
    ratios = (dg["measured_mib"] / (dg["reserved_mib"] / 2)).round(6)
    assert ratios[dg["run_id"] == "sglang-pr8258.log#0"].iloc[0] == pytest.approx(7536.64 / 512, abs=0.01)  # 14.72
    mark_defaulted(res, {"sglang-pr8258.log#0": "decode_max_bs,chunked_prefill_size"})
    cal = calibrate([str(res)])
    t = term(cal, "decode_graph")
    assert ("sglang-pr8258.log#0", "x rests on decode_max_bs, taken from defaults rather than read") in [
        (e.run_id, e.why) for e in t.excluded
    ]
    kept = ratios[~dg["run_id"].isin({e.run_id for e in t.excluded})].sort_values(ascending=False)
    assert t.runs == len(kept)
    assert t.fit.slope == pytest.approx(kept.iloc[0], rel=1e-6)
    if len(kept) > 1:  # leave-one-out: the run holding the max is under-reserved without it iff it beats the next
        top = dg.loc[kept.index[0], "run_id"]
        assert (top in t.loo_under) == (kept.iloc[0] > kept.iloc[1])
    text = render_text(cal)
    assert "decode_graph: memory_hook.reserve_for_graph_mb: decode max_bs * 2" in text
    assert "sglang-pr8258.log#0: x rests on decode_max_bs, taken from defaults rather than read" in text


def test_json_is_the_same_object(ingested: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = tmp_path / "ing"
    shutil.copytree(ingested, res)
    mark_defaulted(res, {})
    assert run_calibrate([str(res)], json_out=True) == 0
    obj = json.loads(capsys.readouterr().out)
    cal = calibrate([str(res)])
    dg = next(t for t in obj["terms"] if t["key"] == "decode_graph")
    assert dg["fit"]["slope"] == pytest.approx(term(cal, "decode_graph").fit.slope)
    assert dg["runs"] == term(cal, "decode_graph").runs
    assert {u["term"] for u in obj["unobservable"]} >= {"activation", "dp_padding", "xpu"}
    assert [k["mode"] for k in obj["kv"]] == [k.mode for k in cal.kv]


def test_directories_combine_and_dedupe(tmp_path: Path) -> None:
    # run0 in one dir (2 MiB/bs), run1 in another (4 MiB/bs): combined → 4; the same dir twice counts once
    a = write_frame(tmp_path / "a", run_rows("run0", {"decode_graph": (200.0, 200.0, "fits")}))
    b = write_frame(tmp_path / "b", run_rows("run1", {"decode_graph": (200.0, 400.0, "under")}))
    t = term(calibrate([str(a), str(b)]), "decode_graph")
    assert (t.runs, t.fit.slope) == (2, 4.0)
    twice = calibrate([str(a), str(a)])
    assert term(twice, "decode_graph").runs == 1
    assert any("counted once" in n for n in twice.notes)


def test_store_written_runs(tmp_path: Path) -> None:
    # through Store.add: decode 1500 MiB measured at max_bs 512 (reserved 1024) → 2.9296875 MiB/bs
    dg = TermComparison("decode_graph", 1024.0, 1500.0, "under", "decode capture Δ")
    store_run(tmp_path / "s", "r1", [dg], ctx=RunContext(group="r1", decode_max_bs=512, hidden_size=7168))
    # a probe run reads its inputs from its own scenario: the store says "" (profiler/core/provenance.py)
    assert set(load_results(tmp_path / "s")["defaulted_inputs"]) == {""}
    t = term(calibrate([str(tmp_path / "s")]), "decode_graph")
    assert t.fit.slope == pytest.approx(1500 / 512)
    assert t.observations[0].hidden == 7168


def test_no_runs_at_all(tmp_path: Path) -> None:
    cal = calibrate([str(write_frame(tmp_path / "empty", []))])
    assert cal.runs == 0 and all(t.fit is None for t in cal.terms) and cal.kv == ()
    assert "no constant can be fitted" in render_text(cal)


def test_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(MemfracError, match="no such results directory"):
        calibrate([str(tmp_path / "missing")])
    (tmp_path / "bare").mkdir()
    with pytest.raises(MemfracError, match=r"no results\.parquet"):
        calibrate([str(tmp_path / "bare")])
    d = str(write_frame(tmp_path / "ok", []))
    with pytest.raises(MemfracError, match="--quantile"):
        calibrate([d], quantile_q=1.5)
    with pytest.raises(MemfracError, match="--margin"):
        calibrate([d], margin_mib=-1.0)
    with pytest.raises(MemfracError, match="at least one"):
        calibrate([])


# --------------------------------------------------------------------- the Q = 1 guarantee, any data

_pos = st.floats(min_value=1.0, max_value=1e5, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_pos, st.floats(0.0, 1e5, allow_nan=False)), min_size=1, max_size=12))
def test_max_never_under_reserves_what_it_was_fitted_on(pairs: list[tuple[float, float]]) -> None:
    """Q = 1: zero under-reserved runs on the fit data, for every form (slope, flat, DeepEP affine)."""
    obs = [Obs(f"r{i}", "m", "null", x, y, 0.0) for i, (x, y) in enumerate(pairs)]
    for key in ("decode_graph", "constant", "deepep_a2a"):
        assert evaluate_term(key, obs, 1.0, 0.0).under_fitted == (), key


def test_the_header_names_the_range_of_rule_sets(tmp_path: Path, ingested: Path) -> None:
    """Issue 23: ingested logs spanning many releases read "sized by sglang 0.5.9 rules" (the most common one)."""
    import re

    import pandas as pd

    from profiler.model.heuristic import RULE_SETS

    c = calibrate([str(ingested)])
    m = re.search(r"sized by sglang (\S+) … (\S+) rules \((\d+) rule sets\);", render_text(c).splitlines()[0])
    assert m, render_text(c).splitlines()[0]
    evidence = {o.run_id for t in c.terms for o in t.observations}
    df = pd.read_parquet(ingested / "results.parquet")
    names = {n for sets in df[df["run_id"].isin(evidence)]["rule_sets"] for n in sets}
    order = [n for n in RULE_SETS if n in names]
    assert (m[1], m[2], int(m[3])) == (order[0], order[-1], len(order)) and len(order) > 1
