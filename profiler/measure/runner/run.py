"""`memfrac run`: one scenario end to end — start the worker in its role, load it, stop it, record it.

Artifacts land in one directory as they are produced, so nothing is lost when a worker dies:
`command.json` (the resolved launch command and environment), `sglang.log`, `probe/probe-<pid>.jsonl`,
`server_info.json`, `load.json`, `measurement.json` and `run.json` (status, failure, timings).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from profiler.core.errors import MemfracError
from profiler.core.measurement import Failure, Identity, Measurement, Phase, Rank
from profiler.measure.machine import GpuUse, cuda_machine, gpu_use
from profiler.measure.probe.reader import ProbeRun, read_probe_dir
from profiler.measure.runner.classify import Witnesses, classify
from profiler.measure.runner.load import LoadResult, plan_load, run_load, serving_of
from profiler.measure.runner.patience import Patience
from profiler.measure.runner.worker import Worker, WorkerSpec, build_spec
from profiler.model.scenario import Scenario, scenario_dict

Progress = Callable[[str], None]
# On a CPU machine the outputs stay short (the requests are still every one the worker admits: the pipeline, and
# the driver reaching the worker's own worst case, are what a CPU run proves — not the memory of a GPU worker).
CPU_OUTPUT_LEN = 16
RELEASE_WAIT_S = 60.0  # how long stop may take to give the GPU memory back (driver teardown)
RELEASE_POLL_S = 2.0
_READY_KEYS = ("max_total_num_tokens", "chunked_prefill_size", "max_prefill_tokens", "max_running_requests")


@dataclass
class RunResult:
    """The outcome of one worker run (the Measurement holds the memory; this holds the story)."""

    scenario: str
    status: str  # "ok" | "failed"
    device: str
    out_dir: Path
    measurement: Measurement
    startup_s: float | None = None
    load: list[LoadResult] = field(default_factory=list)
    stop: dict[str, Any] = field(default_factory=dict)
    gpu_check: dict[str, Any] = field(default_factory=dict)

    @property
    def failure(self) -> Failure | None:
        return self.measurement.failure

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "status": self.status,
            "device": self.device,
            "out_dir": str(self.out_dir),
            "startup_s": self.startup_s,
            "failure": asdict(self.failure) if self.failure else None,
            "load": [r.as_dict() for r in self.load],
            "stop": self.stop,
            "gpu_check": self.gpu_check,
            "measurement": "measurement.json",
        }


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)


_write_json = write_json


def _host_ram_mib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (ValueError, OSError):
        return float("inf")


def check_cpu_feasible(s: Scenario) -> None:
    """A CPU run holds the dummy weights in host memory: refuse what cannot fit, say what would."""
    if s.tp * s.pp * s.dp > 1:
        raise MemfracError(
            f"{s.name}: tp×pp×dp = {s.tp * s.pp * s.dp} needs GPUs; without CUDA memfrac runs single-process CPU "
            "workers only (use a tp=1 scenario such as scenarios/cpu-smoke-decode.toml, or run on a GPU node)"
        )
    weights = s.shape.weight_bytes_per_gpu() / 2**20
    ram = _host_ram_mib()
    if weights > 0.4 * ram:
        raise MemfracError(
            f"{s.name}: {s.model}'s dummy weights (~{weights / 1024:.1f} GiB) do not fit a CPU run on this machine "
            f"({ram / 1024:.0f} GiB RAM); use a tiny model (scenarios/cpu-smoke-*.toml) or run on a GPU node"
        )


def check_memory_returned(
    before: GpuUse,
    entries: list[str] | None,
    timeout_s: float | None = None,
    tolerance_mib: float = 512,
    poll_s: float | None = None,
) -> dict[str, Any]:
    """After stop: wait until each of the run's GPUs (by UUID) is back within `tolerance_mib` of its pre-run use.

    `returned` is True or False when nvidia-smi answered, None (unknown, `why` says what failed) when it did not."""
    timeout_s = RELEASE_WAIT_S if timeout_s is None else timeout_s
    poll_s = RELEASE_POLL_S if poll_s is None else poll_s
    if before.error is not None:
        return {"checked": False, "returned": None, "why": f"GPU memory before the run unknown: {before.error}"}
    out: dict[str, Any] = {"checked": True, "gpus": dict(before.uuids), "before_mib": dict(before.used_mib)}
    deadline = time.monotonic() + timeout_s
    failures = 0
    while True:
        after = gpu_use(entries)
        if after.error is not None:
            failures += 1
            if failures >= 3 or time.monotonic() >= deadline:
                return {**out, "returned": None, "why": f"GPU memory after stop unknown: {after.error}"}
        else:
            failures = 0
            out["after_mib"] = {u: after.used_mib.get(u) for u in before.used_mib}
            if all(after.used_mib.get(u, float("inf")) - b <= tolerance_mib for u, b in before.used_mib.items()):
                return {**out, "returned": True}
            if time.monotonic() >= deadline:
                return {**out, "returned": False, "why": f"still above the pre-run use + {tolerance_mib:.0f} MiB"}
        time.sleep(poll_s)


def ready_phase(info: dict[str, Any]) -> Phase:
    """The worker's /server_info as the rank's `ready` phase: the resolved sizes and what the scheduler admits."""
    det = {k: info.get(k) for k in _READY_KEYS if isinstance(info.get(k), int | float)}
    states = info.get("internal_states") or []
    if states and isinstance(states[0], dict):
        eff = states[0].get("effective_max_running_requests_per_dp")
        if isinstance(eff, int):
            det["effective_max_running_requests_per_dp"] = eff  # what the scheduler admits (internal_state.py:73)
        mu = states[0].get("memory_usage")
        if isinstance(mu, dict):
            det["server_info_memory_usage_gib"] = mu  # sglang's own per-phase GiB (weight, kvcache, graph)
    return Phase("ready", source="server_info", details=det)


def assemble(
    s: Scenario, spec: WorkerSpec, probe: ProbeRun, info: dict[str, Any] | None, failure: Failure | None,
    from_log: Measurement | None,
) -> Measurement:  # fmt: skip
    """The run's Measurement: probe ranks, plus what /server_info and the log add."""
    host = (probe.kind or ("gpu" if spec.device == "cuda" else "host")) == "host"
    ident = Identity(
        model=s.model,
        architecture=s.shape.architecture,
        gpu_name="cpu" if host else (probe.device_name or s.gpu.name),
        gpu_total_mib=None if host else (probe.device_total_mib or float(s.gpu.total_mib)),
        gpu_total_how="host run: no GPU" if host else ("torch" if probe.device_total_mib else "scenario"),
        gpu_count=None if host else s.gpus_needed,
        mode=s.mode, tp=s.tp, pp=s.pp, dp=s.dp, attn_dp=s.attn_dp, ep=s.ep,
        sglang_version=probe.sglang_version or (str(info.get("version")) if info and info.get("version") else None),
        hostname=socket.gethostname(),
    )  # fmt: skip
    ranks: list[Rank] = list(probe.ranks)
    if info:
        target = ranks[0] if ranks else Rank(label="")
        if not ranks:
            ranks.append(target)
        target.phases.append(ready_phase(info))
    m = Measurement(
        id=f"{s.name}@{time.strftime('%Y%m%dT%H%M%S')}",
        source="probe",
        memory_kind="host" if host else "gpu",
        origin=str(spec.out_dir),
        scenario=s.name,
        identity=ident,
        args={k: v for k, v in (info or {}).items() if isinstance(v, str | int | float | bool | type(None))}
        or scenario_dict(s),
        args_source="server_info" if info else "scenario",
        mfs_origin="given" if s.mem_fraction_static is not None else "auto",
        ranks=ranks,
        failure=failure,
        unparsed_memory_lines=from_log.unparsed_memory_lines if from_log else 0,
        unparsed_examples=from_log.unparsed_examples if from_log else [],
    )
    if host:
        m.notes.append(
            "host-memory measurement: sglang ran on the CPU (no CUDA here); every number is process RSS of the "
            "scheduler, not GPU memory"
        )
    if probe.bad_lines:
        m.notes.append(f"{probe.bad_lines} probe line(s) were cut off (the worker died while writing)")
    return m


def run_scenario(
    s: Scenario,
    out_dir: Path,
    *,
    gpus: list[int] | None = None,
    device: str | None = None,
    transfer_backend: str = "mooncake_tcp",
    progress: Progress | None = None,
    python: str | None = None,
) -> RunResult:
    """Start, load, stop one worker for scenario `s`; write artifacts to `out_dir`; return the result."""
    say = progress or (lambda _m: None)
    device = device or ("cuda" if cuda_machine() else "cpu")
    if device == "cpu":
        check_cpu_feasible(s)
    out_dir = Path(os.path.abspath(out_dir))  # the worker starts there: every path it is given must be absolute
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_json(out_dir / "scenario.json", scenario_dict(s))
    spec = build_spec(s, out_dir, device=device, gpus=gpus, transfer_backend=transfer_backend, python=python)
    worker = Worker(spec)
    _write_json(out_dir / "command.json", {"argv": worker.command(), "env": spec.env, "device": device})
    entries = spec.visible_devices
    gpu_before = gpu_use(entries) if device == "cuda" else None
    say(f"{s.name}: starting {s.mode} worker on {device} (port {spec.port}); log: {spec.log_path}")
    ready = timed_out = died = during_load = False
    info: dict[str, Any] | None = None
    loads: list[LoadResult] = []
    startup_s: float | None = None
    try:
        worker.start()
        ready = worker.wait_ready(s.run.startup_timeout_s, progress=_ticker(say, s.name) if progress else None)
        if not ready:
            died = not worker.alive()
            timed_out = not died
            if timed_out:
                say(f"{s.name}: not ready in time ({worker.timeout_detail})")
        else:
            startup_s = (worker.ready_at or time.monotonic()) - worker.started_at
            say(f"{s.name}: ready after {startup_s:.0f} s")
            info = worker.server_info()
            if info is not None:
                _write_json(out_dir / "server_info.json", info)
            loads = _drive(worker, s, info or {}, device, say)
            _write_json(out_dir / "load.json", [r.as_dict() for r in loads])
            during_load = True
            if any(r.failed for r in loads) and worker.alive():
                # requests refused because the worker is going down: on a loaded machine its exit lags the refusals
                Patience(5, "the worker exiting after its requests failed").until(lambda: not worker.alive())
            died = not worker.alive()
            timed_out = not died and any(r.timed_out for r in loads)
            during_load = died or timed_out
    finally:
        stop = worker.stop()
    say(f"{s.name}: stopped in {stop.get('stop_s')} s" + (" (SIGKILL needed)" if stop.get("sigkill") else ""))
    return finish_worker(worker, ready, info, died=died, timed_out=timed_out, during_load=during_load, stop=stop,
                         startup_s=startup_s, loads=loads, gpu_before=gpu_before)  # fmt: skip


def finish_worker(
    worker: Worker, ready: bool, info: dict[str, Any] | None, *, died: bool = False, timed_out: bool = False,
    during_load: bool = False, stop: dict[str, Any] | None = None, startup_s: float | None = None,
    loads: list[LoadResult] | None = None, gpu_before: GpuUse | None = None,
) -> RunResult:  # fmt: skip
    """After a worker stopped: its probe, its log, the failure class, the Measurement and run.json (one worker of
    `memfrac run`, or one side of a pair)."""
    spec, s, out_dir, loads = worker.spec, worker.spec.scenario, worker.spec.out_dir, loads or []
    stop = stop if stop is not None else worker.stop()
    gpu_check = (
        check_memory_returned(gpu_before, spec.visible_devices)
        if gpu_before is not None
        else {"checked": False, "returned": None, "why": "host run" if spec.device == "cpu" else "not asked"}
    )
    probe = read_probe_dir(spec.probe_dir)
    from_log = _parse_log(spec.log_path)
    tail = _tail(spec.log_path)
    load_error = next((f"{r.plan.kind}: {r.errors[0] if r.errors else 'no request succeeded'}"
                       for r in loads if r.sent and not r.ok), None)  # fmt: skip
    load_timeout = next((e for r in loads if r.timed_out for e in r.errors if e.startswith("timed out")), None)
    w = Witnesses(
        ready, timed_out, died, during_load, worker.returncode if died or not ready else None, tail, load_error,
        worker.timeout_detail or load_timeout, role=s.mode, served=any(r.ok for r in loads),
    )  # fmt: skip
    failure = classify(w, probe, from_log)
    m = assemble(s, spec, probe, info, failure, from_log)
    if loads:
        m.serving.update(serving_of([r.as_dict() for r in loads]))
    m.save(out_dir / "measurement.json")
    res = RunResult(
        s.name, "ok" if failure is None else "failed", spec.device, out_dir, m, startup_s, loads, stop, gpu_check
    )
    write_json(out_dir / "run.json", res.as_dict())
    return res


def _ticker(say: Progress, name: str) -> Callable[[float], None]:
    last = [0.0]

    def tick(elapsed: float) -> None:
        if elapsed - last[0] >= 15:
            last[0] = elapsed
            say(f"{name}: starting… {elapsed:.0f} s")

    return tick


def _drive(worker: Worker, s: Scenario, info: dict[str, Any], device: str, say: Progress) -> list[LoadResult]:
    out_len = min(s.run.output_len, CPU_OUTPUT_LEN) if device == "cpu" else s.run.output_len
    plans = plan_load(s.mode, info, max_requests=s.run.load_requests, output_len=out_len)
    for p in plans:
        say(f"{s.name}: load {p.kind}: {p.requests} requests × {p.input_len} tokens in, {p.output_len} out, "
            f"{p.concurrency} at once ({p.why})")
    res = run_load(
        worker.net, worker.spec.port, s.mode, plans, timeout_s=s.run.load_timeout_s,
        bootstrap_port=worker.spec.bootstrap_port, vocab=s.shape.vocab_size or 32000,
    )  # fmt: skip
    for r in res:
        say(
            f"{s.name}: load {r.plan.kind}: {r.ok}/{r.sent} ok in {r.elapsed_s:.1f} s"
            + (f", {r.failed} failed" if r.failed else "")
        )
    return res


def _parse_log(path: Path) -> Measurement | None:
    if not path.exists():
        return None
    try:
        from profiler.logs import parse_log

        runs = parse_log(path)
    except Exception:
        return None
    return runs[-1] if runs else None


def _tail(path: Path, n: int = 60) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-n:])
    except OSError:
        return ""
