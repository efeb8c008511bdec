"""memfrac audit: rows equal the scalar model and the analytic sizes, its acceptance and fractions equal the
real resolver on a sample, findings and the calibrated reserve are pinned by hand, the command writes its files."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from profiler.calibrate.audit import GRAPHS, evaluate_space, findings, make_space, read_calibration, run_audit
from profiler.core.errors import MemfracError
from profiler.model import a2a
from profiler.model.gpus import gpu_by_name
from profiler.model.heuristic import HeuristicInputs, reserve, rules_for
from profiler.model.modelcfg import load_model_shape
from profiler.model.scenario import BUNDLED_MODELS, single_scenario
from tests.conftest import needs_sglang

RULES = rules_for("0.5.23")
MIB = 2**20


@pytest.fixture(scope="module")
def rows():
    # every bundled model and backend; a GPU per capacity band (the floor, the <60 GiB bands, SM89 vs SM90/100)
    return evaluate_space(make_space(gpus=["RTX-4090", "L40S", "H100-80GB", "H200", "B200"]), RULES)


def _graph(label):
    return next(g for g in GRAPHS if g[0] == label)


def test_rows_equal_the_scalar_model_and_the_analytic_sizes_on_a_random_sample(rows):
    rng = np.random.default_rng(12)
    sample = rows.iloc[rng.choice(len(rows), size=3000, replace=False)]
    for r in sample.itertuples(index=False):
        path = str(BUNDLED_MODELS / str(r.model))
        sh = load_model_shape(path)
        _, dec, pre, off = _graph(str(r.graphs))
        inp = HeuristicInputs(
            gpu_mem_mib=int(r.gpu_mib), mode=str(r.mode), tp=int(r.tp), attn_dp=int(r.attn_dp), is_mla=sh.is_mla,
            is_multimodal=sh.is_multimodal, model_path=path, architecture=sh.architecture, disable_cuda_graph=off,
            decode_backend=dec, prefill_backend=pre, moe_a2a_backend=str(r.backend),
            post_capture_env=bool(r.post_capture_env),
        )  # fmt: skip
        want = reserve(inp, RULES)
        assert r.fraction == want.mem_fraction_static and r.reserved_mib == want.reserved_mib, r
        floor = next(t for t in want.terms if t.name == "floor_topup")
        assert r.floor_mib == (floor.mib if floor.on else 0.0)
        assert r.weights_mib == sh.weight_bytes_per_gpu(int(r.tp), 1, int(r.attn_dp)) / MIB
        assert r.kv_bytes_per_token == sh.kv_bytes_per_token(int(r.tp), 1, int(r.attn_dp))
        if str(r.backend) != "none":
            b = a2a.BACKENDS[str(r.backend)]
            chunk = want.resolved.chunked_prefill_size
            t = None if math.isnan(r.tokens) else int(r.tokens)
            t = t if t is not None else a2a.default_tokens(b, chunk // int(r.attn_dp) if chunk > 0 else 0)
            size = a2a.size_for(
                a2a.A2AInputs(str(r.backend), sh.hidden_size, sh.num_experts, a2a.model_topk(path), int(r.tp), t or 0,
                              deepep_mode=str(r.deepep_mode), attn_dp=int(r.attn_dp), nnodes=-(-int(r.tp) // 8))
            )  # fmt: skip
            got = None if math.isnan(r.a2a_device_mib) else r.a2a_device_mib
            assert got == (None if size.device_bytes is None else size.device_bytes / MIB), r
            assert str(r.a2a_fails) == size.fails


def _scenario(r):
    _, dec, pre, off = _graph(str(r.graphs))
    keys = {"mode": str(r.mode), "tp": int(r.tp), "attn_dp": int(r.attn_dp), "disable_cuda_graph": off}
    if dec:
        keys["decode_graph"] = {"backend": dec}
    if pre:
        keys["prefill_graph"] = {"backend": pre}
    if r.post_capture_env:
        keys["post_capture_kv_sizing"] = True
    b = str(r.backend)
    if b != "none":
        keys["moe_a2a_backend"] = b
        keys["deepep_mode"] = str(r.deepep_mode)
        if not math.isnan(r.tokens):
            keys["a2a_dispatch_tokens"] = int(r.tokens)
        if b == "flashinfer":
            keys["moe_runner_backend"] = "deep_gemm"
    if int(r.ep) != 1:
        keys["ep"] = int(r.ep)
    return single_scenario(str(r.model), str(r.gpu), **keys)


@needs_sglang
def test_acceptance_and_fraction_equal_the_real_resolver_on_a_sample(rows):
    """The audit's `sglang_refusal` (its copy of sglang's backend checks) and its fractions, against sglang
    0.5.23 itself: 40 configurations per backend, half of them from those the audit says sglang refuses."""
    from profiler.engine.validation import validate

    rng = np.random.default_rng(7)
    picks = []
    for b in a2a.A2A_BACKENDS:
        sub = rows[rows["backend"] == b]
        for accepted in (True, False):
            part = sub[sub["accepted"] == accepted]
            if len(part):
                picks.append(part.iloc[rng.choice(len(part), size=min(20, len(part)), replace=False)])
    import pandas as pd

    sample = pd.concat(picks)
    scenarios = [_scenario(r) for r in sample.itertuples(index=False)]
    names = [f"s{i}" for i in range(len(scenarios))]
    scenarios = [s.with_(name=n) for s, n in zip(scenarios, names, strict=True)]
    v = validate(scenarios)
    bad = []
    for n, r in zip(names, sample.itertuples(index=False), strict=True):
        o = v.results[n]
        if (o.error is None) != bool(r.accepted):
            bad.append(f"{r.backend} {r.model} {r.gpu} {r.mode} tp{r.tp} dp{r.attn_dp} {r.graphs} t={r.tokens}: "
                       f"audit {r.sglang_refusal!r} sglang {o.error!r}")  # fmt: skip
        elif o.error is None and o.mem_fraction_static != r.fraction:
            bad.append(f"{n}: sglang {o.mem_fraction_static} audit {r.fraction}")
    assert len(sample) >= 300
    assert not bad, f"{len(bad)}/{len(sample)} differ:\n" + "\n".join(bad[:15])


def test_floor_decides_llama8_decode_h200_by_hand():
    df = evaluate_space(
        make_space(models=["meta-llama--Llama-3.1-8B-Instruct"], gpus=["H200"], modes=["decode"]), RULES
    )
    r = df[(df["tp"] == 1) & (df["graphs"] == "default") & ~df["post_capture_env"]].iloc[0]
    # 512 + max(256, 2048)·1.5 = 3072 + 1·1/8·1024 = 128 + 256·2 = 512 → 4224; the floor lifts it by 6016 MiB
    # KV per token: 8 heads × 128 × 32 layers × 2 B × 2 = 131,072 B (8 tokens per MiB) → 48,128 tokens given up
    assert (r["reserved_mib"], r["floor_mib"], r["fraction"]) == (10240.0, 6016.0, 0.929)
    assert r["floor_kv_tokens_given_up"] == 48_128
    f = findings(df)
    fl = f[f["kind"] == "floor_decides"].iloc[0]
    assert fl["scope"] == "decode nodes" and "KV given up" in fl["detail"]


def test_dsv3_deepep_decode_row_is_over_its_reserve_and_dsv3_at_tp1_does_not_fit(rows):
    r = rows[(rows["model"] == "deepseek-ai--DeepSeek-V3") & (rows["gpu"] == "H200") & (rows["mode"] == "decode")
             & (rows["tp"] == 8) & (rows["attn_dp"] == 1) & (rows["backend"] == "deepep") & (rows["tokens"] == 128)
             & (rows["deepep_mode"] == "auto") & (rows["graphs"] == "default") & ~rows["post_capture_env"]]  # fmt: skip
    (row,) = r.itertuples(index=False)
    # the DeepEP test: 2,516,748,064 B on the device against the 2 GiB reserve
    assert row.a2a_device_mib == 2_516_748_064 / MIB and row.a2a_reserve_mib == 2048.0
    assert row.a2a_verdict == "over_reserve" and row.accepted
    big = rows[(rows["model"] == "deepseek-ai--DeepSeek-V3") & (rows["tp"] == 1) & rows["accepted"]]
    assert (big["weights_mib"] > big["gpu_mib"]).all()  # 671 B params on one GPU: weights_exceed_gpu


def test_calibrated_reserve_by_hand(tmp_path):
    cal = tmp_path / "calibration.json"
    cal.write_text(json.dumps({"schema_version": 1, "rules": "0.5.23", "terms": {
        "decode_graph": {"formula": "24 MiB/bs", "params": {"mib_per_bs": 24.0}}}}))  # fmt: skip
    rules, c = read_calibration(cal)
    assert rules == "0.5.23" and (c["decode_graph"].form, c["decode_graph"].slope) == ("per_unit", 24.0)
    df = evaluate_space(
        make_space(models=["meta-llama--Llama-3.1-70B-Instruct"], gpus=["H200"], modes=["decode"]), RULES, c
    )
    r = df[(df["tp"] == 8) & (df["attn_dp"] == 1) & (df["graphs"] == "default") & ~df["post_capture_env"]].iloc[0]
    # today: 512 + 3072 + 8/8·1024 + 512·2 = 5632 → floor 10240. Calibrated: 512 + 3072 + 1024 + 512·24 = 16896
    assert (r["reserved_mib"], r["calibrated_reserved_mib"], r["calibrated_excess_mib"]) == (10240.0, 16896.0, 6656.0)
    f = findings(df)
    assert "under_reserved_calibrated" in set(f["kind"])


def test_what_calibrate_writes_round_trips_through_audit(tmp_path, capsys):
    """issue 16: calibrate writes {"mib_per_bs": 17.92}; audit used to expect {"form","slope","constant"} and
    turned decode_graph into a flat 0. Llama-3.1-8B decode on H200 (tp 1, 0.5.23): today 512 + 256·1.5
    (decode: max(max_bs 256, 2048) = 2048 tokens → 3072) + 128 + 256·2 = 4224 → floor 10240. With 17.92 MiB/bs:
    512 + 3072 + 128 + 256·17.92 = 8299.52 → still the floor: 10240. With a fixed 4000 + 17.92/bs: 12299.52."""
    from profiler.calibrate.codec import write_calibration
    from profiler.calibrate.fit import calibrate
    from tests.fixtures.results.handmade import run_rows, write_frame

    rows = []
    for i, (bs, mib) in enumerate(((4, 71.68), (512, 1474.56))):  # 17.92 and 2.88 MiB/bs: ratio → 17.92
        rows += run_rows(f"r{i}", {"decode_graph": (2.0 * bs, mib, "under")}, model=f"m/{i}", group=f"g{i}")
    cal = calibrate([str(write_frame(tmp_path / "res", rows))])
    path = tmp_path / "cal.json"
    doc = write_calibration(cal, path)
    _, c = read_calibration(path)
    f = c["decode_graph"]
    assert doc["terms"]["decode_graph"]["params"] == {"mib_per_bs": 17.92} or f.form == "affine"
    space = make_space(models=["meta-llama--Llama-3.1-8B-Instruct"], gpus=["H200"], modes=["decode"])
    df = evaluate_space(space, RULES, c)
    r = df[(df["tp"] == 1) & (df["graphs"] == "default") & ~df["post_capture_env"] & (df["backend"] == "none")]
    r = r.iloc[0]
    assert r["reserved_mib"] == 10240.0
    assert r["calibrated_reserved_mib"] == pytest.approx(max(10240.0, 3712.0 + f.reserve(256.0)))
    hand = tmp_path / "hand.json"
    hand.write_text(json.dumps({"schema_version": 1, "rules": "0.5.9", "terms": {
        "decode_graph": {"params": {"mib_per_bs": 17.92, "fixed_mib": 4000.0}}}}))  # fmt: skip
    _, c2 = read_calibration(hand)
    r2 = evaluate_space(space, RULES, c2)
    r2 = r2[(r2["tp"] == 1) & (r2["graphs"] == "default") & ~r2["post_capture_env"] & (r2["backend"] == "none")]
    assert r2.iloc[0]["calibrated_reserved_mib"] == pytest.approx(12299.52)
    # --rules decides the rules (0.5.23 by default), never the file's 0.5.9; the output says so
    assert run_audit(["meta-llama--Llama-3.1-8B-Instruct"], ["H200"], ["decode"], ["none"], str(hand),
                     str(tmp_path / "a")) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "sglang 0.5.23 rules" in out
    assert "calibration evidence sized by sglang 0.5.9 rules; applied with the 0.5.23 rules (--rules)" in out


def test_calibration_errors_are_one_line(tmp_path):
    p = tmp_path / "c.json"
    p.write_text("{}")
    with pytest.raises(MemfracError, match=r"c\.json: terms: bad value None; allowed: an object"):
        read_calibration(p)
    p.write_text(json.dumps({"schema_version": 1, "terms": {"activation": {"params": {"form": 1.0}}}}))
    with pytest.raises(MemfracError, match=r"params\.form: bad value 1\.0; allowed: a param activation takes"):
        read_calibration(p)
    with pytest.raises(MemfracError, match="no such file"):
        read_calibration(tmp_path / "none.json")


def test_unknown_names_are_refused_with_what_exists():
    with pytest.raises(MemfracError, match="unknown GPU 'H300'; known: T4"):
        make_space(gpus=["H300"])
    with pytest.raises(MemfracError, match="unknown backend 'deepep3'"):
        make_space(backends=["deepep3"])


def test_the_command_prints_findings_and_writes_rows_and_plots(tmp_path, capsys):
    out = tmp_path / "audit"
    assert run_audit(["Qwen--Qwen3-30B-A3B"], ["H200", "L40S"], None, ["none", "deepep", "pplx"], None, str(out)) == 0
    text = capsys.readouterr().out
    assert "memfrac audit:" in text and "a2a_over_reserve" in text and "floor_decides" in text
    assert re.search(r"evaluated in \d+\.\d s, \d+\.\d s wall", text)
    import pandas as pd

    df = pd.read_parquet(out / "audit.parquet")
    assert len(df) == 2 * 3 * 9 * (2 + 15 + 5) * 4 * 2  # GPUs × roles × parallelism × variants × graphs × post
    assert {p.name for p in out.glob("*.png")} >= {"heatmap-model-gpu-decode.png", "heatmap-tokens-experts-deepep.png"}
    assert gpu_by_name("H200").total_mib in set(df["gpu_mib"])


def test_calibrated_floor_other_than_10_gib_by_hand(tmp_path):
    """`explain --calibration` with a floor of 8192 MiB: Llama-3.1-8B decode on H200 (0.5.23) has pre-floor terms
    512 + 3072 + 128 + 512 = 4224. Today: max(4224, 10240) = 10240 → (143771 − 10240)/143771 = 0.92877 → 0.929,
    floor_topup 10240 − 4224 = 6016. Calibrated: max(4224, 8192) = 8192 → (143771 − 8192)/143771 = 0.94302 →
    0.943, floor_topup 8192 − 4224 = 3968. (Summed against 10 GiB the calibrated reserve would stay 10240.)"""
    from profiler.calibrate.codec import load_calibration
    from profiler.calibrate.reserve import calibrated_reserve
    from profiler.calibrate.shapes import calibrated_sum
    from profiler.model.heuristic import inputs_from_scenario, reserve, rules_for
    from profiler.model.scenario import single_scenario

    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"schema_version": 1, "rules": "0.5.23",
                                "terms": {"floor_topup": {"params": {"floor_mib": 8192.0}}}}))  # fmt: skip
    cal = load_calibration(path)
    s = single_scenario("meta-llama--Llama-3.1-8B-Instruct", "H200", mode="decode")
    cr = calibrated_reserve(s, reserve(inputs_from_scenario(s), rules_for("0.5.23")), cal)
    assert (cr.today_mib, cr.calibrated_mib) == (10240.0, 8192.0)
    assert (cr.today_fraction, cr.calibrated_fraction) == (0.929, 0.943)
    ft = next(t for t in cr.terms if t.name == "floor_topup")
    assert (ft.today_mib, ft.calibrated_mib) == (6016.0, 3968.0)
    # the one sum every reader uses, directly: a floor above 10 GiB lifts the same terms to 12288
    from profiler.calibrate.codec import fits

    terms = {"constant": 512.0, "activation": 3072.0, "parallel": 128.0, "decode_graph": 512.0}
    high = fits({"terms": {"floor_topup": {"params": {"floor_mib": 12288.0}}}})
    assert calibrated_sum(terms, high, floor_on=True)[:2] == (10240.0, 12288.0)


def test_the_caption_gives_the_evaluation_and_the_wall_time():
    """Issue 23: `audit` printed 8.0 s when the command took 16–28 s."""
    from profiler.calibrate.audit import timing

    assert timing(8.04, 21.96) == "evaluated in 8.0 s, 22.0 s wall (with the rows written and the heat maps drawn)"
