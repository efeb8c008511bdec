"""Scenario → sglang command-line arguments, for the release being driven.

One builder serves the real resolver (`profiler.engine.oracle` parses these argv with sglang's own argparse) and
the worker runner (`profiler.measure.runner` launches them), so what is resolved is what is started. Flag
spellings changed across releases (`--attn-dp-size` arrived with 0.5.22; older releases spell attention DP
`--dp-size N --enable-dp-attention`; the graph flags were renamed in 0.5.14; DeepEP was `--enable-deepep-moe`
before `--moe-a2a-backend`), and some flags did not exist yet: a scenario that needs one is refused with the
release that introduced it. First releases read from each release's `ServerArgs.add_cli_args`.
"""

from __future__ import annotations

from packaging.version import Version

from profiler.core.errors import MemfracError
from profiler.model.heuristic.releases import DEFAULT_RELEASE
from profiler.model.scenario import Scenario

#: The first release whose parser has each flag (only flags memfrac emits that arrived after 0.4.0).
FLAG_SINCE = {
    "--ep-size": "0.4.0.post1",
    "--speculative-algorithm": "0.4.1.post4",
    "--speculative-num-draft-tokens": "0.4.1.post4",
    "--speculative-num-steps": "0.4.1.post4",
    "--speculative-eagle-topk": "0.4.1.post4",
    "--speculative-draft-model-path": "0.4.1.post4",
    "--cuda-graph-bs": "0.4.1.post5",
    "--disaggregation-mode": "0.4.4.post2",
    "--enable-deepep-moe": "0.4.4.post2",
    "--deepep-mode": "0.4.4.post4",
    "--pp-size": "0.4.6.post2",
    "--moe-a2a-backend": "0.4.10.post2",
    "--enable-piecewise-cuda-graph": "0.5.3.post2",
    "--piecewise-cuda-graph-max-tokens": "0.5.3.post2",
    "--piecewise-cuda-graph-tokens": "0.5.3.post2",
    "--disable-piecewise-cuda-graph": "0.5.10rc0",
    "--cuda-graph-backend-decode": "0.5.14",
    "--attn-dp-size": "0.5.22",
}


def _at_least(release: str, since: str) -> bool:
    return Version(release) >= Version(since)


def _need(release: str, flag: str, why: str) -> None:
    since = FLAG_SINCE.get(flag)
    if since is not None and not _at_least(release, since):
        raise MemfracError(f"sglang {release} has no {flag} (added in {since}); {why} cannot be expressed there")


def server_argv(s: Scenario, release: str = DEFAULT_RELEASE) -> list[str]:
    """The sglang server arguments that express scenario `s` (model path included, runtime flags not).

    MemfracError when the scenario needs a flag release `release` does not have.
    """
    a: list[str] = ["--model-path", s.model_path]
    if s.tp != 1:
        a += ["--tp-size", str(s.tp)]
    if s.pp != 1:
        _need(release, "--pp-size", f"pp {s.pp}")
        a += ["--pp-size", str(s.pp)]
    if s.attn_dp > 1:
        if _at_least(release, "0.5.22"):
            a += ["--attn-dp-size", str(s.attn_dp)]
        else:
            a += ["--dp-size", str(s.attn_dp), "--enable-dp-attention"]
    elif s.dp != 1:
        a += ["--dp-size", str(s.dp)]
    if s.ep != 1:
        _need(release, "--ep-size", f"ep {s.ep}")
        a += ["--ep-size", str(s.ep)]
    if s.mode != "null":
        _need(release, "--disaggregation-mode", f"mode {s.mode}")
        a += ["--disaggregation-mode", s.mode]
    if s.disable_cuda_graph:
        a += ["--disable-cuda-graph"]
    if s.disable_cuda_graph_padding:
        a += ["--disable-cuda-graph-padding"]
    a += _graph_flags(s, release)
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
        ("--speculative-draft-model-path", s.speculative_draft_model_path),
        ("--mem-fraction-static", s.mem_fraction_static),
    ):
        if v is not None:
            _need(release, flag, f"{flag} {v}")
            a += [flag, str(v)]
    if s.moe_a2a_backend != "none":
        if _at_least(release, "0.4.10.post2"):
            a += ["--moe-a2a-backend", s.moe_a2a_backend]
        else:
            _need(release, "--enable-deepep-moe", f"moe_a2a_backend {s.moe_a2a_backend}")
            a += ["--enable-deepep-moe"]
        _need(release, "--deepep-mode", f"deepep_mode {s.deepep_mode}")
        a += ["--deepep-mode", s.deepep_mode]
    if s.moe_runner_backend is not None:
        _need(release, "--moe-runner-backend", f"moe_runner_backend {s.moe_runner_backend}")
        a += ["--moe-runner-backend", s.moe_runner_backend]
    if s.moe_a2a_backend == "deepep_v2" and s.deepep_v2_mode != "direct":
        _need(release, "--deepep-v2-mode", f"deepep_v2_mode {s.deepep_v2_mode}")
        a += ["--deepep-v2-mode", s.deepep_v2_mode]
    if s.kv_cache_dtype != "auto":
        a += ["--kv-cache-dtype", s.kv_cache_dtype]
    a += list(s.extra_args)
    return a


def _graph_flags(s: Scenario, release: str) -> list[str]:
    d, p = s.decode_graph, s.prefill_graph
    out: list[str] = []
    if _at_least(release, "0.5.14"):
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
    # ≤ 0.5.13: one decode graph switch; the piecewise (prefill) graph: an off-switch from 0.5.10rc0, an
    # on-switch (--enable-piecewise-cuda-graph) 0.5.3.post2 … 0.5.9, nothing before
    if d.backend == "disabled":
        out += ["--disable-cuda-graph"] if not s.disable_cuda_graph else []
    if d.max_bs is not None:
        out += ["--cuda-graph-max-bs", str(d.max_bs)]
    if d.bs is not None:
        _need(release, "--cuda-graph-bs", "an explicit decode bs list")
        out += ["--cuda-graph-bs", *map(str, d.bs)]
    optin = not _at_least(release, "0.5.10rc0")
    if p.backend == "disabled":
        out += [] if optin else ["--disable-piecewise-cuda-graph"]
    elif p.backend is not None and optin:
        _need(release, "--enable-piecewise-cuda-graph", f"prefill graph {p.backend}")
        out += ["--enable-piecewise-cuda-graph"]
    if p.max_bs is not None:
        _need(release, "--piecewise-cuda-graph-max-tokens", "a prefill graph max_bs")
        out += ["--piecewise-cuda-graph-max-tokens", str(p.max_bs)]
    if p.bs is not None:
        _need(release, "--piecewise-cuda-graph-tokens", "a prefill graph bs list")
        if _at_least(release, "0.5.8"):
            out += ["--piecewise-cuda-graph-tokens", *map(str, p.bs)]
        else:  # 0.5.3.post2 … 0.5.7 parse it as one JSON list (type=json_list_type)
            out += ["--piecewise-cuda-graph-tokens", "[" + ",".join(map(str, p.bs)) + "]"]
    return out


def launch_command(
    s: Scenario, host: str, port: int, release: str = DEFAULT_RELEASE, extra: list[str] | None = None
) -> list[str]:
    """The full worker command line: `python -m sglang.launch_server` with dummy weights on our port."""
    return [
        "python", "-m", "sglang.launch_server", *server_argv(s, release),
        "--load-format", "dummy", "--host", host, "--port", str(port), *(extra or []),
    ]  # fmt: skip
