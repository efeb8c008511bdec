"""sglang 0.5.23's KV sizing replayed at another fraction: what the pool and the pools sized from the slack become.

Why: a recommended fraction is only safe if the memory it leaves covers what the worker needs. sglang does not give
the slack to the worker whole: `KVCacheConfigurator.configure` (mem_cache/kv_cache_configurator.py:457-511) turns
the budget into tokens first, THEN builds the request pools out of what is left —

    budget  = available − pre_model_load × (1 − mfs)                  _profile_available_bytes, :2990-3060
    tokens  = (budget − fixed) // cell, page-aligned, ≤ max_total_tokens   pool_configurator.py:637-647, :3094-3117
    reqs    = resolve_max_num_reqs(tokens)                            :3119-3172 (below: `admitted_requests`)
    req_to_token = int32 [reqs + pre_alloc + 1, context + extra]      memory_pool.py:376-410,
                                                                      disaggregation/decode.py:171-215
    allocator    = int64 free-page index over the tokens              mem_cache/allocator/token.py:42-48

— so a higher fraction buys more tokens, which admit more requests, whose req_to_token rows grow out of the slack
too. Only `admitted_requests` is sglang arithmetic memfrac mirrors (tests/model/test_kv_sizing.py holds it against
the real method); every other size is read off the worker's own objects at its fraction (the probe's kv_pool hook)
and scaled from there: rows by the requests, columns as read, the allocator by the tokens, the pool by the bytes
per token sglang divided its budget by (`KvSizingInputs.cell_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: resolve_max_num_reqs (kv_cache_configurator.py:3119-3126): int(tokens / context × 512), clamped to [2048, 4096].
REQS_PER_CONTEXT = 512
MIN_ESTIMATED_REQS = 2048
MAX_ESTIMATED_REQS = 4096
INT32_BYTES = 4
#: req_to_token's columns beyond the context: get_req_to_token_extra_context_len (allocation_sizing.py:96-105),
#: 4 + the speculative draft tokens (0 without a draft); the same "context_len + 4" in the 0.4/0.5 ReqToTokenPool.
REQ_TO_TOKEN_EXTRA_COLS = 4


def admitted_requests(tokens: int, context_len: int, max_running_requests: int | None = None,
                      attn_dp_size: int = 1) -> int:  # fmt: skip
    """Requests one (attention-DP) scheduler admits at once: sglang's `KVCacheConfigurator.resolve_max_num_reqs`
    for a model without Mamba state (kv_cache_configurator.py:3119-3136) —
    min(clamp(int(tokens / context × 512), 2048, 4096), tokens // 2), or the user's value per DP rank, at most
    tokens // 2."""
    estimated = max(min(int(tokens / context_len * REQS_PER_CONTEXT), MAX_ESTIMATED_REQS), MIN_ESTIMATED_REQS)
    if max_running_requests is not None:
        return min(max(1, max_running_requests // attn_dp_size), tokens // 2)
    return min(estimated, tokens // 2)


@dataclass(frozen=True, slots=True)
class KvSizingInputs:
    """What the replay needs, each read from the worker at its own fraction `mfs` (MiB unless named)."""

    mfs: float
    pre_model_load_mib: float  # bootstrap.py measure_pre_model_load_memory (the slack's base)
    budget_mib: float  # _profile_available_bytes at mfs (the probe's kv_pool `budget_mib`)
    tokens: int  # max_total_num_tokens sglang made of it
    pool_mib: float  # the KV pool(s) of those tokens, target + draft (bytes per token = pool / tokens)
    context_len: int
    requests: int  # max_running_requests sglang resolved (KVCacheConfigResult; per attention-DP rank)
    req_rows: int  # req_to_token rows as allocated (requests + pre_alloc + 1)
    req_cols: int  # req_to_token columns (context + extra, get_req_to_token_extra_context_len)
    allocator_mib: float  # the allocator's device index tensors
    page_size: int = 1
    max_total_tokens: int | None = None  # the user's cap (--max-total-tokens)
    max_running_requests: int | None = None  # the user's --max-running-requests
    attn_dp_size: int = 1

    @property
    def available_mib(self) -> float:
        """Free memory when the budget was taken: budget + pre_model_load × (1 − mfs) (the same sglang line)."""
        return self.budget_mib + self.pre_model_load_mib * (1 - self.mfs)

    @property
    def cell_bytes(self) -> float:
        """The bytes per token sglang divided the budget by (`tokens = budget // cell`, pool_configurator.py:641-646).
        A pool allocates tokens + page_size rows of them (memory_pool.py:2260): pool bytes / (tokens + page_size) is the
        cell itself when it gives the worker's own token count back; else (a pool with other buffers, or one capped
        by --max-total-tokens) the middle of the cells that do, budget / (tokens + ½), or, capped, the pool's bytes
        per token."""
        exact = self.pool_mib * 2**20 / (self.tokens + self.page_size)
        budget = self.budget_mib * 2**20
        if int(budget // exact) // self.page_size * self.page_size == self.tokens:
            return exact
        capped = self.max_total_tokens is not None and self.tokens >= self.max_total_tokens // self.page_size * \
            self.page_size
        return self.pool_mib * 2**20 / self.tokens if capped else budget / (self.tokens + 0.5)


@dataclass(frozen=True, slots=True)
class KvSizing:
    """The pools at one fraction (MiB), and how they were reached."""

    mfs: float
    tokens: int
    requests: int
    pool_mib: float  # (tokens + page_size) × the cell: the K/V buffers' rows (memory_pool.py:2260)
    req_to_token_mib: float
    allocator_mib: float

    @property
    def slack_pools_mib(self) -> float:
        """What sglang builds out of the slack after sizing the pool: req_to_token + the allocator's index."""
        return self.req_to_token_mib + self.allocator_mib


def req_to_token_mib(rows: int, cols: int) -> float:
    """ReqToTokenPool.req_to_token: torch.zeros((rows, cols), dtype=torch.int32) (memory_pool.py:406)."""
    return rows * cols * INT32_BYTES / 2**20


def size_at(x: KvSizingInputs, mfs: float) -> KvSizing:
    """Replay sglang's sizing of this worker at fraction `mfs` (exact at the worker's own fraction when the inputs
    are consistent: `check_replay`)."""
    budget = x.available_mib - x.pre_model_load_mib * (1 - mfs)
    cell = x.cell_bytes
    tokens = int(max(budget, 0.0) * 2**20 // cell) if cell > 0 else 0
    tokens = tokens // x.page_size * x.page_size
    if x.max_total_tokens is not None:
        tokens = min(tokens, x.max_total_tokens // x.page_size * x.page_size)
    reqs = admitted_requests(tokens, x.context_len, x.max_running_requests, x.attn_dp_size) if tokens > 1 else 0
    rows = reqs + (x.req_rows - x.requests)  # pre_alloc + the padding row, as the worker allocated them
    alloc = x.allocator_mib * tokens / x.tokens if x.tokens else 0.0
    pool = (tokens + x.page_size) * cell / 2**20
    return KvSizing(mfs, tokens, reqs, pool, req_to_token_mib(rows, x.req_cols), alloc)


def check_replay(x: KvSizingInputs) -> str:
    """'' when the replay at the worker's own fraction gives back what the worker built; else why not (then no
    fraction is recommended from it: the replay would rest on inputs that do not describe this worker)."""
    s = size_at(x, x.mfs)
    bad = []
    if abs(s.tokens - x.tokens) > max(x.page_size, 1):
        bad.append(f"tokens {s.tokens:,} vs the worker's {x.tokens:,}")
    if s.requests != x.requests:
        bad.append(f"admitted requests {s.requests:,} vs the worker's {x.requests:,}")
    return "; ".join(bad)


def largest_fraction(ok: callable, lo: float, hi: float = 0.999) -> float | None:  # type: ignore[valid-type]
    """The largest fraction on sglang's 0.001 grid in [lo, hi] for which `ok(f)` holds, assuming `ok` holds below
    any fraction where it holds (more static memory never leaves more room); None when even `lo` fails."""
    a, b = math.ceil(lo * 1000), math.floor(hi * 1000)
    if a > b or not ok(a / 1000):
        return None
    while a < b:  # ok(a) holds: bisect for the last grid point that holds
        mid = (a + b + 1) // 2
        if ok(mid / 1000):
            a = mid
        else:
            b = mid - 1
    return a / 1000
