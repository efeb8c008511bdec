"""memfrac's SGLang general plugin (entry-point group `sglang.srt.plugins`, name `memfrac_probe`).

sglang calls `register()` at the start of every process that loads plugins; the probe only acts in the
scheduler (the process that owns the GPU), when `MEMFRAC_PROBE_DIR` is set — i.e. only for workers memfrac
started. It wraps each startup phase (AROUND hooks) and the scheduler's batch loop, and writes what it
sees to `$MEMFRAC_PROBE_DIR/probe-<pid>.jsonl`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from collections.abc import Callable
from typing import Any

ENV_DIR = "MEMFRAC_PROBE_DIR"
PLUGIN_NAME = "memfrac_probe"


def register() -> None:
    """The entry point. Never raises into sglang (a failing plugin is only logged there)."""
    out = os.environ.get(ENV_DIR)
    if not out:
        return
    patches: list[str] = []
    if os.environ.get("MEMFRAC_CPU_PATCHES") == "1":
        from profiler.measure.probe.cpu_patches import apply_cpu_patches

        patches = apply_cpu_patches()
    if "sglang.srt.managers.scheduler" not in sys.modules:
        return  # the HTTP/tokenizer and detokenizer processes hold no GPU memory of their own
    from profiler.measure.probe.recorder import Recorder

    rec = Recorder(out)
    try:
        _install(rec, patches)
    except Exception as e:  # report, never crash the worker from here
        rec.error(f"probe failed to install: {type(e).__name__}: {e}")


def _install(rec: Any, patches: list[str]) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from profiler.measure.probe.targets import TARGETS, resolve

    try:
        import sglang

        version = getattr(sglang, "__version__", "unknown")
    except Exception:
        version = "unknown"
    resolutions = [resolve(t) for t in TARGETS]
    rec.start_record = {
        "type": "start",
        "kind": rec.probe.kind,
        "argv": sys.argv[:1],
        "ppid": os.getppid(),
        "sglang_version": version,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pytorch_cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "patches": patches,
        "targets": [_target_record(r) for r in resolutions],
    }  # written ahead of this process's first record (the DP controller, which runs no phase, writes none)
    missing = [r for r in resolutions if not r.ok and r.target.required]
    if missing:
        rec.error("hook targets missing in the installed sglang: " + "; ".join(r.note for r in missing))
        return
    for r in resolutions:
        if r.ok:
            HookRegistry.register(r.target.path, _hook_for(rec, r.target), HookType.AROUND)
    rec.on_open = lambda: rec.write(hooks_record(HookRegistry, resolutions))
    from profiler.measure.probe import kv_hash  # a PD pair's per-request KV hashes (MEMFRAC_KV_HASH=1 only)

    kv_hash.install(HookRegistry, HookType, os.environ[ENV_DIR])
    rec.guard_peak_resets()
    atexit.register(rec.flush_runtime)


Hook = Callable[..., Any]
After = Callable[[Any, Any, tuple, dict], None]


def hooks_record(registry: Any, resolutions: list[Any]) -> dict[str, Any]:
    """Which hooks sglang's HookRegistry really applied. It only logs a patch that fails
    (hook_registry.py:157-166 apply_hooks: `logger.exception`), so a phase would go unmeasured in silence; by
    the first record (init_parallel) load_plugins has applied them (scheduler.py:6323)."""
    patched = getattr(registry, "_patched", None)
    applied = {r.target.path: (r.target.path in patched) if patched is not None else None
               for r in resolutions if r.ok}  # fmt: skip
    required = sorted({r.target.path for r in resolutions if r.ok and r.target.required})
    return {"type": "hooks", "applied": applied, "required": required}

#: sglang empties torch's cache as these phases begin (`get_available_gpu_memory(empty_cache=True)` before
#: "Capture … CUDA graph begin", cuda_graph_setup.py capture_prefill_graph / capture_decode_graph): the probe
#: empties it first, so cache left by the eager warm-up is not charged to the capture (nor credited to it).
EMPTY_CACHE_AT_BEGIN = frozenset({"prefill_graph", "decode_graph", "verify_graph"})
#: ... and at the end of the eager runner (its warm-up cache is released at the next phase's start).
EMPTY_CACHE_AT_END = frozenset({"eager_runner"})


def _target_record(r: Any) -> dict[str, Any]:
    t = r.target
    return {"phase": t.phase, "path": t.path, "ok": r.ok, "note": r.note, "required": t.required,
            "backend": t.backend or None}  # fmt: skip


def call_role(args: tuple, kwargs: dict) -> str | None:
    """target | draft for a hooked call, from the ModelRunner it runs for (`is_draft_worker`): passed as
    `self`, `model_runner=`, an object holding `.model_runner`, or `is_draft_worker=` (bootstrap.py)."""
    flag = kwargs.get("is_draft_worker")
    if isinstance(flag, bool):
        return "draft" if flag else "target"
    for a in (*args, *kwargs.values()):
        for obj in (a, getattr(a, "model_runner", None), getattr(a, "draft_runner", None)):
            v = getattr(obj, "is_draft_worker", None) if obj is not None else None
            if isinstance(v, bool):
                return "draft" if v else "target"
    return None


def _decode_phase_name(args: tuple, kwargs: dict) -> str:
    """`capture_decode_graph` captures the target-verify graph when speculative (cuda_graph_setup.py:
    memory_phase = "target_verify" when `model_runner.spec_algorithm.is_speculative()`)."""
    mr = kwargs.get("model_runner", args[0] if args else None)
    try:
        if mr is not None and not mr.is_draft_worker and mr.spec_algorithm.is_speculative():
            return "verify_graph"
    except AttributeError:
        pass
    return "decode_graph"


def _phase_hook(
    rec: Any,
    phase: str,
    after: After | None = None,
    *,
    role: str | None = None,
    name: Callable[[tuple, dict], str] | None = None,
) -> Hook:
    def hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        ph = name(args, kwargs) if name is not None else phase
        r = role or call_role(args, kwargs) or "target"
        fr = rec.begin(ph, role=r, empty_cache=ph in EMPTY_CACHE_AT_BEGIN)
        try:
            result = original(*args, **kwargs)
        except BaseException as e:
            rec.end(fr, e)
            raise
        if after is not None:
            try:
                after(fr, result, args, kwargs)
            except Exception as e:
                fr.details["probe_note"] = f"{type(e).__name__}: {e}"
        rec.end(fr, empty_cache=ph in EMPTY_CACHE_AT_END)
        return result

    return hook


def _ranks_after(rec: Any) -> Callable[[Any, Any, tuple, dict], None]:
    def after(fr: Any, _result: Any, _a: tuple, _k: dict) -> None:
        from sglang.srt.runtime_context import get_parallel

        ranks, sizes = parallel_identity(get_parallel())
        rec.ranks = ranks
        fr.details["sizes"] = sizes
        if rec.probe.cuda:
            import torch

            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            fr.details["device_name"] = props.name
            fr.details["device_total_mib"] = props.total_memory / 2**20

    return after


def parallel_identity(p: Any) -> tuple[dict[str, int], dict[str, int]]:
    """(ranks, sizes) of this scheduler from sglang's ParallelContext. The replica (DP rank) is what the DP
    controller assigned (`dp_rank`: scheduler.py:6324 resolve_spawn_dp_rank → publish, runtime_context.py:1588;
    None without a DP controller), over `num_dp_ranks` = dp_size × attn_dp_size (runtime_context.py:202-207).
    `attn_dp_rank` alone is 0 on every plain-DP replica (runtime_context.py:82-90: attention DP off), which
    labelled both replicas of a `--dp-size 2` worker TP0; it stands in only where no DP rank was assigned."""
    ranks: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for key, attrs in (("tp", ("tp_rank",)), ("pp", ("pp_rank",)), ("dp", ("dp_rank", "attn_dp_rank")),
                       ("ep", ("moe_ep_rank",))):  # fmt: skip
        v = next((x for x in (getattr(p, a, None) for a in attrs) if isinstance(x, int)), None)
        if v is not None:
            ranks[key] = v
    for key, attrs in (("tp", ("tp_size",)), ("pp", ("pp_size",)), ("dp", ("num_dp_ranks", "attn_dp_size")),
                       ("ep", ("moe_ep_size",))):  # fmt: skip
        v = next((x for x in (getattr(p, a, None) for a in attrs) if isinstance(x, int)), None)
        if v is not None:
            sizes[key] = v
    return ranks, sizes


def _baseline_after(fr: Any, result: Any, _a: tuple, _k: dict) -> None:
    if isinstance(result, int | float):
        fr.details["pre_model_load_mib"] = float(result) * 1024  # sglang returns GiB


def _kv_after(fr: Any, result: Any, _a: tuple, _k: dict) -> None:
    """The pool sglang built (`KVCacheConfigResult`, kv_cache_configurator.py): tokens, bytes, dtype."""
    tokens = getattr(result, "max_total_num_tokens", None)
    pool = getattr(result, "token_to_kv_pool", None)
    if isinstance(tokens, int):
        fr.details["kv_tokens"] = tokens
    size = getattr(pool, "mem_usage", None)  # GiB, as the "KV Cache is allocated" line prints it
    if isinstance(size, int | float) and size > 0:
        fr.details["kv_mib"] = float(size) * 1024
    else:
        getter = getattr(pool, "get_kv_size_bytes", None)
        if callable(getter):
            b = getter()
            total = sum(b) if isinstance(b, tuple | list) else b
            if isinstance(total, int | float) and total > 0:
                fr.details["kv_mib"] = float(total) / 2**20
    dtype = getattr(pool, "dtype", None)
    if dtype is not None:
        fr.details["kv_dtype"] = str(dtype)
    mrr = getattr(result, "max_running_requests", None)
    if isinstance(mrr, int):
        fr.details["max_running_requests"] = mrr
    _request_pools(fr, result, _a[0] if _a else None)
    if getattr(pool, "post_capture_active", False) is True:
        # memory_pool.py:2217-2220, 2088: the pool is a VA upper bound; kv_mib/kv_tokens above are that bound
        fr.details["post_capture_active"] = True
        backed = getattr(pool, "post_capture_backed_bytes", None)
        if isinstance(backed, int | float):
            fr.details["backed_mib"] = float(backed) / 2**20


def _tensor_bytes(obj: Any) -> tuple[int, int]:
    """(bytes, count) of the torch tensors an object holds directly (its own attributes, not nested objects)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - sglang brings torch
        return 0, 0
    ts = [v for v in vars(obj).values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in ts), len(ts)


def _request_pools(fr: Any, result: Any, configurator: Any) -> None:
    """What configure built out of the slack after sizing the KV pool (kv_cache_configurator.py:478-482
    `_init_pools`): the req_to_token table (ReqToTokenPool / DecodeReqToTokenPool: int32 [rows, context + extra],
    memory_pool.py:406, disaggregation/decode.py:205) and the allocator's index tensors (allocator/token.py:44-48
    free_pages / release_pages), read off sglang's objects. A draft worker is handed the target's pools
    (`req_to_token_pool=self.req_to_token_pool`, :481): they are counted once, on the target."""
    rt = getattr(result, "req_to_token_pool", None)
    table = getattr(rt, "req_to_token", None)
    shape = getattr(table, "shape", None)
    mib = 0.0
    shared = configurator is not None and getattr(configurator, "req_to_token_pool", None) is not None
    if table is not None and shape is not None and len(shape) == 2 and not shared:
        b = int(table.numel()) * int(table.element_size())
        fr.details.update(req_to_token_mib=b / 2**20, req_to_token_rows=int(shape[0]), req_to_token_cols=int(shape[1]))
        mib += b / 2**20
    alloc = getattr(result, "token_to_kv_pool_allocator", None)
    alloc_shared = configurator is not None and getattr(configurator, "token_to_kv_pool_allocator", None) is not None
    if alloc is not None and not alloc_shared:
        b, n = _tensor_bytes(alloc)
        if n:
            fr.details["allocator_mib"] = b / 2**20
            mib += b / 2**20
        page = getattr(alloc, "page_size", None)
        if isinstance(page, int):
            fr.details["page_size"] = page
    ctx = getattr(getattr(configurator, "model_config", None), "context_len", None)
    if isinstance(ctx, int):
        fr.details["context_len"] = ctx
    if mib:
        fr.details["request_pools_mib"] = mib


def _capture_after(family: str) -> After:
    """Whether a capture call really captured (cuda_graph_setup.py:472-506 capture_prefill_graph returns the eager
    runner or no runner when the family is disabled — an empty window, not a graph) and the backend sglang
    resolved for the family (runtime_context `get_exec().graph.cuda_graph_config.<family>.backend`)."""

    def after(fr: Any, result: Any, _a: tuple, _k: dict) -> None:
        runner = getattr(result, "runner", None)
        kind = type(runner).__name__ if runner is not None else None
        fr.details["captured"] = kind is not None and kind != "EagerRunner"
        if kind is not None:
            fr.details["runner"] = kind
        with contextlib.suppress(Exception):
            from sglang.srt.runtime_context import get_exec

            b = getattr(get_exec().graph.cuda_graph_config, family).backend
            fr.details["backend"] = str(getattr(b, "value", b))

    return after


def _resize_after(fr: Any, _result: Any, args: tuple, kwargs: dict) -> None:
    """The pool post-capture KV sizing left (model_runner.py:1061-1063: `max_total_num_tokens` of the resize;
    kv_pool_runtime.py:151-153 `finalize_backing` of the target pool and every draft pool that is not the
    target's; `post_capture_backed_bytes`, memory_pool.py:2725, is the physically backed span)."""
    mr = args[0] if args else kwargs.get("self")
    tokens = getattr(mr, "max_total_num_tokens", None)
    if isinstance(tokens, int):
        fr.details["kv_tokens"] = tokens
    pool = getattr(mr, "token_to_kv_pool", None)
    backed = getattr(pool, "post_capture_backed_bytes", None)
    if isinstance(backed, int | float):
        fr.details["kv_mib"] = float(backed) / 2**20
    drafts = [getattr(r, "token_to_kv_pool", None) for r in kwargs.get("draft_runners") or ()]
    sizes = [getattr(d, "post_capture_backed_bytes", None) for d in drafts if d is not None and d is not pool]
    if sizes and all(isinstance(b, int | float) for b in sizes):
        fr.details["draft_kv_mib"] = float(sum(sizes)) / 2**20  # type: ignore[arg-type]


def _budget_hook(rec: Any, phase: str) -> Hook:
    def hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            top = rec.top
            if top is not None and isinstance(result, int | float):
                top.details["budget_mib"] = float(result) / 2**20  # KV byte budget
        except Exception:
            pass
        return result

    return hook


def _ladder_hook(rec: Any, phase: str) -> Hook:
    def hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            bs = kwargs.get("size", args[1] if len(args) > 1 else None)
            if isinstance(bs, int):
                rec.ladder(phase, bs)
        except Exception:
            pass
        return result

    return hook


def _scalar(v: Any) -> Any:
    """An argument as JSON: numbers, strings, enums by value, process groups by size; None otherwise."""
    if isinstance(v, bool | int | float | str) or v is None:
        return v
    if hasattr(v, "value") and isinstance(v.value, str | int):
        return v.value
    if hasattr(v, "itemsize"):  # torch dtypes
        return str(v)
    return None


def _a2a_hook(rec: Any, target: Any) -> Hook:
    """Measure the first creation of one backend's all-to-all buffer (later calls return the cached buffer,
    so the hot path stays one flag check). Details: backend, the arguments sglang passed, the EP group size,
    memfrac's analytic size from those arguments (`profiler.model.a2a.size_from_call`) and, where the library says
    what it allocated, reported_bytes."""
    import inspect

    done: set[int | None] = set()
    sig: list[Any] = []
    # flashinfer_megamoe.py:252-261: `_ensure_flashinfer_megamoe_layer(layer, …)` builds one state per MoE layer
    # (the first call for each layer allocates): every layer's first call is a creation, not only the first call
    per_layer = target.backend == "flashinfer_megamoe"

    def hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        key = id(kwargs.get("layer", args[0] if args else None)) if per_layer else None
        if key in done:
            return original(*args, **kwargs)
        done.add(key)
        given: dict[str, Any] = {}
        try:
            if not sig:
                sig.append(inspect.signature(original))
            bound = sig[0].bind_partial(*args, **kwargs).arguments
            group = bound.get("group")
            if group is not None and hasattr(group, "size"):
                given["num_ranks"] = int(group.size())
            for k, v in bound.items():
                if k not in ("self", "cls", "group") and _scalar(v) is not None:
                    given[k] = _scalar(v)
        except Exception as e:
            given["probe_note"] = f"arguments not read: {type(e).__name__}: {e}"

        def after(fr: Any, result: Any, a: tuple, _k: dict) -> None:
            from profiler.model.a2a import reported_bytes, size_from_call

            fr.details.update(backend=target.backend, args=given)
            size = size_from_call(target.backend, given)
            if size is not None:
                fr.details.update(analytic_bytes=size.analytic_bytes, device_bytes=size.device_bytes,
                                  analytic_source=size.source, fails=size.fails or None)  # fmt: skip
            rep = reported_bytes(target.backend, result, a)
            if rep is not None:
                fr.details["reported_bytes"] = rep

        return _phase_hook(rec, target.phase, after)(original, *args, **kwargs)

    return hook


def batch_shape(batch: Any, result: Any, draft_tokens: int | None) -> tuple[str, int, int, bool | None] | None:
    """(kind, requests, tokens, graph) of one scheduler batch (managers/schedule_batch.py ScheduleBatch:
    `forward_mode`, `batch_size()`, `extend_num_tokens`; a speculative decode verifies `draft_tokens` per request);
    graph: whether it replayed a CUDA graph (managers/utils.py GenerationBatchResult.can_run_cuda_graph), None when
    the result does not say. None for an idle or unknown batch."""
    mode = getattr(batch, "forward_mode", None)
    if mode is None:
        return None
    reqs = int(batch.batch_size()) if callable(getattr(batch, "batch_size", None)) else len(batch.reqs)
    graph = getattr(result, "can_run_cuda_graph", None)
    graph = graph if isinstance(graph, bool) else None
    if mode.is_decode():
        spec = getattr(batch, "spec_algorithm", None)
        per = draft_tokens if draft_tokens and spec is not None and not spec.is_none() else 1
        return "decode", reqs, reqs * per, graph
    if mode.is_extend():
        n = getattr(batch, "extend_num_tokens", None)
        return "extend", reqs, int(n) if isinstance(n, int) else 0, graph
    return None


def _runtime_hook(rec: Any, phase: str) -> Hook:
    draft: list[int | None] = []

    def hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(Exception):
            rec.runtime_before()  # the first batch is sglang's warm-up request: baseline before it
        result = original(*args, **kwargs)
        with contextlib.suppress(Exception):
            if not draft:
                draft.append(_draft_tokens())
            shape = batch_shape(kwargs.get("batch", args[1] if len(args) > 1 else None), result, draft[0])
            if shape is not None:
                rec.runtime_batch(*shape)
        with contextlib.suppress(Exception):
            rec.runtime_sample()
        return result

    return hook


def _draft_tokens() -> int | None:
    """Tokens a speculative decode step verifies per request (runtime_context get_spec())."""
    try:
        from sglang.srt.runtime_context import get_spec

        n = get_spec().speculative_num_draft_tokens
        return int(n) if isinstance(n, int) else None
    except Exception:
        return None


_HOOKS: dict[str, Callable[[Any, str], Hook]] = {
    "phase": lambda rec, phase: _phase_hook(rec, phase),
    "ranks": lambda rec, phase: _phase_hook(rec, phase, _ranks_after(rec)),
    "baseline": lambda rec, phase: _phase_hook(rec, phase, _baseline_after),
    "kv": lambda rec, phase: _phase_hook(rec, phase, _kv_after),
    "decode": lambda rec, phase: _phase_hook(rec, phase, _capture_after("decode"), name=_decode_phase_name),
    "prefill": lambda rec, phase: _phase_hook(rec, phase, _capture_after("prefill")),
    "draft": lambda rec, phase: _phase_hook(rec, phase, role="draft"),
    "resize": lambda rec, phase: _phase_hook(rec, phase, _resize_after),
    "budget": _budget_hook,
    "ladder": _ladder_hook,
    "runtime": _runtime_hook,
}


def a2a_hook(rec: Any, backend: str, path: str = "") -> Hook:
    """The first-creation hook of one all-to-all backend's buffer (phase `a2a_buffer`), without a target to
    resolve: for memfrac's own drivers of the hooks (selfcheck, the simulated worker)."""
    from profiler.measure.probe.targets import Target

    return _a2a_hook(rec, Target("a2a_buffer", path or f"{backend}.buffer", "a2a", required=False, backend=backend))


def _hook_for(rec: Any, target: Any) -> Hook:
    """The hook for one target: a phase window of its kind, or an all-to-all backend's first buffer creation."""
    return _a2a_hook(rec, target) if target.kind == "a2a" else _HOOKS[target.kind](rec, target.phase)
