"""Which physical GPU a sweep's GPU index names, and how much of it is in use (nvidia-smi, matched by UUID).

Index i of `--gpus` is the i-th GPU this process may use: the i-th entry of the parent's CUDA_VISIBLE_DEVICES
when one is set (Slurm, containers and Ray set it; entries may be indices, GPU UUIDs or MIG ids), else GPU i
in PCI order. A worker gets the composed entries and CUDA_DEVICE_ORDER=PCI_BUS_ID — the order nvidia-smi
numbers GPUs in — so an integer entry names the same GPU for CUDA and for nvidia-smi; memory is then read
per GPU UUID, never by position. When nvidia-smi cannot answer, memory use is unknown and says why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from profiler.core.errors import MemfracError

VISIBLE = "CUDA_VISIBLE_DEVICES"
QUERY = "--query-gpu=index,uuid,memory.used"


@dataclass(frozen=True, slots=True)
class SmiGpu:
    """One physical GPU as nvidia-smi lists it."""

    index: int  # nvidia-smi's (PCI-order) index
    uuid: str  # "GPU-…"
    used_mib: float  # memory.used


@dataclass(frozen=True, slots=True)
class GpuUse:
    """memory.used of the GPUs a run may use, by UUID, or why it is unknown (`error`)."""

    used_mib: dict[str, float] = field(default_factory=dict)  # UUID → memory.used MiB
    uuids: dict[str, str] = field(default_factory=dict)  # CUDA_VISIBLE_DEVICES entry → UUID
    error: str | None = None

    def of(self, entry: str) -> float | None:
        u = self.uuids.get(entry)
        return None if u is None else self.used_mib.get(u)


def parent_entries(env: Mapping[str, str] | None = None) -> list[str] | None:
    """The parent's CUDA_VISIBLE_DEVICES as a list of entries; None when it is unset (every GPU visible)."""
    raw = (os.environ if env is None else env).get(VISIBLE)
    if raw is None:
        return None
    return [e.strip() for e in raw.split(",") if e.strip()]


def visible_devices(gpus: list[int] | None, parent: list[str] | None) -> list[str] | None:
    """The CUDA_VISIBLE_DEVICES entries for a worker given sweep indices `gpus` (None: inherit the parent's)."""
    if gpus is None:
        return parent
    if parent is None:
        return [str(g) for g in gpus]
    bad = [g for g in gpus if not 0 <= g < len(parent)]
    if bad:
        offer = f"indices 0–{len(parent) - 1}" if parent else "no GPU"
        raise MemfracError(
            f"--gpus {','.join(map(str, gpus))}: GPU index {bad[0]} is not in this process's "
            f"CUDA_VISIBLE_DEVICES={','.join(parent)!r} ({offer}); --gpus counts within that list"
        )
    return [parent[g] for g in gpus]


def worker_env(gpus: list[int] | None, parent: list[str] | None) -> dict[str, str]:
    """What a CUDA worker's environment gets: the composed device list and the PCI order nvidia-smi uses."""
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    entries = visible_devices(gpus, parent)
    if gpus is not None and entries is not None:
        env[VISIBLE] = ",".join(entries)
    return env


def query(timeout_s: float = 30.0) -> tuple[list[SmiGpu] | None, str | None]:
    """(every GPU nvidia-smi lists, None) or (None, why nvidia-smi gave no answer)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, "nvidia-smi not found on PATH"
    try:
        out = subprocess.run(
            [smi, QUERY, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return None, f"nvidia-smi {QUERY} did not answer within {timeout_s:.0f} s"
    except OSError as e:
        return None, f"nvidia-smi failed to start: {e}"
    if out.returncode != 0:
        msg = (out.stderr.strip() or out.stdout.strip()).splitlines()
        return None, f"nvidia-smi {QUERY} exited {out.returncode}: {msg[-1][:200] if msg else '(no output)'}"
    rows = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            rows.append(SmiGpu(int(parts[0]), parts[1], float(parts[2])))
        except (IndexError, ValueError):
            continue  # "[N/A]" memory (some MIG set-ups) or a warning line
    if not rows:
        return None, f"nvidia-smi {QUERY} listed no GPU with a readable memory.used"
    return rows, None


def resolve(entry: str, rows: list[SmiGpu]) -> SmiGpu | str:
    """The GPU a CUDA_VISIBLE_DEVICES entry names (an index in PCI order, or a unique GPU-UUID prefix); else why not."""
    if entry.isdigit():
        hit = [r for r in rows if r.index == int(entry)]
    elif entry.startswith("MIG-"):
        return f"{entry} is a MIG instance: nvidia-smi's per-GPU memory.used covers every instance of its GPU"
    else:
        want = entry if entry.startswith("GPU-") else f"GPU-{entry}"
        hit = [r for r in rows if r.uuid.startswith(want)]
    if len(hit) == 1:
        return hit[0]
    if not hit:
        return f"CUDA_VISIBLE_DEVICES entry {entry!r} matches no GPU nvidia-smi lists"
    return f"CUDA_VISIBLE_DEVICES entry {entry!r} matches {len(hit)} GPUs"


def gpu_use(entries: list[str] | None, timeout_s: float = 30.0) -> GpuUse:
    """memory.used of each entry's GPU (every GPU when `entries` is None), matched by UUID."""
    rows, err = query(timeout_s)
    if rows is None:
        return GpuUse(error=err)
    if entries is None:
        entries = [str(r.index) for r in rows]
    used, uuids = {}, {}
    for e in entries:
        r = resolve(e, rows)
        if isinstance(r, str):
            return GpuUse(error=r)
        used[r.uuid], uuids[e] = r.used_mib, r.uuid
    return GpuUse(used, uuids)


def default_gpus(env: Mapping[str, str] | None = None) -> list[int]:
    """Sweep indices of every GPU this process may use: the parent's list, else what nvidia-smi lists, else 0–7."""
    parent = parent_entries(env)
    if parent is not None:
        return list(range(len(parent)))
    rows, _ = query()
    return list(range(len(rows))) if rows else list(range(8))


def cuda_machine() -> bool:
    """True when this machine has an NVIDIA GPU the driver can see (without importing torch)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU " in out.stdout


def node_gpu_mib() -> float | None:
    """memory.total of this node's first GPU (what the heuristic sees here), from nvidia-smi."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        vals = [float(x) for x in out.stdout.split()]
        return min(vals) if vals else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def gpu_inventory() -> dict[str, Any]:
    """{"gpus": [{name, memory_total_mib}], "driver", "cuda"} of this machine (empty / None without nvidia-smi)."""
    env: dict[str, Any] = {"gpus": [], "driver": None, "cuda": None}
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if out.returncode == 0:
            for line in out.stdout.strip().splitlines():
                name, mem, drv = (x.strip() for x in line.split(","))
                env["gpus"].append({"name": name, "memory_total_mib": float(mem)})
                env["driver"] = drv
    except (OSError, subprocess.TimeoutExpired, ValueError):
        pass
    try:
        txt = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
        for tok in txt.split("CUDA Version:")[1:2]:
            env["cuda"] = tok.split()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return env
