"""The KV sizing replay (profiler/model/kv_sizing.py) against sglang 0.5.23's own code, and by hand.

`admitted_requests` is the one piece of sglang arithmetic memfrac mirrors: it is held against the real
`KVCacheConfigurator.resolve_max_num_reqs` (kv_cache_configurator.py:3119) over a grid, with sglang's schedule bag
patched where that module reads it. The req_to_token size is held against the real ReqToTokenPool and
DecodeReqToTokenPool built on the meta device (no memory), and the allocator's index against the real
TokenToKVPoolAllocator (mem_cache/allocator/token.py:42-48).
"""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest

from profiler.model.kv_sizing import (
    KvSizingInputs,
    admitted_requests,
    check_replay,
    largest_fraction,
    req_to_token_mib,
    size_at,
)
from tests.conftest import needs_sglang

F = 142971.0  # free at start of the simulated H200 (tests/fakes/sim_worker.py)
LLAMA_BPT = 131072  # Llama-3.1-8B bf16 KV bytes per token
CTX = 131072


def _sglang_reqs(tokens: int, context: int, mrr: int | None, dp: int) -> int:
    from sglang.srt.mem_cache import kv_cache_configurator as kvc

    me = SimpleNamespace(model_config=SimpleNamespace(context_len=context), attn_dp_size=dp, mambaish_config=None)
    with mock.patch.object(kvc, "get_schedule", lambda: SimpleNamespace(max_running_requests=mrr)):
        return kvc.KVCacheConfigurator.resolve_max_num_reqs(me, tokens)


@needs_sglang
@pytest.mark.parametrize("context", [4096, 32768, 131072])
@pytest.mark.parametrize("mrr,dp", [(None, 1), (None, 8), (64, 1), (1000, 8), (100000, 1)])
def test_admitted_requests_is_sglangs_resolve_max_num_reqs(context, mrr, dp):
    for tokens in (2, 3, 100, 4095, 8192, 65536, 939360, 982824, 1048575, 4_000_000, 40_000_000):
        assert admitted_requests(tokens, context, mrr, dp) == _sglang_reqs(tokens, context, mrr, dp), tokens


def test_admitted_requests_by_hand():
    """939,360 tokens / 131,072 × 512 = 3,669.375 → 3,669 (inside [2048, 4096]); 8,192 tokens of a 4,096 context
    → 1,024 → lifted to 2,048; 4,000 tokens → min(2,048, 2,000) = 2,000; the user's 1,000 over 8 DP ranks → 125."""
    assert admitted_requests(939360, CTX) == 3669
    assert admitted_requests(8192, 4096) == 2048
    assert admitted_requests(4000, 4096) == 2000
    assert admitted_requests(10_000_000, CTX) == 4096
    assert admitted_requests(939360, CTX, 1000, 8) == 125


@needs_sglang
@pytest.mark.parametrize("decode", [False, True])
def test_req_to_token_size_is_sglangs_pool(decode):
    from sglang.srt.disaggregation.decode import DecodeReqToTokenPool
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

    if decode:
        pool = DecodeReqToTokenPool(size=3669, max_context_len=CTX + 4, device="meta", enable_memory_saver=False,
                                    pre_alloc_size=7)  # fmt: skip
        rows = 3669 + 7 + 1
    else:
        pool = ReqToTokenPool(size=3669, max_context_len=CTX + 4, device="meta", enable_memory_saver=False)
        rows = 3669 + 1
    assert tuple(pool.req_to_token.shape) == (rows, CTX + 4)
    nbytes = pool.req_to_token.numel() * pool.req_to_token.element_size()
    assert req_to_token_mib(rows, CTX + 4) == nbytes / 2**20


@needs_sglang
def test_allocator_index_is_eight_bytes_a_token():
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

    a = TokenToKVPoolAllocator(size=939360, dtype=None, device="meta", kvcache=None, need_sort=False)
    b = sum(t.numel() * t.element_size() for t in (a.free_pages, a.release_pages))
    assert b == 939360 * 8


def _decode_h200(**kw) -> KvSizingInputs:
    """The simulated Llama-3.1-8B decode node at sglang's 0.929: free at start 142,971, weights 15,400 → 127,571
    available; budget 127,571 − 142,971 × 0.071 = 117,420.059 → 939,360 tokens (8 a MiB; the pool's 939,361 rows:
    117,420.125 MiB),
    3,669 requests, req_to_token 3,670 × 131,076 × 4 B = 1,835.06 MiB, allocator 939,360 × 8 B = 7.17 MiB."""
    base = dict(mfs=0.929, pre_model_load_mib=F, budget_mib=127571.0 - F * 0.071, tokens=939360,
                pool_mib=117420.125, context_len=CTX, requests=3669, req_rows=3670, req_cols=CTX + 4,
                allocator_mib=939360 * 8 / 2**20)  # fmt: skip
    return KvSizingInputs(**(base | kw))


def test_replay_at_the_workers_fraction_gives_it_back():
    x = _decode_h200()
    s = size_at(x, 0.929)
    assert (s.tokens, s.requests) == (939360, 3669)
    assert s.req_to_token_mib == pytest.approx(3670 * 131076 * 4 / 2**20)
    assert round(s.req_to_token_mib, 2) == 1835.06
    assert check_replay(x) == ""
    assert "admitted requests" in check_replay(_decode_h200(requests=2048, req_rows=2049))


def test_replay_at_a_higher_fraction_by_hand():
    """At 0.967: slack 142,971 × 0.033 = 4,718.043; budget 127,571 − 4,718.043 = 122,852.957 MiB → 982,823 tokens
    (× 8, floored); 982,823 / 131,072 × 512 = 3,839.15 → 3,839 requests; req_to_token 3,840 × 131,076 × 4 B =
    1,920.06 MiB — 85 MiB more than at 0.929, out of the slack."""
    s = size_at(_decode_h200(), 0.967)
    assert s.tokens == 982823 and s.requests == 3839 and s.pool_mib == 982824 / 8
    assert round(s.req_to_token_mib, 2) == 1920.06
    assert s.allocator_mib == pytest.approx(982823 * 8 / 2**20)


def test_the_cell_is_the_pools_bytes_per_row_when_it_gives_the_tokens_back():
    """117,420.125 MiB / 939,361 rows = 131,072 B exactly (budget // it = 939,360: the worker's count); a pool with
    more in it (117,500 MiB: 131,161 B a row gives 938,648 tokens back, not 939,360) falls back to the middle of the
    cells that do: 117,420.059 MiB / 939,360.5 = 131,072.07 B."""
    assert _decode_h200().cell_bytes == 131072.0
    assert _decode_h200(pool_mib=117500.0).cell_bytes == pytest.approx(117420.059 * 2**20 / 939360.5)


def test_a_user_cap_on_tokens_holds_the_replay():
    x = _decode_h200(max_total_tokens=939360)
    assert size_at(x, 0.967).tokens == 939360


def test_largest_fraction_bisects_the_grid():
    assert largest_fraction(lambda f: f <= 0.954, 0.5) == 0.954
    assert largest_fraction(lambda f: f <= 0.4, 0.5) is None
    assert largest_fraction(lambda f: True, 0.5) == 0.999
