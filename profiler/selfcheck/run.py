"""`memfrac selfcheck` end to end: the attribution checks, then the worker life, into one report and an exit status.

Its own module so that the checks (`checks`) and the worker life (`life`, which judges with the checks' records)
do not import each other: run → checks, run → life → checks. Everything of `checks` is reached through the module
(`cuda.find_libcudart`, …) so that a test's monkeypatch of `checks` applies here too.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from profiler.core.errors import MemfracError
from profiler.measure.probe.snapshot import Probe
from profiler.selfcheck import checks, cuda
from profiler.selfcheck.life import LifeTruth, free_memory_refusal, judge_life_dir, judge_life_records, run_cuda_life


def judge_readings(readings: dict[str, Any]) -> tuple[list[checks.Check], Any]:
    """Re-judge a run from its recorded readings (`--json`'s "readings"): (checks, the life's ledger or None)."""
    found: list[checks.Check] = []
    for name, d in (readings.get(checks.ATTRIBUTION) or {}).items():
        found += checks._JUDGES[name](checks.readings_from_dict(d))
    ledger = None
    life = readings.get(checks.LIFE)
    if life:
        res = judge_life_records(life["probe_records"], LifeTruth.from_dict(life["truth"]))
        found += res.checks
        ledger = res.ledger
    return found, ledger


def _guarded(
    name: str, fn: Callable[[], list[checks.Check]], torch: Any, group: str = checks.ATTRIBUTION
) -> list[checks.Check]:
    """Run one check; an exception becomes a checks.failed check that names it, and the memory is settled after."""
    try:
        return fn()
    except Exception as e:
        return [checks.failed(name, f"could not measure: {type(e).__name__}: {e}", group)]
    finally:
        with contextlib.suppress(Exception):
            cuda.settle(torch)


def _allocator(torch: Any) -> str:
    try:
        backend = torch.cuda.get_allocator_backend()
    except Exception:
        backend = "?"
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")
    return f"{backend} (PYTORCH_CUDA_ALLOC_CONF={conf})" if conf else backend


def selfcheck(device: int = 0, *, life: bool = True, probe_dir: str | Path | None = None) -> checks.SelfcheckReport:
    """Run every check on `device`: the attribution checks, then (with `life`) the worker life, whose probe
    JSONL lands in `probe_dir` (a temporary directory, removed, when None). Raises checks.NoCudaDevice when the device
    is not visible, checks.NotEnoughFreeMemory when the life would not fit beside what else holds the GPU."""
    t0 = time.monotonic()
    why = cuda.cuda_unavailable_reason(device)
    if why:
        raise checks.NoCudaDevice(why)
    import torch

    torch.cuda.set_device(device)
    torch.zeros(1, device=f"cuda:{device}")  # creates the context; the probe never does
    torch.cuda.synchronize()
    props = torch.cuda.get_device_properties(device)
    free_b, _total_b = torch.cuda.mem_get_info(device)
    report = checks.SelfcheckReport(
        device=device,
        device_name=props.name,
        total_mib=props.total_memory / checks.MIB,
        torch_version=torch.__version__,
        allocator=_allocator(torch),
        free_mib=free_b / checks.MIB,
        cuda_version=torch.version.cuda,
    )
    if life:
        refusal = free_memory_refusal(report.free_mib, device)
        if refusal:
            raise checks.NotEnoughFreeMemory(refusal)
    probe = Probe()
    recorded: dict[str, Any] = {}

    def run(name: str, read: Callable[[], Any]) -> None:
        def fn() -> list[checks.Check]:
            r = read()
            recorded[name] = checks.readings_as_dict(r)
            return checks._JUDGES[name](r)

        report.checks.extend(_guarded(name, fn, torch))

    run("idle", lambda: cuda.read_idle(torch, probe))
    run("torch tensor", lambda: cuda.read_torch_tensor(torch, probe, device))
    rt: cuda.CudaRuntime | None = None

    def malloc() -> checks.AllocReadings:
        nonlocal rt
        rt = cuda.CudaRuntime(cuda.find_libcudart(), device)
        report.libcudart = f"{rt.path} (runtime {rt.version})"
        return cuda.read_cuda_malloc(torch, probe, rt)

    run("cudaMalloc", malloc)
    run("graph ladder", lambda: cuda.read_graph_ladder(torch, probe, device))
    run("peak reset", lambda: cuda.read_peak_reset(torch, probe, device))
    report.readings[checks.ATTRIBUTION] = recorded
    if life:
        _run_life(report, torch, device, rt, probe_dir)
    report.elapsed_s = time.monotonic() - t0
    return report


def _run_life(
    report: checks.SelfcheckReport, torch: Any, device: int, rt: cuda.CudaRuntime | None, probe_dir: Any
) -> None:
    """The worker life on this device, judged; its checks, ledger and readings join the report."""

    if rt is None:
        report.checks.append(
            checks.failed("worker life", "not run: no CUDA runtime library for its cudaMalloc", checks.LIFE)
        )
        return
    with contextlib.ExitStack() as stack:
        d = Path(probe_dir) if probe_dir is not None else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        d.mkdir(parents=True, exist_ok=True)
        try:
            truth = run_cuda_life(torch, device, rt, d)
        except Exception as e:
            report.checks.append(checks.failed("worker life", f"could not run: {type(e).__name__}: {e}", checks.LIFE))
            return
        finally:
            with contextlib.suppress(Exception):
                cuda.settle(torch)
        res = judge_life_dir(d, truth)
        report.checks += res.checks
        report.ledger = res.ledger
        report.readings[checks.LIFE] = {"truth": truth.as_dict(), "probe_records": res.records}


def run_selfcheck(json_out: bool = False, device: int = 0, probe_dir: str | None = None) -> int:
    """`memfrac selfcheck`: prints the report (tables, or with json_out the JSON document) and returns 0 when
    every check passes, 1 when one fails, 2 when no CUDA device is visible or the worker life cannot fit
    (one line on stderr; with json_out stdout still gets a document, its `refused` the same reason)."""
    why = cuda.cuda_unavailable_reason(device)
    if why:
        return _refuse(f"{why}; nothing to check", json_out, device)
    try:
        report = selfcheck(device, probe_dir=probe_dir)
    except MemfracError as e:
        return _refuse(str(e), json_out, device)
    print(json.dumps(report.as_dict(), indent=1, default=str) if json_out else checks.render_text(report))
    return 0 if report.passed else 1


def _refuse(why: str, json_out: bool, device: int) -> int:
    """Exit 2: the reason on stderr, and with json_out the refusal document on stdout (a caller that saves
    stdout, like scripts/gpu-acceptance.sh, always gets JSON)."""
    print(f"memfrac selfcheck: {why}", file=sys.stderr)
    if json_out:
        print(json.dumps(checks.refusal_document(device, why), indent=1))
    return 2
