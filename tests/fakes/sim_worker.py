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


class DeepEPBuffer:
    """layers/moe/token_dispatcher/deepep.py `DeepEPBuffer.get_deepep_buffer`: builds the buffer once."""

    _buffer = None

    @classmethod
    def _state(cls) -> SimpleNamespace:
        return SimpleNamespace(buffer=cls._buffer)


class Sim:
    """One scheduler process: a device, a recorder, and the hooks the plugin installs."""

    def __init__(self, out_dir: Path, pid: int, tp_rank: int = 0) -> None:
        self.dev = SimDevice()
        self.clock = Clock()
        self.rec = Recorder(str(out_dir), probe=SimProbe(self.dev, self.clock))  # type: ignore[arg-type]
        self.rec.pid = pid
        self.rec.path = str(out_dir / f"probe-{pid}.jsonl")
        self.rec.start_record = {"type": "start", "kind": "gpu", "sglang_version": "0.5.23", "targets": []}
        self.tp_rank = tp_rank
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
        self.call("baseline", "baseline", lambda **_: self.dev.free / 1024, device="cuda", is_draft_worker=draft)

    def weights(self, mib: float, mr: Any) -> None:
        """model_runner.py `ModelRunner.load_model`."""
        self.call("phase", "weights", lambda _mr: self.dev.alloc(mib), mr)

    def kv_pool(self, kv_mib: float, req_to_token_mib: float, bytes_per_token: float, mr: Any,
                tokens: int | None = None, post_capture: bool = False) -> None:  # fmt: skip
        """kv_cache_configurator.py `KVCacheConfigurator.configure` → KVCacheConfigResult (the pool's
        `mem_usage` is GiB, as its "KV Cache is allocated" line prints). `tokens`: a draft pool takes the
        target's token count (scheduler.py:1104-1108: `memory_pool_config=` of the target). `post_capture`:
        SGLANG_ENABLE_POST_CAPTURE_KV_SIZING — `kv_mib` is only the VA upper bound (memory_pool.py:2217-2220,
        "VA upper bound", 2088); nothing of it is backed yet (post_capture_backed_bytes 0, memory_pool.py:2725)."""
        cfg = SimpleNamespace(is_draft_worker=mr.is_draft_worker)

        def body(_self: Any) -> Any:
            self.dev.alloc((0.0 if post_capture else kv_mib) + req_to_token_mib)
            n = tokens if tokens is not None else int(kv_mib * 2**20 // bytes_per_token)
            pool = SimpleNamespace(mem_usage=kv_mib / 1024, dtype="torch.bfloat16", post_capture_active=post_capture,
                                   post_capture_backed_bytes=0)  # fmt: skip
            return SimpleNamespace(max_total_num_tokens=n, token_to_kv_pool=pool, max_running_requests=2048)

        self.call("kv", "kv_pool", body, cfg)

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
        self, pool_mib: float, warmup_mib: float, mr: Any, precarve_reset: bool = False, inside: Any = None
    ) -> None:
        """cuda_graph_setup.py `capture_prefill_graph`: get_available_gpu_memory(empty_cache=True) before
        "Capture … prefill CUDA graph begin", the largest bucket's warm-up, the graph into the shared pool
        (runner_utils/pool.py), and get_available_gpu_memory(empty_cache=True) again before "… end".
        `precarve_reset`: runner_utils/pool.py GraphPoolPrecarve.measure — torch.cuda.empty_cache();
        torch.cuda.reset_peak_memory_stats() — between warm-up and capture (SGLANG_ENABLE_GRAPH_POOL_PRECARVE)."""

        def body(*, model_runner: Any, eager_runner: Any) -> None:
            self.dev.empty_cache()
            self.dev.transient(warmup_mib)
            if precarve_reset:
                self.dev.empty_cache()
                self.rec.probe._torch.cuda.reset_peak_memory_stats()
            if inside is not None:
                inside()
            self.dev.graph_pool(pool_mib)
            self.dev.empty_cache()

        self.call("phase", "prefill_graph", body, model_runner=mr, eager_runner=object())

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

    def startup(self, mr: Any, kv_mib: float) -> None:
        """The steps every scenario shares, up to the graphs: NCCL, baseline, weights 15,400, the KV pool
        (+ req_to_token 400), attention backends 60, the eager runner (static 240, warm-up 700)."""
        self.init_parallel()
        self.baseline()
        self.weights(15400.0, mr)
        self.kv_pool(kv_mib, 400.0, LLAMA_BPT, mr)
        self.attention_backends(60.0, mr)
        self.eager_runner(240.0, 700.0, mr)

    def serve(self, batches: list[float]) -> None:
        """managers/scheduler.py `Scheduler.run_batch` per batch; the first is sglang's own warm-up request.
        Activations are freed to torch's cache at the end of each batch."""
        hook = self.hook("runtime", "runtime")
        for act in batches:
            hook(lambda _s, _b, _a=act: self.dev.transient(_a), object(), object())
        self.rec.flush_runtime()


# ---------------------------------------------------------------------------------------------------------
# The scenarios (MiB). Llama-3.1-8B bf16 KV: 2 × 32 layers × 8 heads × 128 × 2 B = 131,072 B per token.
# ---------------------------------------------------------------------------------------------------------

LLAMA_BPT = 131072.0
#: Allocations sglang makes between hooked windows (no memfrac hook sees them: they are `unattributed`).
CUBLAS_WORKSPACE_MIB = 32.0  # prewarm_graph_pool_borrow, SGLANG_ENABLE_GRAPH_POOL_BORROW (Sim.sampling_prewarm)
FUTURE_MAP_MIB = 2.0  # init_overlap's FutureMap, every life (Sim.init_overlap)
#: A hooked one: the EAGLE draft's multi-step attention backends (EagleDraftWorker.init_attention_backend).
DRAFT_MULTISTEP_MIB = 16.0
DECODE_RUNGS = [(256, 900.0), (128, 20.0), (64, 10.0), (32, 6.0), (16, 4.0), (8, 2.0), (4, 2.0), (2, 2.0), (1, 2.0)]


def unified(out: Path) -> None:
    """A unified worker: prefill graph first, then decode graphs reusing its pool (growth beyond 500 MiB:
    400 at bs 256), a precarve peak reset inside the prefill capture, and a light serving load. With
    SGLANG_ENABLE_GRAPH_POOL_PRECARVE and SGLANG_ENABLE_GRAPH_POOL_BORROW: after capture the sampling prewarm
    makes the forward stream's cuBLAS workspace (32, unhooked; scheduler.py:1167 — borrowing then lets
    step-local eager allocations reuse wholly free graph-pool segments, environ.py:1649, which could only lower
    this light serving draw; it is modelled as plain cached activations); init_disaggregation makes nothing
    without a PD role (its empty window is left out); init_overlap's FutureMap (2, unhooked; scheduler.py:692)."""
    s = Sim(out, 1001)
    mr = model_runner()
    s.startup(mr, 117000.0)
    s.prefill_graph(500.0, 1500.0, mr, precarve_reset=True)
    s.decode_graph([(256, 400.0), *DECODE_RUNGS[1:]], mr)
    s.finalize(20.0, mr)
    s.sampling_prewarm(borrow=True)
    s.init_overlap()
    s.serve([300.0, 250.0, 200.0])
    s.close()


def decode(out: Path, deepep: bool = False) -> None:
    """A PD decode worker: no prefill graph (role gating), decode graphs with their own 900 MiB pool, the
    warm-up request (1,800 MiB of activations) before a 2,300 MiB serving peak. `deepep`: the DeepEP buffer
    (2,500 MiB, outside torch) and a lazily created NCCL buffer (64 MiB) inside the first decode capture.
    After capture: the sampling prewarm (nothing at the default flags, scheduler.py:1166-1170), then
    init_disaggregation 30 (scheduler.py:689) and init_overlap's FutureMap 2 (unhooked, scheduler.py:692)."""
    s = Sim(out, 2001 if not deepep else 3001)
    mr = model_runner()
    s.startup(mr, 117000.0)
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
    s.serve([1800.0, 2300.0, 2000.0])
    s.close()


def prefill(out: Path) -> None:
    """A PD prefill worker: the prefill graph only, chunked-prefill activations of 3,000 MiB while serving;
    the sampling prewarm (nothing at the default flags), init_disaggregation 30, init_overlap's FutureMap 2
    (unhooked, scheduler.py:692)."""
    s = Sim(out, 4001)
    mr = model_runner()
    s.startup(mr, 110000.0)
    s.prefill_graph(500.0, 1200.0, mr)
    s.finalize(20.0, mr)
    s.sampling_prewarm()
    s.disaggregation_init(30.0)
    s.init_overlap()
    s.serve([2500.0, 3000.0])
    s.close()


def eagle(out: Path) -> None:
    """A unified EAGLE worker: the draft ModelRunner repeats baseline, weights, kv_pool, attention backends,
    eager runner and finalize (eagle_worker_v2.py builds TpModelWorker(is_draft_worker=True)); the target's
    capture_decode_graph captures the verify graph; the draft's own graphs come from its runners' __init__.
    scheduler.py:1113-1117 init_all_attention_backends: the target's, then the draft's (its ModelRunner's 20,
    then the multi-step backends 16 in their own hooked window, eagle_worker_v2.py:283-284); after every capture
    the sampling prewarm (the target's: nothing, base_spec_worker.py:240-241) and init_overlap's FutureMap 2
    (unhooked, scheduler.py:692; the spec relay buffers of overlap_utils.py:373-417 are made lazily at the
    first decode that carries them, while serving)."""
    s = Sim(out, 5001)
    target, draft = model_runner(speculative=True), model_runner(draft=True, speculative=True)
    s.init_parallel()
    s.baseline()
    s.weights(15400.0, target)
    s.baseline(draft=True)
    s.weights(900.0, draft)
    s.kv_pool(110000.0, 400.0, LLAMA_BPT, target)
    s.kv_pool(3000.0, 0.0, 4096.0, draft, tokens=880000)  # the target's 110,000 MiB × 8 tokens/MiB
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
    s.serve([1500.0, 1900.0])
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
    bound (1,000,000 tokens) and backs nothing but req_to_token (400); graphs as `decode`; sampling prewarm
    (scheduler.py:1166-1170, 16 MiB, unhooked); the resize backs 120,000 MiB = 960,000 tokens; disaggregation
    init 30; overlap init's future map (scheduler.py:692 init_overlap → 1664, 8 MiB, unhooked); serving 2,300."""
    s = Sim(out, 8001)
    mr = model_runner()
    s.init_parallel()
    s.baseline()
    s.weights(15400.0, mr)
    s.kv_pool(125000.0, 400.0, LLAMA_BPT, mr, post_capture=True)
    s.attention_backends(60.0, mr)
    s.eager_runner(240.0, 700.0, mr)
    s.decode_graph(DECODE_RUNGS, mr)
    s.finalize(20.0, mr)
    s.unhooked(16.0)  # prewarm_graph_pool_borrow / prewarm_sampling
    s.post_capture_resize(120000.0, 960000)
    s.disaggregation_init(30.0)
    s.unhooked(8.0)  # init_overlap: future map
    s.serve([1800.0, 2300.0, 2000.0])
    s.close()


class Parallel(SimpleNamespace):
    """runtime_context.py ParallelContext, as get_parallel() gives it to a plain-DP replica (--dp-size 2, no
    attention DP): dp_rank from the DP controller (scheduler.py:6324), attn_dp_rank 0 (runtime_context.py:82-90)."""


def plain_dp(out: Path) -> None:
    """`--dp-size 2` without attention DP: two replicas (data_parallel_controller.py:426-442, one scheduler each),
    both TP0. Replica 0 serves a 2,270 MiB peak (headroom 8,873 − 2,270 = 6,603), replica 1 a 6,270 MiB one
    (2,603): replica 1 is judged."""
    for dp, peak in ((0, 2270.0), (1, 6270.0)):
        s = Sim(out, 9001 + dp)
        mr = model_runner()
        par = Parallel(tp_rank=0, pp_rank=0, dp_rank=dp, attn_dp_rank=0, moe_ep_rank=0, tp_size=1, pp_size=1,
                       num_dp_ranks=2, attn_dp_size=1, moe_ep_size=1)  # fmt: skip
        s.init_parallel(parallel=par)
        s.baseline()
        s.weights(15400.0, mr)
        s.kv_pool(117000.0, 400.0, LLAMA_BPT, mr)
        s.attention_backends(60.0, mr)
        s.eager_runner(240.0, 700.0, mr)
        s.decode_graph(DECODE_RUNGS, mr)
        s.finalize(20.0, mr)
        s.disaggregation_init(30.0)
        s.serve([1800.0, peak, 2000.0])
        s.close()


def decode_deepep_ladder(out: Path) -> None:
    """`decode-deepep`'s startup with the largest bs's warm-up (300 MiB) cached through the capture and no
    serving: the lowest free reading inside the capture (its ladder) is the worst point."""
    s = Sim(out, 3101)
    mr = model_runner()
    s.startup(mr, 117000.0)

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
    "prefill": prefill,
    "eagle": eagle,
    "selfcheck": selfcheck_life,
}


def write_trace(name: str, out_dir: Path) -> Path:
    """Run one scenario through the real probe; its probe-<pid>.jsonl lands in `out_dir/name`."""
    d = out_dir / name
    d.mkdir(parents=True, exist_ok=True)
    for old in d.glob("probe-*.jsonl"):
        old.unlink()
    SCENARIOS[name](d)
    return d


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/memfrac-sim")
    for n in SCENARIOS:
        print(write_trace(n, root))
