"""Build the heuristic's inputs from a scenario (and, in `profiler.logs`, from a recovered server_args)."""

from __future__ import annotations

import json
from pathlib import Path

from profiler.heuristic.record import HeuristicInputs
from profiler.scenario import Scenario

_TRUE = {"1", "true", "yes", "on"}


def vision_shape(model_path: str) -> tuple[int | None, int | None]:
    """(layers, hidden) of a multimodal model's vision tower, as the VLM scaling reads them."""
    try:
        raw = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None, None
    vc = raw.get("vision_config")
    if not isinstance(vc, dict):
        return None, None
    return vc.get("num_hidden_layers", vc.get("depth")), vc.get("hidden_size")


def inputs_from_scenario(s: Scenario, platform: str = "cuda") -> HeuristicInputs:
    """The heuristic's view of a scenario: what sglang would receive as flags, nothing filled in."""
    shape = s.shape
    vit_layers, vit_hidden = vision_shape(s.model_path) if shape.is_multimodal else (None, None)
    env = s.env_dict
    return HeuristicInputs(
        gpu_mem_mib=s.gpu.total_mib,
        mode=s.mode,
        tp=s.tp,
        pp=s.pp,
        dp=s.dp,
        attn_dp=s.attn_dp,
        is_mla=shape.is_mla,
        is_multimodal=shape.is_multimodal,
        vit_layers=vit_layers,
        vit_hidden=vit_hidden,
        model_path=s.model_path,
        architecture=shape.architecture,
        chunked_prefill_size=s.chunked_prefill_size,
        max_prefill_tokens=s.max_prefill_tokens if s.max_prefill_tokens is not None else 16384,
        max_running_requests=s.max_running_requests,
        max_total_tokens=s.max_total_tokens,
        context_length=s.context_length,
        disable_cuda_graph=s.disable_cuda_graph,
        disable_cuda_graph_padding=s.disable_cuda_graph_padding,
        decode_backend=s.decode_graph.backend,
        decode_max_bs=s.decode_graph.max_bs,
        decode_bs=s.decode_graph.bs,
        prefill_backend=s.prefill_graph.backend,
        prefill_max_bs=s.prefill_graph.max_bs,
        prefill_bs=s.prefill_graph.bs,
        speculative_algorithm=s.speculative_algorithm,
        speculative_num_draft_tokens=s.speculative_num_draft_tokens,
        moe_a2a_backend=s.moe_a2a_backend,
        deepep_mode=s.deepep_mode,
        mem_fraction_static=s.mem_fraction_static,
        post_capture_env=env.get("SGLANG_ENABLE_POST_CAPTURE_KV_SIZING", "").lower() in _TRUE,
        platform=platform,
        unmodeled=tuple(s.extra_args),
    )
