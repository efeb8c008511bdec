"""The probe's snapshot layer and NVML: queried while it can answer, never again after it cannot, never per sample.

NVML lists processes by host PID; inside a container the worker's PID is a namespace PID, so NVML never
finds it. Asking anyway costs an NVML round trip per snapshot, and the recorder's runtime samples run on the
scheduler thread every 50 ms. Test doubles stand in for torch's CUDA calls and for pynvml (the library's
surface only; the numbers they return are arbitrary and only their flow is checked).
"""

from __future__ import annotations

import os
import sys
import types
from types import SimpleNamespace

import pytest

from profiler.measure.probe.snapshot import Probe

UUID = "GPU-6f1b0c2e-0000-4000-8000-000000000001"


class FakeCuda:
    """torch.cuda as the probe uses it: an initialised context on device 0."""

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def mem_get_info(self, dev: int) -> tuple[int, int]:
        return 70_000 * (1 << 20), 80_000 * (1 << 20)

    def memory_stats(self, dev: int) -> dict[str, int]:
        return {"allocated_bytes.all.current": 1 << 30, "reserved_bytes.all.current": 2 << 30}

    def get_device_properties(self, dev: int) -> SimpleNamespace:
        return SimpleNamespace(uuid=UUID.removeprefix("GPU-"))

    def reset_peak_memory_stats(self, dev: int) -> None:
        pass


def fake_pynvml(pids: list[int]) -> types.ModuleType:
    """A pynvml double: one GPU (our UUID) whose compute processes are `pids`, 512 MiB each; counts calls."""
    m = types.ModuleType("pynvml")
    m.calls = {"init": 0, "procs": 0}  # type: ignore[attr-defined]

    def init() -> None:
        m.calls["init"] += 1  # type: ignore[attr-defined]

    def procs(handle: object) -> list[SimpleNamespace]:
        m.calls["procs"] += 1  # type: ignore[attr-defined]
        return [SimpleNamespace(pid=p, usedGpuMemory=512 * (1 << 20)) for p in pids]

    m.nvmlInit = init  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = lambda: 1  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)  # type: ignore[attr-defined]
    m.nvmlDeviceGetUUID = lambda h: UUID.encode()  # type: ignore[attr-defined]
    m.nvmlDeviceGetComputeRunningProcesses = procs  # type: ignore[attr-defined]
    return m


def gpu_probe(monkeypatch: pytest.MonkeyPatch, pids: list[int]) -> tuple[Probe, types.ModuleType]:
    nv = fake_pynvml(pids)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    p = Probe()
    p._torch = SimpleNamespace(cuda=FakeCuda(), _C=SimpleNamespace(_cuda_hasPrimaryContext=lambda d: True))
    return p, nv


def test_nvml_reads_this_process_when_its_pid_is_listed(monkeypatch):
    p, nv = gpu_probe(monkeypatch, [123, os.getpid()])
    s = p.snapshot()
    assert s.kind == "gpu" and s.nvml_used_mib == 512.0 and s.free_mib == 70_000.0
    assert p.snapshot().nvml_used_mib == 512.0
    assert nv.calls == {"init": 1, "procs": 2}


def test_nvml_is_disabled_after_the_first_miss(monkeypatch):
    """A container: NVML lists host PIDs, never ours. One query finds that out; the next 9 snapshots ask nothing."""
    p, nv = gpu_probe(monkeypatch, [4242, 4243])
    snaps = [p.snapshot() for _ in range(10)]
    assert all(s.nvml_used_mib is None for s in snaps)
    assert all(s.free_mib == 70_000.0 for s in snaps)  # the driver and torch layers still read
    assert nv.calls == {"init": 1, "procs": 1}
    assert "no process with this PID" in (p.nvml_off or "")


def test_snapshot_without_nvml_asks_nvml_nothing(monkeypatch):
    p, nv = gpu_probe(monkeypatch, [os.getpid()])
    s = p.snapshot(nvml=False)
    assert s.nvml_used_mib is None and s.torch_reserved_mib == 2048.0
    assert nv.calls == {"init": 0, "procs": 0}


def test_runtime_samples_never_query_nvml(monkeypatch, tmp_path):
    """The scheduler calls runtime_sample after every batch: after the baseline, no sample touches NVML."""
    from profiler.measure.probe.recorder import Recorder

    p, nv = gpu_probe(monkeypatch, [os.getpid()])
    rec = Recorder(str(tmp_path), probe=p)
    rec.runtime_sample(force=True)  # the runtime baseline (a snapshot of its own)
    base = dict(nv.calls)
    for _ in range(20):
        rec.runtime_sample(force=True)
    assert nv.calls == base, "runtime samples on the scheduler thread must not call NVML"
