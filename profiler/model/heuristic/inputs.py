"""Build the heuristic's inputs from a scenario (and, in `profiler.logs`, from a recovered server_args)."""

from __future__ import annotations

import json
from pathlib import Path

from profiler.model.heuristic.record import HeuristicInputs
from profiler.model.scenario import Scenario

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


def _first(args: dict, *keys: str) -> object:
    for k in keys:
        v = args.get(k)
        if v is not None:
            return v
    return None


def _graph(args: dict, phase: str) -> dict:
    cfg = args.get("cuda_graph_config")
    if isinstance(cfg, dict) and isinstance(cfg.get(phase), dict):
        return cfg[phase]
    return {}


def inputs_from_args(
    args: dict,
    *,
    gpu_mem_mib: int | None,
    architecture: str | None = None,
    mode: str | None = None,
    is_mla: bool | None = None,
    is_multimodal: bool | None = None,
) -> HeuristicInputs:
    """The heuristic's inputs from a server_args dict as sglang printed or reported it (any 0.3–0.5 naming).

    A log's server_args holds resolved values (defaults filled in); fed back, they resolve to themselves,
    except what resolution changes after the heuristic (the DP-divided chunk), which callers note.
    """
    from profiler.model.modelcfg import MLA_ARCHITECTURES

    arch = architecture or ""
    dec, pre = _graph(args, "decode"), _graph(args, "prefill")
    enable_dp = bool(args.get("enable_dp_attention"))
    attn_dp = _first(args, "attn_dp_size")
    if not isinstance(attn_dp, int) or attn_dp < 1:
        attn_dp = int(args.get("dp_size") or 1) if enable_dp else 1
    dp = int(args.get("dp_size") or 1) if not enable_dp else 1
    a2a = _first(args, "moe_a2a_backend") or ("deepep" if args.get("enable_deepep_moe") else "none")
    prefill_backend = _first(args, "cuda_graph_backend_prefill") or pre.get("backend")
    if prefill_backend is None and args.get("disable_piecewise_cuda_graph") is True:
        prefill_backend = "disabled"
    if prefill_backend is None and args.get("enable_piecewise_cuda_graph") is True:  # 0.5.3.post2 … 0.5.9 opt-in
        prefill_backend = "piecewise"
    decode_bs = _first(args, "cuda_graph_bs_decode", "cuda_graph_bs") or dec.get("bs")
    prefill_bs = _first(args, "cuda_graph_bs_prefill", "piecewise_cuda_graph_tokens") or pre.get("bs")
    mfs = args.get("mem_fraction_static")

    def _int(v: object) -> int | None:
        return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    return HeuristicInputs(
        gpu_mem_mib=gpu_mem_mib,
        mode=str(mode or args.get("disaggregation_mode") or "null"),
        tp=_int(args.get("tp_size")) or 1,
        pp=_int(args.get("pp_size")) or 1,
        dp=dp,
        attn_dp=attn_dp,
        is_mla=is_mla if is_mla is not None else arch in MLA_ARCHITECTURES,
        is_multimodal=is_multimodal if is_multimodal is not None else arch.endswith("ForConditionalGeneration"),
        model_path=str(args.get("model_path") or ""),
        architecture=arch,
        chunked_prefill_size=_int(args.get("chunked_prefill_size")),
        max_prefill_tokens=_int(args.get("max_prefill_tokens")) or 16384,
        max_running_requests=_int(args.get("max_running_requests")),
        max_total_tokens=_int(args.get("max_total_tokens")),
        context_length=_int(args.get("context_length")),
        disable_cuda_graph=bool(args.get("disable_cuda_graph")),
        disable_cuda_graph_padding=bool(args.get("disable_cuda_graph_padding")),
        decode_backend=_first(args, "cuda_graph_backend_decode") or dec.get("backend"),  # type: ignore[arg-type]
        decode_max_bs=_int(_first(args, "cuda_graph_max_bs_decode", "cuda_graph_max_bs") or dec.get("max_bs")),
        decode_bs=tuple(decode_bs) if isinstance(decode_bs, list) and decode_bs else None,
        prefill_backend=prefill_backend,  # type: ignore[arg-type]
        prefill_max_bs=_int(
            _first(args, "cuda_graph_max_bs_prefill", "piecewise_cuda_graph_max_tokens") or pre.get("max_bs")
        ),
        prefill_bs=tuple(prefill_bs) if isinstance(prefill_bs, list) and prefill_bs else None,
        speculative_algorithm=args.get("speculative_algorithm") or None,  # type: ignore[arg-type]
        speculative_num_draft_tokens=_int(args.get("speculative_num_draft_tokens")),
        moe_a2a_backend=str(a2a),
        deepep_mode=str(args.get("deepep_mode") or "auto"),
        mem_fraction_static=float(mfs) if isinstance(mfs, int | float) and not isinstance(mfs, bool) else None,
    )
