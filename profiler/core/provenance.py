"""Where a run's heuristic inputs came from: read (printed by the log, given by the scenario) or not.

Calibration fits a constant only from runs whose inputs for it were read — a log that never printed its
cuda_graph_max_bs was judged with sglang's default, and fitting MiB per bs from it fits the default, not the
run (a 47 MiB/bs "constant" came out of exactly that). A server_args dump prints every resolved field, so a log
that has one read them all; a launch command gives only the flags the user typed; the rest are defaults.
"""

from __future__ import annotations

from profiler.core.measurement import Measurement

#: HeuristicInputs fields and the server args (any release's spelling) that carry each.
INPUT_ARGS: dict[str, tuple[str, ...]] = {
    "decode_max_bs": ("cuda_graph_max_bs", "cuda_graph_max_bs_decode", "cuda_graph_bs", "cuda_graph_bs_decode",
                      "cuda_graph_config"),
    "decode_bs": ("cuda_graph_bs", "cuda_graph_bs_decode", "cuda_graph_max_bs", "cuda_graph_max_bs_decode",
                  "cuda_graph_config"),
    "decode_backend": ("cuda_graph_backend_decode", "cuda_graph_config", "disable_cuda_graph"),
    "disable_cuda_graph": ("disable_cuda_graph",),
    "chunked_prefill_size": ("chunked_prefill_size",),
    "max_prefill_tokens": ("max_prefill_tokens",),
    "max_running_requests": ("max_running_requests",),
    "speculative_num_draft_tokens": ("speculative_num_draft_tokens", "speculative_algorithm"),
    "prefill_max_bs": ("cuda_graph_max_bs_prefill", "piecewise_cuda_graph_max_tokens", "cuda_graph_config"),
    "prefill_bs": ("cuda_graph_bs_prefill", "piecewise_cuda_graph_tokens", "cuda_graph_max_bs_prefill",
                   "piecewise_cuda_graph_max_tokens", "cuda_graph_config", "disable_piecewise_cuda_graph"),
    "prefill_backend": ("cuda_graph_backend_prefill", "cuda_graph_config", "disable_piecewise_cuda_graph"),
    "max_total_tokens": ("max_total_tokens",),
    "tp": ("tp_size",),
    "pp": ("pp_size",),
    "attn_dp": ("attn_dp_size", "enable_dp_attention"),
    "moe_a2a_backend": ("moe_a2a_backend", "enable_deepep_moe"),
    "deepep_mode": ("deepep_mode",),
    "deepep_tokens": ("SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK",),
}  # fmt: skip
#: How a GPU capacity was known that counts as read (else it was inferred from free memory or an OOM).
_GPU_READ = ("nvidia-smi", "torch", "scenario", "server_info")


def defaulted_inputs(m: Measurement) -> str | None:
    """Comma-separated HeuristicInputs names a run did not read ("" = every one read; None = unknown).

    A memfrac run hands sglang every input through its scenario and reads the resolved values back from
    /server_info: none defaulted. A log: the inputs none of whose server args it printed (an arg the log
    parser marks `"default"` in `args_from` counts as not printed), and the GPU capacity unless it was read. A
    capture the log shows proves its graph backend was on.
    """
    if m.source == "probe":
        return ""
    if not m.args:
        return None
    printed = getattr(m, "args_from", None) or {}
    env = m.args.get("env") if isinstance(m.args.get("env"), dict) else {}
    seen = {p.name for r in m.ranks for p in r.phases if p.role == "target"}
    captured = {"decode_backend", "disable_cuda_graph"} if seen & {"decode_graph", "verify_graph"} else set()
    if "prefill_graph" in seen:  # a capture line proves its backend was on
        captured |= {"prefill_backend"}
    missing = [
        name
        for name, keys in INPUT_ARGS.items()
        if name not in captured and not any((k in m.args or k in env) and printed.get(k) != "default" for k in keys)
    ]
    if not m.identity.gpu_total_how.startswith(_GPU_READ):
        missing.append("gpu_mem_mib")
    return ",".join(missing)
