"""MoE all-to-all backends: what each one allocates per GPU, next to what sglang reserves for it.

sglang 0.5.23 accepts twelve `--moe-a2a-backend` values (`MoeA2ABackend` in `srt/layers/moe/utils.py`; the
CLI choices in `srt/arg_groups/fields/exec_.py`). Its memory heuristic reserves for exactly one of them:
`reserve_for_deepep_a2a_mb` adds 2 GiB after the floor when the backend is "deepep" on a node that runs
a decode graph, and `reserve_for_graph_mb` 1 GiB more with a breakable prefill graph. Every other backend
gets nothing, although each allocates a communication buffer of its own, lazily, on the first MoE
dispatch (inside warmup or graph capture, after the KV pool took its share).

Sizes here are pure functions of what sglang passes to the backend's constructor, mirroring the package's
own size function or layout code, each citing its source. Where no formula can be written honestly the
size is `None` with the reason (`Backend.unsized_reason`), never a default. `size_for` dispatches per
backend; `a2a_inputs.inputs_for` derives the inputs from a scenario the way sglang does (EP group = tp, the
backend's dispatch-capacity environment variable, sglang's default when it is unset).

Per backend (sources: sglang 0.5.23 `srt/layers/moe/token_dispatcher/*.py` for what is passed):

| backend | buffer | formula source |
|---|---|---|
| deepep | NVL (normal) + RDMA (low latency) + 32 MiB workspace | profiler.model.deepep (sgl-deep-ep 0.1.2.post1) |
| deepep_v2 | NCCL symmetric window: workspace + ElasticBuffer | profiler.model.deepep.v2_* (DeepEP @ 099d5f2b) |
| mooncake | GDR buffer + 32 MiB workspace | Mooncake mooncake-ep/include/mooncake_ep_buffer.h |
| nixl | RDMA buffer + 32 MiB workspace | nixl examples/device/ep/csrc/config.hpp |
| pplx | per-peer send buffers + bookkeeping | pplx-kernels csrc/all_to_all/{intranode,internode}.cpp |
| flashinfer | MNNVL workspace per rank | flashinfer 0.7.2 comm/trtllm_moe_alltoall.py, csrc/trtllm_moe_alltoall.cu |
| mori, megamoe, flashinfer_megamoe, ascend_fuseep, ascend_tp | — | none: see `Backend.unsized_reason` |
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profiler.core.units import BYTES_PER_GIB, BYTES_PER_MIB
from profiler.model import deepep

MIB = BYTES_PER_MIB
GIB = BYTES_PER_GIB
#: 32 MiB cudaMalloc workspace of the DeepEP-derived buffers (DeepEP, Mooncake EP and NIXL EP alike).
WORKSPACE_32MIB_BYTES = 32 * MIB


@dataclass(frozen=True, slots=True)
class Backend:
    """One `--moe-a2a-backend` value: how sglang sizes its buffer, and what memfrac knows of that size."""

    name: str
    tokens_env: str | None  # the per-rank dispatch capacity sglang reads (None: no buffer to size)
    tokens_default: int | None  # sglang's default for it (None: derived from the configuration)
    tokens_max: int | None  # an upper bound the backend asserts
    reads_deepep_mode: bool  # whether --deepep-mode changes what it does
    platform: str  # "cuda", "rocm" or "npu": where its kernels run
    creation: str  # the sglang function that creates the buffer (first MoE dispatch)
    unsized_reason: str = ""  # why there is no analytic size ("" when there is one)

    @property
    def sized(self) -> bool:
        return not self.unsized_reason


_TD = "sglang.srt.layers.moe.token_dispatcher"
#: sglang 0.5.23's choices, in its own order (srt/arg_groups/fields/exec_.py `moe_a2a_backend`).
BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("none", None, None, None, False, "cuda", ""),
        Backend(
            "deepep", "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 128, 1024, True, "cuda",
            f"{_TD}.deepep.DeepEPBuffer.get_deepep_buffer",
        ),
        Backend(
            "mooncake", "SGLANG_MOONCAKE_EP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 128, 1024, True, "cuda",
            f"{_TD}.mooncake.EPBuffer.get_ep_buffer",
        ),
        Backend(
            "nixl", "SGLANG_NIXL_EP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 128, None, True, "cuda",
            f"{_TD}.nixl.NixlEPBuffer.get_nixl_buffer",
        ),
        Backend(
            "mori", "SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 4096, None, True, "rocm",
            f"{_TD}.moriep.init_mori_op",
            "MoRI runs on ROCm only, and for every bundled model sglang uses MoRI EP v1 (EP v2 is validated on "
            "DeepSeek-V4 alone, moe_hook._mori_epv2_unsupported_reason), whose EpDispatchCombineOp allocates some "
            "fifteen symmetric buffers in src/ops/dispatch_combine/dispatch_combine.cpp with no size function, sized "
            "by kernel type and a mori version sglang does not pin"
        ),
        Backend(
            "ascend_fuseep", None, None, None, False, "npu", "",
            "Ascend NPU only: FuseEP dispatches inside the fused HCCL operator, sglang allocates no buffer of its "
            "own (StandardDispatcher), and HCCL's workspace has no published size function",
        ),
        Backend(
            "flashinfer", "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK", None, None, False, "cuda",
            f"{_TD}.flashinfer.FlashinferDispatcher.__init__",
        ),
        Backend(
            "megamoe", "SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK", 8192, None, False, "cuda",
            "sglang.srt.layers.moe.mega_moe._get_mega_moe_symm_buffer",
            "deep_gemm sizes the symmetric buffer in C++ (_C.get_symm_buffer_size_for_mega_moe), which needs a CUDA "
            "device (its JIT runtime reads the SM count, and sgl-deep-gemm 0.2.3.post2 differs from upstream "
            "DeepGEMM's layout); the probe records the size on a GPU",
        ),
        Backend(
            "deepep_v2", "SGLANG_DEEPEP_V2_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 128, None, False, "cuda",
            f"{_TD}.deepep_v2.DeepEPv2Buffer.get_buffer",
        ),
        Backend(
            "pplx", "SGLANG_PPLX_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 128, None, True, "cuda",
            f"{_TD}.pplx.PplxAllToAllManager.get_all_to_all",
        ),
        Backend(
            "ascend_tp", None, None, None, False, "npu", "",
            "sglang resolves ascend_tp to none (srt/arg_groups/moe_hook.py handle_a2a_moe): no all-to-all buffer",
        ),
        Backend(
            "flashinfer_megamoe", "SGLANG_FLASHINFER_MEGAMOE_MAX_TOKENS_PER_RANK", None, None, False, "cuda",
            "sglang.srt.layers.moe.flashinfer_megamoe._ensure_flashinfer_megamoe_layer",
            "flashinfer.moe_ep.MoEEpMegaLayer allocates per-kernel symmetric buffers from a megakernel config "
            "(DeepGEMM or CuTe DSL) with no size function; sglang also refuses it for every bundled model (it needs "
            "MXFP8/NVFP4 experts on SM100)",
        ),
    )
}  # fmt: skip
A2A_BACKENDS: tuple[str, ...] = tuple(BACKENDS)
#: Backends whose heuristic reserve is not zero (memory_hook.py compares the name with "deepep").
RESERVED_BACKENDS = frozenset({"deepep"})


@dataclass(frozen=True, slots=True)
class A2AInputs:
    """What sglang hands the backend's buffer constructor on one GPU."""

    backend: str
    hidden: int
    num_experts: int  # routed experts as the dispatcher sees them
    topk: int
    num_ranks: int  # the EP group: tp (sglang sets ep_size = tp_size for every a2a backend)
    tokens_per_rank: int  # the dispatch capacity (the backend's environment variable, or sglang's default)
    deepep_mode: str = "auto"
    deepep_v2_mode: str = "direct"
    attn_dp: int = 1
    nnodes: int = 1
    fp8_dispatch: bool = False
    params_bytes: int = 2  # sglang passes BF16 sizes


@dataclass(frozen=True, slots=True)
class A2ASize:
    """One GPU's all-to-all buffer: exact bytes where a formula exists, the reason where it does not."""

    backend: str
    tokens_per_rank: int | None
    analytic_bytes: int | None  # what the backend asks for (None: no formula, see `note`)
    device_bytes: int | None  # with the allocation rounding memfrac knows (NVSHMEM heap granules, 2 MiB windows)
    parts: tuple[tuple[str, int], ...] = ()
    source: str = ""
    note: str = ""  # what is not counted, or why there is no size
    fails: str = ""  # the buffer creation raises for this configuration (sglang's own message)

    @property
    def analytic_mib(self) -> float | None:
        return None if self.analytic_bytes is None else self.analytic_bytes / MIB

    @property
    def device_mib(self) -> float | None:
        return None if self.device_bytes is None else self.device_bytes / MIB

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "tokens_per_rank": self.tokens_per_rank,
            "analytic_bytes": self.analytic_bytes,
            "device_bytes": self.device_bytes,
            "parts": dict(self.parts),
            "source": self.source,
            "note": self.note,
            "fails": self.fails,
        }


def backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown moe_a2a_backend {name!r}; sglang 0.5.23 accepts {', '.join(BACKENDS)}") from None


# ------------------------------------------------------------------------------------------------------
# Per-backend size functions (bytes)
# ------------------------------------------------------------------------------------------------------


def mooncake_ep_buffer_bytes(tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int) -> int:
    """``mooncake::get_ep_buffer_size_hint`` (Mooncake mooncake-ep/include/mooncake_ep_buffer.h, ``BufferPair``).

    Two (odd/even) pairs of send/receive signal buffers (4 B per expert) and send/receive data buffers of
    E·T·(2·16 + 2H) bytes: total = 4·4E + 4·E·T·(32 + 2H). Unchanged from v0.3.7 to v0.3.12.post1 and HEAD
    (3b5a5941); the rank count does not enter.
    """
    signal = num_experts * 4
    data = num_experts * tokens_per_rank * (2 * 16 + hidden * 2)
    return 4 * signal + 4 * data


def nixl_ep_rdma_buffer_bytes(tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int) -> int:
    """``nixl_ep::get_low_latency_buffer_size_hint`` (nixl examples/device/ep/csrc/config.hpp ``EPLayout``).

    DeepEP's low-latency layout with 8-byte (uint64) signalling: dispatch message 16 + max(2H, H + 4·H/128),
    combine message 4·H/128 + 2H; 2·send + 2·receive + 2·align128(8E), then rounded to the next multiple of
    128 strictly above (nixl @ 8770b655; the layout is the same since #1186).
    """
    scales = hidden // 128
    d = 16 + max(hidden * 2, hidden + scales * 4)
    c = scales * 4 + hidden * 2
    send = max(tokens_per_rank * d, num_experts * tokens_per_rank * c)
    recv = max(num_experts * tokens_per_rank * d, num_experts * tokens_per_rank * c)
    signal = -(-num_experts * 8 // 128) * 128
    n = 2 * send + 2 * recv + 2 * signal
    return (n + 128) // 128 * 128


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def pplx_intranode_bytes(
    tokens_per_rank: int, num_experts: int, world_size: int, hidden: int, hidden_bytes: int, scale_bytes: int = 0
) -> int:
    """Device bytes of ``AllToAllIntraNode`` (pplx-kernels csrc/all_to_all/intranode.cpp @ 2bd6e30f).

    One send buffer per peer of max(dispatch, combine), with L = ceil(E / W) local experts: dispatch =
    16 + round16(4L) + T·L·round16(hidden_bytes + scale_bytes + 4), combine = 16 + round16(4L) +
    T·L·round16(4H) (combine is float32); plus the receive counters (4T), token counts (4E, 4LW), six
    bookkeeping arrays of L·T·W uint32, the token index and three pointer tables (8W each).
    """
    local = -(-num_experts // world_size)
    dispatch = 16 + _round_up(local * 4, 16) + tokens_per_rank * local * _round_up(hidden_bytes + scale_bytes + 4, 16)
    combine = 16 + _round_up(local * 4, 16) + tokens_per_rank * local * _round_up(hidden * 4, 16)
    batch = local * tokens_per_rank * world_size
    return (
        world_size * max(dispatch, combine)
        + 4 * tokens_per_rank
        + 4 * num_experts
        + 4 * local * world_size
        + 6 * 4 * batch
        + 4
        + 3 * 8 * world_size
    )


def pplx_internode_bytes(
    tokens_per_rank: int,
    num_experts: int,
    world_size: int,
    dp_size: int,
    hidden: int,
    hidden_bytes: int,
    scale_bytes: int = 0,
) -> int:
    """Device bytes of ``AllToAllInterNode`` (pplx-kernels csrc/all_to_all/internode.cpp @ 2bd6e30f).

    NVSHMEM: token counts 2·8·L·G, combine signals 8T, sync 8W, dispatch in/out T and B tokens of
    round16(hidden_bytes + scale_bytes + 4), combine in B·4H and out T·E·4H; cudaMalloc: 4·L·G and five
    uint32 arrays of B plus the token index. G = ceil(W / dp_size) DP groups, B = L·G·T.
    """
    local = -(-num_experts // world_size)
    groups = -(-world_size // dp_size)
    batch = local * groups * tokens_per_rank
    per_token = _round_up(hidden_bytes + scale_bytes + 4, 16)
    nvshmem = (
        2 * 8 * local * groups
        + 8 * tokens_per_rank
        + 8 * world_size
        + tokens_per_rank * per_token
        + batch * per_token
        + batch * hidden * 4
        + tokens_per_rank * num_experts * hidden * 4
    )
    return nvshmem + 4 * local * groups + 5 * 4 * batch + 4


#: flashinfer's MoE all-to-all kernels support at most this top-k (moeAlltoAllKernels.h kMaxTopK).
FLASHINFER_MAX_TOPK = 22


def flashinfer_aux_bytes(ep_size: int, max_num_tokens: int, eplb_stats_num_experts: int = 0) -> int:
    """``calculateOffsets(...)[PAYLOAD_DATA_OFFSET_INDEX]`` (flashinfer 0.7.2 data/csrc/trtllm_moe_alltoall.cu)."""

    def align(x: int) -> int:
        return _round_up(x, 128)

    off = 4 + 4 + ep_size * 4 + ep_size * 4
    off = align(off) + ep_size * 4
    off = align(off) + ep_size * 4
    off = align(off) + max_num_tokens * FLASHINFER_MAX_TOPK * 4
    off = align(off) + max_num_tokens * FLASHINFER_MAX_TOPK * 4
    off = align(off) + ep_size * eplb_stats_num_experts * 4
    return align(off)


def flashinfer_workspace_bytes_per_rank(
    ep_size: int, max_num_tokens: int, dispatch_payload_bytes: int, combine_payload_bytes: int
) -> int:
    """``moe_a2a_get_workspace_size_per_rank`` (flashinfer 0.7.2 comm/trtllm_moe_alltoall.py): aux +
    ep·T·dispatch payload + ep·T·combine payload, each padded to 128 bytes."""
    return (
        _round_up(flashinfer_aux_bytes(ep_size, max_num_tokens), 128)
        + _round_up(ep_size * max_num_tokens * dispatch_payload_bytes, 128)
        + _round_up(ep_size * max_num_tokens * combine_payload_bytes, 128)
    )


def flashinfer_dispatch_payload_bytes(hidden: int, topk: int, dispatch_type: str = "bf16") -> int:
    """Per-token dispatch payload sglang computes (token_dispatcher/flashinfer.py FlashinferDispatcher.__init__):
    BF16 hidden + top-k ids and weights (8 B each pair); NVFP4/MXFP8 take the max with the BF16 size."""
    ids_weights = topk * 4 + topk * 4
    bf16 = hidden * 2 + ids_weights
    if dispatch_type == "nvfp4":
        return max(hidden // 2 + hidden // 16 + ids_weights, bf16)
    if dispatch_type == "mxfp8":
        return max(hidden + hidden // 32 + ids_weights, bf16)
    return bf16


# ------------------------------------------------------------------------------------------------------
# Dispatch
# ------------------------------------------------------------------------------------------------------

_NORMAL_UNSUPPORTED = (
    "{name} raises NotImplementedError('Normal mode is not supported for {label} EP yet.') when the buffer is "
    "created with --deepep-mode {mode} (auto enables normal); use --deepep-mode low_latency"
)


def size_for(inp: A2AInputs) -> A2ASize:
    """The buffer one GPU allocates for `inp` (see the module table for each source)."""
    b = backend(inp.backend)
    t = inp.tokens_per_rank
    if b.name == "none":
        return A2ASize("none", None, 0, 0, source="no all-to-all backend")
    if not b.sized:
        return A2ASize(b.name, t if b.tokens_env else None, None, None, note=b.unsized_reason)
    if b.name == "deepep":
        try:
            s = deepep.analytic_sizes(
                deepep.DeepEPInputs(
                    hidden=inp.hidden, num_experts=inp.num_experts, tokens_per_rank=t, num_ranks=inp.num_ranks,
                    mode=inp.deepep_mode,  # type: ignore[arg-type]
                )
            )  # fmt: skip
        except ValueError as e:
            return A2ASize("deepep", t, None, None, source="profiler.model.deepep", fails=str(e))
        parts = (
            ("nvl_bytes", s.num_nvl_bytes + s.nvl_metadata),
            ("rdma_bytes", s.num_rdma_bytes),
            ("workspace_bytes", s.workspace),
        )
        return A2ASize(
            "deepep", t, s.analytic_bytes, s.total_bytes, parts,
            "profiler.model.deepep (sgl-deep-ep 0.1.2.post1 csrc/legacy/config.hpp, buffer.hpp)",
            "device bytes round the RDMA buffer up to NVSHMEM's 512 MiB heap granules; NVSHMEM's own state is not "
            "counted",
        )  # fmt: skip
    if b.name == "deepep_v2":
        hybrid = inp.deepep_v2_mode == "hybrid"
        try:
            buf = deepep.v2_elastic_buffer_bytes(
                t, inp.hidden, inp.topk, inp.num_ranks, fp8_dispatch=inp.fp8_dispatch, hybrid=hybrid
            )
        except ValueError as e:
            return A2ASize("deepep_v2", t, None, None, fails=str(e))
        ws = deepep.v2_workspace_bytes()
        return A2ASize(
            "deepep_v2", t, buf + ws, buf + ws, (("elastic_buffer_bytes", buf), ("workspace_bytes", ws)),
            "profiler.model.deepep.v2_elastic_buffer_bytes (DeepEP @ 099d5f2b csrc/elastic/buffer.hpp)",
            f"{'hybrid' if hybrid else 'direct'} mode, {'FP8' if inp.fp8_dispatch else 'BF16'} dispatch; the host "
            "workspace (cudaMallocHost) and NCCL's own window state are not counted",
        )  # fmt: skip
    if b.name in ("mooncake", "nixl"):
        label = "Mooncake" if b.name == "mooncake" else "Nixl"
        fails = "" if inp.deepep_mode == "low_latency" else _NORMAL_UNSUPPORTED.format(
            name=b.name, label=label, mode=inp.deepep_mode
        )  # fmt: skip
        if b.name == "mooncake":
            buf = mooncake_ep_buffer_bytes(t, inp.hidden, inp.num_ranks, inp.num_experts)
            src = "profiler.model.a2a.mooncake_ep_buffer_bytes (Mooncake mooncake-ep/include/mooncake_ep_buffer.h)"
        else:
            buf = nixl_ep_rdma_buffer_bytes(t, inp.hidden, inp.num_ranks, inp.num_experts)
            src = "profiler.model.a2a.nixl_ep_rdma_buffer_bytes (nixl examples/device/ep/csrc/config.hpp)"
        total = buf + WORKSPACE_32MIB_BYTES
        return A2ASize(
            b.name, t, total, total, (("buffer_bytes", buf), ("workspace_bytes", WORKSPACE_32MIB_BYTES)), src,
            "the transport's page rounding (cuMem/VMM granularity) is not counted", fails,
        )  # fmt: skip
    if b.name == "pplx":
        hidden_bytes = inp.hidden * (1 if inp.fp8_dispatch else inp.params_bytes)
        scale = -(-inp.hidden // 128) * 4 if inp.fp8_dispatch else 0
        fails = "" if inp.deepep_mode != "normal" else "moe_a2a_backend='pplx' only supports low-latency mode"
        if inp.attn_dp < 2:
            fails = "pplx-kernels' AllToAll needs at least 2 DP groups (--attn-dp-size >= 2)"
        if inp.nnodes > 1:
            dp_size = max(1, inp.num_ranks // max(1, inp.attn_dp))
            buf = pplx_internode_bytes(t, inp.num_experts, inp.num_ranks, dp_size, inp.hidden, hidden_bytes, scale)
            src = "profiler.model.a2a.pplx_internode_bytes (pplx-kernels csrc/all_to_all/internode.cpp)"
        else:
            buf = pplx_intranode_bytes(t, inp.num_experts, inp.num_ranks, inp.hidden, hidden_bytes, scale)
            src = "profiler.model.a2a.pplx_intranode_bytes (pplx-kernels csrc/all_to_all/intranode.cpp)"
        return A2ASize(
            "pplx", t, buf, buf, (("buffer_bytes", buf),), src,
            "NVSHMEM's heap (nvshmem_init) and cudaMalloc page rounding are not counted", fails,
        )  # fmt: skip
    if b.name == "flashinfer":
        payload = flashinfer_dispatch_payload_bytes(inp.hidden, inp.topk)
        ws = flashinfer_workspace_bytes_per_rank(inp.num_ranks, t, payload, inp.hidden * 2)
        fails = "" if inp.topk <= FLASHINFER_MAX_TOPK else f"top-k {inp.topk} > flashinfer's kMaxTopK 22"
        return A2ASize(
            "flashinfer", t, ws, ws, (("workspace_bytes", ws),),
            "profiler.model.a2a.flashinfer_workspace_bytes_per_rank (flashinfer 0.7.2 comm/trtllm_moe_alltoall.py)",
            "BF16 dispatch (NVFP4/MXFP8 dispatch never shrinks it: sglang takes the max with BF16); MNNVL page "
            "rounding is not counted", fails,
        )  # fmt: skip
    raise AssertionError(b.name)  # every sized backend is handled above


# ------------------------------------------------------------------------------------------------------
# From a scenario
# ------------------------------------------------------------------------------------------------------


def model_topk(model_path: str) -> int:
    """Experts per token from config.json (num_experts_per_tok / moe_topk), 0 when absent."""
    try:
        raw = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    text = raw.get("text_config") if isinstance(raw.get("text_config"), Mapping) else raw
    for k in ("num_experts_per_tok", "moe_topk", "top_k", "num_experts_per_token"):
        if isinstance(text.get(k), int):
            return int(text[k])
    return 0


def default_tokens(b: Backend, chunk_per_dp: int) -> int | None:
    """sglang's capacity when the environment variable is unset (flashinfer: max(prefill ceiling, 4096))."""
    if b.name == "flashinfer":
        return max(chunk_per_dp, 4096)  # srt/arg_groups/overrides.py flashinfer_a2a_max_dispatch_tokens_per_rank
    if b.name == "flashinfer_megamoe":
        return None  # derived from cutedsl_moe_max_num_tokens() at runtime (1024 when it cannot)
    return b.tokens_default


# ------------------------------------------------------------------------------------------------------
# From what a worker passed (the probe's `a2a_buffer` phase)
# ------------------------------------------------------------------------------------------------------


def size_from_call(name: str, args: Mapping[str, Any]) -> A2ASize | None:
    """memfrac's size from the arguments sglang passed to the backend's buffer creation (None: not sized).

    `args` are the probe's: the creation function's own argument names, plus num_ranks (the group's size).
    """
    if name not in BACKENDS or not BACKENDS[name].sized:
        return None
    g = args.get
    try:
        ranks = int(g("num_ranks") or 0)
        if name in ("deepep", "mooncake", "nixl"):
            inp = A2AInputs(
                name, int(g("hidden_size")), int(g("num_experts")), 0, ranks,
                int(g("num_max_dispatch_tokens_per_rank")), deepep_mode=str(g("deepep_mode") or "auto"),
            )  # fmt: skip
        elif name == "deepep_v2":
            inp = A2AInputs(
                name, int(g("hidden_size")), 0, int(g("router_topk") or 0), ranks,
                int(g("num_max_dispatch_tokens_per_rank")), fp8_dispatch=bool(g("use_fp8_dispatch")),
                deepep_v2_mode="hybrid" if g("allow_hybrid_mode") else "direct",
            )  # fmt: skip
        elif name == "pplx":
            hidden = int(g("hidden_dim"))
            return A2ASize(
                "pplx", int(g("max_num_tokens")),
                *(2 * [pplx_intranode_bytes(int(g("max_num_tokens")), int(g("num_experts")), ranks, hidden,
                                            int(g("hidden_dim_bytes")), int(g("hidden_dim_scale_bytes") or 0))]),
                source="profiler.model.a2a.pplx_intranode_bytes (intranode assumed)",
            )  # fmt: skip
        elif name == "flashinfer":
            return None  # sglang computes the workspace itself: reported_bytes reads it
        else:
            return None
    except (TypeError, ValueError):
        return None
    return size_for(inp)


def reported_bytes(name: str, result: Any, args: tuple) -> int | None:
    """What the library itself says it allocated, where it says so (read from the created objects)."""
    try:
        if name == "flashinfer" and args:
            return int(args[0].workspace_size)  # FlashinferDispatcher: sglang's moe_a2a_get_workspace_size_per_rank
        if name == "megamoe" and result is not None:
            return int(result.buffer.nbytes)  # deep_gemm SymmBuffer: _C.get_symm_buffer_size_for_mega_moe
        if name == "deepep_v2" and result is not None:
            return int(result.num_bytes)  # ElasticBuffer.num_bytes (workspace excluded)
        if name == "mooncake" and result is not None:
            return int(result.num_ep_buffer_bytes)
        if name == "nixl" and result is not None:
            return int(result.num_rdma_bytes)
    except (AttributeError, TypeError, ValueError):
        return None
    return None
