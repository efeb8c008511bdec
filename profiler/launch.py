"""Scenario → sglang command-line arguments, for the release being driven.

One builder serves the real resolver (`profiler.oracle` parses these argv with sglang's own argparse) and
the worker runner (`profiler.runner` launches them), so what is resolved is what is started. Flag
spellings changed across releases (`--attn-dp-size` arrived with 0.5.20's argument groups; older
releases spell attention DP `--dp-size N --enable-dp-attention` and the decode graph `--cuda-graph-max-bs`),
so the builder takes the release.
"""

from __future__ import annotations

from profiler.heuristic.rules import version_tuple
from profiler.scenario import Scenario


def _at_least(release: str, *v: int) -> bool:
    return version_tuple(release) >= v


def server_argv(s: Scenario, release: str = "0.5.23") -> list[str]:
    """The sglang server arguments that express scenario `s` (model path included, runtime flags not)."""
    a: list[str] = ["--model-path", s.model_path]
    if s.tp != 1:
        a += ["--tp-size", str(s.tp)]
    if s.pp != 1:
        a += ["--pp-size", str(s.pp)]
    if s.attn_dp > 1:
        if _at_least(release, 0, 5, 22):
            a += ["--attn-dp-size", str(s.attn_dp)]
        else:
            a += ["--dp-size", str(s.attn_dp), "--enable-dp-attention"]
    elif s.dp != 1:
        a += ["--dp-size", str(s.dp)]
    if s.ep != 1:
        a += ["--ep-size", str(s.ep)]
    if s.mode != "null":
        a += ["--disaggregation-mode", s.mode]
    if s.disable_cuda_graph:
        a += ["--disable-cuda-graph"]
    if s.disable_cuda_graph_padding:
        a += ["--disable-cuda-graph-padding"]
    a += _graph_flags(s, _at_least(release, 0, 5, 14))
    for flag, v in (
        ("--chunked-prefill-size", s.chunked_prefill_size),
        ("--max-prefill-tokens", s.max_prefill_tokens),
        ("--max-running-requests", s.max_running_requests),
        ("--max-total-tokens", s.max_total_tokens),
        ("--context-length", s.context_length),
        ("--speculative-algorithm", s.speculative_algorithm),
        ("--speculative-num-draft-tokens", s.speculative_num_draft_tokens),
        ("--speculative-num-steps", s.speculative_num_steps),
        ("--speculative-eagle-topk", s.speculative_eagle_topk),
        ("--mem-fraction-static", s.mem_fraction_static),
    ):
        if v is not None:
            a += [flag, str(v)]
    if s.moe_a2a_backend != "none":
        a += ["--moe-a2a-backend", s.moe_a2a_backend, "--deepep-mode", s.deepep_mode]
    if s.moe_runner_backend is not None:
        a += ["--moe-runner-backend", s.moe_runner_backend]
    if s.moe_a2a_backend == "deepep_v2" and s.deepep_v2_mode != "direct":
        a += ["--deepep-v2-mode", s.deepep_v2_mode]
    if s.kv_cache_dtype != "auto":
        a += ["--kv-cache-dtype", s.kv_cache_dtype]
    a += list(s.extra_args)
    return a


def _graph_flags(s: Scenario, new: bool) -> list[str]:
    d, p = s.decode_graph, s.prefill_graph
    out: list[str] = []
    if new:
        if d.backend is not None:
            out += ["--cuda-graph-backend-decode", d.backend]
        if d.max_bs is not None:
            out += ["--cuda-graph-max-bs-decode", str(d.max_bs)]
        if d.bs is not None:
            out += ["--cuda-graph-bs-decode", *map(str, d.bs)]
        if p.backend is not None:
            out += ["--cuda-graph-backend-prefill", p.backend]
        if p.max_bs is not None:
            out += ["--cuda-graph-max-bs-prefill", str(p.max_bs)]
        if p.bs is not None:
            out += ["--cuda-graph-bs-prefill", *map(str, p.bs)]
        return out
    # 0.5.12–0.5.13 spellings: one decode graph switch, the piecewise (prefill) graph flags
    if d.backend == "disabled":
        out += ["--disable-cuda-graph"] if not s.disable_cuda_graph else []
    if d.max_bs is not None:
        out += ["--cuda-graph-max-bs", str(d.max_bs)]
    if d.bs is not None:
        out += ["--cuda-graph-bs", *map(str, d.bs)]
    if p.backend == "disabled":
        out += ["--disable-piecewise-cuda-graph"]
    if p.max_bs is not None:
        out += ["--piecewise-cuda-graph-max-tokens", str(p.max_bs)]
    if p.bs is not None:
        out += ["--piecewise-cuda-graph-tokens", *map(str, p.bs)]
    return out


def launch_command(
    s: Scenario, host: str, port: int, release: str = "0.5.23", extra: list[str] | None = None
) -> list[str]:
    """The full worker command line: `python -m sglang.launch_server` with dummy weights on our port."""
    return [
        "python", "-m", "sglang.launch_server", *server_argv(s, release),
        "--load-format", "dummy", "--host", host, "--port", str(port), *(extra or []),
    ]  # fmt: skip
