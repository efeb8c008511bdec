"""Known GPUs and the capacity SGLang sees for each.

SGLang's heuristic reads `get_device_memory_capacity()`, which is nvidia-smi's `memory.total` in MiB
(the minimum over visible GPUs). The numbers below are that exact field as printed by real machines
(public `nvidia-smi --query-gpu=name,memory.total` outputs), not the marketing size: the heuristic's
size bands and its fraction depend on the exact value.
"""

from __future__ import annotations

from dataclasses import dataclass

from profiler.core.errors import MemfracError


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

# Where each memory.total above was read: a public nvidia-smi output of that exact product. "modal-2797" is
# Modal's list of nvidia-smi totals across its fleet (github.com/modal-labs/modal-client/pull/2797); "file id N"
# is a public repository file in the project's search index quoting `nvidia-smi --query-gpu=name,memory.total`
# (or the nvidia-smi table) for that GPU. Re-checked for issue 10: every entry matches its source. B300 SXM6 AC
# reports 275040 MiB in several independent outputs (file ids 66224630367, 57713776942, 59805518224); a log
# with 275.75 GiB free at load is therefore a larger part, not this one, and is not matched to it.
SOURCES: dict[str, str] = {
    "T4": "modal-2797; file id 53052278521 ('Tesla T4, 15360 MiB total')",
    "RTX-5080": "file ids 57659263367, 33311716229 ('NVIDIA GeForce RTX 5080, 16303 MiB'); nvidia-smi in "
    "tests/fixtures/logs INDEX (repo_unknown_qwen3-0.6b_rtx5080)",
    "A10": "modal-2797 (A10: 23028MiB)",
    "L4": "modal-2797 (L4: 23034MiB)",
    "RTX-4090": "file ids 55542750366, 63263851491 ('NVIDIA GeForce RTX 4090, 24564 MiB')",
    "RTX-3090": "file ids 60973092206, 57428273948 ('NVIDIA GeForce RTX 3090, 24576 MiB')",
    "RTX-5090": "file ids 58416872009, 70594460296 ('NVIDIA GeForce RTX 5090, 32607 MiB')",
    "A100-40GB": "modal-2797 (A100 40GB: 40960MiB); file id 65742760196 ('NVIDIA A100-SXM4-40GB, 40960 MiB')",
    "L40S": "modal-2797 (L40S: 46068MiB)",
    "L40": "file ids 62446421435, 67228339148 ('NVIDIA L40, 46068 MiB')",
    "H100-80GB": "modal-2797 (H100: 81559MiB); github.com/wilicc/gpu-burn/issues/114 (nvidia-smi '/ 81559MiB')",
    "H800": "file id 71303046155 ('NVIDIA H800, 81559 MiB')",
    "A100-80GB": "modal-2797 (A100 80GB: 81920MiB); file id 67279305501 ('NVIDIA A100 80GB PCIe, 81920 MiB')",
    "H100-NVL": "file ids 63368633454, 71246027304 ('NVIDIA H100 NVL, 95830 MiB')",
    "H20": "file ids 65846954299, 62604352415 ('NVIDIA H20, 97871 MiB')",
    "H200": "file ids 67279305501, 55419965514 ('NVIDIA H200, 143771 MiB')",
    "H20-3e": "file ids 65778504935, 56324297938 ('NVIDIA H20-3e, 143771 MiB')",
    "B200": "file ids 56212356169, 58505898451 ('NVIDIA B200, 183359 MiB')",
    "B300": "file ids 66224630367, 57713776942, 59805518224 ('NVIDIA B300 SXM6 AC, 275040 MiB')",
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
