"""A simulated CUDA device and sglang 0.5.23's call sequence, driven through memfrac's REAL probe hooks.

This is the test double for the one layer that needs a GPU (profiler/measure/probe/snapshot.py): `SimDevice` keeps
the driver's free memory and torch's allocator counters (allocated / reserved, current and peak, cached
blocks released only by empty_cache), and `SimProbe` reads it exactly as `Probe.snapshot()` reads CUDA.
Everything above it is memfrac's own code: `plugin._HOOKS` wrap the simulated sglang functions, the real
`Recorder` writes probe JSONL (format v2), and tests read that back with the real reader, ledger and
comparison. Each step cites the sglang 0.5.23 source it replays (paths inside the `sglang` package).

`write_trace(name, out_dir)` writes one scenario's JSONL (`python -m tests.fakes.sim_worker DIR` writes them
all, to read by eye).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from profiler.core.measurement import Snapshot
from profiler.measure.probe import plugin
from profiler.measure.probe.recorder import Recorder
from profiler.selfcheck import life

H200_MIB = 143771.0
#: Llama-3.1-8B: bf16 KV 2 × 32 layers × 8 heads × 128 × 2 B = 131,072 B per token; context 131,072.
LLAMA_BPT = 131072.0
LLAMA_CONTEXT = 131072


def _tensor_mib(t: Any) -> float:
    return t.numel() * t.element_size() / 2**20


def sglang_sizes(budget_bytes: float, bpt: float, context: int, mrr: int | None, decode: bool,
                 draft_tokens: int = 0) -> SimpleNamespace:  # fmt: skip
    """What configure builds from a KV byte budget — by sglang 0.5.23's own code, never memfrac's mirror of it:
    tokens by `DefaultPoolConfigurator.calculate_pool_sizes` (pool_configurator.py:637-647), the admitted requests by
    `KVCacheConfigurator.resolve_max_num_reqs` (kv_cache_configurator.py:3119), the req_to_token pool by
    `ReqToTokenPool` / `DecodeReqToTokenPool` (memory_pool.py:388-410, disaggregation/decode.py:186-215; columns
    context + get_req_to_token_extra_context_len() = 4 + draft tokens, allocation_sizing.py:95-116; no extra decode
    slots by default, pd_disaggregation_hook.py:133-142) and the allocator by `TokenToKVPoolAllocator`
    (allocator/token.py:42-48) — built on the meta device: their shapes, no memory."""
    from unittest import mock

    from sglang.srt.disaggregation.decode import DecodeReqToTokenPool
    from sglang.srt.mem_cache import kv_cache_configurator as kvc
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator

    me = SimpleNamespace(_fixed_overhead_bytes=0, _cell_size=int(bpt), _zero_kv_max_tokens=0)
    tokens = DefaultPoolConfigurator.calculate_pool_sizes(me, int(budget_bytes), 1).max_total_num_tokens
    conf = SimpleNamespace(model_config=SimpleNamespace(context_len=context), attn_dp_size=1, mambaish_config=None)
    with mock.patch.object(kvc, "get_schedule", lambda: SimpleNamespace(max_running_requests=mrr)):
        reqs = kvc.KVCacheConfigurator.resolve_max_num_reqs(conf, tokens)
    cols = context + 4 + draft_tokens
    if decode:
        rt = DecodeReqToTokenPool(size=reqs, max_context_len=cols, device="meta", enable_memory_saver=False,
                                  pre_alloc_size=0)  # fmt: skip
    else:
        rt = ReqToTokenPool(size=reqs, max_context_len=cols, device="meta", enable_memory_saver=False)
    alloc = TokenToKVPoolAllocator(size=tokens, dtype=None, device="meta", kvcache=None, need_sort=False)
    return SimpleNamespace(tokens=tokens, requests=reqs, budget_bytes=budget_bytes, req_to_token_pool=rt,
                           allocator=alloc)  # fmt: skip


@dataclass
class SimDevice:
    """Driver + caching-allocator arithmetic of one GPU, in MiB. `raw` is memory outside torch (cudaMalloc
    by NCCL/DeepEP, NVSHMEM heap, the CUDA context)."""

    total: float = H200_MIB
    cuda_up: bool = False
    raw: float = 0.0
    allocated: float = 0.0
    cached: float = 0.0  # reserved but not allocated (released by empty_cache)
    pool: float = 0.0  # CUDA-graph private pool: reserved, kept by empty_cache
    peak_allocated: float = 0.0
    peak_reserved: float = 0.0
    resets: list[str] = field(default_factory=list)

    @property
    def reserved(self) -> float:
        return self.allocated + self.cached + self.pool

    @property
    def free(self) -> float:
        return self.total - self.raw - self.reserved

    def _peaks(self) -> None:
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def alloc(self, mib: float) -> None:
        """torch.empty: served from the cache first, else new reserved memory."""
        use = min(self.cached, mib)
        self.cached -= use
        self.allocated += mib
        self._peaks()

    def release(self, mib: float) -> None:
        """A tensor freed: its blocks stay reserved in torch's cache."""
        self.allocated -= mib
        self.cached += mib

    def transient(self, mib: float) -> None:
        """Activations of one forward: allocated, then freed to the cache."""
        self.alloc(mib)
        self.release(mib)

    def graph_pool(self, mib: float) -> None:
        """A CUDA graph's private pool grows (reserved, survives empty_cache)."""
        self.pool += mib
        self._peaks()

    def raw_alloc(self, mib: float) -> None:
        self.raw += mib

    def empty_cache(self, *_: Any) -> None:
        self.cached = 0.0

    def reset_peak_memory_stats(self, *_: Any) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved
        self.resets.append("reset")


class SimProbe:
    """`profiler.measure.probe.snapshot.Probe`'s interface over a SimDevice (the CUDA layer's test double)."""

    def __init__(self, dev: SimDevice, clock: Callable[[], float]) -> None:
        self.dev = dev
        self.clock = clock
        self._torch = SimpleNamespace(
            cuda=SimpleNamespace(empty_cache=dev.empty_cache, reset_peak_memory_stats=dev.reset_peak_memory_stats)
        )

    @property
    def cuda(self) -> bool:
        return self.dev.cuda_up

    @property
    def kind(self) -> str:
        return "gpu"

    def snapshot(self, nvml: bool = True) -> Snapshot:
        s = Snapshot(kind="gpu", t=self.clock(), rss_mib=900.0, rss_peak_mib=900.0)
        if not self.dev.cuda_up:
            return s
        d = self.dev
        s.device, s.free_mib, s.total_mib = 0, d.free, d.total
        s.torch_allocated_mib, s.torch_reserved_mib = d.allocated, d.reserved
        s.torch_peak_allocated_mib, s.torch_peak_reserved_mib = d.peak_allocated, d.peak_reserved
        return s

    def reset_peaks(self) -> None:
        if self.dev.cuda_up:
            self.dev.peak_allocated, self.dev.peak_reserved = self.dev.allocated, self.dev.reserved


class Clock:
    def __init__(self) -> None:
        self.t = 1_780_000_000.0

    def __call__(self) -> float:
        self.t += 0.25
        return self.t


# ---------------------------------------------------------------------------------------------------------
# sglang's objects, as the hooks see them
# ---------------------------------------------------------------------------------------------------------


class _Spec:
    def __init__(self, speculative: bool) -> None:
        self._s = speculative

    def is_speculative(self) -> bool:
        return self._s


def model_runner(draft: bool = False, speculative: bool = False) -> SimpleNamespace:
    """What the hooks read off a ModelRunner (model_runner.py: `self.is_draft_worker`, `self.spec_algorithm`)."""
    return SimpleNamespace(is_draft_worker=draft, spec_algorithm=_Spec(speculative))


class BreakableCudaGraphRunner:
    """The runner class capture_prefill_graph returns for the CUDA default (breakable) backend."""


class DecodeCudaGraphRunner:
    """The runner class capture_decode_graph returns."""


class _Mode:
    """model_executor/forward_batch_info.py ForwardMode, as the runtime hook asks it."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def is_decode(self) -> bool:
        return self.kind == "decode"

    def is_extend(self, include_draft_extend_v2: bool = False) -> bool:
        return self.kind == "extend"


def batch(kind: str, requests: int, tokens: int | None = None) -> SimpleNamespace:
    """A ScheduleBatch as the runtime hook reads it (managers/schedule_batch.py: forward_mode, batch_size(),
    extend_num_tokens, spec_algorithm)."""
    return SimpleNamespace(forward_mode=_Mode(kind), batch_size=lambda: requests, spec_algorithm=None,
                           extend_num_tokens=(tokens or requests) if kind == "extend" else None)  # fmt: skip


class DeepEPBuffer:
    """layers/moe/token_dispatcher/deepep.py `DeepEPBuffer.get_deepep_buffer`: builds the buffer once."""

    _buffer = None

    @classmethod
    def _state(cls) -> SimpleNamespace:
        return SimpleNamespace(buffer=cls._buffer)


class Sim:
    """One scheduler process: a device, a recorder, and the hooks the plugin installs."""

    def __init__(self, out_dir: Path, pid: int, tp_rank: int = 0) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.dev = SimDevice()
        self.clock = Clock()
        self.rec = Recorder(str(out_dir), probe=SimProbe(self.dev, self.clock))  # type: ignore[arg-type]
        self.rec.pid = pid
        self.rec.path = str(out_dir / f"probe-{pid}.jsonl")
        self.rec.start_record = {"type": "start", "kind": "gpu", "sglang_version": "0.5.23", "targets": []}
        self.tp_rank = tp_rank
        self.pre_mib: float | None = None
        self.rec.guard_peak_resets()

    def hook(self, kind: str, phase: str) -> Callable[..., Any]:
        return plugin._HOOKS[kind](self.rec, phase)

    def call(self, kind: str, phase: str, body: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.hook(kind, phase)(body, *args, **kwargs)

    def close(self) -> None:
        self.rec.close()

    # --- the startup steps ------------------------------------------------------------------------------
    def init_parallel(self, context_mib: float = 520.0, nccl_mib: float = 280.0, parallel: Any = None) -> None:
        """distributed/bootstrap.py `init_parallel_runtime`: no CUDA context before it; NCCL after. `parallel`:
        sglang's ParallelContext as `get_parallel()` returns it (runtime_context.py), read by the probe's REAL
        ranks hook (plugin._ranks_after)."""

        def body() -> None:
            self.dev.cuda_up = True
            self.dev.raw_alloc(context_mib + nccl_mib)
            if parallel is None:
                self.rec.ranks = {"tp": self.tp_rank}

        if parallel is None:
            self.call("phase", "init_parallel", body)
            return
        fake = SimpleNamespace(get_parallel=lambda: parallel)
        saved = sys.modules.get("sglang.srt.runtime_context")
        sys.modules["sglang.srt.runtime_context"] = fake  # type: ignore[assignment]
        try:
            self.call("ranks", "init_parallel", body)
        finally:
            if saved is None:
                sys.modules.pop("sglang.srt.runtime_context", None)
            else:
                sys.modules["sglang.srt.runtime_context"] = saved

    def baseline(self, draft: bool = False) -> None:
        """bootstrap.py `measure_pre_model_load_memory(*, device, is_draft_worker)`: returns free GiB."""
        if not draft:
            self.pre_mib = self.dev.free
        self.call("baseline", "baseline", lambda **_: self.dev.free / 1024, device="cuda", is_draft_worker=draft)

    def weights(self, mib: float, mr: Any) -> None:
        """model_runner.py `ModelRunner.load_model`."""
        self.call("phase", "weights", lambda _mr: self.dev.alloc(mib), mr)

    def kv_pool(self, mr: Any, *, mfs: float | None = None, decode: bool = False, bpt: float = LLAMA_BPT,
                context: int = LLAMA_CONTEXT, mrr: int | None = None, target: Any = None,
                va_mib: float | None = None, cell: float | None = None, draft_tokens: int = 0) -> Any:  # fmt: skip
        """kv_cache_configurator.py `KVCacheConfigurator.configure` (:457-511) → KVCacheConfigResult, sized the way
        sglang sizes it (`sglang_sizes`: its own functions and pool classes): the budget at `mfs`, the tokens, the
        admitted requests, then the request pools out of the slack. The pool's `mem_usage` is GiB, as its "KV Cache
        is allocated" line prints. `target`: a draft pool (scheduler.py:1097-1110) takes the target's tokens and is
        handed its req_to_token pool and allocator (:478-482) — it builds neither. `va_mib`:
        SGLANG_ENABLE_POST_CAPTURE_KV_SIZING — configure reserves only that VA upper bound (memory_pool.py:2217-2220,
        "VA upper bound", 2088), nothing of it backed (post_capture_backed_bytes 0, memory_pool.py:2725). `cell`: the
        bytes per token the budget is divided by when it is more than this pool's (an EAGLE target's includes the
        draft's, pool_configurator.py:259-300)."""
        self.dev.empty_cache()  # _profile_available_bytes: gc + get_available_gpu_memory(empty_cache=True)
        if target is not None:
            z = SimpleNamespace(tokens=target.max_total_num_tokens, requests=target.max_running_requests,
                                budget_bytes=None, req_to_token_pool=target.req_to_token_pool,
                                allocator=target.token_to_kv_pool_allocator)  # fmt: skip
            handed = (target.req_to_token_pool, target.token_to_kv_pool_allocator)
        elif va_mib is not None:
            z = sglang_sizes(va_mib * 2**20, cell or bpt, context, mrr, decode, draft_tokens)
            handed = (None, None)
        else:
            assert mfs is not None and self.pre_mib is not None
            budget = int((self.dev.free / 1024 - self.pre_mib / 1024 * (1 - mfs)) * (1 << 30))  # :3004-3060
            z = sglang_sizes(budget, cell or bpt, context, mrr, decode, draft_tokens)
            handed = (None, None)
        kv_mib = 0.0 if va_mib is not None else (z.tokens + 1) * bpt / 2**20  # (size + page_size) rows, :2260
        shown = va_mib if va_mib is not None else kv_mib
        cfg = SimpleNamespace(is_draft_worker=mr.is_draft_worker, model_config=SimpleNamespace(context_len=context),
                              req_to_token_pool=handed[0], token_to_kv_pool_allocator=handed[1])  # fmt: skip

        def body(_self: Any) -> Any:
            if z.budget_bytes is not None:
                self.call("budget", "kv_pool", lambda _c, _pre: z.budget_bytes, cfg, self.pre_mib / 1024)
            own = 0.0 if handed[0] is not None else _tensor_mib(z.req_to_token_pool.req_to_token)
            own += 0.0 if handed[1] is not None else sum(_tensor_mib(t) for t in (z.allocator.free_pages,
                                                                                 z.allocator.release_pages))
            self.dev.alloc(kv_mib + own)
            pool = SimpleNamespace(mem_usage=shown / 1024, dtype="torch.bfloat16",
                                   post_capture_active=va_mib is not None, post_capture_backed_bytes=0)  # fmt: skip
            return SimpleNamespace(max_total_num_tokens=z.tokens, token_to_kv_pool=pool,
                                   max_running_requests=z.requests, req_to_token_pool=z.req_to_token_pool,
                                   token_to_kv_pool_allocator=z.allocator)  # fmt: skip

        return self.call("kv", "kv_pool", body, cfg)

    def post_capture_resize(self, kv_mib: float, tokens: int) -> None:
        """scheduler.py:1172-1180 → model_runner.py:1061 `post_capture_resize_kv_pool(*, draft_runners)` →
        kv_pool_runtime.py:59-153: the final span is backed (kv_vmm_backing.py: VMM, outside torch's allocator)
        and `max_total_num_tokens` set to the resized pool."""
        pool = SimpleNamespace(post_capture_backed_bytes=0)
        mr = SimpleNamespace(max_total_num_tokens=None, token_to_kv_pool=pool, is_draft_worker=False)

        def body(runner: Any, *, draft_runners: tuple = ()) -> None:
            self.dev.raw_alloc(kv_mib)
            pool.post_capture_backed_bytes = int(kv_mib * 2**20)
            runner.max_total_num_tokens = tokens

        self.call("resize", "post_capture_resize", body, mr, draft_runners=())

    def unhooked(self, mib: float) -> None:
        """An allocation sglang makes between hooked windows, which no hook sees: it lands in `unattributed`."""
        self.dev.alloc(mib)

    def attention_backends(self, mib: float, mr: Any) -> None:
        self.call("phase", "attention_backends", lambda _mr: self.dev.alloc(mib), mr)

    def draft_multistep_backends(self, mib: float) -> None:
        """eagle_worker_v2.py:276-284 `EagleDraftWorker.init_attention_backends`: the draft ModelRunner's own
        `init_attention_backends` (its own window, above), then `self.init_attention_backend()` (:391-420):
        DraftBackendFactory's multi-step decode backend — one backend per draft step (e.g. flashinfer_backend.py
        FlashInferMultiStepDraftBackend: `kv_indptr` (num_steps, max_bs + 1) and a backend per step;
        flashattention_backend.py:3482-3503 FlashAttentionMultiStepBackend) — and the draft-extend backend.
        memfrac hooks it (targets.py: `attention_backends`, kind draft): a sibling window after the
        ModelRunner's, role draft."""
        worker = SimpleNamespace(draft_runner=model_runner(draft=True, speculative=True))
        self.call("draft", "attention_backends", lambda _w: self.dev.alloc(mib), worker)

    def sampling_prewarm(self, borrow: bool = False) -> None:
        """scheduler.py:1160-1171, right after `init_all_cuda_graphs` (:1146), on the forward stream:
        `prewarm_graph_pool_borrow()` (runner_utils/pool.py:177-184) calls torch.cuda.current_blas_handle() only
        when SGLANG_ENABLE_GRAPH_POOL_BORROW (environ.py:1650, default False): torch allocates the forward
        stream's cuBLAS workspace through its caching allocator, 4,096 KiB × 8 = 32 MiB on sm90 (torch's
        CublasHandlePool default `:4096:8`). Then `prewarm_sampling()`: ModelRunner's only returns an empty
        SamplingPrewarmResult (model_runner.py:1165-1168) and an EAGLE worker's is the target's
        (base_spec_worker.py:240-241) — nothing allocated. No memfrac hook: lands in `unattributed`."""
        if borrow:
            self.unhooked(CUBLAS_WORKSPACE_MIB)

    def init_overlap(self) -> None:
        """scheduler.py:692 `self.init_overlap()` (after init_disaggregation, :689) → :1664-1686: FutureMap is
        always on (:1667), overlap or not: `spec_algorithm.create_future_map` (spec_info.py:185-200) →
        overlap_utils.py:304-322 `output_tokens_buf` and `new_seq_lens_buf`, int64 × req_pool_size each (2 ×
        2,049 × 8 B = 32 KiB), plus streams (no memory). Sub-MiB tensors are carved from a fresh 2 MiB
        small-block segment of torch's caching allocator (the capture's empty_cache left none cached): 2 MiB
        reserved. No memfrac hook: lands in `unattributed`."""
        self.unhooked(FUTURE_MAP_MIB)

    def eager_runner(self, static_mib: float, warmup_mib: float, mr: Any) -> None:
        """runner/eager_runner.py `EagerRunner.__init__(model_runner)`: the fixed-max static buffer, then a
        warm-up forward whose activations stay in torch's cache (cuda_graph_setup.py capture_cuda_graphs)."""

        def body(_self: Any, _mr: Any) -> None:
            self.dev.alloc(static_mib)
            self.dev.transient(warmup_mib)

        self.call("phase", "eager_runner", body, object(), mr)

    def prefill_graph(
        self, pool_mib: float, warmup_mib: float, mr: Any, precarve_reset: bool = False, inside: Any = None,
        exec_mib: float = 0.0,
    ) -> None:
        """cuda_graph_setup.py `capture_prefill_graph`: get_available_gpu_memory(empty_cache=True) before
        "Capture … prefill CUDA graph begin", the largest bucket's warm-up, the graph into the shared pool
        (runner_utils/pool.py), and get_available_gpu_memory(empty_cache=True) again before "… end".
        `precarve_reset`: runner_utils/pool.py GraphPoolPrecarve.measure — torch.cuda.empty_cache();
        torch.cuda.reset_peak_memory_stats() — between warm-up and capture (SGLANG_ENABLE_GRAPH_POOL_PRECARVE).
        `exec_mib`: the graphs' own memory outside torch (cudaGraphExec objects) — all sglang's prefill-graph term
        counts (memory_hook.py:385). Returns a GraphCapture (cuda_graph_setup.py:483-493) with a capturing runner."""

        def body(*, model_runner: Any, eager_runner: Any) -> Any:
            self.dev.empty_cache()
            self.dev.transient(warmup_mib)
            if precarve_reset:
                self.dev.empty_cache()
                self.rec.probe._torch.cuda.reset_peak_memory_stats()
            if inside is not None:
                inside()
            self.dev.graph_pool(pool_mib)
            self.dev.raw_alloc(exec_mib)
            self.dev.empty_cache()
            return SimpleNamespace(runner=BreakableCudaGraphRunner())

        self.call("prefill", "prefill_graph", body, model_runner=mr, eager_runner=object())

    def decode_graph(
        self, rungs: list[tuple[int, float]], mr: Any, inside_first: Any = None, warmup_cached_mib: float = 0.0
    ) -> None:
        """cuda_graph_setup.py `capture_decode_graph`: empty_cache, then DecodeCudaGraphRunner captures
        `reversed(self.capture_bs)` (decode_cuda_graph_runner.py `_capture_one_stream`), one
        `capture_one_shape(bs, forward, …)` each; the first capture's warm-up runs the first MoE dispatch
        (where DeepEP creates its buffer: `inside_first`). `rungs`: (bs, pool growth) in capture order."""
        ladder = self.hook("ladder", "decode_graph")

        def body(*, model_runner: Any) -> None:
            self.dev.empty_cache()
            runner = object()
            for i, (bs, grow) in enumerate(rungs):

                def one(_runner: Any, size: int, _forward: Any, _grow: float = grow, _first: bool = i == 0) -> None:
                    if _first and inside_first is not None:
                        inside_first()
                    if _first and warmup_cached_mib:  # the largest bs's warm-up forwards, cached until the end
                        self.dev.transient(warmup_cached_mib)
                    self.dev.graph_pool(_grow)

                ladder(one, runner, bs, None)
            self.dev.empty_cache()
            return SimpleNamespace(runner=DecodeCudaGraphRunner())

        self.call("decode", "decode_graph", body, model_runner=mr)

    def deepep_buffer(self, mib: float) -> None:
        """The first `DeepEPBuffer.get_deepep_buffer(group, hidden, param_bytes, mode, tokens, experts)`:
        deep_ep/buffers/legacy.py allocates the NVL buffer (cudaMalloc/IPC) and the RDMA buffer in the
        NVSHMEM heap — outside torch's allocator. The probe records it as phase a2a_buffer, backend deepep."""

        def get_deepep_buffer(cls: Any, group: Any, hidden_size: int, param_bytes: int, deepep_mode: str,
                              num_max_dispatch_tokens_per_rank: int, num_experts: int) -> None:  # fmt: skip
            self.dev.raw_alloc(mib)
            cls._buffer = object()

        DeepEPBuffer._buffer = None
        hook = plugin.a2a_hook(self.rec, "deepep", "sglang.srt.layers.moe.token_dispatcher.deepep.DeepEPBuffer")
        hook(get_deepep_buffer, DeepEPBuffer, None, 7168, 2, "low_latency", 128, 256)

    def finalize(self, mib: float, mr: Any) -> None:
        """cuda_graph_setup.py `finalize_cuda_graph_capture(model_runner)`."""
        self.call("phase", "finalize", lambda _mr: self.dev.alloc(mib), mr)

    def draft_graph(self, phase: str, rungs: list[tuple[int, float]]) -> None:
        """eagle_worker_v2.py `_capture_cuda_graphs`: `EAGLEDraftCudaGraphRunner(self)` /
        `EAGLEDraftExtendCudaGraphRunner(self)` capture in __init__, each through its own capture_one_shape."""
        ladder = self.hook("ladder", phase)

        def body(_self: Any, _worker: Any) -> None:
            self.dev.empty_cache()
            for bs, grow in rungs:
                ladder(lambda _r, size, _f, _g=grow: self.dev.graph_pool(_g), object(), bs, None)

        self.call("draft", phase, body, object(), SimpleNamespace(draft_runner=model_runner(draft=True)))

    def disaggregation_init(self, mib: float) -> None:
        """managers/scheduler.py `Scheduler.init_disaggregation` (PD roles)."""
        self.call("phase", "disaggregation_init", lambda _s: self.dev.alloc(mib), object())

    def startup(self, mr: Any, mfs: float, decode: bool = False) -> Any:
        """The steps every scenario shares, up to the graphs: NCCL, baseline, weights 15,400, the KV pool sglang
        sizes at `mfs` (with its request pools), attention backends 60, the eager runner (static 240, warm-up 700)."""
        self.init_parallel()
        self.baseline()
        self.weights(15400.0, mr)
        kv = self.kv_pool(mr, mfs=mfs, decode=decode)
        self.attention_backends(60.0, mr)
        self.eager_runner(240.0, 700.0, mr)
        return kv

    def serve(self, batches: list[tuple[float, SimpleNamespace | None, bool | None]]) -> None:
        """managers/scheduler.py `Scheduler.run_batch(batch)` per (activation MiB, batch, graph replayed); the first
        is sglang's own warm-up request. Activations are freed to torch's cache at the end of each batch; the result
        says whether the batch replayed a CUDA graph (managers/utils.py GenerationBatchResult.can_run_cuda_graph)."""
        hook = self.hook("runtime", "runtime")
        for act, b, graph in batches:
            res = SimpleNamespace(can_run_cuda_graph=graph)
            hook(lambda _s, _b, _a=act, _r=res: (self.dev.transient(_a), _r)[1], object(), b or object())
        self.rec.flush_runtime()


# ---------------------------------------------------------------------------------------------------------
# The scenarios (MiB). Llama-3.1-8B bf16 KV: 2 × 32 layers × 8 heads × 128 × 2 B = 131,072 B per token.
# ---------------------------------------------------------------------------------------------------------

#: Allocations sglang makes between hooked windows (no memfrac hook sees them: they are `unattributed`).
CUBLAS_WORKSPACE_MIB = 32.0  # prewarm_graph_pool_borrow, SGLANG_ENABLE_GRAPH_POOL_BORROW (Sim.sampling_prewarm)
FUTURE_MAP_MIB = 2.0  # init_overlap's FutureMap, every life (Sim.init_overlap)
#: A hooked one: the EAGLE draft's multi-step attention backends (EagleDraftWorker.init_attention_backend).
DRAFT_MULTISTEP_MIB = 16.0
DECODE_RUNGS = [(256, 900.0), (128, 20.0), (64, 10.0), (32, 6.0), (16, 4.0), (8, 2.0), (4, 2.0), (2, 2.0), (1, 2.0)]


def record_run(out: Path, mode: str, mfs: float, kv: Any, load: list[dict[str, Any]] | None = None,
               draft_tokens: int | None = None) -> dict[str, Any]:
    """What `memfrac run` stores beside the probe: server_info.json as sglang 0.5.23 reports it (resolved args; the
    CLI's max_running_requests unresolved, None — http_server.py build_server_info; per DP rank
    `effective_max_running_requests_per_dp` and the token capacity, internal_state.py:73, :77-90) and load.json with
    the plan the corrected driver (profiler.measure.runner.load.plan_load) makes of it — or `load`, an older
    driver's plan, as given."""
    from profiler.measure.runner.load import LoadResult, plan_load

    info = {"version": "0.5.23", "mem_fraction_static": mfs, "disaggregation_mode": mode,
            "chunked_prefill_size": 8192, "max_prefill_tokens": 16384, "max_running_requests": None,
            "max_total_tokens": None, "max_req_input_len": LLAMA_CONTEXT - 5, "num_reserved_decode_tokens": 512,
            "speculative_num_draft_tokens": draft_tokens,
            "internal_states": [{"effective_max_running_requests_per_dp": kv.max_running_requests,
                                 "memory_usage": {"token_capacity": kv.max_total_num_tokens}}]}  # fmt: skip
    (out / "server_info.json").write_text(json.dumps(info))
    if load is None:
        load = [LoadResult(p, sent=p.requests, ok=p.requests).as_dict() for p in plan_load(mode, info)]
    (out / "load.json").write_text(json.dumps(load))
    return info


def decode_plan(info: dict[str, Any]) -> Any:
    from profiler.measure.runner.load import plan_load

    return next(p for p in plan_load(str(info["disaggregation_mode"]), info) if p.kind == "decode")


def unified(out: Path) -> None:
    """A unified worker at sglang's 0.903: prefill graph first (a 500 MiB torch pool, 30 MiB of graph execs outside
    torch, a 1,500 MiB warm-up, a precarve peak reset inside), then decode graphs reusing its pool (growth beyond it:
    400 at bs 256). With SGLANG_ENABLE_GRAPH_POOL_PRECARVE and SGLANG_ENABLE_GRAPH_POOL_BORROW: after capture the
    sampling prewarm makes the forward stream's cuBLAS workspace (32, unhooked; scheduler.py:1167);
    init_disaggregation makes nothing without a PD role (its empty window is left out); init_overlap's FutureMap
    (2, unhooked; scheduler.py:692). Served by the corrected driver: sglang's warm-up (one request, 300), chunks of
    8,192 tokens replaying in the graph pool (250 more), then every admitted request the pool holds at once
    decoding eager (2,600: logits of [n, 128,256] in bf16 and fp32, layers/logits_processor.py)."""
    s = Sim(out / "probe", 1001)
    mr = model_runner()
    kv = s.startup(mr, 0.903)
    s.prefill_graph(500.0, 1500.0, mr, precarve_reset=True, exec_mib=30.0)
    s.decode_graph([(256, 400.0), *DECODE_RUNGS[1:]], mr)
    s.finalize(20.0, mr)
    s.sampling_prewarm(borrow=True)
    s.init_overlap()
    info = record_run(out, "null", 0.903, kv)
    n = decode_plan(info).reachable_requests
    s.serve([(300.0, batch("extend", 1, 16), False), (250.0, batch("extend", 1, 8192), True),
             (2600.0, batch("decode", n), False), (200.0, batch("decode", 64), True)])  # fmt: skip
    s.close()


def decode(out: Path, deepep: bool = False, load64: bool = False) -> None:
    """A PD decode worker at sglang's 0.929 (0.915 with DeepEP): no prefill graph (role gating), decode graphs with
    their own 900 MiB pool, the warm-up request (1,800 MiB of activations) before the corrected driver's burst —
    every request the pool holds at once (it admits 3,669; with 512 tokens kept free per request,
    disaggregation/decode.py:2052-2058, it holds 1,778) decoding eager: 2,300 MiB (logits [1,778, 128,256] in bf16
    and fp32 alone are 1,305 MiB, layers/logits_processor.py). `deepep`: the DeepEP buffer (2,500 MiB, outside
    torch) and a lazily created NCCL buffer (64 MiB) inside the first decode capture. After capture: the sampling
    prewarm (nothing at the default flags, scheduler.py:1166-1170), init_disaggregation 30 (scheduler.py:689) and
    init_overlap's FutureMap 2 (unhooked, scheduler.py:692). `load64`: the driver before issue 26 — 64 requests (it
    read /server_info's unresolved max_running_requests as None and fell back to 64), every step a graph replay
    of bs ≤ 256: warm-up 20, then 40."""
    mfs = 0.915 if deepep else 0.929
    s = Sim(out / "probe", 2001 if not deepep else 3001)
    mr = model_runner()
    kv = s.startup(mr, mfs, decode=True)
    first = None
    if deepep:

        def first() -> None:
            s.deepep_buffer(2500.0)
            s.dev.raw_alloc(64.0)

    s.decode_graph(DECODE_RUNGS, mr, inside_first=first)
    s.finalize(20.0, mr)
    s.sampling_prewarm()
    s.disaggregation_init(30.0)
    s.init_overlap()
    if load64:
        old = {"kind": "decode", "requests": 64, "concurrency": 64, "input_len": 16, "output_len": 256}
        record_run(out, "decode", mfs, kv, load=[{"plan": old, "sent": 64, "ok": 64, "failed": 0}])
        s.serve([(20.0, batch("decode", 1), True), (40.0, batch("decode", 64), True)])
    else:
        n = decode_plan(record_run(out, "decode", mfs, kv)).reachable_requests
        s.serve([(1800.0, batch("decode", 1), True), (2300.0, batch("decode", n), False),
                 (2000.0, batch("decode", n - 200), False)])  # fmt: skip
    s.close()


def decode_oom(out: Path) -> None:
    """The decode node given --mem-fraction-static 0.975, above what it needs: slack 142,971 × 0.025 = 3,574.275, of
    which the request pools take 1,945.1 (991,973 tokens admit 3,874 requests) — 1,629.0 after the KV window, 329.0
    at the serving baseline after the graphs (the decode node's), and the corrected driver's first eager burst asks
    for 2,300: the worker dies with CUDA out of memory while serving. memfrac run records that failure in run.json
    (profiler/measure/runner/classify.py reads it from the worker's log); the probe kept what came before."""
    s = Sim(out / "probe", 2101)
    mr = model_runner()
    kv = s.startup(mr, 0.975, decode=True)
    s.decode_graph(DECODE_RUNGS, mr)
    s.finalize(20.0, mr)
    s.sampling_prewarm()
    s.disaggregation_init(30.0)
    s.init_overlap()
    record_run(out, "decode", 0.975, kv)
    s.serve([(20.0, batch("decode", 1), True)])
    s.close()
    (out / "run.json").write_text(json.dumps({"status": "failed", "failure": {
        "kind": "oom_runtime", "phase": "runtime", "message": "torch.OutOfMemoryError: CUDA out of memory. Tried to "
        "allocate 2.25 GiB. GPU 0 has a total capacity of 140.40 GiB of which 329.00 MiB is free."}}))  # fmt: skip


def prefill(out: Path) -> None:
    """A PD prefill worker at sglang's 0.907: the breakable prefill graph only — a 900 MiB torch pool where every
    chunk replays (activation memory by sglang's meaning: memory_hook.py:385) and 40 MiB of graph execs outside
    torch (the prefill-graph term's own memory), warm-up 1,200 —; the sampling prewarm (nothing at the default
    flags), init_disaggregation 30, init_overlap's FutureMap 2 (unhooked, scheduler.py:692). Served by the corrected
    driver: chunks of 8,192 tokens replaying in the pool, 150 MiB above the serving baseline."""
    s = Sim(out / "probe", 4001)
    mr = model_runner()
    kv = s.startup(mr, 0.907)
    s.prefill_graph(900.0, 1200.0, mr, exec_mib=40.0)
    s.finalize(20.0, mr)
    s.sampling_prewarm()
    s.disaggregation_init(30.0)
    s.init_overlap()
    record_run(out, "prefill", 0.907, kv)
    s.serve([(100.0, batch("extend", 1, 16), True), (150.0, batch("extend", 1, 8192), True),
             (120.0, batch("extend", 16, 8192), True)])  # fmt: skip
    s.close()


def eagle(out: Path) -> None:
    """A unified EAGLE worker (4 draft tokens) at sglang's 0.903: the draft ModelRunner repeats baseline, weights,
    kv_pool, attention backends, eager runner and finalize (eagle_worker_v2.py builds TpModelWorker(is_draft_worker
    =True)); the target's budget is divided by the target's and the draft's bytes per token together
    (pool_configurator.py:259-300: 131,072 + a one-layer draft's 4,096), the draft's pool takes the target's tokens
    and is handed its request pools (kv_cache_configurator.py:478-482); req_to_token rows carry 4 + 4 extra columns
    (allocation_sizing.py:95-116). The target's capture_decode_graph captures the verify graph; the draft's own
    graphs come from its runners' __init__. scheduler.py:1113-1117 init_all_attention_backends: the target's, then
    the draft's (its ModelRunner's 20, then the multi-step backends 16 in their own hooked window,
    eagle_worker_v2.py:283-284); after every capture the sampling prewarm (the target's: nothing,
    base_spec_worker.py:240-241) and init_overlap's FutureMap 2 (unhooked, scheduler.py:692)."""
    s = Sim(out / "probe", 5001)
    target, draft = model_runner(speculative=True), model_runner(draft=True, speculative=True)
    s.init_parallel()
    s.baseline()
    s.weights(15400.0, target)
    s.baseline(draft=True)
    s.weights(900.0, draft)
    kv = s.kv_pool(target, mfs=0.903, cell=LLAMA_BPT + 4096.0, draft_tokens=4)
    s.kv_pool(draft, bpt=4096.0, target=kv)
    s.attention_backends(60.0, target)
    s.attention_backends(20.0, draft)
    s.draft_multistep_backends(DRAFT_MULTISTEP_MIB)
    s.eager_runner(240.0, 700.0, target)
    s.prefill_graph(500.0, 1200.0, target)
    s.decode_graph([(64, 1100.0), (32, 20.0), (16, 10.0), (8, 6.0), (4, 4.0), (2, 2.0), (1, 2.0)], target)
    s.finalize(20.0, target)
    s.eager_runner(50.0, 100.0, draft)
    s.finalize(0.0, draft)
    s.draft_graph("draft_graph", [(64, 280.0), (32, 10.0), (16, 10.0)])
    s.draft_graph("draft_extend_graph", [(64, 140.0), (32, 10.0)])
    s.sampling_prewarm()
    s.init_overlap()
    info = record_run(out, "null", 0.903, kv, draft_tokens=4)
    n = decode_plan(info).reachable_requests
    s.serve([(1500.0, batch("extend", 1, 16), False), (1200.0, batch("extend", 1, 8192), True),
             (1900.0, batch("decode", n), False)])  # fmt: skip
    s.close()


# ---------------------------------------------------------------------------------------------------------
# The selfcheck worker life (profiler/selfcheck/life.py) on the simulated device: the same `drive_life`, the
# same hooks and plan as the GPU run, so the same judge runs in CI. Footprints the plan leaves to the allocator
# are chosen here (MiB): a forward's intermediates are 9 hidden-state rows of 2 KiB per row alive at once
# (16,384 rows: 288), the prefill family's pool 144 + 2, the decode family's growth beyond it 260 + 2 + 2, each
# graph executable 0.5 outside torch, the CUDA context 520.
# ---------------------------------------------------------------------------------------------------------

SIM_CONTEXT_MIB = 520.0
SIM_EXEC_MIB = 0.5
SIM_PREFILL_POOL = {8192: 144.0, 4096: 0.0, 2048: 0.0, 1024: 2.0}
SIM_DECODE_POOL = {64: 260.0, 32: 0.0, 16: 2.0, 8: 0.0, 4: 0.0, 2: 2.0, 1: 0.0}
SIM_PREFILL_TRANSIENT = 150.0
SIM_SERVE_TRANSIENT = 2.0


def _rows_transient(rows: int) -> float:
    return 9 * rows * 2048 / 2**20


class SimLife:
    """`profiler.selfcheck.life.LifeDevice` on a SimDevice. `flaw` makes the life misbehave the way a worker (or
    a regression) would, so each check can be shown to fire: weights_extra (64 MiB more inside the weights
    window), kv_extra (a 400 MiB req_to_token pool beside the KV), a2a_unhooked (the buffer made behind the
    deepep hook, as when its target fails to resolve), nccl_in_capture (a lazily made 64 MiB NCCL buffer inside
    the first decode capture)."""

    def __init__(self, sim: Sim, flaw: str = "") -> None:
        self.s, self.dev, self.flaw = sim, sim.dev, flaw
        self.prefill_pool: float | None = None
        self.rungs: list[tuple[int, float | None]] = []
        self.peak_free: float | None = None
        self.a2a_made = False

    def init_parallel(self) -> None:
        self.dev.cuda_up = True
        self.dev.raw_alloc(SIM_CONTEXT_MIB)

    def free_gib(self, **_: Any) -> float:
        return self.dev.free / 1024

    def load_weights(self, _mr: Any) -> None:
        self.dev.alloc(life.WEIGHTS_MIB)
        if self.flaw == "weights_extra":
            self.dev.raw_alloc(64.0)

    def configure_kv(self, _cfg: Any) -> Any:
        self.dev.alloc(life.KV_MIB + (400.0 if self.flaw == "kv_extra" else 0.0))
        pool = SimpleNamespace(mem_usage=life.KV_MIB / 1024, dtype="torch.bfloat16")
        tokens = life.KV_MIB * 2**20 // life.KV_BYTES_PER_TOKEN
        return SimpleNamespace(max_total_num_tokens=tokens, token_to_kv_pool=pool, max_running_requests=256)

    def eager_runner(self, _runner: Any, _mr: Any) -> None:
        self.dev.alloc(life.EAGER_STATIC_MIB)
        self.dev.transient(_rows_transient(life.MAX_ROWS))

    def _capture(self, grow: float) -> None:
        self.dev.empty_cache()  # torch.cuda.graph.__enter__
        self.dev.graph_pool(grow)
        self.dev.raw_alloc(SIM_EXEC_MIB)

    def capture_prefill(self, *, model_runner: Any, eager_runner: Any) -> None:
        self.dev.empty_cache()
        self.dev.transient(life.PREFILL_WARMUP_MIB + SIM_PREFILL_TRANSIENT)
        self.dev.empty_cache()
        self.s.rec.probe._torch.cuda.reset_peak_memory_stats()  # GraphPoolPrecarve.measure (guarded or not)
        for n in life.PREFILL_TOKENS:
            self._capture(SIM_PREFILL_POOL[n])
        self.prefill_pool = self.dev.pool
        self.dev.empty_cache()

    def decode_begin(self) -> None:
        self.dev.empty_cache()

    def capture_one_shape(self, _runner: Any, bs: int, forward: Callable[[], Any]) -> None:
        if self.flaw != "a2a_unhooked":
            forward()
        elif not self.a2a_made:  # made once, behind the hook's back
            self.dev.raw_alloc(life.A2A_MIB)
            self.a2a_made = True
        if self.flaw == "nccl_in_capture" and bs == life.DECODE_BS[0]:
            self.dev.raw_alloc(64.0)
        self.dev.transient(_rows_transient(bs * life.ROWS_PER_BS))
        self._capture(SIM_DECODE_POOL[bs])
        self.rungs.append((bs, self.dev.pool))

    def decode_end(self) -> None:
        self.dev.empty_cache()

    def a2a_buffer(self, state: Any, *_: Any) -> Any:
        if state.buffer is None:
            self.dev.raw_alloc(life.A2A_MIB)
            state.buffer = object()
        return state.buffer

    def run_batch(self, _scheduler: Any, batch: Any) -> None:
        mib = batch.act_mib + SIM_SERVE_TRANSIENT
        self.dev.alloc(mib)
        if batch.index == 0:
            self.peak_free = self.dev.free
        self.dev.release(mib)

    def truth(self) -> life.LifeTruth:
        return life.plan_truth(
            prefill_pool_mib=self.prefill_pool,
            decode_rungs=tuple(self.rungs),
            serving_peak_free_mib=self.peak_free,
            prefill_transient_mib=SIM_PREFILL_TRANSIENT,
            serve_transient_mib=SIM_SERVE_TRANSIENT,
            graph_exec_mib=life.N_GRAPHS * SIM_EXEC_MIB,
        )


def selfcheck_life(out: Path, flaw: str = "", guard: bool = True) -> life.LifeTruth:
    """The selfcheck worker life on the simulated device; writes probe-6001.jsonl and truth.json to `out`.
    `guard=False`: without the recorder's guard around torch's peak reset (sglang's resets clobber windows)."""
    s = Sim(out, 6001)
    if not guard:
        s.rec.probe._torch.cuda.reset_peak_memory_stats = s.dev.reset_peak_memory_stats
    dev = SimLife(s, flaw)
    life.drive_life(s.rec, dev)
    s.close()
    truth = dev.truth()
    (out / "truth.json").write_text(json.dumps(truth.as_dict()))
    return truth


def post_capture(out: Path) -> None:
    """A PD decode worker with SGLANG_ENABLE_POST_CAPTURE_KV_SIZING: configure reserves a 125,000 MiB VA upper
    bound (1,000,000 tokens) and backs nothing but the request pools it sizes from those tokens (3,906 requests:
    req_to_token 3,907 × 131,076 × 4 B, the allocator's index 1,000,000 × 8 B); graphs as `decode`; sampling prewarm
    (scheduler.py:1166-1170, 16 MiB, unhooked); the resize backs 120,000 MiB = 960,000 tokens; disaggregation
    init 30; overlap init's future map (scheduler.py:692 init_overlap → 1664, 8 MiB, unhooked); serving: the
    warm-up 1,800, the corrected driver's burst 2,300."""
    s = Sim(out / "probe", 8001)
    mr = model_runner()
    s.init_parallel()
    s.baseline()
    s.weights(15400.0, mr)
    kv = s.kv_pool(mr, va_mib=125000.0, decode=True)
    s.attention_backends(60.0, mr)
    s.eager_runner(240.0, 700.0, mr)
    s.decode_graph(DECODE_RUNGS, mr)
    s.finalize(20.0, mr)
    s.unhooked(16.0)  # prewarm_graph_pool_borrow / prewarm_sampling
    s.post_capture_resize(120000.0, 960000)
    s.disaggregation_init(30.0)
    s.unhooked(8.0)  # init_overlap: future map
    n = decode_plan(record_run(out, "decode", 0.988, SimpleNamespace(
        max_running_requests=kv.max_running_requests, max_total_num_tokens=960000))).reachable_requests
    s.serve([(1800.0, batch("decode", 1), True), (2300.0, batch("decode", n), False)])
    s.close()


class Parallel(SimpleNamespace):
    """runtime_context.py ParallelContext, as get_parallel() gives it to a plain-DP replica (--dp-size 2, no
    attention DP): dp_rank from the DP controller (scheduler.py:6324), attn_dp_rank 0 (runtime_context.py:82-90)."""


def plain_dp(out: Path) -> None:
    """`--dp-size 2` without attention DP, decode nodes at 0.929: two replicas (data_parallel_controller.py:426-442,
    one scheduler each), both TP0. Replica 0 serves a 2,270 MiB peak, replica 1 a 6,270 MiB one: replica 1 is
    judged."""
    kv = None
    for dp, peak in ((0, 2270.0), (1, 6270.0)):
        s = Sim(out / "probe", 9001 + dp)
        mr = model_runner()
        par = Parallel(tp_rank=0, pp_rank=0, dp_rank=dp, attn_dp_rank=0, moe_ep_rank=0, tp_size=1, pp_size=1,
                       num_dp_ranks=2, attn_dp_size=1, moe_ep_size=1)  # fmt: skip
        s.init_parallel(parallel=par)
        s.baseline()
        s.weights(15400.0, mr)
        kv = s.kv_pool(mr, mfs=0.929, decode=True)
        s.attention_backends(60.0, mr)
        s.eager_runner(240.0, 700.0, mr)
        s.decode_graph(DECODE_RUNGS, mr)
        s.finalize(20.0, mr)
        s.disaggregation_init(30.0)
        s.serve([(1800.0, batch("decode", 1), True), (peak, batch("decode", 1778), False)])
        s.close()
    record_run(out, "decode", 0.929, kv)


def decode_deepep_ladder(out: Path) -> None:
    """`decode-deepep`'s startup with the largest bs's warm-up (300 MiB) cached through the capture and no
    serving: the lowest free reading inside the capture (its ladder) is the worst point."""
    s = Sim(out / "probe", 3101)
    mr = model_runner()
    s.startup(mr, 0.915, decode=True)

    def first() -> None:
        s.deepep_buffer(2500.0)
        s.dev.raw_alloc(64.0)

    s.decode_graph(DECODE_RUNGS, mr, inside_first=first, warmup_cached_mib=300.0)
    s.finalize(20.0, mr)
    s.disaggregation_init(30.0)
    s.close()


SCENARIOS: dict[str, Callable[[Path], Any]] = {
    "post-capture": post_capture,
    "plain-dp": plain_dp,
    "decode-deepep-ladder": decode_deepep_ladder,
    "unified": unified,
    "decode": decode,
    "decode-deepep": lambda out: decode(out, deepep=True),
    "decode-64": lambda out: decode(out, load64=True),
    "decode-oom": decode_oom,
    "prefill": prefill,
    "eagle": eagle,
    "selfcheck": selfcheck_life,
}


def write_trace(name: str, out_dir: Path) -> Path:
    """Run one scenario through the real probe, laid out as `memfrac run` leaves a run: `out_dir/name/probe/
    probe-<pid>.jsonl`, with server_info.json and load.json beside probe/ (the selfcheck life: its probe file and
    truth.json in `out_dir/name`)."""
    d = out_dir / name
    d.mkdir(parents=True, exist_ok=True)
    for old in [*d.glob("probe-*.jsonl"), *d.glob("probe/probe-*.jsonl")]:
        old.unlink()
    SCENARIOS[name](d)
    return d


def measurement(d: Path, name: str, mode: str) -> Any:
    """A simulated run's Measurement as `memfrac judge` reads it (profiler/face/judge.py measurement_of): its probe
    files, /server_info (the worker's fraction, the resolved args, the ready phase) and the load plan."""
    from profiler.core.measurement import Identity, Measurement
    from profiler.face.judge import probe_dir_of
    from profiler.measure.probe.reader import read_probe_dir
    from profiler.measure.runner.load import serving_of
    from profiler.measure.runner.run import ready_phase

    run = read_probe_dir(probe_dir_of(d))
    m = Measurement(id=name, source="probe", memory_kind="gpu", origin=str(d), scenario=name,
                    identity=Identity(gpu_total_mib=143771.0, mode=mode), ranks=run.ranks)  # fmt: skip
    si, lj = d / "server_info.json", d / "load.json"
    if si.is_file():
        info = json.loads(si.read_text())
        m.args = {k: v for k, v in info.items() if isinstance(v, str | int | float | bool | type(None))}
        m.args_source = "server_info"
        run.ranks[0].phases.append(ready_phase(info))
    if lj.is_file():
        m.serving.update(serving_of(json.loads(lj.read_text())))
    return m


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/memfrac-sim")
    for n in SCENARIOS:
        print(write_trace(n, root))
