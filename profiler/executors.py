"""Where sweep runs execute: this node's GPUs (local) or a Ray cluster (ray, an optional extra).

Both take jobs (one worker start each, with the GPU count it needs) and hand results back to the driver
as each run finishes; the driver stores them. A failing or hung run never stops the others: every run
has its own process group and its own time limits (startup, load, stop), enforced by the runner.
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

from profiler.errors import MemfracError
from profiler.plan import RunGroup
from profiler.runner.run import RunResult, gpu_memory_used, run_scenario


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
    error: str | None = None  # the executor could not run it at all (not a worker failure)
    gpus: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0


Done = Callable[[JobResult], None]
Started = Callable[[Job], None]


def _run_one(job: Job, gpus: list[int] | None) -> JobResult:
    t0 = time.monotonic()
    try:
        res = run_scenario(job.group.launch, job.out_dir, gpus=gpus, device=job.device, python=job.python)
        return JobResult(job, res, None, gpus or [], time.monotonic() - t0)
    except MemfracError as e:
        return JobResult(job, None, str(e), gpus or [], time.monotonic() - t0)
    except Exception as e:  # a bug must not take the sweep down; it is reported with the run
        return JobResult(
            job, None, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}", gpus or [], time.monotonic() - t0
        )


class LocalExecutor:
    """Runs jobs on this node: first-fit onto free GPUs, one thread per running worker.

    On CUDA a GPU is only handed out when nvidia-smi shows it free (memory.used under `free_below_mib`); on
    a CPU machine `slots` parallel workers share the host (each tiny worker takes ~4.5 GB of RAM).
    """

    def __init__(self, gpus: list[int], device: str, slots: int = 1, free_below_mib: float = 1024.0) -> None:
        self.gpus = list(gpus) if device == "cuda" else list(range(max(1, slots)))
        self.device = device
        self.free_below_mib = free_below_mib

    def _gpus_free(self, ids: list[int]) -> bool:
        if self.device != "cuda":
            return True
        used = gpu_memory_used(ids)
        return used is not None and all(used.get(g, 0.0) < self.free_below_mib for g in ids)

    def run(
        self, jobs: list[Job], done: Done, deadline: float | None = None, started: Started | None = None
    ) -> list[Job]:
        """Run until every job ran or the deadline passed; return the jobs never started (`started(job)` as each
        starts: the sweep's progress bar shows the runs in flight)."""
        pending: list[Job] = []
        for j in jobs:
            if self.device == "cuda" and j.gpus_needed > len(self.gpus):
                done(JobResult(j, None, f"needs {j.gpus_needed} GPUs; this node offers {len(self.gpus)} (--gpus)"))
            else:
                pending.append(j)
        free = list(self.gpus)
        held: dict[int, list[int]] = {}  # id(job) → the GPUs (or CPU slots) it holds
        results: queue.Queue[JobResult] = queue.Queue()
        while pending or held:
            if deadline is None or time.monotonic() < deadline:
                for j in list(pending):
                    need = j.gpus_needed if self.device == "cuda" else 1
                    take = free[:need]
                    if len(take) < need or not self._gpus_free(take):
                        continue
                    free = free[need:]
                    pending.remove(j)
                    held[id(j)] = take
                    gpus = take if self.device == "cuda" else None
                    if started is not None:
                        started(j)
                    threading.Thread(
                        target=lambda j=j, gpus=gpus: results.put(_run_one(j, gpus)),
                        name=f"memfrac-{j.group.key}",
                        daemon=True,
                    ).start()
            elif not held:
                break
            if not held:
                time.sleep(5)  # every GPU busy with memory that is not ours: wait, then look again
                continue
            try:
                r = results.get(timeout=1.0)
            except queue.Empty:
                continue
            free = sorted(free + held.pop(id(r.job)))
            done(r)
        return pending


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
        ray = self.ray
        total = int(ray.cluster_resources().get("GPU", 0))
        refs: dict[Any, tuple[Job, float]] = {}
        pending: list[Job] = []
        for j in jobs:
            if deadline is not None and time.monotonic() >= deadline:
                pending.append(j)
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

    from profiler.measurement import Measurement

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
