"""The GPU a log's text names or prints, wherever it sits in the file, and the run(s) each clue belongs to.

A log pasted into an issue carries more than sglang's own lines: sglang's `check_env` block ("GPU 0,1:
NVIDIA A100 80GB PCIe" — torch.cuda.get_device_name), `nvidia-smi -L`, an `nvidia-smi` table (the name row,
and the memory cell "507MiB / 24564MiB", whose right side is memory.total: the very figure sglang's heuristic
reads), an `nvidia-smi --query-gpu=name,memory.total` line, rocminfo's "Marketing Name: AMD Instinct MI300X", a
fused-MoE kernel-config path ("device_name=NVIDIA_H100_80GB_HBM3"), or a cloud instance type ("g6.12xlarge").
Each such line is a `GpuClue`; `GpuClues` collects them while the file is read and hands each run its own at the
end. Which clue wins, and how the capacity is labelled, is `identity._gpu`'s call.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from profiler.logs.placement import run_holding
from profiler.model.gpus import Gpu, gpu_from_instance, gpu_from_smi_name

# sglang.check_env: f"GPU {','.join(ids)}: {torch.cuda.get_device_name(i)}" (not "GPU 0,1 Compute Capability: 9.0",
# not "GPU 0 has a total capacity of …")
_CHECK_ENV = re.compile(r"^\s*GPU ((?:\d+,)*\d+): ([A-Za-z].*?)\s*$")
# nvidia-smi table: "|   0  NVIDIA GeForce RTX 4090        Off |   00000000:4E:00.0 Off |   Off |"
_SMI_NAME = re.compile(r"^\|\s+(\d+)\s+((?:NVIDIA|Tesla|Quadro)\b.*?)\s+(?:On|Off)\s+\|")
# nvidia-smi table, the row under it: "| 30%   29C    P8    22W /  450W |     507MiB /  24564MiB |  0%  Default |"
# (temperature and performance state first: a MIG table's BAR1 row "2MiB / 32767MiB" has neither)
_SMI_MEMORY = re.compile(r"\d+C\s+P\d+\b.*?\|\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|")
# nvidia-smi --query-gpu=[index,]name,memory.total[,…] --format=csv: "0, NVIDIA A10G, 23028 MiB"
_SMI_CSV = re.compile(r"^\s*(?:\d+,\s*)?((?:NVIDIA|Tesla|Quadro)\b[^,|]*?),\s*(\d+)\s*MiB\b")
# srt/layers/moe/fused_moe_triton get_config_file_name: torch.cuda.get_device_name with "_" for " "
_KERNEL_PATH = re.compile(r"device_name=([A-Za-z][\w\-]*?)(?:,|\.json|\s|$)")
# rocminfo, per agent: "  Marketing Name:          AMD Instinct MI300X"
_ROCMINFO = re.compile(r"Marketing Name:\s+(AMD Instinct \S+)")
# cloud instance types that fix the GPU (profiler.model.gpus.INSTANCE_GPUS)
_INSTANCE = re.compile(
    r"(?<![\w.-])((?:g5|g6|g6e|p4d|p4de|p5|p5e|p5en|p6-b200)\.\d*x?large"
    r"|(?:a2-highgpu|a2-ultragpu|a3-highgpu|a3-megagpu|a3-ultragpu)-\d+g|g2-standard-\d+)(?![\w-])"
)
_GATE = ("GPU ", "NVIDIA", "Tesla", "Quadro", "MiB", "Instinct", "xlarge", "gpu-", "g2-standard")

#: clue kinds, strongest first: what the machine printed about itself, then what prose or a name says
KINDS = ("nvidia-smi memory.total", "nvidia-smi --query-gpu", "nvidia-smi", "nvidia-smi -L", "check_env", "rocminfo",
         "kernel-config path", "instance type")  # fmt: skip


class GpuClue(NamedTuple):
    """One line that names a GPU or prints its capacity."""

    line: int
    kind: str  # one of KINDS
    text: str  # what the line says, as printed ("NVIDIA H100 80GB HBM3", "507MiB / 24564MiB", "g6.12xlarge")
    gpu: Gpu | None  # the known GPU it names (None: a capacity only, or a name memfrac does not know)
    total_mib: float | None  # the capacity sglang reads: printed (memory.total) or the named GPU's
    printed: bool  # the machine printed it about itself (a tool's output), not prose or a name in a command
    gpus: int | None = None  # how many GPUs the line lists (check_env "GPU 0,1,2,3")

    def label(self) -> str:
        return f"{self.kind} {self.text!r} (line {self.line})"


def gpu_clue(lineno: int, text: str) -> GpuClue | None:
    """The first GPU clue one line holds, or None."""
    got = line_clues(lineno, text)
    return got[0] if got else None


def line_clues(lineno: int, text: str) -> list[GpuClue]:
    """Every GPU clue one line holds: one tool line, or each instance type prose names ("g6.12xlarge instead
    of p5.48xlarge": both, and the free memory decides)."""
    if not any(g in text for g in _GATE):
        return []
    one = _tool_clue(lineno, text)
    if one is not None:
        return [one]
    out = []
    for m in _INSTANCE.finditer(text):
        g = gpu_from_instance(m.group(1))
        out.append(GpuClue(lineno, KINDS[7], m.group(1), g, float(g.total_mib) if g else None, False))
    return out


def _tool_clue(lineno: int, text: str) -> GpuClue | None:
    if (m := _SMI_MEMORY.search(text)) is not None:
        total = float(m.group(2))
        return GpuClue(lineno, KINDS[0], f"{m.group(1)}MiB / {m.group(2)}MiB", None, total, True)
    if (m := _SMI_CSV.search(text)) is not None:
        g = gpu_from_smi_name(m.group(1))
        return GpuClue(lineno, KINDS[1], f"{m.group(1).strip()}, {m.group(2)} MiB", g, float(m.group(2)), True)
    if (m := _SMI_NAME.search(text)) is not None:
        return _named(lineno, KINDS[2], m.group(2).strip(), printed=True)
    if (m := _CHECK_ENV.search(text)) is not None:
        name, uuid = m.group(2), m.group(2).find(" (UUID: ")
        if uuid > 0:  # nvidia-smi -L: one line per GPU, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-…)"
            return _named(lineno, KINDS[3], name[:uuid], printed=True)
        c = _named(lineno, KINDS[4], name, printed=True)
        return c._replace(gpus=m.group(1).count(",") + 1)
    if (m := _ROCMINFO.search(text)) is not None:
        return _named(lineno, KINDS[5], m.group(1), printed=True)
    if "device_name=" in text and (m := _KERNEL_PATH.search(text)) is not None:
        return _named(lineno, KINDS[6], m.group(1).replace("_", " "), printed=True)
    return None


def _named(lineno: int, kind: str, name: str, *, printed: bool) -> GpuClue:
    g = gpu_from_smi_name(name)
    return GpuClue(lineno, kind, name, g, float(g.total_mib) if g else None, printed)


class _RunLike(Protocol):  # logs.run._Run (which imports this module)
    first_line: int | None
    last_line: int | None
    gpu_clues: list[GpuClue]
    m: Any


class GpuClues:
    """Every GPU clue of one file, in line order; `assign` gives each run its own (see there)."""

    __slots__ = ("clues",)

    def __init__(self) -> None:
        self.clues: list[GpuClue] = []

    def see(self, lineno: int, text: str, msg: str) -> None:
        """Read one line (its raw text, and its message without the prefix)."""
        got = line_clues(lineno, msg)
        if not got and msg is not text and text.startswith("|"):  # an nvidia-smi table row the prefix cut
            got = line_clues(lineno, text)
        self.clues += got

    def assign(self, runs: Sequence[_RunLike]) -> None:
        """A clue goes to the run whose lines it sits among, else the run it precedes (an environment block or
        a command before the start), else the last run before it (an issue's environment after its log). A run
        given none takes the file's clues (one machine wrote them all, as far as the file shows), said so."""
        for c in self.clues:
            target = run_holding(runs, c.line)
            if target is None:
                continue
            target.gpu_clues.append(c)
        for run in runs:
            if not run.gpu_clues and self.clues:
                run.gpu_clues = list(self.clues)
                lines = ", ".join(str(c.line) for c in self.clues[:5])
                run.m.notes.append(
                    f"GPU clues from elsewhere in this file (lines {lines}): none among this run's lines"
                )
