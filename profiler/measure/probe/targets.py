"""Where the probe hooks into a worker: sglang functions per startup phase, resolved against the install.

Names move between releases (facts §5), so every target is checked against the sglang actually
installed before a hook is registered; a missing required one is an error that lists the names the
module or class does have. sglang's own HookRegistry only logs a failed patch, which would silently
lose a phase.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Literal

Kind = Literal[
    "phase", "ladder", "budget", "baseline", "a2a", "runtime", "ranks", "kv", "decode", "prefill", "draft", "resize"
]


@dataclass(frozen=True, slots=True)
class Target:
    """One hook: the phase it measures, the dotted sglang path, and how the probe treats it."""

    phase: str
    path: str
    kind: Kind = "phase"
    required: bool = True
    backend: str = ""  # kind "a2a": the --moe-a2a-backend whose buffer this call creates


_SETUP = "sglang.srt.model_executor.model_runner_components.cuda_graph_setup"
_TD = "sglang.srt.layers.moe.token_dispatcher"
#: The first creation of each all-to-all backend's buffer (phase "a2a_buffer", details.backend). Optional:
#: several backends' modules import packages that need a CUDA device (deep_ep) or are not installed here.
A2A_CREATION: tuple[tuple[str, str], ...] = (
    ("deepep", f"{_TD}.deepep.DeepEPBuffer.get_deepep_buffer"),
    ("deepep_v2", f"{_TD}.deepep_v2.DeepEPv2Buffer.get_buffer"),
    ("mooncake", f"{_TD}.mooncake.EPBuffer.get_ep_buffer"),
    ("nixl", f"{_TD}.nixl.NixlEPBuffer.get_nixl_buffer"),
    ("pplx", f"{_TD}.pplx.PplxAllToAllManager.get_all_to_all"),
    ("mori", f"{_TD}.moriep.init_mori_op"),
    ("mori", f"{_TD}.moriep.init_mori_epv2_op"),
    ("flashinfer", f"{_TD}.flashinfer.FlashinferDispatcher.__init__"),
    ("megamoe", "sglang.srt.layers.moe.mega_moe._get_mega_moe_symm_buffer"),
    ("flashinfer_megamoe", "sglang.srt.layers.moe.flashinfer_megamoe._ensure_flashinfer_megamoe_layer"),
)
_KVC = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator"
_SPEC = "sglang.srt.speculative"

_DRAFT_CAPTURES = (
    "multi_layer_eagle_worker_v2.MultiLayerEagleDraftWorker._capture_cuda_graphs",
    "dflash_worker_v2.DFlashWorkerV2.init_cuda_graphs",
    "frozen_kv_mtp_worker_v2.FrozenKVMTPDraftWorker._capture_cuda_graphs",
    "dspark_components.dspark_worker_v2.DSparkWorkerV2.init_cuda_graphs",
    "uno_worker_v2.UnoWorkerV2.init_cuda_graphs",
)

#: sglang 0.5.23 (checked by tests against the installed release).
TARGETS: tuple[Target, ...] = (
    Target("init_parallel", "sglang.srt.distributed.bootstrap.init_parallel_runtime", "ranks"),
    Target("baseline", "sglang.srt.distributed.bootstrap.measure_pre_model_load_memory", "baseline"),
    Target("weights", "sglang.srt.model_executor.model_runner.ModelRunner.load_model"),
    Target("kv_pool", f"{_KVC}.configure", "kv"),
    Target("kv_pool", f"{_KVC}._profile_available_bytes", "budget"),
    Target("attention_backends", "sglang.srt.model_executor.model_runner.ModelRunner.init_attention_backends"),
    Target("eager_runner", "sglang.srt.model_executor.runner.eager_runner.EagerRunner.__init__"),
    Target("prefill_graph", f"{_SETUP}.capture_prefill_graph", "prefill"),
    Target("decode_graph", f"{_SETUP}.capture_decode_graph", "decode"),  # verify_graph when speculative
    Target(
        "decode_graph",
        "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.capture_one_shape",
        "ladder",
    ),
    # EAGLE drafts build their graphs directly (eagle_worker_v2.py `_capture_cuda_graphs`: the runners'
    # __init__ captures) and override capture_one_shape, so neither capture_decode_graph nor the base
    # class's ladder hook sees them.
    Target("draft_graph", f"{_SPEC}.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner.__init__", "draft"),
    Target(
        "draft_graph", f"{_SPEC}.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner.capture_one_shape", "ladder"
    ),
    Target(
        "draft_extend_graph",
        f"{_SPEC}.eagle_draft_extend_cuda_graph_runner.EAGLEDraftExtendCudaGraphRunner.__init__",
        "draft",
    ),
    Target(
        "draft_extend_graph",
        f"{_SPEC}.eagle_draft_extend_cuda_graph_runner.EAGLEDraftExtendCudaGraphRunner.capture_one_shape",
        "ladder",
    ),
    # The other draft workers' own graphs (spec_info.py names the algorithms): each worker captures them in one
    # method, outside capture_decode_graph (a DFlash draft's ModelRunner capture inside it is nested, role draft).
    # Optional: a release may lack an algorithm. Their memory was in `unattributed` before.
    *(Target("draft_graph", f"{_SPEC}.{path}", "draft", required=False) for path in _DRAFT_CAPTURES),
    # eagle_worker_v2.py:276-284: the draft's multi-step attention backends and their graph runners' buffers,
    # built after the draft ModelRunner's own init_attention_backends
    Target("attention_backends", f"{_SPEC}.eagle_worker_v2.EagleDraftWorker.init_attention_backend", "draft",
           required=False),
    Target("finalize", f"{_SETUP}.finalize_cuda_graph_capture"),
    # scheduler.py:1172-1180 after capture and sampling prewarm; kv_pool_runtime.py:151 backs the final span
    Target("post_capture_resize", "sglang.srt.model_executor.model_runner.ModelRunner.post_capture_resize_kv_pool",
           "resize"),
    Target("disaggregation_init", "sglang.srt.managers.scheduler.Scheduler.init_disaggregation"),
    *(Target("a2a_buffer", path, "a2a", required=False, backend=b) for b, path in A2A_CREATION),
    Target("runtime", "sglang.srt.managers.scheduler.Scheduler.run_batch", "runtime"),
)


class TargetError(RuntimeError):
    """A required hook target does not exist in the installed sglang."""


@dataclass(frozen=True, slots=True)
class Resolution:
    target: Target
    ok: bool
    note: str = ""


def _available(obj: object) -> list[str]:
    return sorted(n for n in dir(obj) if not n.startswith("__"))


def resolve(target: Target) -> Resolution:
    """Import the target's module and walk its attributes; say precisely what is missing."""
    parts = target.path.split(".")
    module = None
    i = len(parts)
    err: Exception | None = None
    while i > 0:
        try:
            module = importlib.import_module(".".join(parts[:i]))
            break
        except ModuleNotFoundError as e:
            err = e
            i -= 1
        except Exception as e:  # an optional module that cannot import here (deep_ep without CUDA)
            return Resolution(target, False, f"cannot import {'.'.join(parts[:i])}: {type(e).__name__}: {e}")
    if module is None:
        return Resolution(target, False, f"no module for {target.path} ({err})")
    obj: object = module
    walked = ".".join(parts[:i])
    for name in parts[i:]:
        if not hasattr(obj, name):
            have = ", ".join(n for n in _available(obj) if not inspect.ismodule(getattr(obj, n, None)))
            return Resolution(target, False, f"{walked} has no {name!r}; it has: {have}")
        obj = getattr(obj, name)
        walked += f".{name}"
    if not callable(obj):
        return Resolution(target, False, f"{target.path} is not callable")
    return Resolution(target, True)


def resolve_all(targets: tuple[Target, ...] = TARGETS) -> list[Resolution]:
    """Resolve every target; raise `TargetError` naming each missing required one."""
    out = [resolve(t) for t in targets]
    missing = [r for r in out if not r.ok and r.target.required]
    if missing:
        raise TargetError("hook targets missing in the installed sglang: " + "; ".join(r.note for r in missing))
    return out
