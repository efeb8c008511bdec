"""Where sweep runs execute: this node's GPUs (local) or a Ray cluster (ray, an optional extra).

Both take jobs (one worker start each, with the GPU count it needs) and hand results back to the driver
as each run finishes; the driver stores them. A failing or hung run never stops the others: every run
has its own process group and its own time limits (startup, load, stop), enforced by the runner. A run
that never begins — its GPUs stayed busy with memory that is not ours, nvidia-smi could not tell, or the
sweep's budget ran out — is handed back too, as not started, with the reason.
"""

from __future__ import annotations

import io
import queue
import shutil
import tarfile
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profiler.core.errors import MemfracError
from profiler.measure.machine import gpu_use, parent_entries, visible_devices
from profiler.measure.runner.run import RunResult, run_scenario
from profiler.sweep.plan import RunGroup

NOT_STARTED = "not_started"  # a JobResult/manifest status: the executor never started the worker


@dataclass
class Job:
    group: RunGroup
    out_dir: Path
    device: str  # cuda | cpu
    python: str | None = None

    @property
    def gpus_needed(self) -> int:
        return self.group.gpus_needed


@dataclass
class JobResult:
    job: Job
    result: RunResult | None
    error: str | None = None  # the executor could not run it at all (not a worker failure); or why not started
    gpus: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0
    started: bool = True  # False: never started (GPUs stayed busy, nvidia-smi failed, budget spent); see `error`
    pair: Any = None  # a PD pair's PairResult (profiler.measure.runner.pair); `result` is then its prefill side

    @property
    def status(self) -> str:
        """ok | failed (the worker's) | error (the executor could not run it) | not_started."""
        if not self.started:
            return NOT_STARTED
        if self.pair is not None:
            return str(self.pair.status)
        return self.result.status if self.result is not None else "error"


def not_started(job: Job, why: str, waited_s: float = 0.0) -> JobResult:
    return JobResult(job, None, why, [], waited_s, started=False)


Done = Callable[[JobResult], None]
Started = Callable[[Job], None]


def _run_one(job: Job, gpus: list[int] | None, progress: Callable[[str], None] | None = None) -> JobResult:
    t0 = time.monotonic()
    try:
        g = job.group
        if g.peer is not None:  # a PD pair: prefill on the first GPUs, decode on the rest
            from profiler.measure.runner.pair import run_pair

            n = g.launch.gpus_needed
            split = (gpus[:n], gpus[n:]) if gpus else (None, None)
            pr = run_pair(g.launch, g.peer, job.out_dir, name=g.key, device=job.device, gpus=split,
                          transfer_backend=g.launch.transfer_backend or "mooncake_tcp",
                          mini_lb=g.launch.router == "mini_lb", python=job.python, progress=progress)  # fmt: skip
            res = pr.prefill if pr.prefill is not None else None
            return JobResult(job, res, pr.failure if res is None else None, gpus or [], time.monotonic() - t0, pair=pr)
        res = run_scenario(g.launch, job.out_dir, gpus=gpus, device=job.device, python=job.python, progress=progress)
        return JobResult(job, res, None, gpus or [], time.monotonic() - t0)
    except MemfracError as e:
        return JobResult(job, None, str(e), gpus or [], time.monotonic() - t0)
    except Exception as e:  # a bug must not take the sweep down; it is reported with the run
        return JobResult(
            job, None, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}", gpus or [], time.monotonic() - t0
        )


class LocalExecutor:
    """Runs jobs on this node: first-fit onto free GPUs, one thread per running worker.

    On CUDA a GPU is only handed out when nvidia-smi shows it free (memory.used under `free_below_mib`), the
    GPU named the way the worker will see it (sweep index → the parent's CUDA_VISIBLE_DEVICES entry → UUID).
    A run waits at most `gpu_wait_s` for GPUs that only foreign memory or a failing nvidia-smi keep from it
    (waiting for this sweep's own runs does not count), never past the deadline, then comes back not started.
    On a CPU machine `slots` parallel workers share the host (each tiny worker takes ~4.5 GB of RAM).
    `progress` gets each worker's own lines as `memfrac run` prints them (starting…, ready, load, stopped).
    """

    def __init__(
        self,
        gpus: list[int],
        device: str,
        slots: int = 1,
        free_below_mib: float = 1024.0,
        gpu_wait_s: float = 600.0,
        poll_s: float = 5.0,
        say: Callable[[str], None] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.gpus = list(gpus) if device == "cuda" else list(range(max(1, slots)))
        self.device = device
        self.free_below_mib = free_below_mib
        self.gpu_wait_s = gpu_wait_s
        self.poll_s = poll_s
        self.say = say or (lambda _m: None)
        self.progress = progress

    def idle(self, ids: list[int]) -> tuple[list[int], str | None]:
        """Which of `ids` are free to hand out now, and why the others are not (None when all are)."""
        if self.device != "cuda" or not ids:
            return list(ids), None
        try:
            entries = visible_devices(ids, parent_entries())
        except MemfracError as e:
            return [], str(e)
        use = gpu_use(entries)
        if use.error is not None:
            return [], use.error
        free, why = [], []
        for g, e in zip(ids, entries or [], strict=True):
            mib = use.of(e)
            if mib is not None and mib < self.free_below_mib:
                free.append(g)
            else:
                shown = "?" if mib is None else f"{mib:.0f}"
                why.append(f"GPU {g} ({use.uuids.get(e, e)}) has {shown} MiB in use")
        if why:
            why[-1] += f" by others (free means under {self.free_below_mib:.0f} MiB)"
        return free, "; ".join(why) or None

    def _need(self, j: Job) -> int:
        return j.gpus_needed if self.device == "cuda" else 1

    def run(
        self, jobs: list[Job], done: Done, deadline: float | None = None, started: Started | None = None
    ) -> list[Job]:
        """Run until every job ran or was given up on; every job reaches `done`. Return those never started
        (`started(job)` as each starts: the sweep's progress bar shows the runs in flight)."""
        pending: list[Job] = []
        for j in jobs:
            if self.device == "cuda" and j.gpus_needed > len(self.gpus):
                done(JobResult(j, None, f"needs {j.gpus_needed} GPUs; this node offers {len(self.gpus)} (--gpus)"))
            else:
                pending.append(j)
        free = list(self.gpus)
        held: dict[int, list[int]] = {}  # id(job) → the GPUs (or CPU slots) it holds
        waiting: dict[int, float] = {}  # id(job) → since when only busy/unreadable GPUs keep it waiting
        never: list[Job] = []
        results: queue.Queue[JobResult] = queue.Queue()
        last_why: str | None = None
        while pending or held:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                for j in pending:
                    extra = f"; GPUs were busy: {last_why}" if id(j) in waiting and last_why else ""
                    done(not_started(j, f"the sweep budget (--budget) ran out before it could start{extra}"))
                never += pending
                pending = []
            elif any(len(free) >= self._need(j) for j in pending):  # someone fits our bookkeeping: ask the GPUs
                idle, why = self.idle(free)
                last_why = why
                for j in list(pending):
                    need = self._need(j)
                    if len(free) < need:  # our own runs hold the GPUs: not the GPUs' fault, no clock
                        waiting.pop(id(j), None)
                        continue
                    take = [g for g in free if g in idle][:need]
                    if len(take) < need:
                        since = waiting.setdefault(id(j), now)
                        if since == now:
                            self.say(f"{j.group.key}: waiting up to {self.gpu_wait_s:.0f} s for free GPUs: {why}")
                        if now - since >= self.gpu_wait_s:
                            pending.remove(j)
                            never.append(j)
                            n = f"{need} free GPU" + ("s" if need > 1 else "")
                            done(not_started(j, f"waited {now - since:.0f} s for {n}: {why}", now - since))
                        continue
                    waiting.pop(id(j), None)
                    free = [g for g in free if g not in take]
                    idle = [g for g in idle if g not in take]
                    pending.remove(j)
                    held[id(j)] = take
                    gpus = take if self.device == "cuda" else None
                    if started is not None:
                        started(j)
                    threading.Thread(
                        target=lambda j=j, gpus=gpus: results.put(_run_one(j, gpus, self.progress)),
                        name=f"memfrac-{j.group.key}",
                        daemon=True,
                    ).start()
            if not held:
                if pending:
                    time.sleep(self.poll_s)  # GPUs busy with memory that is not ours: wait, then look again
                continue
            try:
                r = results.get(timeout=self.poll_s)  # a finished run wakes the loop at once
            except queue.Empty:
                continue
            free = sorted(free + held.pop(id(r.job)))
            done(r)
        return never


# ---------------------------------------------------------------------------------------------------
# Ray
# ---------------------------------------------------------------------------------------------------


def _tar(d: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for p in sorted(d.rglob("*")):
            if p.is_file():
                t.add(p, arcname=str(p.relative_to(d)))
    return buf.getvalue()


def _untar(data: bytes, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as t:
        t.extractall(dest, filter="data")


def ray_task(scenario: Any, device: str, python: str | None) -> dict[str, Any]:
    """Runs on a Ray worker: the run in a scratch dir there, its artifacts shipped back as a tarball."""
    import json
    import os

    scratch = Path(tempfile.mkdtemp(prefix="memfrac-ray-"))
    try:
        res = run_scenario(scenario, scratch / "run", device=device, python=python)
        where = {"node": os.uname().nodename, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
        (res.out_dir / "ray.json").write_text(json.dumps(where))
        return {"status": res.status, "artifacts": _tar(res.out_dir), **where}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class RayExecutor:
    """Each run is a Ray task asking for `num_gpus` = its GPU count; results come back to the driver."""

    def __init__(self, address: str | None = None, device: str = "cuda", num_gpus: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise MemfracError("the Ray executor needs Ray: pip install 'memfrac[ray]'") from None
        self.ray = ray
        self.device = device
        if not ray.is_initialized():
            if address:
                ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
            else:
                ray.init(num_gpus=num_gpus, ignore_reinit_error=True, log_to_driver=False, include_dashboard=False)
        self._remote = ray.remote(ray_task)

    def run(
        self, jobs: list[Job], done: Done, deadline: float | None = None, started: Started | None = None
    ) -> list[Job]:
        """Submit every job (those past the deadline come back not started); return those never started."""
        ray = self.ray
        total = int(ray.cluster_resources().get("GPU", 0))
        refs: dict[Any, tuple[Job, float]] = {}
        pending: list[Job] = []
        for j in jobs:
            if deadline is not None and time.monotonic() >= deadline:
                pending.append(j)
                done(not_started(j, "the sweep budget (--budget) ran out before it could start"))
                continue
            if j.gpus_needed > total:
                done(JobResult(j, None, f"needs {j.gpus_needed} GPUs; the Ray cluster has {total}"))
                continue
            ref = self._remote.options(num_gpus=j.gpus_needed, name=f"memfrac:{j.group.key}").remote(
                j.group.launch, self.device, j.python
            )
            refs[ref] = (j, time.monotonic())
            if started is not None:
                started(j)  # submitted: Ray starts it when a node has its GPUs
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            for ref in ready:
                j, t0 = refs.pop(ref)
                try:
                    out = ray.get(ref)
                    _untar(out["artifacts"], j.out_dir)
                    done(JobResult(j, _result_from_dir(j.out_dir), None, [], time.monotonic() - t0))
                except Exception as e:
                    done(JobResult(j, None, f"Ray task failed: {type(e).__name__}: {e}", [], time.monotonic() - t0))
        return pending


def _result_from_dir(d: Path) -> RunResult:
    """Rebuild a RunResult from a run's artifacts (what a remote run sends back)."""
    import json

    from profiler.core.measurement import Measurement

    run = json.loads((d / "run.json").read_text())
    m = Measurement.load(d / "measurement.json")
    return RunResult(
        run["scenario"],
        run["status"],
        run["device"],
        d,
        m,
        run.get("startup_s"),
        [],
        run.get("stop", {}),
        run.get("gpu_check", {}),
    )
