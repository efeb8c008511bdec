"""Scenario files: validation messages, matrix expansion, names, defaults."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from profiler.core.errors import MemfracError, ScenarioError
from profiler.model.scenario import load_scenarios, scenario_dict, single_scenario
from tests.conftest import ROOT


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.toml"
    p.write_text(text)
    return p


def test_default_set_expands_with_readable_unique_names():
    ss = load_scenarios(ROOT / "scenarios" / "default.toml")
    names = [s.name for s in ss]
    assert len(ss) == 18 and len(set(names)) == 18
    assert "llama8b-H200-decode-max_bs64" in names
    assert "dsv3-deepep-H100-80GB-prefill" in names
    dsv3 = next(s for s in ss if s.name == "dsv3-deepep-H200-decode")
    assert (dsv3.tp, dsv3.ep, dsv3.moe_a2a_backend, dsv3.gpus_needed) == (8, 8, "deepep", 8)
    assert dsv3.env_dict["SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"] == "128"
    assert dsv3.run.startup_timeout_s == 1200  # from [defaults]
    modes = {s.mode for s in ss}
    gpus = {s.gpu.name for s in ss}
    assert modes == {"null", "prefill", "decode"} and gpus == {"H200", "H100-80GB"}


def test_single_scenario_file_and_gpu_by_mib(tmp_path):
    p = write(tmp_path, 'name = "x"\nmodel = "Qwen--Qwen3-8B"\ngpu = 46068\nmode = "prefill"\n')
    (s,) = load_scenarios(p)
    assert s.gpu.name == "L40S" and s.gpu.total_mib == 46068 and s.mode == "prefill"
    p = write(tmp_path, 'name = "x"\nmodel = "Qwen--Qwen3-8B"\ngpu = 50000\n')
    assert load_scenarios(p)[0].gpu.total_mib == 50000


def test_matrix_dotted_keys_and_lists(tmp_path):
    p = write(
        tmp_path,
        'name = "m"\nmodel = "meta-llama--Llama-3.1-8B-Instruct"\ngpu = "H100"\n'
        '[matrix]\n"decode_graph.max_bs" = [8, 16]\n"decode_graph.bs" = [[1, 2], [4]]\n'
        "disable_cuda_graph = [true, false]\n",
    )
    ss = load_scenarios(p)
    assert len(ss) == 8
    assert ss[0].name == "m-max_bs8-bs1_2-disable_cuda_graph"
    assert ss[-1].name == "m-max_bs16-bs4-no_disable_cuda_graph"
    assert ss[0].decode_graph.max_bs == 8 and ss[0].decode_graph.bs == (1, 2)
    assert dict(ss[0].matrix)["decode_graph.max_bs"] == 8


@pytest.mark.parametrize(
    ("body", "key", "value", "allowed"),
    [
        ('mode = "both"', "mode", "'both'", "null | prefill | decode"),
        ("tp = 0", "tp", "0", "an integer 1..512"),
        ('gpu = "H300"', "gpu", "'H300'", "a GPU name (T4,"),
        ('model = "nope"', "model", "'nope'", "meta-llama--Llama-3.1-8B-Instruct"),
        ("mem_fraction_static = 1.2", "mem_fraction_static", "1.2", "strictly between 0 and 1"),
        ("chunked_prefill_size = -2", "chunked_prefill_size", "-2", "or -1 to disable chunking"),
        ("colour = 1", "colour", "1", "known keys:"),
        ('decode_graph = { backend = "fast" }', "decode_graph.backend", "'fast'", "full | breakable | disabled"),
        ("decode_graph = { bs = [] }", "decode_graph.bs", "[]", "non-empty list"),
        ('moe_a2a_backend = "deepep3"', "moe_a2a_backend", "'deepep3'", "none | deepep | mooncake | nixl | mori"),
        ("a2a_dispatch_tokens = 64", "a2a_dispatch_tokens", "64", "only with a backend that has a dispatch buffer"),
        ('moe_a2a_backend = "deepep"\na2a_dispatch_tokens = 2048', "a2a_dispatch_tokens", "2048", "1..1024 for deepep"),
        ('moe_a2a_backend = "mooncake"\na2a_dispatch_tokens = 1025', "a2a_dispatch_tokens", "1025", "1..1024 for moon"),
        ('moe_a2a_backend = "nixl"\ndeepep_dispatch_tokens = 64', "deepep_dispatch_tokens", "64", "only with moe_a2a_"),
        (
            'moe_a2a_backend = "deepep"\ndeepep_dispatch_tokens = 64\na2a_dispatch_tokens = 64',
            "deepep_dispatch_tokens",
            "64",
            "not both",
        ),
        ('deepep_v2_mode = "hybrid"', "deepep_v2_mode", "'hybrid'", "only with moe_a2a_backend = deepep_v2"),
        ('moe_a2a_backend = "deepep_v2"\ndeepep_v2_mode = "x"', "deepep_v2_mode", "'x'", "direct | hybrid"),
        ('env = { "1BAD" = "x" }', "env", "", "a table of NAME = value"),
    ],
)
def test_bad_values_name_file_key_value_and_allowed(tmp_path, body, key, value, allowed):
    base = {"model": 'model = "meta-llama--Llama-3.1-8B-Instruct"', "gpu": 'gpu = "H200"'}
    lines = ['name = "x"'] + [v for k, v in base.items() if not body.startswith(f"{k} =")] + [body]
    p = write(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(ScenarioError) as ei:
        load_scenarios(p)
    msg = str(ei.value)
    assert str(p) in msg and f"key '{key}'" in msg and value in msg and allowed in msg, msg
    assert "\n" not in msg


def test_matrix_errors(tmp_path):
    p = write(tmp_path, 'name = "x"\nmodel = "Qwen--Qwen3-8B"\ngpu = "H200"\n[matrix]\nmode = "decode"\n')
    with pytest.raises(ScenarioError, match=r"matrix\.mode.*non-empty list"):
        load_scenarios(p)
    p = write(tmp_path, 'name = "x"\nmodel = "Qwen--Qwen3-8B"\ngpu = "H200"\n[matrix]\nflavour = [1]\n')
    with pytest.raises(ScenarioError, match=r"matrix\.flavour"):
        load_scenarios(p)


def test_duplicate_names_and_missing_name(tmp_path):
    p = write(
        tmp_path,
        '[[scenario]]\nname="a"\nmodel="Qwen--Qwen3-8B"\ngpu="H200"\n[[scenario]]\nname="a"\nmodel="Qwen--Qwen3-8B"\ngpu="H100"\n',
    )
    with pytest.raises(ScenarioError, match="unique names"):
        load_scenarios(p)
    p = write(tmp_path, 'model="Qwen--Qwen3-8B"\ngpu="H200"\n')
    with pytest.raises(ScenarioError, match="key 'name'"):
        load_scenarios(p)


def test_not_toml_and_missing_file(tmp_path):
    with pytest.raises(MemfracError, match="not valid TOML"):
        load_scenarios(write(tmp_path, "name = = 1"))
    with pytest.raises(MemfracError, match="not found"):
        load_scenarios(tmp_path / "none.toml")


def test_cli_bad_scenario_is_one_line_exit_2(tmp_path):
    p = write(tmp_path, 'name = "x"\nmodel = "Qwen--Qwen3-8B"\ngpu = "H200"\nmode = "both"\n')
    r = subprocess.run([sys.executable, "-m", "profiler.face.cli", "explain", str(p)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"memfrac: error: {p}: key 'mode': bad value 'both'; allowed: null | prefill | decode | pd "
        '(the string "null": a unified worker; "pd": a pair)'
    ]


def test_scenario_dict_is_json_ready():
    import json

    s = single_scenario("deepseek-ai--DeepSeek-V3", "H200", tp=8, moe_a2a_backend="deepep", decode_graph={"bs": [4, 1]})
    d = json.loads(json.dumps(scenario_dict(s)))
    assert d["gpu"] == {"name": "H200", "total_mib": 143771} and d["decode_graph"]["bs"] == [1, 4]


@pytest.mark.parametrize(
    "keys",
    [  # each is accepted by the real sglang 0.5.23 resolver (tests/engine/test_validation.py replays them): memfrac no
        # longer refuses what sglang accepts
        {"tp": 4, "ep": 3},  # sglang: 0.897 (ep is overridden or ignored)
        {"moe_a2a_backend": "deepep"},  # DeepEP at tp 1: 0.883 for Qwen3-30B-A3B on H200
        {"speculative_num_draft_tokens": 4},  # without an algorithm: sglang ignores it (0.903)
    ],
)
def test_what_sglang_accepts_loads(keys):
    s = single_scenario("Qwen--Qwen3-30B-A3B", "H200", **keys)
    assert all(getattr(s, k) == v for k, v in keys.items())


def test_dense_model_with_a_backend_loads_and_attn_dp_not_dividing_tp_is_left_to_sglang():
    # sglang refuses tp 4 / attn_dp 3 with an AssertionError in parallel_hook.py; memfrac's schema does not
    # duplicate that rule (profiler.engine.validation reports sglang's own error)
    assert single_scenario("meta-llama--Llama-3.1-8B-Instruct", "H200", tp=4, attn_dp=3).attn_dp == 3
    assert single_scenario("meta-llama--Llama-3.1-8B-Instruct", "H200", moe_a2a_backend="mooncake").tp == 1


@pytest.mark.parametrize(
    ("backend", "env_name"),
    [
        ("deepep", "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"),
        ("deepep_v2", "SGLANG_DEEPEP_V2_NUM_MAX_DISPATCH_TOKENS_PER_RANK"),
        ("mooncake", "SGLANG_MOONCAKE_EP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"),
        ("nixl", "SGLANG_NIXL_EP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"),
        ("pplx", "SGLANG_PPLX_NUM_MAX_DISPATCH_TOKENS_PER_RANK"),
        ("mori", "SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK"),
        ("flashinfer", "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK"),
        ("megamoe", "SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK"),
        ("flashinfer_megamoe", "SGLANG_FLASHINFER_MEGAMOE_MAX_TOKENS_PER_RANK"),
    ],
)
def test_dispatch_tokens_become_the_backends_own_environment_variable(backend, env_name):
    s = single_scenario("Qwen--Qwen3-30B-A3B", "H200", tp=2, moe_a2a_backend=backend, a2a_dispatch_tokens=512)
    assert s.env_dict[env_name] == "512"
    assert s.deepep_dispatch_tokens == (512 if backend == "deepep" else None)
    # an explicit env entry wins over the key
    s2 = s.with_(env=((env_name, "64"),))
    assert s2.env_dict[env_name] == "64"


def test_deepep_dispatch_tokens_is_an_alias_and_post_capture_sets_sglangs_variable():
    s = single_scenario("Qwen--Qwen3-30B-A3B", "H200", tp=2, moe_a2a_backend="deepep", deepep_dispatch_tokens=256)
    assert s.a2a_dispatch_tokens == 256 and s.env_dict["SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"] == "256"
    p = single_scenario("Qwen--Qwen3-8B", "H200", post_capture_kv_sizing=True)
    assert p.env_dict == {"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "1"}
    assert single_scenario("Qwen--Qwen3-8B", "H200").env_dict == {}


def test_post_capture_is_a_matrix_key_with_readable_names(tmp_path):
    p = write(
        tmp_path,
        'name = "q"\nmodel = "Qwen--Qwen3-8B"\ngpu = "H200"\n[matrix]\npost_capture_kv_sizing = [false, true]\n',
    )
    a, b = load_scenarios(p)
    assert (a.name, b.name) == ("q-no_post_capture_kv_sizing", "q-post_capture_kv_sizing")
    assert not a.post_capture_kv_sizing and b.env_dict["SGLANG_ENABLE_POST_CAPTURE_KV_SIZING"] == "1"
