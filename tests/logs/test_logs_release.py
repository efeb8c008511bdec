"""Which release wrote a log: stated cues (profiler.logs.identity.version_cue) and dated formats (formats.py).

Every format line below is a real one (the fixture named beside it); every span was read from the released
wheels' sources (see profiler/logs/formats.py for the file each is printed from).
"""

from __future__ import annotations

import pytest

from profiler.logs import parse_log
from profiler.logs.formats import (
    BY_KEY,
    FORMATS,
    RELEASES,
    format_key,
    next_release,
    release_key,
    release_range,
    releases_between,
)
from profiler.logs.identity import find_version, version_cue
from profiler.logs.prefixes import split_prefix


def test_release_order() -> None:
    assert release_key("0.5.0rc2") < release_key("0.5.0") < release_key("0.5.0.post1") < release_key("0.5.1")
    assert release_key("0.5.10rc0") > release_key("0.5.9") and release_key("v0.4.10.post1") == (0, 4, 10, 3, 1)
    assert list(RELEASES) == sorted(RELEASES, key=release_key) and len(RELEASES) == 101
    assert next_release("0.5.8.post1") == "0.5.9" and next_release("0.5.23") is None
    assert releases_between("0.4.9.post6", "0.5.0rc0") == ["0.4.9.post6", "0.4.10", "0.4.10.post1", "0.4.10.post2",
                                                           "0.5.0rc0"]  # fmt: skip


def test_every_format_span_is_made_of_known_releases() -> None:
    for f in FORMATS:
        for end in (f.first, f.last):
            assert end is None or end in RELEASES, (f.key, end)
        if f.first and f.last:
            assert release_key(f.first) <= release_key(f.last), f.key


@pytest.mark.parametrize(
    ("line", "key"),
    [
        # sglang-3254.log (Feb 2025)
        ("[2025-02-01 04:03:53 TP0] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
         "avail mem=38.90 GB",
         "load_end_no_usage"),
        # sglang-6320.log
        ("[2025-05-15 11:59:25 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.float16, avail mem=58.57 GB, "
         "mem usage=19.22 GB.", "load_end_usage"),
        # repo_unknown_glm5-fp8_8xMI355X.log: elapsed= and dtype= together, 0.5.9 only
        ("[2026-02-26 05:24:17 TP1] Load weight end. elapsed=236.31 s, type=GlmMoeDsaForCausalLM, "
         "dtype=torch.bfloat16, "
         "avail mem=194.32 GB, mem usage=89.58 GB.", "load_end_elapsed_dtype"),
        # sglang-pr17392.log
        ("[2026-05-06 08:52:05 DP0 TP0 EP0] Load weight end. elapsed=33.79 s, type=Qwen3MoeForCausalLM, avail "
         "mem=121.95 GB, mem usage=16.39 GB.", "load_end_elapsed"),
        ("[2025-09-11 10:24:23 TP0] Init torch distributed ends. mem usage=1.25 GB", "init_ends_usage"),
        ("[2026-02-04 11:30:26] Init torch distributed ends. elapsed=0.26 s, mem usage=0.09 GB", "init_ends_elapsed"),
        ("[2025-01-23 19:34:55] KV Cache is allocated. K size: 27.13 GB, V size: 27.13 GB.", "kv_no_tokens"),
        ("[2025-05-15 11:59:26 TP0] KV Cache is allocated. #tokens: 334289, K size: 24.23 GB, V size: 24.23 GB",
         "kv_tokens"),
        ("[2026-02-26 05:35:08 TP7] KV Cache is allocated. #tokens: 3262823, KV size: 186.77 GB", "kv_tokens_mla"),
        ("[2026-07-01 15:19:55 TP10] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 387968, K size: 5.92 GB, "
         "V size: 5.92 GB", "kv_dtype"),
        ("[2025-09-11 10:26:01 TP0] max_total_num_tokens=903439, chunked_prefill_size=8192, max_prefill_tokens=16384, "
         "max_running_requests=3529, context_len=131072, available_gpu_mem=10.26 GB", "ready_avail"),
        ("[2025-01-23 19:35:06] max_total_num_tokens=444500, max_prefill_tokens=16384, max_running_requests=2049, "
         "context_len=131072", "ready_no_chunk"),
        ("[2025-05-02 10:10:10] max_total_num_tokens=15387, chunked_prefill_size=2048, max_prefill_tokens=16384, "
         "max_running_requests=2049, context_len=40960", "ready_chunk"),
        ("[2024-09-19 23:31:14 TP0] Capture cuda graph begin. This can take up to several minutes.", "cap_begin_plain"),
        ("[2025-09-11 10:25:43 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=11.16 GB",
         "cap_begin_avail"),
        ("[2025-01-23 19:35:05] Capture cuda graph end. Time elapsed: 6.57 s", "cap_end_time"),
        ("[2025-03-08 12:30:41 TP0] Capture cuda graph end. Time elapsed: 28.08 s. avail mem=0.53 GB. mem "
         "usage=0.93 GB.",
         "cap_end_avail_usage"),
        ("[2025-09-11 10:26:00 TP0] Capture cuda graph end. Time elapsed: 17.13 s. mem usage=0.89 GB. avail "
         "mem=10.26 GB.",
         "cap_end_usage_avail"),
        # repo_unknown_ornith-probe4.log (prefixes stripped by its author)
        ("Capture target decode CUDA graph end. elapsed=12.47 s, mem usage=1.26 GB, avail mem=10.35 GB.",
         "cap_end_elapsed"),
        ("Capture target decode CUDA graph end. bs=[1, 2, 4, 8], elapsed=3.10 s, mem usage=0.20 GB, avail "
         "mem=10.00 GB.",
         "cap_end_bs"),
        ("[2025-09-11 10:25:44 TP0] Capture cuda graph bs [1, 2, 4, 8, 16, 24, 32]", "cap_bs_list"),
        ("Capturing batches (avail_mem=8.55 GB):   0%|          | 0/23 [00:00<?, ?it/s]", "tqdm_avail"),
        ("Capturing batches (bs=512 avail_mem=43.46 GB):   0%|          | 0/52 [00:00<?, ?it/s]", "tqdm_bs"),
        ("[2026-02-04 11:30:29] Using KV cache dtype: torch.bfloat16", "using_kv_dtype"),
        ("[2025-12-19 07:42:57 TP2] SWAKVPool mem usage: 77.63 GB, swa size: 1496958, full size: 1496958", "swakvpool"),
        ("[2026-02-04 11:30:33] Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, "
         "#running-req: 0, #queue-req: 0, input throughput (token/s): 0.00, cuda graph: False", "batch_comma"),
        ("[2025-07-22 06:20:01 TP0] Decode batch. #running-req: 37, #token: 18237, token usage: 0.01, cuda graph: True",
         "batch_period"),
        ("Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.5000 -> 0.9000", "retract_old"),
        ("KV cache pool is full. Retract requests. #retracted_reqs: 2, #new_tokens_gained: 512", "retract_new"),
        ("[2026-02-01 00:05:03 TP0] Memory pool end. avail mem=3.42 GB", None),  # printed by every release
    ],
)  # fmt: skip
def test_format_of_real_lines(line: str, key: str | None) -> None:
    assert format_key(split_prefix(line).msg) == key


def test_release_range_intersects_the_formats_seen() -> None:
    # repo_unknown_grok1_8xH100.log: tqdm with bs= (0.4.8.post1+) and "Init … ends. mem usage=" (… 0.5.8.post1)
    r = release_range(["tqdm_bs", "init_ends_usage", "ready_avail", "cap_bs_list"])
    assert (r.first, r.last) == ("0.4.8.post1", "0.5.8.post1") and r.conflicts == ()
    assert set(r.decided_by) == {"tqdm_bs", "init_ends_usage"} and r.label() == "0.4.8.post1 … 0.5.8.post1"
    one = release_range(["load_end_elapsed_dtype", "using_kv_dtype"])
    assert (one.first, one.last) == ("0.5.9", "0.5.9") and one.label() == "0.5.9"
    old = release_range(["cap_begin_plain"])
    assert (old.first, old.last) == (None, "0.4.3.post2") and old.label() == "≤0.4.0 … 0.4.3.post2"
    assert not release_range([]).bounded and release_range([]).label() == "≤0.4.0 … 0.5.23+"


def test_contradicting_format_is_left_out_and_named() -> None:
    # kv_dtype (0.5.13+) cannot meet load_end_usage (… 0.5.8.post1): the narrower span wins, the other is named
    r = release_range(["load_end_elapsed_dtype", "kv_dtype"])
    assert (r.first, r.last) == ("0.5.9", "0.5.9") and r.conflicts == ("kv_dtype",)


@pytest.mark.parametrize(
    ("text", "version", "how", "dev", "at_least"),
    [
        ("docker run --gpus all lmsysorg/sglang:v0.4.10.post1-cu126 python3 -m sglang.launch_server", "0.4.10.post1",
         "docker image tag lmsysorg/sglang:v0.4.10.post1-cu126", False, False),
        ("image: rocm/sgl-dev:v0.5.8.post1-rocm720-mi35x-20260218", "0.5.8.post1",
         "docker image tag rocm/sgl-dev:v0.5.8.post1-rocm720-mi35x-20260218", True, False),
        ('pip install "sglang[all]==0.4.6"', "0.4.6", "pip command (sglang==0.4.6)", False, False),
        ('pip install "sglang[all]>=0.4.6.post2"', "0.4.6.post2", "pip command (sglang>=0.4.6.post2)", False, True),
        ("uv pip install sglang==0.5.2rc1", "0.5.2rc1", "pip command (sglang==0.5.2rc1)", False, False),
        ("sglang 0.4.6", "0.4.6", "pip list", False, False),
        ("sglang                            0.4.6.post2", "0.4.6.post2", "pip list", False, False),
        ("/usr/lib/python3/site-packages/sglang-0.4.6.post1.dist-info/METADATA", "0.4.6.post1", "installed "
                                                                                                "package path",
         False, False),
        ("sglang: 0.4.5", "0.4.5", "version line", False, False),  # python -m sglang.check_env
        ("sglang version: 0.5.23", "0.5.23", "version line", False, False),
        ("sglang==0.4.5", "0.4.5", "pinned package", False, False),  # pip freeze
        ('{"model_path": "x", "version": "0.4.6"}', "0.4.6", "server_info version", False, False),
        ('"sglang_version": "0.5.3"', "0.5.3", "server_info sglang_version", False, False),
    ],
)  # fmt: skip
def test_version_cues(text: str, version: str, how: str, dev: bool, at_least: bool) -> None:
    cue = version_cue(text)
    assert cue is not None and (cue.version, cue.how, cue.dev, cue.at_least) == (version, how, dev, at_least)


@pytest.mark.parametrize(
    "text",
    [
        'File "/sgl-workspace/sglang/python/sglang/srt/model_executor/cuda_graph_runner.py", line 267, in __init__',
        "[2025-03-08 12:29:12 TP0] sglang is using nccl==2.21.5",  # repo_llms-in-clouds_qwq32b_4xL4.log
        "sgl-kernel 0.0.8",
        "sglang-router 0.1.5",
        "docker pull lmsysorg/sglang:latest",
    ],
)
def test_not_a_release(text: str) -> None:
    assert version_cue(text) is None and find_version(text) is None


def _log(*lines: str) -> list[str]:
    return list(lines)


LOAD_06 = ("[2025-05-01 10:00:00 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail "
           "mem=60.00 GB, "
           "mem usage=15.00 GB.")  # fmt: skip


def test_stated_release_is_used_with_how_and_line() -> None:
    (m,) = parse_log(_log("$ docker run lmsysorg/sglang:v0.4.6.post1-cu124 python3 -m sglang.launch_server --tp 1",
                          LOAD_06))  # fmt: skip
    assert m.identity.sglang_version == "0.4.6.post1"
    assert m.identity.sglang_how == "docker image tag lmsysorg/sglang:v0.4.6.post1-cu124 (line 1)"


def test_stronger_cue_wins_and_the_other_is_noted() -> None:
    (m,) = parse_log(_log('pip install "sglang[all]==0.4.5"', "sglang: 0.4.6", LOAD_06))
    assert m.identity.sglang_version == "0.4.6" and m.identity.sglang_how == "version line (line 2)"
    assert any("0.4.5" in n for n in m.notes)


def test_cue_after_the_log_applies_to_the_run_before_it() -> None:
    # an issue body: the log, then the environment block (python -m sglang.check_env)
    (m,) = parse_log(_log(LOAD_06, "Python: 3.10.12", "sglang: 0.4.5"))
    assert m.identity.sglang_version == "0.4.5"


def test_dev_image_is_bounded_by_the_next_release_and_the_formats() -> None:
    # the GLM-5 MI355X notes: rocm/sgl-dev:v0.5.8.post1-… (a build from main) printing 0.5.9's load line
    load = ("[2026-02-26 05:24:17 TP1] Load weight end. elapsed=236.31 s, type=GlmMoeDsaForCausalLM, "
            "dtype=torch.bfloat16, avail mem=194.32 GB, mem usage=89.58 GB.")  # fmt: skip
    (m,) = parse_log(_log("image: rocm/sgl-dev:v0.5.8.post1-rocm720-mi35x-20260218", load))
    assert m.identity.sglang_version == "0.5.9"
    assert "a dev build from main after 0.5.8.post1, before 0.5.9" in m.identity.sglang_how
    assert m.identity.sglang_how.endswith("its log formats match 0.5.9")


def test_range_from_formats_when_nothing_is_stated() -> None:
    (m,) = parse_log(_log(LOAD_06, "[2025-05-01 10:00:01 TP0] Capture cuda graph bs [1, 2, 4]"))
    assert m.identity.sglang_version is None and m.identity.sglang_range == ["0.4.6.post2", "0.5.8.post1"]
    assert m.identity.sglang_how.startswith("log formats: 0.4.6.post2 … 0.5.8.post1 (")


def test_stated_release_that_does_not_print_the_formats_is_kept_and_noted() -> None:
    (m,) = parse_log(_log("sglang: 0.5.20", LOAD_06))
    assert m.identity.sglang_version == "0.5.20"
    assert any("does not print every format seen" in n for n in m.notes)


def test_nothing_to_go_on() -> None:
    (m,) = parse_log(_log("[2025-05-01 10:00:03 TP0] Memory pool end. avail mem=10.00 GB"))
    assert m.identity.sglang_version is None and m.identity.sglang_range == []
    assert m.identity.sglang_how == "unknown: no release stated and no dated log format seen"


def test_each_format_names_a_real_source_file() -> None:
    for f in FORMATS:
        assert f.source.startswith("srt/"), f.key
    assert BY_KEY["tqdm_bs"].first == "0.4.8.post1"
