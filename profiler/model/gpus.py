"""Known GPUs and the capacity SGLang sees for each.

SGLang's heuristic reads `get_device_memory_capacity()`, which is nvidia-smi's `memory.total` in MiB
(the minimum over visible GPUs). The numbers below are that exact field as printed by real machines
(public `nvidia-smi --query-gpu=name,memory.total` outputs), not the marketing size: the heuristic's
size bands and its fraction depend on the exact value.
"""

from __future__ import annotations

import re
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

# GPUs that logs name or imply but that the audit's default space and scenarios leave out (more rows there
# would only repeat a capacity above, or a part few deploy sglang on): used to read a log's GPU, never swept.
# name → (the capacity sglang reads, in MiB; the product name torch / nvidia-smi print). ROCm: sglang reads
# rocminfo's "Pool 1" size in KB ÷ 1024 (srt/utils/common.py get_amdgpu_memory_capacity).
_LOG_ONLY: dict[str, tuple[int, str]] = {
    "A10G": (23028, "NVIDIA A10G"),
    "RTX-4090D": (24564, "NVIDIA GeForce RTX 4090 D"),
    "L20": (46068, "NVIDIA L20"),
    "RTX-A6000": (49140, "NVIDIA RTX A6000"),
    "RTX-6000-Ada": (49140, "NVIDIA RTX 6000 Ada Generation"),
    "H100-PCIe": (81559, "NVIDIA H100 PCIe"),
    "A800-80GB": (81920, "NVIDIA A800-SXM4-80GB"),
    "MI300X": (196592, "AMD Instinct MI300X"),
}
SOURCES |= {
    "A10G": "file ids 57510727102, 66686965076 ('NVIDIA A10G, 23028 MiB'; AWS g5 instances)",
    "RTX-4090D": "file ids 69612263523, 62204639427 ('NVIDIA GeForce RTX 4090 D, 24564 MiB')",
    "L20": "file ids 63349564404, 56262453470 ('NVIDIA L20, 46068 MiB')",
    "RTX-A6000": "file ids 24563222508, 63320565603 ('NVIDIA RTX A6000, 49140 MiB')",
    "RTX-6000-Ada": "file ids 54965491866, 57818512793 ('NVIDIA RTX 6000 Ada Generation, 49140 MiB')",
    "H100-PCIe": "file ids 54562561713, 55383072402 ('NVIDIA H100 PCIe, 81559 MiB')",
    "A800-80GB": "file ids 59889546879, 53255403010 ('NVIDIA A800-SXM4-80GB, 81920 MiB')",
    "MI300X": "rocminfo 'Pool 1 … Size: 201310208(0xbffc000) KB' of gfx942 agents, file ids 1638745161, "
    "69614445144, 57069008008: 201310208 KB ÷ 1024 = 196592 MiB",
}
# Other product names the same part prints (torch.cuda.get_device_name, check_env, nvidia-smi): PCIe/SXM
# variants of one capacity. Each named in a public nvidia-smi output (SOURCES above, or the file id here).
_OTHER_NAMES: dict[str, tuple[str, ...]] = {
    "A100-80GB": ("NVIDIA A100 80GB PCIe",),  # file id 67279305501
    "A100-40GB": ("NVIDIA A100-PCIE-40GB",),
    "A800-80GB": ("NVIDIA A800 80GB PCIe",),
    "H800": ("NVIDIA H800 PCIe",),
}
# Cloud instance types that fix the GPU (AWS/GCP documentation of each family): a docker tag, a hostname or a
# prose line naming one names the GPU. Family prefix → bundled GPU name.
INSTANCE_GPUS: dict[str, str] = {
    "g5.": "A10G",  # AWS G5: NVIDIA A10G
    "g6.": "L4",  # AWS G6: NVIDIA L4
    "g6e.": "L40S",  # AWS G6e: NVIDIA L40S
    "p4d.": "A100-40GB",  # AWS P4d: A100 40 GB
    "p4de.": "A100-80GB",  # AWS P4de: A100 80 GB
    "p5.": "H100-80GB",  # AWS P5: H100 80 GB
    "p5e.": "H200",  # AWS P5e / P5en: H200
    "p5en.": "H200",
    "p6-b200.": "B200",  # AWS P6-B200
    "a2-highgpu-": "A100-40GB",  # GCP A2 Standard: A100 40 GB
    "a2-ultragpu-": "A100-80GB",  # GCP A2 Ultra: A100 80 GB
    "a3-highgpu-": "H100-80GB",  # GCP A3: H100 80 GB
    "a3-megagpu-": "H100-80GB",
    "a3-ultragpu-": "H200",  # GCP A3 Ultra: H200
    "g2-standard-": "L4",  # GCP G2: L4
}


def known_gpus() -> list[Gpu]:
    """Every bundled GPU, smallest first."""
    return [Gpu(n, mib, smi) for n, (mib, smi) in sorted(_TABLE.items(), key=lambda kv: (kv[1][0], kv[0]))]


def log_gpus() -> list[Gpu]:
    """Every GPU a log can be matched to (the bundled ones and `_LOG_ONLY`), smallest first."""
    both = _TABLE | _LOG_ONLY
    return [Gpu(n, mib, smi) for n, (mib, smi) in sorted(both.items(), key=lambda kv: (kv[1][0], kv[0]))]


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


def _norm(name: str) -> str:
    """A product name with case, '_' / '-' / space runs and a trailing '…' / '...' (nvidia-smi's cut) folded."""
    return re.sub(r"[\s_\-]+", " ", name.strip().rstrip(".…").lower()).strip()


def gpu_from_smi_name(smi_name: str) -> Gpu | None:
    """Match an nvidia-smi / torch device name ("NVIDIA H200", "NVIDIA_H100_80GB_HBM3" from a kernel-config
    path, "NVIDIA A100 80GB PCIe" from check_env) to a known GPU, or None. A name nvidia-smi cut short
    ("NVIDIA GeForce RTX 4090 ...") matches only when one capacity fits every name it begins."""
    s = _norm(smi_name)
    if not s:
        return None
    names = [(g, _norm(g.nvidia_smi_name)) for g in log_gpus()]
    names += [(g, _norm(o)) for g in log_gpus() for o in _OTHER_NAMES.get(g.name, ())]
    for g, n in names:
        if n == s:
            return g
    if smi_name.rstrip().endswith(("...", "…")):
        hits = [g for g, n in names if n.startswith(s)]
        if hits and len({g.total_mib for g in hits}) == 1:
            return hits[0]
    return None


def gpu_from_instance(instance: str) -> Gpu | None:
    """The GPU a cloud instance type fixes ("g6.12xlarge" → L4, "a3-highgpu-8g" → H100), or None."""
    s = instance.strip().lower()
    for prefix, name in INSTANCE_GPUS.items():
        if s.startswith(prefix):
            return next(g for g in log_gpus() if g.name == name)
    return None


def gpus_near_capacity(usable_gib: float, tolerance_gib: float = 1.5) -> list[Gpu]:
    """GPUs whose total is at least `usable_gib` and within `tolerance_gib` of it.

    Logs print free memory at start ("avail mem"), which sits a little under memory.total (CUDA context,
    driver reservations); this lists the bundled GPUs consistent with such a reading.
    """
    out = []
    for g in log_gpus():
        if 0 <= g.total_gib - usable_gib <= tolerance_gib:
            out.append(g)
    return out
