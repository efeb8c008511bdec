"""The role-aware load driver: once a worker is ready, drive the worst case its reserve is for, read from the worker.

sglang 0.5.23 reserves activation memory for the largest forward a worker may run (arg_groups/memory_hook.py:296-310,
profiler.analyse.load): the requests the scheduler admits at once (decode, unified) and a chunk (prefill, unified).
The admitted requests are NOT /server_info's `max_running_requests` — that is the unresolved CLI field, None unless
given (entrypoints/http_server.py build_server_info) — but each DP rank's `effective_max_running_requests_per_dp`
in `internal_states` (managers/scheduler_components/internal_state.py:73; what resolve_max_num_reqs gave,
kv_cache_configurator.py:3119: 2,048 … 4,096 by default).

decode — one burst of every admitted request at once (input ids, long enough outputs with `ignore_eos` that they all
run together, eager above the decode graph's max_bs); `reachable_requests` says how many of them the KV pool holds at
once (a decode node keeps `num_reserved_decode_tokens` free per request: disaggregation/decode.py:2052-2058, 512);
prefill — requests of a chunk (`chunked_prefill_size` tokens, two at least so every batch is a full chunk), then a
burst of short requests totalling `max_prefill_tokens`; routed to sglang's fake KV sender (bootstrap host
"2.2.2.2", a bootstrap_room each), no decode peer needed; null — both. Requests go in batches (one /generate call
carries up to BATCH_PER_CALL prompts: io_struct.py GenerateReqInput takes lists, a room each), so thousands of
requests need no thousands of connections. Bounded in time (machine-normalised, profiler.measure.runner.patience):
a watchdog cancels what is still in flight once it is spent, and those requests count as timed out.
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
    """One burst: `requests` sent `concurrency` at a time, and the worst case it is meant to reach."""

    kind: str  # "prefill" | "decode"
    requests: int
    concurrency: int
    input_len: int
    output_len: int
    admitted: int | None = None  # decode: the requests the worker admits at once (Σ over DP ranks), as it says
    reachable_requests: int | None = None  # decode: how many of these requests its KV pool holds at once
    target_tokens: int | None = None  # prefill: the forward the reserve is for (a chunk, else max_prefill_tokens)
    why: str = ""  # where each figure was read


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


#: Prompts per /generate call (a batch request): keeps the client's connections few and the server's queue full.
BATCH_PER_CALL = 64
DECODE_INPUT_LEN = 16
PREFILL_SHORT_LEN = 512


def _int(info: dict[str, Any], key: str) -> int | None:
    v = info.get(key)
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 else None


def admitted_requests(info: dict[str, Any]) -> tuple[int | None, str]:
    """Σ over DP ranks of the requests each admits at once (`internal_states[i].effective_max_running_requests_per_dp`),
    and where that was read; None when the worker does not say (an older sglang)."""
    states = [x for x in info.get("internal_states") or [] if isinstance(x, dict)]
    per = [_int(x, "effective_max_running_requests_per_dp") for x in states]
    if per and all(v is not None for v in per):
        return sum(per), (f"effective_max_running_requests_per_dp {'+'.join(str(v) for v in per)} "  # type: ignore[misc]
                          "(/server_info internal_states)")  # fmt: skip
    return None, "the worker did not report effective_max_running_requests_per_dp"


def _tokens(info: dict[str, Any]) -> int | None:
    states = [x for x in info.get("internal_states") or [] if isinstance(x, dict)]
    caps = [(x.get("memory_usage") or {}).get("token_capacity") for x in states]
    caps = [int(c) for c in caps if isinstance(c, int) and c > 0]
    return min(caps) if caps else _int(info, "max_total_num_tokens")


def plan_load(
    mode: str, info: dict[str, Any], *, max_requests: int | None = None, output_len: int = 256
) -> list[LoadPlan]:
    """The bursts that reach the role's worst case, from what the worker reports in /server_info. `max_requests`
    caps a burst (a scenario's `load_requests`): the plan then says it stops short of the worst case."""
    pool = _tokens(info) or 8192
    max_input = _int(info, "max_req_input_len") or pool - 1
    chunk = _int(info, "chunked_prefill_size")
    max_prefill = _int(info, "max_prefill_tokens") or 16384
    target = chunk or max_prefill
    plans = []
    if mode in ("prefill", "null"):
        in_len = max(1, min(target, max_input - 1, pool - 1))  # sglang wants input < max_req_input_len
        n = max(2, -(-target // in_len)) if in_len < target else 2  # two at least: every batch a full chunk
        n = max(1, min(n, max(1, pool // (in_len + 1)))) if n * (in_len + 1) > pool else n
        if max_requests is not None:
            n = min(n, max_requests)
        why = f"{'chunked_prefill_size' if chunk else 'max_prefill_tokens (chunking off)'} {target:,} (resolved)"
        plans.append(LoadPlan("prefill", n, n, in_len, 1, target_tokens=target, why=why))
        short = max(1, min(PREFILL_SHORT_LEN, max_input - 1))
        m = max(1, min(max_prefill // short, pool // (short + 1)))
        if max_requests is not None:
            m = min(m, max_requests)
        plans.append(LoadPlan("prefill", m, m, short, 1, target_tokens=target,
                              why=f"{m} × {short} tokens toward max_prefill_tokens {max_prefill:,}"))  # fmt: skip
    if mode in ("decode", "null"):
        admitted, why = admitted_requests(info)
        n = admitted if admitted is not None else _int(info, "max_running_requests") or 64
        if admitted is None:
            why += f"; driving {n} (the CLI's max_running_requests, or 64): a partial load"
        if max_requests is not None and max_requests < n:
            n, why = max_requests, why + f"; capped at {max_requests} by the scenario's load_requests: a partial load"
        in_len = max(1, min(DECODE_INPUT_LEN, max_input - 2))
        # a decode node keeps num_reserved_decode_tokens free per running request (decode.py:2052-2058) and
        # admits one more only while (input + reserve) fits beside them; a unified node holds input + output
        reserve = _int(info, "num_reserved_decode_tokens") if mode == "decode" else None
        out = max(1, min(output_len, max_input - in_len - 1))
        per = in_len + (reserve if reserve is not None else out)
        held = max(1, (pool - per) // per) if reserve is not None else max(1, pool // per)
        why += f"; the pool of {pool:,} tokens holds {held:,} of {per} tokens at once"
        plans.append(LoadPlan("decode", n, n, in_len, out, admitted=admitted, reachable_requests=min(n, held),
                              why=why))  # fmt: skip
    return plans


def _body(mode: str, plan: LoadPlan, rng: random.Random, room: int, n: int, bootstrap_port: int,
          vocab: int) -> dict[str, Any]:  # fmt: skip
    """One /generate call carrying `n` prompts (rooms room … room + n − 1: io_struct.py:925-929 numbers a scalar)."""
    hi = max(200, min(vocab, 30000))
    ids = [[rng.randrange(100, hi) for _ in range(plan.input_len)] for _ in range(n)]
    b: dict[str, Any] = {
        "input_ids": ids if n > 1 else ids[0],
        "sampling_params": {"max_new_tokens": plan.output_len, "temperature": 0, "ignore_eos": True},
    }
    if mode != "null":
        b.update(bootstrap_host=FAKE_BOOTSTRAP_HOST, bootstrap_port=bootstrap_port, bootstrap_room=room)
    return b


def calls_of(plan: LoadPlan, per_call: int = BATCH_PER_CALL) -> list[int]:
    """The prompts each /generate call of a burst carries: `concurrency` at once in calls of ≤ per_call."""
    width = max(1, plan.concurrency)
    calls = -(-width // per_call)
    size = -(-width // calls)
    out, left = [], plan.requests
    while left > 0:
        out.append(min(size, left))
        left -= out[-1]
    return out


async def _burst(
    c: httpx.AsyncClient, mode: str, plan: LoadPlan, patience: Patience, bootstrap_port: int, vocab: int, seed: int,
    per_call: int = BATCH_PER_CALL,
) -> LoadResult:
    res = LoadResult(plan)
    rng = random.Random(seed)
    sizes = calls_of(plan, per_call)
    sem = asyncio.Semaphore(max(1, -(-plan.concurrency // max(sizes, default=1))))
    t0 = time.monotonic()

    def err(msg: str, n: int) -> None:
        res.failed += n
        if len(res.errors) < 5:
            res.errors.append(msg)

    async def one(i: int, n: int, first: int) -> None:
        async with sem:
            if patience.spent():
                res.timed_out = True
                return
            res.sent += n
            body = _body(mode, plan, rng, seed * 1_000_003 + first, n, bootstrap_port, vocab)
            try:
                r = await c.post("/generate", json=body)
            except asyncio.CancelledError:
                res.timed_out = True
                err(f"timed out: {patience.describe()}", n)
                raise
            except httpx.HTTPError as e:
                err(f"{type(e).__name__}: {e}", n)
                return
            if r.status_code != 200:
                err(f"HTTP {r.status_code}: {r.text[:200]}", n)
                return
            try:
                out = r.json()
            except ValueError as e:
                err(f"bad JSON from /generate: {e}", n)
                return
            outs = out if isinstance(out, list) else [out]
            res.ok += len(outs)
            for o in outs:
                ids = o.get("output_ids") if isinstance(o, dict) else None
                res.output_tokens += len(ids) if isinstance(ids, list) else 0

    firsts = [sum(sizes[:k]) for k in range(len(sizes))]
    tasks = [asyncio.ensure_future(one(k, n, f)) for k, (n, f) in enumerate(zip(sizes, firsts, strict=True))]

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


def serving_of(load: list[dict[str, Any]]) -> dict[str, Any]:
    """What a run's load.json (LoadResult.as_dict per burst) puts in `Measurement.serving`: the plans (what each burst
    was meant to reach, read by profiler.analyse.load) and how each went."""
    ok = [x for x in load if isinstance(x, dict) and isinstance(x.get("plan"), dict)]
    return {
        "load_plans": [x["plan"] for x in ok],
        "load_results": [{k: x.get(k) for k in ("sent", "ok", "failed", "timed_out", "elapsed_s")} | {
            "kind": x["plan"].get("kind")} for x in ok],
    }


def run_load(
    net: NetThread, port: int, mode: str, plans: list[LoadPlan], *, timeout_s: float, bootstrap_port: int = 8998,
    vocab: int = 32000, seed: int = 0, per_call: int = BATCH_PER_CALL,
) -> list[LoadResult]:  # fmt: skip
    """Run the bursts in order within `timeout_s` overall (machine-normalised; inside the worker's namespace
    when needed: the client is created on that thread). `per_call` 1 sends one prompt per /generate call (a PD
    router routes each call as one request)."""
    patience = Patience(timeout_s, "load")
    width = max((len(calls_of(p, per_call)) for p in plans), default=1)

    async def all_bursts() -> list[LoadResult]:
        out = []
        async with async_client(port, width) as c:
            for k, p in enumerate(plans):
                out.append(await _burst(c, mode, p, patience, bootstrap_port, vocab, seed * 10 + k + 1, per_call))
        return out

    return net.call(lambda: asyncio.run(all_bursts()))
