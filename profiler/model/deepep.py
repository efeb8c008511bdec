"""Exact byte sizes of the DeepEP buffers that sglang allocates, next to its 2 GiB guess.

sglang reserves a flat 2 GiB (``reserve_for_deepep_a2a_mb``) for DeepEP when it
picks ``mem_fraction_static``, but the real buffer is created lazily inside
warmup / CUDA-graph capture, outside torch's allocator, and no log line reports
its size.  This module recomputes that size from first principles so the
profiler can compare the guess with what the device really has to give.

The formulas mirror, term by term:

* sglang 0.5.23 ``srt/layers/moe/token_dispatcher/deepep.py``,
  ``DeepEPBuffer.get_deepep_buffer``: NVL bytes = max over the recommended
  dispatch and combine configs of ``Config.get_nvl_buffer_size_hint(hidden*2,
  R)``; RDMA bytes = max of those configs' ``get_rdma_buffer_size_hint`` *and*
  the low-latency hint (a max, not a sum: both modes share one RDMA buffer);
  ``params_bytes`` is hard-coded to 2.
* sgl-deep-ep 0.1.2.post1 (the wheel sglang 0.5.23 pins; DeepEP v2 whose
  ``deep_ep.Buffer`` is the legacy buffer): ``csrc/legacy/config.hpp``
  (``Config``, ``LowLatencyLayout``, ``get_low_latency_rdma_size_hint``),
  ``csrc/legacy/buffer.hpp`` (32 MiB workspace, 160 B NVL metadata,
  ``nvshmem::alloc`` for RDMA) and ``deep_ep/buffers/legacy.py`` (recommended
  configs, ``NVSHMEM_CUMEM_GRANULARITY = 2**29``).

Only the standard library is imported; ``deep_ep`` is imported lazily in
:func:`cross_check_with_deep_ep` because it needs a CUDA device even to import.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from profiler.core.units import BYTES_PER_GIB, BYTES_PER_MIB

__all__ = [
    "DeepEPInputs",
    "DeepEPSizes",
    "Mode",
    "analytic_sizes",
    "cross_check_with_deep_ep",
    "inputs_from_model_config",
    "low_latency_rdma_size_hint",
    "normal_nvl_size_hint",
    "normal_rdma_size_hint",
    "v2_elastic_buffer_bytes",
    "v2_workspace_bytes",
]

Mode = Literal["low_latency", "normal", "auto"]
_MODES: tuple[str, ...] = ("low_latency", "normal", "auto")

MIB = BYTES_PER_MIB
GIB = BYTES_PER_GIB

# csrc/kernels/legacy configs (LEGACY_*): fixed at DeepEP build time.
NUM_MAX_NVL_PEERS = 8
NUM_BUFFER_ALIGNMENT_BYTES = 128
NUM_WORKSPACE_BYTES = 32 * MIB
# The low-latency kernels tag token counts with FINISHED_SUM_TAG = 1024, so sglang
# asserts SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK <= 1024.
MAX_TOKENS_PER_RANK = 1024
# deep_ep/buffers/legacy.py sets NVSHMEM_CUMEM_GRANULARITY = 2**29: the symmetric
# heap is backed by physical memory in chunks of this size.
NVSHMEM_HEAP_GRANULARITY = 512 * MIB
# Buffer() appends barrier signals (8 x int), buffer pointers (8 x void*) and
# barrier-signal pointers (8 x int*) to the NVL allocation.
NVL_METADATA_BYTES = NUM_MAX_NVL_PEERS * (4 + 8 + 8)
# sglang 0.5.23 srt/arg_groups/memory_hook.py reserve_for_deepep_a2a_mb.
HEURISTIC_RESERVE_BYTES = 2 * GIB
# DeepEP's Buffer asserts these so buffer offsets fit 32-bit ints.
_INT_MAX = 2**31 - 1

# Per-token sizes used by the normal-mode hints (config.hpp).
_K_NUM_MAX_TOPK = 128
_K_NUM_MAX_SCALES = 128
_SOURCE_META_BYTES = 8  # internode::SourceMeta: two ints
_TOPK_IDX_BYTES = 8  # topk_idx_t is int64
_INT4_BYTES = 16

# Buffer.get_dispatch_config / get_combine_config in sgl-deep-ep 0.1.2.post1
# (deep_ep/buffers/legacy.py): rank count -> (nvl_send, nvl_recv, rdma_send,
# rdma_recv) chunk sizes; num_sms comes from Buffer.num_sms (default 20).
_DISPATCH_CHUNKS: Mapping[int, tuple[int, int, int, int]] = MappingProxyType(
    {
        2: (24, 256, 6, 128),
        4: (6, 256, 6, 128),
        8: (6, 256, 6, 128),
        16: (36, 288, 20, 128),
        24: (32, 288, 8, 128),
        32: (32, 288, 8, 128),
        48: (32, 288, 8, 128),
        64: (32, 288, 8, 128),
        96: (20, 480, 12, 128),
        128: (20, 560, 12, 128),
        144: (32, 720, 12, 128),
        160: (28, 720, 12, 128),
    }
)
_COMBINE_CHUNKS: Mapping[int, tuple[int, int, int, int]] = MappingProxyType(
    {
        2: (10, 256, 6, 128),
        4: (9, 256, 6, 128),
        8: (4, 256, 6, 128),
        16: (4, 288, 12, 128),
        24: (1, 288, 8, 128),
        32: (1, 288, 8, 128),
        48: (1, 288, 8, 128),
        64: (1, 288, 8, 128),
        96: (1, 480, 8, 128),
        128: (1, 560, 8, 128),
        144: (2, 720, 8, 128),
        160: (2, 720, 8, 128),
    }
)
NORMAL_MODE_RANKS: tuple[int, ...] = tuple(_DISPATCH_CHUNKS)

# HF config keys holding the routed-expert count, in lookup order.
_EXPERT_KEYS: tuple[str, ...] = ("n_routed_experts", "num_experts", "num_local_experts")


def _align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def _check_int(name: str, value: object, low: int, high: int | None, allowed: str) -> None:
    """Reject non-ints and out-of-range values with a message naming the parameter."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer ({allowed}), got {value!r}")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name}={value} is out of range; allowed: {allowed}")


@dataclass(frozen=True)
class DeepEPInputs:
    """What sglang feeds ``DeepEPBuffer.get_deepep_buffer``.

    ``num_experts`` is the count sglang passes to DeepEP: routed experts plus any
    EPLB redundant experts and fused shared-expert slots.  ``hidden_bytes``
    defaults to ``2 * hidden`` because sglang hard-codes ``params_bytes = 2``.
    ``num_sms`` is ``deep_ep.Buffer.num_sms`` (20) unless ``--deepep-config``
    overrides it; the chunk sizes always come from the recommended configs.
    """

    hidden: int
    num_experts: int
    tokens_per_rank: int = 128
    num_ranks: int = 8
    mode: Mode = "auto"
    hidden_bytes: int | None = None
    num_sms: int = 20

    def __post_init__(self) -> None:
        _check_int("hidden", self.hidden, 1, None, "a positive integer")
        _check_int("num_experts", self.num_experts, 1, None, "a positive integer")
        _check_int(
            "tokens_per_rank",
            self.tokens_per_rank,
            1,
            MAX_TOKENS_PER_RANK,
            f"1..{MAX_TOKENS_PER_RANK} (SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK; "
            f"DeepEP's FINISHED_SUM_TAG is 1024)",
        )
        # sglang builds the buffer even at tp 1; DeepEP then sizes low latency alone (normal mode asserts
        # 'Unsupported number of EP ranks: 1' in Buffer.get_dispatch_config, checked below)
        _check_int("num_ranks", self.num_ranks, 1, None, ">= 1")
        if self.num_ranks >= NUM_MAX_NVL_PEERS and self.num_ranks % NUM_MAX_NVL_PEERS:
            raise ValueError(
                f"num_ranks={self.num_ranks} is not supported by DeepEP; allowed: "
                f"fewer than {NUM_MAX_NVL_PEERS}, or a multiple of {NUM_MAX_NVL_PEERS}"
            )
        if self.mode not in _MODES:
            raise ValueError(f"mode={self.mode!r} is not supported; allowed: {', '.join(_MODES)}")
        if self.hidden_bytes is not None:
            _check_int("hidden_bytes", self.hidden_bytes, 1, None, "a positive integer, or None for 2 * hidden")
        _check_int("num_sms", self.num_sms, 2, None, "a positive even integer")
        if self.num_sms % 2:
            raise ValueError(f"num_sms={self.num_sms} is odd; allowed: a positive even integer")
        if self.enables_normal and self.num_ranks not in _DISPATCH_CHUNKS:
            raise ValueError(
                f"num_ranks={self.num_ranks} has no recommended DeepEP config for mode={self.mode!r} (deep_ep's "
                f"Buffer.get_dispatch_config asserts 'Unsupported number of EP ranks: {self.num_ranks}'); "
                f"allowed: {', '.join(map(str, NORMAL_MODE_RANKS))} (or mode='low_latency')"
            )
        if self.enables_low_latency and self.num_experts % self.num_ranks:
            raise ValueError(
                f"num_experts={self.num_experts} is not divisible by num_ranks={self.num_ranks}; "
                "sglang asserts this for low-latency DeepEP (modes 'low_latency' and 'auto')"
            )

    @property
    def enables_normal(self) -> bool:
        return self.mode in ("normal", "auto")

    @property
    def enables_low_latency(self) -> bool:
        return self.mode in ("low_latency", "auto")

    @property
    def effective_hidden_bytes(self) -> int:
        return 2 * self.hidden if self.hidden_bytes is None else self.hidden_bytes


@dataclass(frozen=True)
class DeepEPSizes:
    """Exact bytes of one process's DeepEP buffer (one per GPU).

    ``low_latency_rdma`` / ``normal_nvl`` / ``normal_rdma`` are the hints for the
    buffers the mode enables (0 otherwise).  ``num_nvl_bytes`` / ``num_rdma_bytes``
    are what sglang hands to ``deep_ep.Buffer``.  ``rdma_heap_reserved`` is the
    RDMA buffer rounded up to NVSHMEM's 512 MiB heap granularity: a lower bound,
    since NVSHMEM's own symmetric objects share that heap and its QPs, proxy and
    bootstrap state live outside it (DeepEP issue #510 measured ~3.1 GiB for a
    2.000 GiB hint).  cudaMalloc page rounding is not modelled either.
    ``total_bytes`` = NVL + metadata + workspace + heap reserved;
    ``analytic_bytes`` is the same with the RDMA buffer unrounded.
    """

    inputs: DeepEPInputs
    low_latency_rdma: int
    normal_nvl: int
    normal_rdma: int
    num_nvl_bytes: int
    num_rdma_bytes: int
    nvl_metadata: int
    workspace: int
    rdma_heap_reserved: int
    total_bytes: int
    analytic_bytes: int
    heuristic_reserve_bytes: int = HEURISTIC_RESERVE_BYTES

    @property
    def rdma_heap_rounding(self) -> int:
        """Bytes the 512 MiB heap granularity adds on top of the RDMA buffer."""
        return self.rdma_heap_reserved - self.num_rdma_bytes

    @property
    def excess_over_heuristic_bytes(self) -> int:
        """Positive when the real allocation outgrows sglang's 2 GiB reserve."""
        return self.total_bytes - self.heuristic_reserve_bytes

    @property
    def low_latency_rdma_gib(self) -> float:
        return self.low_latency_rdma / GIB

    @property
    def normal_nvl_mib(self) -> float:
        return self.normal_nvl / MIB

    @property
    def normal_rdma_mib(self) -> float:
        return self.normal_rdma / MIB

    @property
    def total_mib(self) -> float:
        return self.total_bytes / MIB

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB

    @property
    def analytic_mib(self) -> float:
        return self.analytic_bytes / MIB

    @property
    def analytic_gib(self) -> float:
        return self.analytic_bytes / GIB

    @property
    def heuristic_reserve_gib(self) -> float:
        return self.heuristic_reserve_bytes / GIB


@dataclass(frozen=True)
class _ChunkConfig:
    """A ``deep_ep.Config``, with the RDMA receive chunk already aligned as its constructor does."""

    num_sms: int
    nvl_send: int
    nvl_recv: int
    rdma_send: int
    rdma_recv: int

    @classmethod
    def build(cls, num_sms: int, chunks: tuple[int, int, int, int]) -> _ChunkConfig:
        nvl_send, nvl_recv, rdma_send, rdma_recv = chunks
        # Config() rounds the RDMA receive chunk up to a multiple of the send chunk.
        return cls(num_sms, nvl_send, nvl_recv, rdma_send, _align_up(rdma_recv, rdma_send))


def _recommended_configs(num_ranks: int, num_sms: int) -> tuple[_ChunkConfig, _ChunkConfig]:
    return (
        _ChunkConfig.build(num_sms, _DISPATCH_CHUNKS[num_ranks]),
        _ChunkConfig.build(num_sms, _COMBINE_CHUNKS[num_ranks]),
    )


def low_latency_rdma_size_hint(tokens_per_rank: int, hidden: int, num_experts: int) -> int:
    """``Buffer.get_low_latency_rdma_size_hint``; the rank count does not enter the layout.

    Messages are BF16 regardless of FP8 dispatch: dispatch = 16 B control +
    max(2H, H + 4·H/128), combine = 4·H/128 + 2H.  Two (odd/even) copies each of
    send, receive and 128-aligned signalling (4·E) buffers, then
    ``((n + 128) // 128) * 128``: the next multiple of 128 strictly above n.
    """
    num_scales = hidden // 128
    dispatch_msg = _INT4_BYTES + max(hidden * 2, hidden + num_scales * 4)
    combine_msg = num_scales * 4 + hidden * 2
    send = max(tokens_per_rank * dispatch_msg, num_experts * tokens_per_rank * combine_msg)
    recv = max(num_experts * tokens_per_rank * dispatch_msg, num_experts * tokens_per_rank * combine_msg)
    if send % _INT4_BYTES or recv % _INT4_BYTES:
        raise ValueError(
            f"hidden={hidden} with tokens_per_rank={tokens_per_rank}, num_experts={num_experts} gives "
            f"low-latency send/receive buffers of {send}/{recv} bytes, not multiples of 16; DeepEP's "
            "LowLatencyLayout asserts 16-byte alignment (use a hidden size that is a multiple of 128)"
        )
    signal = _align_up(num_experts * 4, NUM_BUFFER_ALIGNMENT_BYTES)
    total = 2 * send + 2 * recv + 2 * signal
    return (total + NUM_BUFFER_ALIGNMENT_BYTES) // NUM_BUFFER_ALIGNMENT_BYTES * NUM_BUFFER_ALIGNMENT_BYTES


def _nvl_hint(cfg: _ChunkConfig, hidden_bytes: int, num_ranks: int) -> int:
    """``Config::get_nvl_buffer_size_hint``: per channel and NVL peer, a receive ring of tokens."""
    num_rdma_ranks = max(num_ranks // NUM_MAX_NVL_PEERS, 1)
    num_nvl_ranks = min(num_ranks, NUM_MAX_NVL_PEERS)
    channels = cfg.num_sms // 2
    per_token = (
        hidden_bytes
        + _SOURCE_META_BYTES
        + _K_NUM_MAX_TOPK * _TOPK_IDX_BYTES
        + _K_NUM_MAX_TOPK * 4
        + _K_NUM_MAX_SCALES * 4
    )
    n = channels * num_nvl_ranks * (2 * num_rdma_ranks + 3) * 4
    n += channels * num_nvl_ranks * cfg.nvl_recv * per_token
    return _align_up(n, NUM_BUFFER_ALIGNMENT_BYTES)


def _rdma_hint(cfg: _ChunkConfig, hidden_bytes: int, num_ranks: int) -> int:
    """``Config::get_rdma_buffer_size_hint``: 0 within one node, else symmetric send+recv rings."""
    if num_ranks <= NUM_MAX_NVL_PEERS:
        return 0
    num_rdma_ranks = num_ranks // NUM_MAX_NVL_PEERS
    channels = cfg.num_sms // 2
    per_token = (
        hidden_bytes
        + _SOURCE_META_BYTES
        + _K_NUM_MAX_TOPK * _TOPK_IDX_BYTES
        + _K_NUM_MAX_TOPK * 4
        + _K_NUM_MAX_SCALES * 4
        + _INT4_BYTES
    )
    n = channels * num_rdma_ranks * (NUM_MAX_NVL_PEERS * 2 + 2) * 2 * 4
    n += channels * num_rdma_ranks * cfg.rdma_recv * per_token * 2
    return _align_up(n, NUM_BUFFER_ALIGNMENT_BYTES)


def normal_nvl_size_hint(hidden_bytes: int, num_ranks: int, num_sms: int = 20) -> int:
    """Max NVL hint over sglang's two recommended configs (dispatch, combine) for ``num_ranks``."""
    return max(_nvl_hint(c, hidden_bytes, num_ranks) for c in _recommended_configs(num_ranks, num_sms))


def normal_rdma_size_hint(hidden_bytes: int, num_ranks: int, num_sms: int = 20) -> int:
    """Max RDMA hint over the same two configs; 0 for ranks <= 8 (pure NVLink)."""
    return max(_rdma_hint(c, hidden_bytes, num_ranks) for c in _recommended_configs(num_ranks, num_sms))


def _check_buffer_limits(inp: DeepEPInputs, nvl: int, rdma: int) -> None:
    """Mirror ``Buffer()``'s asserts so an impossible configuration is not reported as a size."""
    problems = []
    if nvl > _INT_MAX and rdma:
        problems.append(f"NVL buffer {nvl} B > INT_MAX while an RDMA buffer is also allocated")
    if rdma > _INT_MAX and not inp.enables_low_latency:
        problems.append(f"normal-mode RDMA buffer {rdma} B > INT_MAX")
    for name, size in (("NVL", nvl), ("RDMA", rdma)):
        if size // _INT4_BYTES >= _INT_MAX:
            problems.append(f"{name} buffer {size} B is not below 32 GiB (size/16 must be < INT_MAX)")
    if problems:
        raise ValueError(f"DeepEP's Buffer would reject {inp}: " + "; ".join(problems))


def analytic_sizes(inp: DeepEPInputs) -> DeepEPSizes:
    """Bytes sglang's ``get_deepep_buffer`` allocates for ``inp`` (see module docstring)."""
    hidden_bytes = inp.effective_hidden_bytes
    normal_nvl = normal_rdma = low_latency = 0
    if inp.enables_normal:
        normal_nvl = normal_nvl_size_hint(hidden_bytes, inp.num_ranks, inp.num_sms)
        normal_rdma = normal_rdma_size_hint(hidden_bytes, inp.num_ranks, inp.num_sms)
    if inp.enables_low_latency:
        low_latency = low_latency_rdma_size_hint(inp.tokens_per_rank, inp.hidden, inp.num_experts)
    num_nvl = normal_nvl
    num_rdma = max(normal_rdma, low_latency)  # one shared RDMA buffer sized for both modes
    _check_buffer_limits(inp, num_nvl, num_rdma)
    metadata = NVL_METADATA_BYTES if num_nvl else 0
    heap = _align_up(num_rdma, NVSHMEM_HEAP_GRANULARITY)
    return DeepEPSizes(
        inputs=inp,
        low_latency_rdma=low_latency,
        normal_nvl=normal_nvl,
        normal_rdma=normal_rdma,
        num_nvl_bytes=num_nvl,
        num_rdma_bytes=num_rdma,
        nvl_metadata=metadata,
        workspace=NUM_WORKSPACE_BYTES,
        rdma_heap_reserved=heap,
        total_bytes=num_nvl + metadata + NUM_WORKSPACE_BYTES + heap,
        analytic_bytes=num_nvl + metadata + NUM_WORKSPACE_BYTES + num_rdma,
    )


def inputs_from_model_config(
    config: Mapping[str, Any],
    *,
    tokens_per_rank: int = 128,
    num_ranks: int = 8,
    mode: Mode = "auto",
    extra_experts: int = 0,
) -> DeepEPInputs:
    """Build inputs from a HF ``config.json`` dict (``text_config`` is used when present).

    Experts come from ``n_routed_experts`` (DeepSeek, Kimi), ``num_experts``
    (Qwen-MoE) or ``num_local_experts`` (Mixtral-style).  ``extra_experts`` adds
    what sglang appends before calling DeepEP: ``--ep-num-redundant-experts``
    and, when it fuses the shared expert under DeepEP, one slot per EP rank.
    """
    source = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    hidden = source.get("hidden_size")
    if hidden is None:
        raise ValueError("model config has no 'hidden_size' key (looked at the top level and 'text_config')")
    routed = next((source[k] for k in _EXPERT_KEYS if source.get(k)), None)
    if routed is None:
        raise ValueError(
            f"model config (model_type={source.get('model_type')!r}) has none of the routed-expert keys "
            f"{', '.join(_EXPERT_KEYS)}: it is not an MoE model, so DeepEP does not apply"
        )
    _check_int("extra_experts", extra_experts, 0, None, "a non-negative integer")
    return DeepEPInputs(
        hidden=hidden,
        num_experts=routed + extra_experts,
        tokens_per_rank=tokens_per_rank,
        num_ranks=num_ranks,
        mode=mode,
    )


def cross_check_with_deep_ep(inp: DeepEPInputs) -> dict[str, Any] | None:
    """Ask the installed ``deep_ep`` for the same hints; ``None`` where it cannot import.

    ``deep_ep`` checks for a CUDA driver and device at import time and raises
    more than ImportError, so any import failure means "not on a GPU node".
    The recommended configs are deep_ep's own when ``inp.num_sms`` equals
    ``Buffer.num_sms``; otherwise ``Config`` is built from this module's table.
    """
    try:
        import deep_ep  # type: ignore[import-not-found]
    except Exception:  # deep_ep raises RuntimeError/AssertionError, not only ImportError, without CUDA
        return None
    ours = analytic_sizes(inp)
    hidden_bytes = inp.effective_hidden_bytes
    theirs = {"low_latency_rdma": 0, "normal_nvl": 0, "normal_rdma": 0}
    config_source = "none"
    if inp.enables_low_latency:
        theirs["low_latency_rdma"] = int(
            deep_ep.Buffer.get_low_latency_rdma_size_hint(
                inp.tokens_per_rank, inp.hidden, inp.num_ranks, inp.num_experts
            )
        )
    if inp.enables_normal:
        if inp.num_sms == deep_ep.Buffer.num_sms:
            configs = [
                deep_ep.Buffer.get_dispatch_config(inp.num_ranks),
                deep_ep.Buffer.get_combine_config(inp.num_ranks),
            ]
            config_source = "deep_ep.Buffer recommended"
        else:
            configs = [
                deep_ep.Config(inp.num_sms, *table[inp.num_ranks]) for table in (_DISPATCH_CHUNKS, _COMBINE_CHUNKS)
            ]
            config_source = "memfrac table with num_sms"
        r = inp.num_ranks
        theirs["normal_nvl"] = max(int(c.get_nvl_buffer_size_hint(hidden_bytes, r)) for c in configs)
        theirs["normal_rdma"] = max(int(c.get_rdma_buffer_size_hint(hidden_bytes, r)) for c in configs)
    comparison = {k: {"ours": getattr(ours, k), "deep_ep": v} for k, v in theirs.items()}
    return {
        "deep_ep_version": str(getattr(deep_ep, "__version__", "unknown")),
        "config_source": config_source,
        **comparison,
        "match": all(c["ours"] == c["deep_ep"] for c in comparison.values()),
    }


def sizes_dict(s: DeepEPSizes) -> dict[str, Any]:
    """JSON-ready bytes per buffer, their totals and the heuristic's reserve beside them."""
    i = s.inputs
    return {
        "inputs": {"hidden": i.hidden, "num_experts": i.num_experts, "tokens_per_rank": i.tokens_per_rank,
                   "num_ranks": i.num_ranks, "mode": i.mode, "hidden_bytes": i.effective_hidden_bytes},
        "low_latency_rdma_bytes": s.low_latency_rdma,
        "normal_nvl_bytes": s.normal_nvl,
        "normal_rdma_bytes": s.normal_rdma,
        "nvl_metadata_bytes": s.nvl_metadata,
        "workspace_bytes": s.workspace,
        "rdma_heap_reserved_bytes": s.rdma_heap_reserved,
        "analytic_bytes": s.analytic_bytes,
        "total_bytes": s.total_bytes,
        "heuristic_reserve_bytes": s.heuristic_reserve_bytes,
        "excess_over_heuristic_bytes": s.excess_over_heuristic_bytes,
    }  # fmt: skip


def render_sizes(s: DeepEPSizes) -> str:
    """A table of the buffers, exact bytes and GiB, with the heuristic's 2 GiB and the verdict."""
    i = s.inputs
    rows = [
        ("low-latency RDMA (hint)", s.low_latency_rdma),
        ("normal NVL (hint)", s.normal_nvl),
        ("normal RDMA (hint)", s.normal_rdma),
        ("RDMA buffer allocated (max of the two)", s.num_rdma_bytes),
        ("NVL metadata", s.nvl_metadata),
        ("workspace (cudaMalloc)", s.workspace),
        ("analytic total", s.analytic_bytes),
        ("NVSHMEM heap reserved (512 MiB granules)", s.rdma_heap_reserved),
        ("total on the device (lower bound)", s.total_bytes),
        ("sglang's hard-coded reserve", s.heuristic_reserve_bytes),
    ]
    w = max(len(r[0]) for r in rows)
    out = [
        f"DeepEP buffers per GPU: hidden {i.hidden}, experts {i.num_experts}, "
        f"{i.tokens_per_rank} dispatch tokens/rank, "
        f"{i.num_ranks} ranks, mode {i.mode}"
    ]
    out += [f"  {name:<{w}}  {b:>15,} B  {b / GIB:8.3f} GiB" for name, b in rows]
    ex = s.excess_over_heuristic_bytes
    verdict = "exceeds" if ex > 0 else "fits in"
    out.append(
        f"  the device total {verdict} the 2 GiB reserve by {abs(ex) / GIB:.3f} GiB "
        "(NVSHMEM overhead beyond the heap not counted)"
    )
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------------
# DeepEP V2: ElasticBuffer (sglang --moe-a2a-backend deepep_v2)
# ------------------------------------------------------------------------------------------------------
# The V2 buffer lives in one NCCL symmetric-memory window: a workspace, then the dispatch/combine buffer.
# Mirrors deepseek-ai/DeepEP @ 099d5f2b (the commit whose deep_ep/buffers/elastic.py is byte-identical to
# the one in sgl-deep-ep 0.1.2.post1): csrc/elastic/buffer.hpp (calculate_buffer_size,
# get_dispatch_buffer_size, get_combine_buffer_size, the constructor's workspace), the token layouts in
# csrc/kernels/elastic/{dispatch,combine}.hpp and deep_ep/include/deep_ep/common/layout.cuh (TokenLayout,
# BufferLayout<false>, WorkspaceLayout), kNumTMAAlignBytes = 32 (common/ptx.cuh), symmetric::kNumAlignmentBytes
# = 2 MiB (kernels/backend/symmetric.hpp), kNumMaxChannels = 8 x 160 (buffer.hpp).

V2_ALIGNMENT_BYTES = 2 * MIB
_V2_TMA_ALIGN = 32
_V2_MAX_CHANNELS = 8 * 160
_V2_MAX_RANKS, _V2_MAX_EXPERTS, _V2_MAX_INFLIGHT_AGRS, _V2_BARRIER_SIGNAL_BYTES = 1024, 2048, 32, 16


def _v2_token_bytes(hidden_bytes: int, sf_bytes: int, num_topk: int, with_metadata: bool) -> int:
    """``TokenLayout::get_num_bytes<false>``: hidden, scale factors and metadata, each 32-byte aligned."""
    meta = num_topk * (4 + 4) + ((1 + num_topk) * 4 if with_metadata else 0)
    return sum(_align_up(b, _V2_TMA_ALIGN) for b in (hidden_bytes, sf_bytes, meta))


def v2_workspace_bytes() -> int:
    """``WorkspaceLayout::get_num_bytes()`` aligned to 2 MiB: fixed whatever the model (16 MiB)."""
    r, e, ch = _V2_MAX_RANKS, _V2_MAX_EXPERTS, _V2_MAX_CHANNELS
    n = _V2_BARRIER_SIGNAL_BYTES + (r + e) * 8 + r * 8 * 2 + e * 8 * 2 + r * 4 + r * 4 * 2 + e * 4 * 2
    n += r * ch * 8 + r * ch * 4 + 2 * 2 * 8 + (_V2_MAX_INFLIGHT_AGRS + 1) * r * 4
    return _align_up(n, V2_ALIGNMENT_BYTES)


def v2_elastic_buffer_bytes(
    tokens_per_rank: int,
    hidden: int,
    num_topk: int,
    num_ranks: int,
    *,
    fp8_dispatch: bool = False,
    hybrid: bool = False,
    nvl_ranks: int = NUM_MAX_NVL_PEERS,
    allow_multiple_reduction: bool = True,
) -> int:
    """``ElasticBuffer::calculate_buffer_size``: max(dispatch, combine) bytes, aligned to 2 MiB (workspace excluded).

    ``hybrid`` is sglang's ``--deepep-v2-mode hybrid`` (``allow_hybrid_mode``): ranks split into
    ceil(R / nvl_ranks) scale-out x nvl_ranks scale-up; ``direct`` is one scale-up domain of R ranks (sglang
    refuses it across nodes). ``num_topk`` 0 sizes for top-32, as DeepEP does. BF16 dispatch unless
    ``fp8_dispatch`` (then H bytes + ceil(H/32) x 4 bytes of scale packs per token).
    """
    if tokens_per_rank <= 0 or hidden <= 0:
        raise ValueError(f"tokens_per_rank={tokens_per_rank} and hidden={hidden} must be positive (DeepEP asserts it)")
    topk = num_topk or 32
    if hybrid and num_ranks > nvl_ranks:
        if num_ranks % nvl_ranks:
            raise ValueError(f"num_ranks={num_ranks} is not a multiple of the NVLink domain size {nvl_ranks}")
        scaleout, scaleup = num_ranks // nvl_ranks, nvl_ranks
    else:
        scaleout, scaleup = 1, num_ranks
    elem = 1 if fp8_dispatch else 2
    sf = -(-hidden // 32) * 4 if fp8_dispatch else 0
    d_tok = _v2_token_bytes(hidden * elem, sf, topk, True)
    c_tok = _v2_token_bytes(hidden * 2, 0, topk, False)
    t = tokens_per_rank
    if scaleout == 1:  # direct: NVLink scale-up sends need no send buffer
        dispatch = num_ranks * t * d_tok
        combine = (min(num_ranks, topk) if allow_multiple_reduction else topk) * t * c_tok
    else:
        dispatch = scaleup * scaleout * t * d_tok + t * d_tok + scaleout * (t + _V2_MAX_CHANNELS) * d_tok
        up = min(scaleup, topk) if allow_multiple_reduction else topk
        out = min(scaleout, topk) if allow_multiple_reduction else topk
        send = 1 if allow_multiple_reduction else topk
        combine = up * scaleout * t * c_tok + out * t * c_tok + send * scaleout * (t + _V2_MAX_CHANNELS) * c_tok
    return _align_up(max(dispatch, combine), V2_ALIGNMENT_BYTES)


@dataclass(frozen=True, slots=True)
class DeepEPExample:
    """profiler.model.deepep's size of one model's DeepEP buffer, and the fitted reserve for it (when there is one)."""

    model: str
    hidden: int
    experts: int
    tokens: int
    analytic_mib: float
    heap_rounded_mib: float  # the RDMA buffer in NVSHMEM's 512 MiB granules
    fitted_mib: float | None = None


def deepep_examples(models_dir: Path, tokens: Sequence[int] = (128, 256), ranks: int = 8) -> list[DeepEPExample]:
    """profiler.model.deepep sizes of every MoE model config under `models_dir`, per dispatch size T (mode auto)."""
    out = []
    for cfg_path in sorted(models_dir.glob("*/config.json")):
        try:
            cfg = json.loads(cfg_path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        for t in tokens:
            try:
                s = analytic_sizes(inputs_from_model_config(cfg, tokens_per_rank=t, num_ranks=ranks, mode="auto"))
            except ValueError:  # not an MoE model, or a shape DeepEP rejects
                break
            name = cfg_path.parent.name.replace("--", "/")
            out.append(DeepEPExample(name, s.inputs.hidden, s.inputs.num_experts, t, s.analytic_mib, s.total_mib))
    return out
