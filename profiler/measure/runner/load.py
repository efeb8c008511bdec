"""The role-aware load driver: once a worker is ready, drive its worst case so the probe sees the peak.

prefill — requests of `chunked_prefill_size` input tokens, as many at once as the pool admits, routed to
sglang's fake KV sender (bootstrap host "2.2.2.2", a unique bootstrap_room each), no decode peer needed;
decode — `max_running_requests` concurrent requests with long outputs (`ignore_eos`), also carrying the
fake bootstrap fields (a 0.5.23 decode worker dies on a request without `bootstrap_host`);
null — both. Bounded in count and time; loopback only; input ids, since workers run without a tokenizer.
Requests go through one httpx AsyncClient per run, created on the thread that joined the worker's network
namespace when it has one. The time bound is machine-normalised (profiler.measure.runner.patience): a watchdog
cancels what is still in flight once it is spent, and those requests count as timed out.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from profiler.measure.runner.net import NetThread, async_client
from profiler.measure.runner.patience import Patience

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # sglang/srt/disaggregation/utils.py


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """One burst: `requests` sent `concurrency` at a time."""

    kind: str  # "prefill" | "decode"
    requests: int
    concurrency: int
    input_len: int
    output_len: int


@dataclass(slots=True)
class LoadResult:
    plan: LoadPlan
    sent: int = 0
    ok: int = 0
    failed: int = 0
    timed_out: bool = False
    elapsed_s: float = 0.0
    output_tokens: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["plan"] = asdict(self.plan)
        return d


def _int(info: dict[str, Any], key: str, default: int) -> int:
    v = info.get(key)
    return int(v) if isinstance(v, int | float) and v > 0 else default


def plan_load(
    mode: str, info: dict[str, Any], *, max_requests: int | None = None, output_len: int = 256
) -> list[LoadPlan]:
    """The worst case of the role, from the resolved arguments the worker reports in /server_info."""
    pool = _int(info, "max_total_num_tokens", 8192)
    max_input = _int(info, "max_req_input_len", pool - 1)
    chunk = info.get("chunked_prefill_size")
    if not isinstance(chunk, int) or chunk <= 0:
        chunk = _int(info, "max_prefill_tokens", 8192)
    running = _int(info, "max_running_requests", 64)
    plans = []
    if mode in ("prefill", "null"):
        in_len = max(1, min(chunk, max_input - 1, pool - 1))  # sglang wants input < max_req_input_len
        n = max(1, min(running, max(1, pool // in_len)))
        if max_requests is not None:
            n = min(n, max_requests)
        plans.append(LoadPlan("prefill", n, n, in_len, 1))
    if mode in ("decode", "null"):
        in_len = 16
        out = max(1, min(output_len, max_input - in_len - 1))
        n = running if max_requests is None else min(running, max_requests)
        plans.append(LoadPlan("decode", n, n, in_len, out))
    return plans


def _body(mode: str, plan: LoadPlan, rng: random.Random, room: int, bootstrap_port: int, vocab: int) -> dict[str, Any]:
    hi = max(200, min(vocab, 30000))
    b: dict[str, Any] = {
        "input_ids": [rng.randrange(100, hi) for _ in range(plan.input_len)],
        "sampling_params": {"max_new_tokens": plan.output_len, "temperature": 0, "ignore_eos": True},
    }
    if mode != "null":
        b.update(bootstrap_host=FAKE_BOOTSTRAP_HOST, bootstrap_port=bootstrap_port, bootstrap_room=room)
    return b


async def _burst(
    c: httpx.AsyncClient, mode: str, plan: LoadPlan, patience: Patience, bootstrap_port: int, vocab: int, seed: int
) -> LoadResult:
    res = LoadResult(plan)
    rng = random.Random(seed)
    sem = asyncio.Semaphore(plan.concurrency)
    t0 = time.monotonic()

    def err(msg: str) -> None:
        res.failed += 1
        if len(res.errors) < 5:
            res.errors.append(msg)

    async def one(i: int) -> None:
        async with sem:
            if patience.spent():
                res.timed_out = True
                return
            res.sent += 1
            body = _body(mode, plan, rng, seed * 1_000_003 + i, bootstrap_port, vocab)
            try:
                r = await c.post("/generate", json=body)
            except asyncio.CancelledError:
                res.timed_out = True
                err(f"timed out: {patience.describe()}")
                raise
            except httpx.HTTPError as e:
                err(f"{type(e).__name__}: {e}")
                return
            if r.status_code != 200:
                err(f"HTTP {r.status_code}: {r.text[:200]}")
                return
            try:
                out = r.json()
            except ValueError as e:
                err(f"bad JSON from /generate: {e}")
                return
            res.ok += 1
            ids = out.get("output_ids") if isinstance(out, dict) else None
            res.output_tokens += len(ids) if isinstance(ids, list) else 0

    tasks = [asyncio.ensure_future(one(i)) for i in range(plan.requests)]

    async def watchdog() -> None:
        while not all(t.done() for t in tasks):
            if patience.spent():
                res.timed_out = True
                for t in tasks:
                    t.cancel()
                return
            await asyncio.sleep(0.25)

    dog = asyncio.ensure_future(watchdog())
    await asyncio.gather(*tasks, return_exceptions=True)
    dog.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await dog
    res.elapsed_s = time.monotonic() - t0
    return res


def run_load(
    net: NetThread, port: int, mode: str, plans: list[LoadPlan], *, timeout_s: float, bootstrap_port: int = 8998,
    vocab: int = 32000, seed: int = 0,
) -> list[LoadResult]:  # fmt: skip
    """Run the bursts in order within `timeout_s` overall (machine-normalised; inside the worker's namespace
    when needed: the client is created on that thread)."""
    patience = Patience(timeout_s, "load")
    width = max((p.concurrency for p in plans), default=1)

    async def all_bursts() -> list[LoadResult]:
        out = []
        async with async_client(port, width) as c:
            for k, p in enumerate(plans):
                out.append(await _burst(c, mode, p, patience, bootstrap_port, vocab, seed * 10 + k + 1))
        return out

    return net.call(lambda: asyncio.run(all_bursts()))
