"""The conformance grid: configurations on which the model must equal the real resolver exactly.

Shared by the conformance tests and the benchmark, so both measure the same thing. Six GPU sizes (one per
capacity band, RTX 4090 to B200) × three PD roles × variants that exercise every term and resolution step:
TP 1/2/8, pipeline parallel, attention DP (≤ and > 300 max_bs), DeepEP, graphs disabled, chunk sizes incl.
−1, max_running_requests below and above max_bs, explicit bs lists, speculative draft tokens, dense, MoE and
MLA models, max_total_tokens caps, padding off, post-capture sizing.
"""

from __future__ import annotations

from typing import Any

from profiler.model.scenario import Scenario, single_scenario

GRID_GPUS = ("RTX-4090", "L40S", "H100-80GB", "H20", "H200", "B200")
MODES = ("null", "prefill", "decode")

LLAMA8 = "meta-llama--Llama-3.1-8B-Instruct"
LLAMA70 = "meta-llama--Llama-3.1-70B-Instruct"
QWEN8 = "Qwen--Qwen3-8B"
QWEN30 = "Qwen--Qwen3-30B-A3B"
QWEN235 = "Qwen--Qwen3-235B-A22B"
DSV3 = "deepseek-ai--DeepSeek-V3"
KIMI = "moonshotai--Kimi-K2-Instruct"

# (label, model, scenario keys). Every variant runs on every GPU size and role.
VARIANTS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("llama8-default", LLAMA8, {}),
    ("llama8-tp2", LLAMA8, {"tp": 2}),
    ("llama70-tp8", LLAMA70, {"tp": 8}),
    ("llama8-nograph", LLAMA8, {"disable_cuda_graph": True}),
    ("llama8-chunk-off", LLAMA8, {"chunked_prefill_size": -1}),
    ("llama8-chunk-off-mpt32k", LLAMA8, {"chunked_prefill_size": -1, "max_prefill_tokens": 32768}),
    ("llama8-chunk4k", LLAMA8, {"chunked_prefill_size": 4096}),
    ("llama8-chunk16k", LLAMA8, {"chunked_prefill_size": 16384}),
    ("llama8-mrr-below", LLAMA8, {"max_running_requests": 24}),
    ("llama8-mrr-above", LLAMA8, {"max_running_requests": 1024}),
    ("llama8-maxbs64-mrr32", LLAMA8, {"decode_graph": {"max_bs": 64}, "max_running_requests": 32}),
    ("llama8-bs-list", LLAMA8, {"decode_graph": {"bs": [1, 2, 4, 8, 16, 32, 48]}}),
    ("llama8-prefill-bs", LLAMA8, {"prefill_graph": {"bs": [64, 128, 256, 512, 1024]}}),
    ("llama8-prefill-maxbs", LLAMA8, {"prefill_graph": {"max_bs": 3000}}),
    ("llama8-prefill-off", LLAMA8, {"prefill_graph": {"backend": "disabled"}}),
    # an explicit prefill graph with its own max_bs (before 0.5.10: --enable-piecewise-cuda-graph + max tokens)
    ("llama8-prefill-on-maxbs", LLAMA8, {"prefill_graph": {"backend": "breakable", "max_bs": 3000}}),
    ("llama8-decode-off", LLAMA8, {"decode_graph": {"backend": "disabled"}}),
    (
        "llama8-both-graphs-explicit",
        LLAMA8,
        {"decode_graph": {"backend": "full"}, "prefill_graph": {"backend": "breakable"}},
    ),
    ("llama8-no-padding", LLAMA8, {"disable_cuda_graph_padding": True, "decode_graph": {"max_bs": 40}}),
    ("llama8-mtt4k", LLAMA8, {"max_total_tokens": 4096}),
    ("llama8-pp2", LLAMA8, {"pp": 2}),
    ("llama8-post-capture", LLAMA8, {"env": {"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "1"}}),
    ("qwen8-ngram-draft8", QWEN8, {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8}),
    ("qwen8-tp2-attndp2", QWEN8, {"tp": 2, "attn_dp": 2}),
    ("qwen30-tp2", QWEN30, {"tp": 2}),
    ("qwen30-tp4-deepep", QWEN30, {"tp": 4, "ep": 4, "moe_a2a_backend": "deepep"}),
    ("qwen235-tp8-attndp4", QWEN235, {"tp": 8, "attn_dp": 4}),
    ("dsv3-tp8", DSV3, {"tp": 8}),
    ("dsv3-tp8-deepep", DSV3, {"tp": 8, "ep": 8, "moe_a2a_backend": "deepep"}),
    ("dsv3-tp8-deepep-ll", DSV3, {"tp": 8, "ep": 8, "moe_a2a_backend": "deepep", "deepep_mode": "low_latency"}),
    ("dsv3-tp8-attndp8", DSV3, {"tp": 8, "attn_dp": 8}),
    ("dsv3-tp8-attndp8-deepep", DSV3, {"tp": 8, "attn_dp": 8, "ep": 8, "moe_a2a_backend": "deepep"}),
    ("dsv3-tp8-attndp8-maxbs400", DSV3, {"tp": 8, "attn_dp": 8, "decode_graph": {"max_bs": 400}}),
    (
        "dsv3-tp8-nextn4",
        DSV3,
        {
            "tp": 8,
            "speculative_algorithm": "NEXTN",
            "speculative_num_draft_tokens": 4,
            "speculative_num_steps": 3,
            "speculative_eagle_topk": 1,
        },
    ),
    ("dsv3-tp8-mrr128", DSV3, {"tp": 8, "max_running_requests": 128}),
    ("kimi-tp8-deepep", KIMI, {"tp": 8, "ep": 8, "moe_a2a_backend": "deepep"}),
)


def conformance_grid(gpus: tuple[str, ...] = GRID_GPUS, modes: tuple[str, ...] = MODES) -> list[Scenario]:
    """Every variant × GPU size × role, as validated scenarios."""
    out = []
    for gpu in gpus:
        for mode in modes:
            for label, model, keys in VARIANTS:
                out.append(single_scenario(model, gpu, name=f"{label}-{gpu}-{mode}", mode=mode, **keys))
    return out


# ------------------------------------------------------------------------------------------------------
# Every all-to-all backend × role × graph setting (checked against the real resolver like the grid above)
# ------------------------------------------------------------------------------------------------------

A2A_GPUS = ("L40S", "H100-80GB", "H200", "B200")
#: Graph settings each backend is checked under: sglang's defaults, one graph off, both off, one forced on.
A2A_GRAPHS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("graphs-default", {}),
    ("decode-off", {"decode_graph": {"backend": "disabled"}}),
    ("prefill-breakable", {"prefill_graph": {"backend": "breakable"}}),
    ("no-cuda-graph", {"disable_cuda_graph": True}),
)
_BIG = 16384  # a dispatch capacity above every per-rank budget sglang checks for these configurations
#: (label, model, keys) per backend, each a configuration sglang 0.5.23 accepts on some GPU and role.
A2A_VARIANTS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("none-qwen30-tp2-ep2", QWEN30, {"tp": 2, "ep": 2}),
    ("deepep-qwen30-tp1", QWEN30, {"moe_a2a_backend": "deepep"}),
    ("deepep-qwen30-tp2", QWEN30, {"tp": 2, "moe_a2a_backend": "deepep", "a2a_dispatch_tokens": 256}),
    ("deepep-dsv3-tp8-normal", DSV3, {"tp": 8, "moe_a2a_backend": "deepep", "deepep_mode": "normal"}),
    ("deepep-kimi-tp8-attndp8", KIMI, {"tp": 8, "attn_dp": 8, "moe_a2a_backend": "deepep"}),
    ("deepep_v2-qwen30-tp2", QWEN30, {"tp": 2, "moe_a2a_backend": "deepep_v2", "a2a_dispatch_tokens": _BIG}),
    ("deepep_v2-dsv3-tp8", DSV3, {"tp": 8, "moe_a2a_backend": "deepep_v2", "a2a_dispatch_tokens": _BIG}),
    ("mooncake-qwen30-tp2", QWEN30, {"tp": 2, "moe_a2a_backend": "mooncake", "deepep_mode": "low_latency"}),
    ("mooncake-dsv3-tp8", DSV3, {"tp": 8, "moe_a2a_backend": "mooncake", "deepep_mode": "low_latency"}),
    ("nixl-qwen30-tp2", QWEN30, {"tp": 2, "moe_a2a_backend": "nixl", "deepep_mode": "low_latency"}),
    ("nixl-dsv3-tp8-attndp8", DSV3, {"tp": 8, "attn_dp": 8, "moe_a2a_backend": "nixl"}),
    ("mori-qwen30-tp2", QWEN30, {"tp": 2, "moe_a2a_backend": "mori", "a2a_dispatch_tokens": _BIG}),
    ("mori-dsv3-tp8", DSV3, {"tp": 8, "moe_a2a_backend": "mori", "a2a_dispatch_tokens": _BIG}),
    ("ascend_fuseep-qwen30-tp2", QWEN30, {"tp": 2, "moe_a2a_backend": "ascend_fuseep"}),
    ("ascend_tp-qwen30-tp2", QWEN30, {"tp": 2, "moe_a2a_backend": "ascend_tp"}),
    (
        "flashinfer-qwen30-tp2-attndp2",
        QWEN30,
        {"tp": 2, "attn_dp": 2, "moe_a2a_backend": "flashinfer", "moe_runner_backend": "flashinfer_cutlass"},
    ),
    (
        "flashinfer-dsv3-tp8-attndp8",
        DSV3,
        {"tp": 8, "attn_dp": 8, "moe_a2a_backend": "flashinfer", "moe_runner_backend": "flashinfer_cutlass"},
    ),
    ("megamoe-dsv3-tp8", DSV3, {"tp": 8, "moe_a2a_backend": "megamoe"}),
    ("megamoe-qwen30-tp2", QWEN30, {"tp": 2, "moe_a2a_backend": "megamoe", "a2a_dispatch_tokens": _BIG}),
    (
        "pplx-qwen30-tp2-attndp2",
        QWEN30,
        {"tp": 2, "attn_dp": 2, "moe_a2a_backend": "pplx", "a2a_dispatch_tokens": _BIG},
    ),
    ("pplx-dsv3-tp8-attndp8", DSV3, {"tp": 8, "attn_dp": 8, "moe_a2a_backend": "pplx", "a2a_dispatch_tokens": _BIG}),
    ("flashinfer_megamoe-qwen30-tp2-attndp2", QWEN30, {"tp": 2, "attn_dp": 2, "moe_a2a_backend": "flashinfer_megamoe"}),
)


def a2a_grid(gpus: tuple[str, ...] = A2A_GPUS, modes: tuple[str, ...] = MODES) -> list[Scenario]:
    """Every backend variant × graph setting × GPU × role, as validated scenarios."""
    out = []
    for gpu in gpus:
        for mode in modes:
            for label, model, keys in A2A_VARIANTS:
                for glabel, gkeys in A2A_GRAPHS:
                    name = f"{label}-{glabel}-{gpu}-{mode}"
                    out.append(single_scenario(model, gpu, name=name, mode=mode, **keys, **gkeys))
    return out
