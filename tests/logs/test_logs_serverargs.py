"""profiler.logs.serverargs: the ServerArgs repr, read without eval, including cut-off pastes."""

from __future__ import annotations

from profiler.logs.serverargs import literal, parse_server_args
from tests.conftest import LOG_FIXTURES


def test_real_repr_from_a_log() -> None:
    line = next(
        ln
        for ln in (LOG_FIXTURES / "repo_unknown_qwen3-0.6b_wsl_4gb.log").read_text().splitlines()
        if "ServerArgs(" in ln
    )
    sa = parse_server_args(line)
    assert sa is not None and sa.complete
    a = sa.args
    assert a["model_path"] == "/mnt/d/gx/Desktop/Model/Qwen3-0___6B"
    assert a["mem_fraction_static"] == 0.88 and a["chunked_prefill_size"] == 2048
    assert a["attention_backend"] is None and a["disable_cuda_graph"] is False
    assert a["json_model_override_args"] == "{}" and a["disaggregation_mode"] == "null"
    assert a["hicache_ratio"] == 2.0 and a["cuda_graph_bs"] is None


def test_cut_off_mid_value_drops_only_that_field() -> None:
    # sglang-6753.log: the line ends inside "max_micro_batch_size".
    sa = parse_server_args("server_args=ServerArgs(model_path='m', mem_fraction_static=0.8717961202189594, max_micro_b")
    assert sa is not None and not sa.complete and sa.cut_at == "max_micro_b"
    assert sa.args == {"model_path": "m", "mem_fraction_static": 0.8717961202189594}
    sa = parse_server_args("ServerArgs(model_path='/very/long/pa")
    assert sa is not None and (sa.args, sa.complete, sa.cut_at) == ({}, False, "model_path")
    sa = parse_server_args("ServerArgs(lora_paths={'a': ['x', 'y'")
    assert sa is not None and not sa.complete and sa.args == {}


def test_nested_quotes_commas_parens_and_dicts() -> None:
    text = (
        "ServerArgs(chat_template=\"it's (a, b)\", stop='say \"hi\", then)', esc='a\\'b', "
        'json_model_override_args=\'{"rope_scaling": {"type": "yarn", "factor": 4.0}}\', '
        "cuda_graph_config={'decode': {'backend': 'full', 'max_bs': 256}, 'prefill': {'bs': [4, 8]}}, "
        "cuda_graph_bs=[1, 2, (4, 8)], enable=True, x=None, big=1e-05, neg=-3, inf_v=inf)"
    )
    sa = parse_server_args(text)
    assert sa is not None and sa.complete
    a = sa.args
    assert a["chat_template"] == "it's (a, b)"
    assert a["stop"] == 'say "hi", then)'
    assert a["esc"] == "a'b"
    assert a["json_model_override_args"] == '{"rope_scaling": {"type": "yarn", "factor": 4.0}}'
    assert a["cuda_graph_config"] == {"decode": {"backend": "full", "max_bs": 256}, "prefill": {"bs": [4, 8]}}
    assert a["cuda_graph_bs"] == [1, 2, (4, 8)]
    assert (a["enable"], a["x"], a["big"], a["neg"], a["inf_v"]) == (True, None, 1e-05, -3, float("inf"))


def test_objects_and_enums_are_kept_readable() -> None:
    sa = parse_server_args(
        "ServerArgs(backend=<Backend.FULL: 'full'>, path=PosixPath('/x, y'), fn=<function f at 0x1>)"
    )
    assert sa is not None and sa.complete
    assert sa.args == {"backend": "full", "path": "PosixPath('/x, y')", "fn": "<function f at 0x1>"}


def test_no_repr_and_code_is_never_run() -> None:
    assert parse_server_args("server_args=None") is None
    assert literal("__import__('os').system('echo pwned')") == "__import__('os').system('echo pwned')"
    assert literal("[1, 2") == "[1, 2"


def test_condensed_fixture_repr() -> None:
    # repo_unknown_dsv4-flash_8xH20_fixture.log (abridged by its author, still a valid repr).
    sa = parse_server_args(
        "[2026-05-15 08:39:19] server_args=ServerArgs(model_path='/root/workspace/models/DeepSeek-V4-Flash-Base', "
        "tp_size=8, pp_size=1, dp_size=1, ep_size=1, mem_fraction_static=0.88, kv_cache_dtype='bf16', "
        "cuda_graph_max_bs=320, disable_radix_cache=True, page_size=256)"
    )
    assert sa is not None and sa.complete and sa.args["tp_size"] == 8 and sa.args["page_size"] == 256


def test_0_5_23_dict_form_whole_and_cut():
    line = (
        "[2026-11-29 17:23:08] server_args={'model_path': '/m/tiny', 'tp_size': 2, 'cuda_graph_config': "
        "{'decode': {'backend': 'full', 'max_bs': 8}}, 'disaggregation_mode': 'decode', 'mem_fraction_static': 0.719}"
    )
    sa = parse_server_args(line)
    assert sa.complete and sa.args["tp_size"] == 2 and sa.args["cuda_graph_config"]["decode"]["max_bs"] == 8
    assert sa.args["disaggregation_mode"] == "decode" and sa.args["mem_fraction_static"] == 0.719
    cut = parse_server_args(line[:120])
    assert not cut.complete and cut.args == {"model_path": "/m/tiny", "tp_size": 2}
