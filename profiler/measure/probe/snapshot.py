"""Memory snapshots: the only place memfrac's probe touches CUDA.

Three layers on a GPU (facts §5): the driver (`torch.cuda.mem_get_info`: what every allocation, torch's or
not, takes out of the device), torch's caching allocator (`torch.cuda.memory_stats`: allocated/reserved,
current and peak, CUDA-graph private pools included), and NVML's per-process usage (context included).
Non-torch memory (NCCL, DeepEP/NVSHMEM, cuBLAS workspaces, the CUDA context) is driver delta − reserved
delta, computed downstream.

Without CUDA the same calls record host memory instead — process RSS and its peak (VmHWM, reset per phase
through /proc/self/clear_refs) — and every snapshot says `kind: "host"`. Never a made-up GPU number.

A snapshot never initialises CUDA itself: before the worker has picked its device (init_parallel), a
`mem_get_info` would create a context on the wrong GPU, so the device layers are skipped until CUDA is up.
"""

from __future__ import annotations

import os
import time
from typing import Any

from profiler.core.measurement import Snapshot

MIB = float(1 << 20)


def _read_status() -> tuple[float | None, float | None]:
    """(VmRSS, VmHWM) of this process in MiB, from /proc (Linux); (None, None) elsewhere."""
    rss = hwm = None
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) / 1024
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) / 1024
    except OSError:
        pass
    return rss, hwm


def reset_host_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux ≥ 4.0: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class Probe:
    """Takes snapshots in one process. Holds the lazily imported torch/NVML handles, nothing global.

    NVML is asked until it first cannot answer, then never again (`nvml_off` says why): in a container NVML
    lists host PIDs and never ours, and each miss would cost an NVML round trip per snapshot.
    """

    def __init__(self) -> None:
        self._torch: Any = None
        self._nvml: Any = None
        self._nvml_handle: Any = None
        self.nvml_off: str | None = None  # why NVML is no longer asked (None: still asked)
        try:
            import torch

            self._torch = torch
        except ImportError:
            self._torch = None

    @property
    def cuda(self) -> bool:
        """True once this process has a CUDA context on its current device (never creates one)."""
        t = self._torch
        if t is None or not t.cuda.is_available() or not t.cuda.is_initialized():
            return False
        has_ctx = getattr(getattr(t, "_C", None), "_cuda_hasPrimaryContext", None)
        return True if has_ctx is None else bool(has_ctx(t.cuda.current_device()))

    @property
    def kind(self) -> str:
        t = self._torch
        return "gpu" if t is not None and t.cuda.is_available() else "host"

    def snapshot(self, nvml: bool = True) -> Snapshot:
        """Read every layer; `nvml=False` skips NVML (the runtime samples: they run on the scheduler thread)."""
        rss, hwm = _read_status()
        s = Snapshot(kind="gpu" if self.kind == "gpu" else "host", t=time.time(), rss_mib=rss, rss_peak_mib=hwm)
        if not self.cuda:
            return s
        cuda = self._torch.cuda
        dev = cuda.current_device()
        free, total = cuda.mem_get_info(dev)
        st = cuda.memory_stats(dev)
        s.device = dev
        s.free_mib, s.total_mib = free / MIB, total / MIB
        s.torch_allocated_mib = st.get("allocated_bytes.all.current", 0) / MIB
        s.torch_reserved_mib = st.get("reserved_bytes.all.current", 0) / MIB
        s.torch_peak_allocated_mib = st.get("allocated_bytes.all.peak", 0) / MIB
        s.torch_peak_reserved_mib = st.get("reserved_bytes.all.peak", 0) / MIB
        if nvml:
            s.nvml_used_mib = self._nvml_process_mib(dev)
        return s

    def reset_peaks(self) -> None:
        """Start a new peak window: torch's peak stats (GPU) and VmHWM (host)."""
        reset_host_peak()
        if self.cuda:
            self._torch.cuda.reset_peak_memory_stats(self._torch.cuda.current_device())

    def _nvml_process_mib(self, dev: int) -> float | None:
        """This process's memory on its GPU as NVML counts it (context included); None once NVML cannot tell."""
        if self.nvml_off is not None:
            return None
        try:
            if self._nvml is None:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
                uuid = str(self._torch.cuda.get_device_properties(dev).uuid)
                for i in range(pynvml.nvmlDeviceGetCount()):
                    h = pynvml.nvmlDeviceGetHandleByIndex(i)
                    u = pynvml.nvmlDeviceGetUUID(h)
                    u = u.decode() if isinstance(u, bytes) else u
                    if u.replace("GPU-", "") == uuid.replace("GPU-", ""):
                        self._nvml_handle = h
                        break
            if self._nvml_handle is None:
                self.nvml_off = f"NVML lists no GPU with this device's UUID (device {dev})"
                return None
            pid = os.getpid()
            for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._nvml_handle):
                if p.pid == pid and p.usedGpuMemory is not None:
                    return p.usedGpuMemory / MIB
            # a miss: a container's PID namespace (NVML lists host PIDs) or no per-process accounting
            self.nvml_off = f"NVML lists no process with this PID ({pid}) on the GPU"
            return None
        except Exception as e:  # NVML missing, no permission
            self.nvml_off = f"NVML unavailable: {type(e).__name__}: {e}"[:200]
            return None
