"""Known GPUs and the capacity SGLang sees for each.

SGLang's heuristic reads `get_device_memory_capacity()`, which is nvidia-smi's `memory.total` in MiB
(the minimum over visible GPUs). The numbers below are that exact field as printed by real machines
(public `nvidia-smi --query-gpu=name,memory.total` outputs), not the marketing size: the heuristic's
size bands and its fraction depend on the exact value.
"""

from __future__ import annotations

from dataclasses import dataclass

from profiler.errors import MemfracError


@dataclass(frozen=True, slots=True)
class Gpu:
    """A GPU as the heuristic sees it: a name and nvidia-smi memory.total in MiB."""

    name: str
    total_mib: int
    nvidia_smi_name: str = ""

    @property
    def total_gib(self) -> float:
        return self.total_mib / 1024


# name → (memory.total MiB, nvidia-smi product name). Keep sorted by capacity.
_TABLE: dict[str, tuple[int, str]] = {
    "T4": (15360, "Tesla T4"),
    "RTX-5080": (16303, "NVIDIA GeForce RTX 5080"),
    "A10": (23028, "NVIDIA A10"),
    "L4": (23034, "NVIDIA L4"),
    "RTX-4090": (24564, "NVIDIA GeForce RTX 4090"),
    "RTX-3090": (24576, "NVIDIA GeForce RTX 3090"),
    "RTX-5090": (32607, "NVIDIA GeForce RTX 5090"),
    "A100-40GB": (40960, "NVIDIA A100-SXM4-40GB"),
    "L40S": (46068, "NVIDIA L40S"),
    "L40": (46068, "NVIDIA L40"),
    "H100-80GB": (81559, "NVIDIA H100 80GB HBM3"),
    "H800": (81559, "NVIDIA H800"),
    "A100-80GB": (81920, "NVIDIA A100-SXM4-80GB"),
    "H100-NVL": (95830, "NVIDIA H100 NVL"),
    "H20": (97871, "NVIDIA H20"),
    "H200": (143771, "NVIDIA H200"),
    "H20-3e": (143771, "NVIDIA H20-3e"),
    "B200": (183359, "NVIDIA B200"),
    "B300": (275040, "NVIDIA B300 SXM6 AC"),
}

ALIASES: dict[str, str] = {"H100": "H100-80GB", "A100": "A100-80GB", "4090": "RTX-4090", "5090": "RTX-5090"}


def known_gpus() -> list[Gpu]:
    """Every bundled GPU, smallest first."""
    return [Gpu(n, mib, smi) for n, (mib, smi) in sorted(_TABLE.items(), key=lambda kv: (kv[1][0], kv[0]))]


def gpu_by_name(name: str) -> Gpu:
    """Look a GPU up by its bundled name (case-insensitive; a few aliases accepted)."""
    key = {k.lower(): k for k in _TABLE}.get(name.lower()) or ALIASES.get(name) or ALIASES.get(name.upper())
    if key is None:
        raise MemfracError(f"unknown GPU {name!r}; known: {', '.join(sorted(_TABLE))} (or give memory.total in MiB)")
    mib, smi = _TABLE[key]
    return Gpu(key, mib, smi)


def gpu_from_mib(total_mib: int) -> Gpu:
    """A GPU given only by its capacity; named after the bundled GPU of that exact size if there is one."""
    for n, (mib, smi) in _TABLE.items():
        if mib == total_mib:
            return Gpu(n, mib, smi)
    return Gpu(f"{total_mib}MiB", int(total_mib))


def gpu_from_smi_name(smi_name: str) -> Gpu | None:
    """Match an nvidia-smi / torch device name ("NVIDIA H200") to a bundled GPU, or None."""
    s = smi_name.strip().lower()
    for n, (mib, smi) in _TABLE.items():
        if smi.lower() == s:
            return Gpu(n, mib, smi)
    return None


def gpus_near_capacity(usable_gib: float, tolerance_gib: float = 1.5) -> list[Gpu]:
    """GPUs whose total is at least `usable_gib` and within `tolerance_gib` of it.

    Logs print free memory at start ("avail mem"), which sits a little under memory.total (CUDA context,
    driver reservations); this lists the bundled GPUs consistent with such a reading.
    """
    out = []
    for g in known_gpus():
        if 0 <= g.total_gib - usable_gib <= tolerance_gib:
            out.append(g)
    return out
