"""PyTorch's CUDA out-of-memory message → numbers in MiB.

Torch prints sizes with `format_size`: "N bytes", "X KiB", "X MiB" or "X GiB" (two decimals); every unit is
kept and converted (GiB ×1024, KiB /1024, bytes /2**20). Users paste this message wrapped mid-word, with
quote marks or duplicated characters, so every field is read on its own with whitespace-tolerant
patterns (text joined without separators still matches), and a field that is damaged is simply absent.
Formats: torch ≥ 2.1 ("GPU 0 has a total capacity of …", 2.1 spelled it "capacty"; "with X allocated in
private pools" when CUDA graphs hold memory; "Including non-PyTorch memory, this process has X memory in use" or,
where NVML works, one "Process P has X memory in use" per process on the GPU, read as in use only when it is the
only one listed) and torch ≤ 2.0 ("(GPU 0; X total capacity; …)"; torch_npu still prints it: "(NPU 1; …; X
current active; …)").
"""

from __future__ import annotations

import re
from typing import NamedTuple

from profiler.core.units import BYTES_PER_MIB, MIB_PER_GIB

_UNIT_MIB = {"GiB": float(MIB_PER_GIB), "MiB": 1.0, "KiB": 1024 / BYTES_PER_MIB, "bytes": 1.0 / BYTES_PER_MIB}
_SIZE = r"(\d+(?:\.\d+)?)\s*(GiB|MiB|KiB|bytes)"


def _p(phrase: str) -> str:
    return r"\s*".join(phrase.split())


_TRIED = re.compile(_p("Tried to allocate") + r"\s*" + _SIZE)
_TOTAL = re.compile(
    _p("GPU") + r"\s*(\d+)\s*" + _p("has a total capac") + r"i?ty\s*of\s*(\d+(?:\.\d+)?)(?:\s*(GiB|MiB|KiB|bytes))?"
)
_FREE = re.compile(_p("of which") + r"\s*" + _SIZE + r"\s*" + _p("is free"))
_IN_USE = re.compile(_p("this process has") + r"\s*" + _SIZE + r"\s*" + _p("memory in use"))
# With NVML, torch lists every process on the GPU instead: "Process 1939284 has 139.86 GiB memory in use."
_PROCESS = re.compile(_p("Process") + r"\s*\d+\s*" + _p("has") + r"\s*" + _SIZE + r"\s*" + _p("memory in use"))
_ALLOC = re.compile(_p("Of the allocated memory") + r"\s*" + _SIZE + r"\s*" + _p("is allocated by PyTorch"))
_PRIVATE = re.compile(
    r"(?:with\s*" + _SIZE + r"\s*" + _p("allocated in private pools") + r"|" + _SIZE + r"\s*"
    + _p("is allocated by PyTorch in private pools") + r")"
)  # fmt: skip
_RESERVED = re.compile(_SIZE + r"\s*" + _p("is reserved by PyTorch but unallocated"))
_OLD = re.compile(
    r"\(\s*(?:GPU|NPU)\s*(\d+)\s*;\s*"
    + (_SIZE + r"\s*" + _p("total capacity") + r"\s*;\s*")
    + (_SIZE + r"\s*" + _p("already allocated") + r"\s*;\s*")
    + (r"(?:\d+(?:\.\d+)?\s*(?:GiB|MiB|KiB|bytes)\s*" + _p("current active") + r"\s*;\s*)?")  # torch_npu
    + (_SIZE + r"\s*free\s*;\s*")
    + (_SIZE + r"\s*" + _p("reserved in total"))
)


class OomNumbers(NamedTuple):
    """The OOM message's numbers (MiB) and how each was read; None = not in the (possibly cut) text."""

    gpu_index: int | None = None
    tried_alloc_mib: float | None = None
    total_capacity_mib: float | None = None
    free_mib: float | None = None
    in_use_mib: float | None = None
    allocated_by_torch_mib: float | None = None
    private_pools_mib: float | None = None
    reserved_unallocated_mib: float | None = None
    reserved_by_torch_mib: float | None = None  # old format: "X reserved in total by PyTorch" (the allocator's total)
    outside_torch_mib: float | None = None  # in use − allocated by PyTorch − reserved but unallocated (new format)
    notes: tuple[str, ...] = ()


def mib(value: str, unit: str) -> float:
    """A torch-formatted size in MiB."""
    return float(value) * _UNIT_MIB[unit]


def _size(m: re.Match[str] | None, i: int = 1) -> float | None:
    return None if m is None else mib(m.group(i), m.group(i + 1))


def parse_oom(text: str) -> OomNumbers:
    """Read every number the OOM text still carries."""
    notes: list[str] = []
    old = _OLD.search(text)
    if old is not None:
        alloc = mib(old.group(4), old.group(5))
        reserved = mib(old.group(8), old.group(9))
        return OomNumbers(
            gpu_index=int(old.group(1)),
            tried_alloc_mib=_size(_TRIED.search(text)),
            total_capacity_mib=mib(old.group(2), old.group(3)),
            free_mib=mib(old.group(6), old.group(7)),
            allocated_by_torch_mib=alloc,
            reserved_unallocated_mib=reserved - alloc,
            reserved_by_torch_mib=reserved,
            notes=("torch <= 2.0 OOM format: reserved_unallocated = reserved in total - already allocated",),
        )
    gpu = total = None
    t = _TOTAL.search(text)
    if t is not None:
        gpu = int(t.group(1))
        if t.group(3):
            total = mib(t.group(2), t.group(3))
        elif not text[t.end() :].strip() and re.fullmatch(r"\d+\.\d\d", t.group(2)):
            # Cut right after the number: torch prints a GPU's total (always > 1 GiB) in GiB.
            total = mib(t.group(2), "GiB")
            notes.append(f"OOM text ends at 'total capacity of {t.group(2)}' (unit cut off); read as GiB")
    private = _PRIVATE.search(text)
    priv = None
    if private is not None:
        priv = _size(private, 1) if private.group(1) else _size(private, 3)
    in_use, alloc = _size(_IN_USE.search(text)), _size(_ALLOC.search(text))
    if in_use is None:
        procs = _PROCESS.findall(text)
        if len(procs) == 1:  # several processes: which one raised is not said
            in_use = mib(*procs[0])
            notes.append("OOM 'in use' read from the only process torch listed ('Process N has X memory in use')")
    unalloc = _size(_RESERVED.search(text))
    outside = None
    if in_use is not None and alloc is not None and unalloc is not None:
        outside = in_use - alloc - unalloc  # "Including non-PyTorch memory, this process has X in use"
    return OomNumbers(
        gpu_index=gpu,
        tried_alloc_mib=_size(_TRIED.search(text)),
        total_capacity_mib=total,
        free_mib=_size(_FREE.search(text)),
        in_use_mib=in_use,
        allocated_by_torch_mib=alloc,
        private_pools_mib=priv,
        reserved_unallocated_mib=unalloc,
        outside_torch_mib=outside,
        notes=tuple(notes),
    )


def is_complete(text: str) -> bool:
    """True once the text reaches the end of torch's numbers (no need to join more wrapped lines)."""
    compact = "".join(text.split())
    return "butunallocated" in compact or "reservedintotal" in compact
