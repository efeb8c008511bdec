"""Validation by sglang itself: the cases sglang refuses come back in its own words, one line per scenario,
before anything starts; what sglang accepts is no longer refused; outcomes are cached."""

from __future__ import annotations

import pytest

from profiler.core.errors import MemfracError
from profiler.model.scenario import single_scenario
from tests.conftest import RELEASES_DIR, needs_sglang

LLAMA = "meta-llama--Llama-3.1-8B-Instruct"
QWEN30 = "Qwen--Qwen3-30B-A3B"


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMFRAC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# (name, model, keys, what sglang 0.5.23 says: a fraction it resolves, or a fragment of its error)
CASES = [
    # DeepEP at tp 1: accepted (memfrac used to refuse it)
    ("deepep-tp1", QWEN30, {"moe_a2a_backend": "deepep"}, 0.883),
    # srt/arg_groups/parallel_hook.py:326 `assert cfg.tp_size % cfg.attn_dp_size == 0`: a bare assert, so the
    # message is sglang's source line
    ("attn-dp-3-of-4", LLAMA, {"tp": 4, "attn_dp": 3}, "parallel_hook.py:326: assert cfg.tp_size % cfg.attn_dp_size"),
    # model_config: context_length above the model's derived 131072
    ("ctx-200k", LLAMA, {"context_length": 200000}, "greater than the derived context_length (131072)"),
    # speculative_hook.py: EAGLE with draft tokens but no steps/topk asserts all three are unset
    ("eagle-no-steps", LLAMA, {"speculative_algorithm": "EAGLE", "speculative_num_draft_tokens": 4},
     "speculative_hook.py:1160: assert (cfg.speculative_eagle_topk is None"),
    ("ngram-attn-dp", QWEN30, {"tp": 2, "attn_dp": 2, "speculative_algorithm": "NGRAM",
                               "speculative_num_draft_tokens": 8},
     "ngram speculative decoding does not support dp attention"),
    ("standalone-attn-dp", QWEN30, {"tp": 2, "attn_dp": 2, "speculative_algorithm": "STANDALONE",
                                    "speculative_num_draft_tokens": 4, "speculative_num_steps": 3,
                                    "speculative_eagle_topk": 1},
     "standalone speculative decoding does not support dp attention"),
    # the breakable-only 0.5.14 rule below is 0.5.14's; 0.5.23 accepts a full prefill graph
    ("prefill-full", LLAMA, {"prefill_graph": {"backend": "full"}}, 0.903),
    # megamoe's platform check sees the scenario's GPU (oracle platform facts): SM90 yes, SM89 no
    ("megamoe-h200", "deepseek-ai--DeepSeek-V3", {"tp": 8, "moe_a2a_backend": "megamoe"}, 0.886),
]  # fmt: skip


@needs_sglang
def test_sglang_says_what_it_accepts_and_refuses_in_its_own_words(cache):
    from profiler.engine.validation import validate

    scenarios = [single_scenario(m, "H200", name=n, **k) for n, m, k, _ in CASES]
    said: list[str] = []
    v = validate(scenarios, progress=said.append)
    assert v.validated and v.release == "0.5.23" and v.cached == 0
    # issue 23: the import (seconds to a minute) is announced before it starts, and its end said
    assert said[0] == (f"validating {len(CASES)} scenario(s) with sglang 0.5.23 (installed, in this process): "
                       "importing sglang takes ~20–40 s the first time…")  # fmt: skip
    assert len(said) == 2 and said[1].startswith(f"sglang 0.5.23 resolved {len(CASES)} scenario(s) in ")
    for name, _, _, want in CASES:
        r = v.results[name]
        if isinstance(want, float):
            assert r.error is None and r.mem_fraction_static == want, (name, r)
        else:
            assert r.mem_fraction_static is None and want in r.error and "\n" not in r.error, (name, r.error)
    # the second time nothing is resolved: every outcome comes from the cache, equal
    said.clear()
    again = validate(scenarios, progress=said.append)
    assert again.cached == len(scenarios) and again.refused == v.refused and said == []  # nothing imported
    assert {n: again.fraction(n) for n in again.results} == {n: v.fraction(n) for n in v.results}


@needs_sglang
def test_check_raises_one_line_per_refused_scenario_naming_it(cache):
    from profiler.engine.validation import check

    ok = single_scenario(LLAMA, "H200", name="fine")
    bad = single_scenario(LLAMA, "H200", name="too-long", context_length=200000)
    bad2 = single_scenario(LLAMA, "H200", name="attn3", tp=4, attn_dp=3)
    with pytest.raises(MemfracError) as e:
        check([ok, bad, bad2])
    lines = str(e.value).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("<args>: scenario 'too-long': sglang 0.5.23 refuses it: ValueError: Warning: User")
    assert lines[1].startswith("<args>: scenario 'attn3': sglang 0.5.23 refuses it: AssertionError at sglang/")
    assert check([ok]).validated


@needs_sglang
def test_an_older_rules_release_is_validated_by_its_own_parser(cache):
    from profiler.engine.validation import validate

    if not (RELEASES_DIR / "0.5.14" / ".installed").exists():
        pytest.skip("sglang 0.5.14 not installed side by side: run `make old-releases`")
    s = single_scenario(LLAMA, "H200", name="prefill-full", prefill_graph={"backend": "full"})
    v = validate([s], rules="0.5.14")
    assert (v.release, v.where) == ("0.5.14", "side by side")
    # 0.5.14's cuda_graph_config allows breakable, tc_piecewise or disabled for the prefill phase
    assert "backend='full' not allowed" in v.results["prefill-full"].error


def test_without_sglang_it_says_so_once(monkeypatch, cache):
    import profiler.engine.validation as val

    monkeypatch.setattr(val, "installed_version", lambda: None)
    v = val.validate([single_scenario(LLAMA, "H200")])
    assert not v.validated and "not validated by sglang" in v.summary() and "not installed" in v.summary()
    assert val.check([single_scenario(LLAMA, "H200")], enabled=False).reason == "--no-validate"


def test_an_older_rules_release_not_installed_is_said(monkeypatch, tmp_path, cache):
    import profiler.engine.validation as val

    monkeypatch.setattr(val, "installed_version", lambda: "0.5.23")
    monkeypatch.setenv("MEMFRAC_SGLANG_RELEASES", str(tmp_path / "none"))
    v = val.validate([single_scenario(LLAMA, "H200")], rules="0.5.14")
    assert not v.validated and "not installed side by side" in v.reason


@needs_sglang
def test_explain_reports_sglangs_refusal_as_one_line_and_exit_2(tmp_path, cache, capsys):
    from profiler.face.cli import main

    p = tmp_path / "s.toml"
    p.write_text(f'name = "x"\nmodel = "{LLAMA}"\ngpu = "H200"\ncontext_length = 200000\n')
    assert main(["explain", str(p)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    progress, (line,) = err.strip().splitlines()[:-1], err.strip().splitlines()[-1:]
    assert all(ln.startswith("memfrac: ") and "error" not in ln for ln in progress), err  # the import, announced
    assert line.startswith(f"memfrac: error: {p}: scenario 'x': sglang 0.5.23 refuses it: ValueError: Warning:")
