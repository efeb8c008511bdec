"""A real prefill/decode pair: two workers with a real transfer backend, sglang's router in front, load through it.

`run_pair(prefill, decode, out)` starts the prefill worker (`--disaggregation-transfer-backend B
--disaggregation-bootstrap-port P`) and the decode worker (the same backend) at once, waits for both on their
own /health, then starts the router of the `sglang-router` package (`python -m sglang_router.launch_router
--pd-disaggregation --prefill URL P --decode URL`, `--mini-lb` for its Python load balancer) and waits on the
router's /health (it answers 503 until it has seen its workers healthy). The load goes to the router only, so
every request is prefilled on one worker and its KV cache crosses to the other: three prompt kinds —
single-chunk, chunked (longer than the prefill chunk: several chunk sends) and prefix-cached (a prompt whose
prefix the prefill worker has just computed) — each with its own `rid`, which sglang keeps on both workers.

The proof of transfer is per request and does not rest on output tokens (dummy weights make them nearly
uniform): both workers hash the request's KV rows (profiler/measure/probe/kv_hash.py) at send and at receive;
`transfer.json` pairs them by rid. sglang's warm-up requests (to the fake bootstrap host) are the negative
control: their rows on decode were never written and hash as zeros.

On a CPU machine the pair and its router run in one loopback-only network namespace (mooncake's listeners bind
every interface), held by a `sleep` process that `unshare -n` started; the workers and the router enter it with
`nsenter`. Each worker keeps its own directory (`prefill/`, `decode/`: command, log, probe, server_info,
measurement, run.json as `memfrac run` writes them); `router/` holds the router's command and log; `pair.json`
the story; `load.json` every request.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from profiler.core.errors import MemfracError
from profiler.measure.runner.load import LoadPlan, LoadResult, plan_load, run_load
from profiler.measure.runner.net import async_client, base_url, free_ports
from profiler.measure.runner.patience import Patience
from profiler.measure.runner.reaper import Watchdog
from profiler.measure.runner.run import CPU_OUTPUT_LEN, RunResult, check_cpu_feasible, finish_worker, write_json
from profiler.measure.runner.worker import Worker, WorkerSpec, build_spec
from profiler.model.scenario import Scenario, scenario_dict

Progress = Callable[[str], None]
ROUTER_READY_S = 180.0  # the router polls its workers' health; 10-25 s on a 2-core machine
#: The load of a pair, per prompt kind: (requests, input tokens as a multiple of the prefill chunk).
CHUNKED_CHUNKS = 3  # a chunked prompt spans 3 prefill chunks (the last one partial)
PAIR_OUTPUT_LEN = 8


@dataclass
class PairRequest:
    rid: str
    kind: str  # single | chunked | prefix
    input_len: int
    status: int | None = None
    output_tokens: int = 0
    error: str | None = None
    elapsed_s: float = 0.0


@dataclass
class PairResult:
    name: str
    status: str  # ok | failed
    out_dir: Path
    prefill: RunResult | None
    decode: RunResult | None
    router: dict[str, Any] = field(default_factory=dict)
    requests: list[PairRequest] = field(default_factory=list)
    transfer: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "status": self.status, "failure": self.failure,
            "prefill": str(self.prefill.out_dir) if self.prefill else None,
            "decode": str(self.decode.out_dir) if self.decode else None,
            "router": self.router, "requests": [r.__dict__ for r in self.requests],
            "transfer": {k: v for k, v in self.transfer.items() if k != "requests"},
        }  # fmt: skip


class Namespace:
    """A loopback-only network namespace held by one `sleep` (root, unshare, ip, nsenter); None off a CPU."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.watchdog: Watchdog | None = None  # the namespace's `sleep` goes when memfrac dies (reaper.py)

    @staticmethod
    def possible() -> str | None:
        if os.geteuid() != 0:
            return "a network namespace needs root"
        missing = [t for t in ("unshare", "nsenter", "ip") if not shutil.which(t)]
        return f"missing {', '.join(missing)}" if missing else None

    def start(self, timeout_s: float = 30.0) -> int:
        self.proc = subprocess.Popen(
            ["unshare", "-n", "--", "sh", "-c", "ip link set lo up && exec sleep 86400"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        self.watchdog = Watchdog(self.proc.pid, 0.0)
        wait = Patience(timeout_s, "the network namespace")
        comm = Path(f"/proc/{self.proc.pid}/comm")
        while not wait.spent():  # `sleep` runs once lo is up (the shell execs it after `ip link set lo up`)
            if self.proc.poll() is not None:
                err = (self.proc.stderr.read() if self.proc.stderr else b"").decode(errors="replace").strip()
                raise MemfracError(f"could not create a network namespace: {err or self.proc.returncode}")
            with contextlib.suppress(OSError):
                if comm.read_text().strip() == "sleep":
                    return self.proc.pid
            time.sleep(0.05)
        raise MemfracError(wait.describe())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.watchdog is not None:
            self.watchdog.release()


def router_argv(python: str, port: int, prefill: WorkerSpec, decode: WorkerSpec, *, mini_lb: bool,
                prometheus_port: int) -> list[str]:  # fmt: skip
    """sglang-router 0.3.2's PD command line (`launch_router --help`: `--prefill URL BOOTSTRAP_PORT`)."""
    a = [python, "-m", "sglang_router.launch_router", "--pd-disaggregation", "--host", "127.0.0.1",
         "--port", str(port), "--prefill", base_url(prefill.port), str(prefill.bootstrap_port),
         "--decode", base_url(decode.port)]  # fmt: skip
    if mini_lb:
        a.append("--mini-lb")
    else:
        a += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(prometheus_port)]
    return a


def check_router() -> None:
    import importlib.util

    if importlib.util.find_spec("sglang_router") is None:
        raise MemfracError("a PD pair needs sglang's router: pip install sglang-router==0.3.2 (memfrac[sglang])")


def pair_prompts(chunk: int, vocab: int, *, per_kind: int = 2) -> list[tuple[PairRequest, list[int]]]:
    """The pair's prompts: `per_kind` single-chunk (½ chunk), chunked (CHUNKED_CHUNKS chunks, the last
    partial) and prefix-cached (a single-chunk prompt's tokens + a short tail: prefill's radix cache holds the
    prefix). Deterministic ids below the vocabulary (ids 100 … min(vocab, 30000))."""
    hi = max(200, min(vocab, 30000))

    def ids(n: int, seed: int) -> list[int]:
        return [100 + (i * 7919 + seed * 104729) % (hi - 100) for i in range(n)]

    single = max(8, chunk // 2)
    chunked = max(2 * chunk + 1, CHUNKED_CHUNKS * chunk - chunk // 4)
    out = []
    for k in range(per_kind):
        out.append((PairRequest(f"memfrac-single-{k}", "single", single), ids(single, 1 + k)))
    for k in range(per_kind):
        out.append((PairRequest(f"memfrac-chunked-{k}", "chunked", chunked), ids(chunked, 11 + k)))
    for k in range(per_kind):  # the prefix: single-{k}'s prompt, already prefilled and cached
        p = ids(single, 1 + k) + ids(max(4, chunk // 8), 21 + k)
        out.append((PairRequest(f"memfrac-prefix-{k}", "prefix", len(p)), p))
    return out


def drive_router(router: Worker, prompts: list[tuple[PairRequest, list[int]]], timeout_s: float,
                 output_len: int = PAIR_OUTPUT_LEN) -> list[PairRequest]:  # fmt: skip
    """Send the prompts one after another through the router (in its namespace), bounded overall."""
    import asyncio

    patience = Patience(timeout_s, "load through the router")

    async def go() -> list[PairRequest]:
        async with async_client(router.spec.port, 1) as c:
            for req, input_ids in prompts:
                if patience.spent():
                    req.error = f"not sent: {patience.describe()}"
                    continue
                body = {"input_ids": input_ids, "rid": req.rid,
                        "sampling_params": {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True}}
                t0 = time.monotonic()
                try:
                    r = await asyncio.wait_for(c.post("/generate", json=body), max(1.0, patience.remaining_wall()))
                    req.status = r.status_code
                    if r.status_code == 200:
                        out = r.json()
                        ids = out.get("output_ids") if isinstance(out, dict) else None
                        req.output_tokens = len(ids) if isinstance(ids, list) else 0
                    else:
                        req.error = f"HTTP {r.status_code}: {r.text[:300]}"
                except (httpx.HTTPError, ValueError, TimeoutError) as e:
                    req.error = f"{type(e).__name__}: {e}"[:300] or type(e).__name__
                req.elapsed_s = round(time.monotonic() - t0, 2)
        return [p for p, _ in prompts]

    return router.net.call(lambda: asyncio.run(go()))


def pair_plans(prefill_info: dict[str, Any], decode_info: dict[str, Any], output_len: int
               ) -> tuple[list[LoadPlan], list[LoadPlan]]:  # fmt: skip
    """The bursts that reach each side's worst case, as `memfrac run` drives a single role (runner/load.py): the
    prefill worker's chunk and max_prefill_tokens from ITS /server_info, the decode burst of every request the decode
    worker says it admits (its internal_states) from its own. Through the router, one prompt per call."""
    return (plan_load("prefill", prefill_info, output_len=output_len),
            plan_load("decode", decode_info, output_len=output_len))  # fmt: skip


def read_kv(probe_dir: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted(probe_dir.glob("kv-*.jsonl")):
        for line in f.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def transfer_evidence(prefill_dir: Path, decode_dir: Path, requests: list[PairRequest]) -> dict[str, Any]:
    """Pair each request's send hash (prefill) with its receive hash (decode), by rid; the warm-up's fake
    requests as the negative control."""
    sent = [r for r in read_kv(prefill_dir) if r.get("type") == "kv_send"]
    recv = [r for r in read_kv(decode_dir) if r.get("type") == "kv_recv"]
    by_rid_s = {r.get("rid"): r for r in sent}
    by_rid_r = {r.get("rid"): r for r in recv}
    rows = []
    for q in requests:
        s, d = by_rid_s.get(q.rid), by_rid_r.get(q.rid)
        rows.append({
            "rid": q.rid, "kind": q.kind, "input_len": q.input_len, "http": q.status,
            "send_sha256": s.get("sha256") if s else None, "recv_sha256": d.get("sha256") if d else None,
            "tokens": s.get("tokens") if s else None, "recv_tokens": d.get("tokens") if d else None,
            "send_calls": s.get("send_calls") if s else None,
            "prefill_cached_tokens": s.get("cached_tokens") if s else None,
            "zero": bool(s and s.get("zero")) or bool(d and d.get("zero")),
            "equal": bool(s and d and s.get("sha256") and s.get("sha256") == d.get("sha256")),
            "error": (s or {}).get("error") or (d or {}).get("error"),
        })  # fmt: skip
    fakes = [{"side": side, "rid": r.get("rid"), "zero": r.get("zero"), "tokens": r.get("tokens"),
              "sha256": r.get("sha256")} for side, rs in (("prefill", sent), ("decode", recv))
             for r in rs if r.get("fake")]  # fmt: skip
    proven = [r for r in rows if r["equal"] and not r["zero"] and r["tokens"]]
    return {
        "how": "sha256 of each request's KV rows: at send on prefill (send_kv_chunk), at receive on decode "
               "(_verify_kv_checksums); probe/kv_hash.py",
        "requests": rows,
        "proven": len(proven),
        "of": len(rows),
        "kinds_proven": sorted({r["kind"] for r in proven}),
        "negative_control": fakes,
        "negative_control_zero": bool([f for f in fakes if f["side"] == "decode"])
        and all(f["zero"] for f in fakes if f["side"] == "decode"),
    }


def run_pair(
    prefill: Scenario,
    decode: Scenario,
    out_dir: Path,
    *,
    name: str | None = None,
    device: str | None = None,
    gpus: tuple[list[int] | None, list[int] | None] = (None, None),
    transfer_backend: str = "mooncake_tcp",
    mini_lb: bool = False,
    progress: Progress | None = None,
    python: str | None = None,
) -> PairResult:
    """Start the pair and its router, load through the router, stop everything, record both workers."""
    from profiler.measure.machine import cuda_machine

    say = progress or (lambda _m: None)
    name = name or prefill.name.removesuffix("-prefill")
    if prefill.mode != "prefill" or decode.mode != "decode":
        raise MemfracError(f"{name}: a pair is one prefill and one decode scenario (got {prefill.mode}, {decode.mode})")
    check_router()
    device = device or ("cuda" if cuda_machine() else "cpu")
    if device == "cpu":
        check_cpu_feasible(prefill)
        check_cpu_feasible(decode)
    out_dir = Path(os.path.abspath(out_dir))  # the workers start in their directories: every path absolute
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "scenario.json", {"prefill": scenario_dict(prefill), "decode": scenario_dict(decode)})
    ns = Namespace()
    netns = None
    if device == "cpu" and Namespace.possible() is None:
        netns = ns.start()
    specs = []
    for s, g in ((prefill, gpus[0]), (decode, gpus[1])):
        sp = build_spec(s, out_dir / s.mode, device=device, gpus=g, transfer_backend=transfer_backend,
                        python=python, paired=True)  # fmt: skip
        sp.netns_pid = netns
        specs.append(sp)
    pspec, dspec = specs
    workers = [Worker(pspec), Worker(dspec)]
    rport, prom = free_ports(2)
    py = python or sys.executable
    # the Rust router's /health answers 200 before it has activated its workers (a request then gets 503
    # "No prefill workers available"); /readiness waits for them. The mini load balancer has no such state.
    rspec = WorkerSpec(prefill, device, out_dir / "router", port=rport, netns_pid=netns, python=py,
                       ready_path="/health" if mini_lb else "/readiness")  # fmt: skip
    rspec.out_dir.mkdir(parents=True, exist_ok=True)
    rspec.argv = router_argv(py, rport, pspec, dspec, mini_lb=mini_lb, prometheus_port=prom)
    rspec.env = {"PYTHONUNBUFFERED": "1"}
    router = Worker(rspec)
    for w in workers:
        write_json(w.spec.out_dir / "command.json", {"argv": w.command(), "env": w.spec.env, "device": device})
    write_json(rspec.out_dir / "command.json", {"argv": router.command(), "env": rspec.env})
    from profiler.measure.machine import gpu_use

    before = {w.spec.scenario.mode: gpu_use(w.spec.visible_devices) if device == "cuda" else None for w in workers}
    res = PairResult(name, "failed", out_dir, None, None)
    states: dict[str, dict[str, Any]] = {}
    loads: list[PairRequest] = []
    bursts: dict[str, list[LoadResult]] = {}
    t_start = time.monotonic()
    try:
        for w in workers:
            say(f"{name}: starting {w.spec.scenario.mode} worker on {device} (port {w.spec.port})")
            w.start()
        for w in workers:
            ok = w.wait_ready(w.spec.scenario.run.startup_timeout_s)
            states[w.spec.scenario.mode] = {"ready": ok, "startup_s": (w.ready_at - w.started_at) if ok else None}
            if not ok:
                res.failure = f"{w.spec.scenario.mode} worker not ready: " + (
                    w.timeout_detail or f"exited with status {w.returncode}")
                break
            say(f"{name}: {w.spec.scenario.mode} ready after {states[w.spec.scenario.mode]['startup_s']:.0f} s")
        if res.failure is None:
            for w in workers:
                info = w.server_info()
                states[w.spec.scenario.mode]["info"] = info
                if info is not None:
                    write_json(w.spec.out_dir / "server_info.json", info)
            router.start()
            rready = router.wait_ready(ROUTER_READY_S)
            res.router = {"argv": router.command(), "ready": rready, "mini_lb": mini_lb,
                          "ready_after_s": round(router.ready_at - router.started_at, 1) if rready else None,
                          "last_seen": router.last_seen}  # fmt: skip
            if not rready:
                why = router.timeout_detail or f"exited with status {router.returncode}"
                res.failure = f"router not ready: {why}"
            else:
                say(f"{name}: router ready after {res.router['ready_after_s']} s")
                info = states["prefill"].get("info") or {}
                chunk = info.get("chunked_prefill_size") if isinstance(info.get("chunked_prefill_size"), int) else 0
                chunk = chunk if chunk and chunk > 0 else 1024
                prompts = pair_prompts(chunk, prefill.shape.vocab_size or 32000)
                say(f"{name}: {len(prompts)} requests through the router (single, chunked, prefix-cached)")
                loads = drive_router(router, prompts, prefill.run.load_timeout_s)
                write_json(out_dir / "load.json", [r.__dict__ for r in loads])
                bad = [r for r in loads if r.status != 200]
                if bad:
                    res.failure = f"{len(bad)}/{len(loads)} requests failed through the router: {bad[0].error}"
                else:
                    out_len = min(decode.run.output_len, CPU_OUTPUT_LEN) if device == "cpu" else decode.run.output_len
                    pplans, dplans = pair_plans(info, states["decode"].get("info") or {}, out_len)
                    say(f"{name}: load through the router: " + "; ".join(
                        f"{p.kind} {p.requests} × {p.input_len} tokens" for p in pplans + dplans))
                    done = run_load(router.net, router.spec.port, "null", pplans + dplans, per_call=1,
                                    timeout_s=decode.run.load_timeout_s, vocab=prefill.shape.vocab_size or 32000)
                    bursts = {"prefill": done[: len(pplans)], "decode": done[len(pplans):]}
                    for w in workers:
                        write_json(w.spec.out_dir / "load.json",
                                   [r.as_dict() for r in bursts[w.spec.scenario.mode]])  # fmt: skip
                    short = [r for r in done if r.ok < r.plan.requests]
                    if short:
                        r = short[0]
                        res.failure = (f"{r.plan.kind} burst through the router: {r.ok}/{r.plan.requests} requests "
                                       f"completed: {r.errors[0] if r.errors else 'timed out'}")  # fmt: skip
    finally:
        alive = {w.spec.scenario.mode: w.alive() for w in workers}  # before we stop them: who died by itself
        res.router["stop"] = router.stop(10.0) if router.proc else {}
        stops = {w.spec.scenario.mode: w.stop() for w in workers}
        ns.stop()
    res.requests = loads
    for w in workers:
        mode = w.spec.scenario.mode
        st = states.get(mode, {})
        died = w.proc is not None and not alive[mode]
        timed_out = not died and not st.get("ready", False) and w.timeout_detail is not None
        rr = finish_worker(w, st.get("ready", False), st.get("info"), died=died, timed_out=timed_out,
                           during_load=died and bool(st.get("ready")), stop=stops[mode],
                           startup_s=st.get("startup_s"), gpu_before=before[mode],
                           loads=bursts.get(mode))  # fmt: skip
        if mode == "prefill":
            res.prefill = rr
        else:
            res.decode = rr
        if rr.failure and res.failure is None:
            res.failure = f"{mode}: {rr.failure.kind}: {rr.failure.message}"[:500]
    res.transfer = transfer_evidence(pspec.probe_dir, dspec.probe_dir, loads)
    write_json(out_dir / "transfer.json", res.transfer)
    if res.failure is None and loads and res.transfer["proven"] < len(loads):
        res.failure = f"transfer proven for {res.transfer['proven']}/{len(loads)} requests (transfer.json)"
    res.status = "ok" if res.failure is None else "failed"
    res.router["wall_s"] = round(time.monotonic() - t_start, 1)
    write_json(out_dir / "pair.json", res.as_dict())
    return res


__all__ = ["PairResult", "pair_plans", "pair_prompts", "router_argv", "run_pair", "transfer_evidence"]


def pair_of(path: str, name: str | None) -> tuple[Scenario, Scenario] | None:
    """The pair `memfrac run FILE [--scenario NAME]` means: the file's only pair, or the pair named NAME (or
    one of its roles); None when it means a single worker."""
    from profiler.model.scenario import load_scenarios

    scenarios = load_scenarios(path)
    pairs: dict[str, list[Scenario]] = {}
    for s in scenarios:
        if s.pair is not None:
            pairs.setdefault(s.pair, []).append(s)
    if name is not None:
        key = name if name in pairs else next((s.pair for s in scenarios if s.name == name and s.pair), None)
    else:
        key = next(iter(pairs)) if len(pairs) == 1 and len(scenarios) == 2 else None
    if key is None:
        return None
    roles = {s.mode: s for s in pairs[key]}
    return roles["prefill"], roles["decode"]


def run_pair_command(pair: tuple[Scenario, Scenario], *, out: str | None, gpus: list[int] | None, device: str | None,
                     validate: bool, as_json: bool) -> int:  # fmt: skip
    """`memfrac run` on a pair: validate both roles with sglang, run, print a summary (exit 0 ok, 1 failed)."""
    from profiler.engine.validation import check
    from profiler.measure.runner.summary import render_pair

    pre, dec = pair
    v = check([pre, dec], enabled=validate)
    print(v.summary() if v.validated else f"note: {v.summary()}", file=sys.stderr)
    name = pre.pair or pre.name
    out_dir = Path(out) if out else Path("results/runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    n = pre.gpus_needed
    split = (gpus[:n], gpus[n:]) if gpus else (None, None)
    res = run_pair(pre, dec, out_dir, name=name, device=device, gpus=split,
                   transfer_backend=pre.transfer_backend or "mooncake_tcp", mini_lb=pre.router == "mini_lb",
                   progress=lambda m: print(m, file=sys.stderr, flush=True))  # fmt: skip
    print(json.dumps(res.as_dict(), indent=1, default=str) if as_json else render_pair(res))
    return 0 if res.status == "ok" else 1
