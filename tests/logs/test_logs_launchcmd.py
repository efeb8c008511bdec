"""profiler.logs.launchcmd: launch commands as users paste them → sglang arg names."""

from __future__ import annotations

import pytest

from profiler.logs import parse_log
from profiler.logs.launchcmd import arg_name, is_launch_command, parse_launch_command, typed


def test_opt_equals_value_and_model_alias() -> None:
    # sglang-8538.log
    cmd = parse_launch_command(
        "python3 -m sglang.launch_server --model /models/meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8 "
        "--port=8080 --tp-size=8 --mem-fraction-static=0.8 --context-length=524288 --tool-call-parser=pythonic "
        "--chat-template=examples/chat_template/tool_chat_template_llama4_pythonic.jinja --attention-backend=fa3 "
        "--enable-multimodal"
    )
    assert cmd is not None
    assert cmd.args["model_path"] == "/models/meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8"
    assert (cmd.args["tp_size"], cmd.args["mem_fraction_static"], cmd.args["port"]) == (8, 0.8, 8080)
    assert cmd.args["enable_multimodal"] is True and cmd.args["attention_backend"] == "fa3"


def test_prompt_both_model_flags_and_long_alias() -> None:
    # repo_llms-in-clouds_qwq32b_4xL4.log: '--model' then '--model-path' (last wins, as in argparse)
    cmd = parse_launch_command(
        "python3.12 -m sglang.launch_server   --model Qwen/QwQ-32B --model-path /home/model/Qwen/QwQ-32B   "
        "--host 0.0.0.0 --port 30000 --tensor-parallel-size 4   --log-level info   --enable-metrics "
        "--trust-remote-code --enable-p2p-check                       "
    )
    assert cmd is not None
    assert cmd.args["model_path"] == "/home/model/Qwen/QwQ-32B" and cmd.args["tp_size"] == 4
    assert cmd.args["enable_p2p_check"] is True and cmd.args["host"] == "0.0.0.0"
    cmd = parse_launch_command(
        "root@nccl-test-host-1:/diagnostic# python3 -m sglang.launch_server --model-path meta-llama/Meta-Llama-3-8B-"
        "Instruct --disaggregation-mode decode --port 30001 --base-gpu-id 1 --disaggregation-ib-device mlx5_0"
    )
    assert cmd is not None and cmd.hostname == "nccl-test-host-1"
    assert cmd.args["disaggregation_mode"] == "decode" and cmd.args["base_gpu_id"] == 1


def test_env_prefix_quotes_lists_and_shell_tail() -> None:
    cmd = parse_launch_command(
        "CUDA_VISIBLE_DEVICES=0,1 SGLANG_X='a b' sglang serve --model-path \"/m/with space\" --dp 2 "
        "--cuda-graph-bs 1 2 4 --chunked-prefill-size -1 --json-model-override-args '{\"a\": [1, 2]}' "
        "--speculative-draft-model d 2>&1 | tee server.log"
    )
    assert cmd is not None
    assert cmd.env == {"CUDA_VISIBLE_DEVICES": "0,1", "SGLANG_X": "a b"}
    assert cmd.args == {
        "model_path": "/m/with space",
        "dp_size": 2,
        "cuda_graph_bs": [1, 2, 4],
        "chunked_prefill_size": -1,
        "json_model_override_args": {"a": [1, 2]},
        "speculative_draft_model_path": "d",
    }


def test_backslash_continuations_with_env_lines_through_parse_log() -> None:
    # sglang-24453.log (abridged): env assignments on their own continued lines, then the command.
    lines = [
        "PYTHONUNBUFFERED=1 \\",
        "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK=256 \\",
        "python -m sglang.launch_server \\",
        "    --model-path /models/Kimi-K2-Thinking_fp8 \\",
        "    --tp-size 32 --dp-size 32 --ep-size 32 \\",
        "    --enable-dp-attention --moe-a2a-backend deepep \\",
        "    --mem-fraction-static 0.7 \\",
        "    --cuda-graph-max-bs 128",
    ]
    (m,) = parse_log(lines)
    assert m.args_source == "launch_command"
    assert m.args["tp_size"] == 32 and m.args["enable_dp_attention"] is True and m.args["cuda_graph_max_bs"] == 128
    assert m.identity.attn_dp == 32 and m.mfs_origin == "given"
    assert any("SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK=256" in n for n in m.notes)
    assert m.first_line == 1


@pytest.mark.parametrize(
    "text",
    [
        '  File "/sgl-workspace/sglang/python/sglang/launch_server.py", line 7, in <module>',
        "pip install sglang==0.4.5",
        "$ PROFILE=longctx ./serve.sh",
    ],
)
def test_not_a_launch_command(text: str) -> None:
    assert not is_launch_command(text)
    assert parse_launch_command(text) is None


def test_arg_names_and_values() -> None:
    assert arg_name("--tp") == "tp_size" and arg_name("enable-hicache") == "enable_hierarchical_cache"
    assert arg_name("--cuda-graph-max-bs") == "cuda_graph_max_bs"
    assert (typed("8"), typed("0.88"), typed("1e-3"), typed("auto")) == (8, 0.88, 1e-3, "auto")
    assert typed("{bad json") == "{bad json"


def test_sglangs_own_usage_hint_is_not_a_launch_command():
    assert not is_launch_command("  Example: sglang serve --model-path <model> [options]")


def test_command_quoted_inline_in_markdown_backticks() -> None:
    # tests/fixtures/logs-heldout/sglang-4602.log, line 12 (and sglang-565.log line 2): the backticks quote the
    # whole command; they are not part of "python" or of the last value.
    cmd = parse_launch_command(
        "`python -m sglang.launch_server  --mem-fraction-static 0.90  --model-path <deepseek-v3/deeseek-r1> "
        "--trust-remote-code --tp-size 8 --disable-cuda-graph  --page-size 64`"
    )
    assert cmd is not None
    assert (cmd.args["mem_fraction_static"], cmd.args["tp_size"], cmd.args["page_size"]) == (0.9, 8, 64)
    assert cmd.args["disable_cuda_graph"] is True and cmd.args["model_path"] == "<deepseek-v3/deeseek-r1>"
    assert cmd.leftovers == ()
    (m,) = parse_log([
        "`python -m sglang.launch_server --model-path /mnt/ebs_volume/models/llama/llama-3-8b-instruct --tp-size=4 "
        "--mem-fraction-static=0.75 --port 30000 --enable-flashinfer`"
    ])  # fmt: skip
    assert (m.args["tp_size"], m.args["mem_fraction_static"], m.args["port"]) == (4, 0.75, 30000)
