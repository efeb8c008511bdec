"""`memfrac selfcheck`: proves on any CUDA machine, without sglang, that the probe's snapshots attribute memory.

Each check makes memory whose size and owner are known, takes `Probe.snapshot()` before and after (after
`torch.cuda.synchronize()`, and after `torch.cuda.empty_cache()` where the caching allocator's free cache
would blur the reading), and compares the per-layer deltas with what the allocation must have cost:

0. idle: two snapshots with nothing between them: every layer moves by 0 (a snapshot costs no GPU memory,
   and nothing else is allocating on this GPU; if it fails, every driver delta below is suspect).
1. a 512 MiB torch tensor: driver, torch reserved and torch allocated all take 512 MiB, non-torch
   (driver − reserved) 0; freed + `empty_cache`: all give 512 MiB back.
2. a 256 MiB `cudaMalloc` through ctypes on libcudart (behind torch's back): driver takes 256 MiB, torch
   reserved 0, so non-torch 256 MiB; `cudaFree`: the driver gives 256 MiB back.
3. a CUDA-graph ladder (4-layer MLP, batch sizes 64 → 1, one shared graph pool, like sglang): each capture's
   driver delta equals its torch reserved delta (graph private pools are inside torch reserved, non-torch 0),
   memory never goes down, and replaying every graph afterwards costs nothing: the per-capture deltas sum to
   the ladder's total.
4. peak reset: `reset_peaks()` drops an earlier 512 MiB peak, and a transient 256 MiB tensor allocated and
   freed after it shows in `torch_peak_allocated_mib`.

Tolerance: |measured − expected| ≤ max(5 % of the check's size, 2 MiB) on every compared layer, where the
size is the allocation the check is about (so a non-torch residual of a 512 MiB check, a difference of two
~512 MiB readings, gets 25.6 MiB). The 2 MiB floor is the CUDA allocation granule: `cudaMalloc` and the
caching allocator's large segments come in 2 MiB pages, and the driver's free count moves in such pages.
The sizes are multiples of 2 MiB and powers of two, so they are exact under the default allocator and under
`roundup_power2_divisions`; with `expandable_segments:True` torch maps 20 MiB pages (512 → 520 MiB, 1.6 %).

NVML's per-process delta is reported beside the others but never decides a check (containers hide PIDs, MIG
hides per-process usage); a disagreement with the driver is named in the check's note.

Only the CUDA-touching functions import torch; the records, the tolerance and the rendering are plain Python.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import json
import os
import site
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profiler.errors import MemfracError
from profiler.measurement import Snapshot
from profiler.probe.snapshot import Probe

MIB = 1 << 20
REL_TOL = 0.05
ABS_TOL_MIB = 2.0
TOLERANCE_RULE = "|measured − expected| ≤ max(5% of the check's size, 2 MiB)"

TORCH_ALLOC_MIB = 512
NON_TORCH_ALLOC_MIB = 256
PEAK_PRIOR_MIB = 512
PEAK_TRANSIENT_MIB = 256

LADDER = (64, 32, 16, 8, 4, 2, 1)  # largest first, as sglang captures
HIDDEN, FFN, LAYERS = 1024, 4096, 4
# Rows per batch entry: a 4-layer MLP at bs 64 × 1 row would need < 2 MiB of graph memory, all of it inside one
# allocation granule; 256 rows make the bs=64 capture hold ~300-400 MiB (two 128 MiB FFN activations alive at once,
# the 32 MiB hidden state, the output), so the tolerance is a small share of what is measured.
ROWS_PER_BS = 256

# Layer keys of `Check.measured_mib`, in table order, with their column titles.
LAYERS_SHOWN: tuple[tuple[str, str], ...] = (
    ("driver", "driver Δ"),
    ("torch_reserved", "reserved Δ"),
    ("torch_allocated", "allocated Δ"),
    ("torch_peak_allocated", "peak alloc Δ"),
    ("non_torch", "non-torch Δ"),
    ("nvml", "NVML Δ"),
)


class NoCudaDevice(MemfracError):
    """No CUDA device is visible to this process: nothing to check."""


class LibcudartNotFound(MemfracError):
    """No CUDA runtime library to call `cudaMalloc` through; the message names every place looked in."""


class CudaRuntimeError(RuntimeError):
    """A CUDA runtime call through ctypes returned an error."""


# ---------------------------------------------------------------------------------------------------------------
# Records, tolerance, deltas: plain Python


def tolerance_mib(size_mib: float) -> float:
    """The tolerance of a check about `size_mib` of memory: 5 % of it or 2 MiB, whichever is larger."""
    return max(REL_TOL * abs(size_mib), ABS_TOL_MIB)


def within(measured: float | None, expected: float, tol: float) -> bool:
    """True when a reading exists and lies within `tol` of `expected` (a missing reading never passes)."""
    return measured is not None and abs(measured - expected) <= tol + 1e-9


@dataclass(frozen=True, slots=True)
class Check:
    """One measurement. `measured_mib` holds every layer's delta (memory taken by the step; negative: given
    back; None: the layer gave no reading); `expected_by_layer` holds the layers the check compares and what
    each must read; `expected_mib` is the headline figure shown in the table."""

    name: str
    expected_mib: float
    measured_mib: dict[str, float | None]
    expected_by_layer: dict[str, float]
    tolerance_mib: float
    passed: bool
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 3)

        return {
            "name": self.name,
            "expected_mib": r(self.expected_mib),
            "measured_mib": {k: r(v) for k, v in self.measured_mib.items()},
            "expected_by_layer": {k: r(v) for k, v in self.expected_by_layer.items()},
            "tolerance_mib": r(self.tolerance_mib),
            "passed": self.passed,
            "note": self.note,
        }


@dataclass(slots=True)
class SelfcheckReport:
    """Every check of one run, with what the run found about the machine."""

    device: int
    device_name: str
    total_mib: float
    torch_version: str
    allocator: str
    checks: list[Check] = field(default_factory=list)
    libcudart: str | None = None

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def as_dicts(self) -> list[dict[str, Any]]:
        return [c.as_dict() for c in self.checks]


def judge(
    name: str,
    size_mib: float,
    measured: dict[str, float | None],
    expected_by_layer: dict[str, float],
    *,
    expected_mib: float | None = None,
    also: tuple[bool, str] = (True, ""),
    note: str = "",
) -> Check:
    """A `Check` from readings: passes when every expected layer is within the tolerance of `size_mib` and the
    extra condition `also` = (holds, what it says when it does not) holds."""
    tol = tolerance_mib(size_mib)
    notes = [note] if note else []
    off = [k for k, e in expected_by_layer.items() if not within(measured.get(k), e, tol)]
    for k in off:
        m = measured.get(k)
        notes.append(f"{k} {'no reading' if m is None else f'{m:+.1f}'} vs expected {_e_fmt(expected_by_layer[k])}")
    ok, why = also
    if not ok:
        notes.append(why)
    drv, nv = measured.get("driver"), measured.get("nvml")
    if drv is not None and nv is not None and abs(nv - drv) > tol:
        notes.append(f"NVML Δ {nv:+.1f} differs from driver Δ {drv:+.1f} (informational)")
    return Check(
        name=name,
        expected_mib=size_mib if expected_mib is None else expected_mib,
        measured_mib=dict(measured),
        expected_by_layer=dict(expected_by_layer),
        tolerance_mib=tol,
        passed=not off and ok,
        note="; ".join(notes),
    )


def _e_fmt(v: float) -> str:
    return f"{v:+.1f}" if v else "0"


def failed(name: str, note: str) -> Check:
    """A check that could not measure (an exception, a missing library): fails, says why."""
    return Check(name, 0.0, {}, {}, ABS_TOL_MIB, False, note)


def deltas(before: Snapshot, after: Snapshot) -> dict[str, float | None]:
    """Per-layer memory taken between two snapshots, MiB (negative: given back). driver = free before − free
    after; non-torch = driver − torch reserved; NVML = this process's NVML usage after − before."""

    def diff(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else b - a

    driver = diff(after.free_mib, before.free_mib)
    reserved = diff(before.torch_reserved_mib, after.torch_reserved_mib)
    return {
        "driver": driver,
        "torch_reserved": reserved,
        "torch_allocated": diff(before.torch_allocated_mib, after.torch_allocated_mib),
        "torch_peak_allocated": diff(before.torch_peak_allocated_mib, after.torch_peak_allocated_mib),
        "non_torch": None if driver is None or reserved is None else driver - reserved,
        "nvml": diff(before.nvml_used_mib, after.nvml_used_mib),
    }


# ---------------------------------------------------------------------------------------------------------------
# Rendering


def _cell(c: Check, key: str) -> str:
    v = c.measured_mib.get(key)
    if v is None:
        return "-"
    if key not in c.expected_by_layer:
        return f"({v:.1f})"
    return f"{v:.1f}" + ("" if within(v, c.expected_by_layer[key], c.tolerance_mib) else "!")


def render_text(report: SelfcheckReport) -> str:
    """The report as a table: one row per check; compared layers plain, informational ones in (), a compared
    layer out of tolerance marked !, notes below."""
    head = (
        f"memfrac selfcheck: GPU {report.device} ({report.device_name}, {report.total_mib:,.0f} MiB), "
        f"torch {report.torch_version}, allocator {report.allocator}"
    )
    lines = [
        head,
        f"tolerance: {TOLERANCE_RULE}. Δ = MiB taken by the step (negative: given back); "
        "non-torch = driver − torch reserved.",
        "",
    ]
    titles = ["check", "expected", *(t for _, t in LAYERS_SHOWN), "tol", "result"]
    rows = [
        [
            c.name,
            f"{c.expected_mib:.1f}",
            *(_cell(c, k) for k, _ in LAYERS_SHOWN),
            f"{c.tolerance_mib:.1f}",
            "pass" if c.passed else "FAIL",
        ]
        for c in report.checks
    ]
    widths = [max(len(r[i]) for r in [titles, *rows]) for i in range(len(titles))]

    def fmt(r: list[str]) -> str:
        return "  ".join(s.ljust(w) if i == 0 else s.rjust(w) for i, (s, w) in enumerate(zip(r, widths, strict=True)))

    lines += [fmt(titles), "  ".join("-" * w for w in widths), *map(fmt, rows), ""]
    lines.append("(x) informational, not compared; ! a compared layer out of tolerance; - no reading")
    notes = [f"  {c.name}: {c.note}" for c in report.checks if c.note]
    if notes:
        lines += ["notes:", *notes]
    if report.libcudart:
        lines.append(f"libcudart: {report.libcudart}")
    n_ok = sum(c.passed for c in report.checks)
    verdict = "all pass" if report.passed else "FAILED"
    lines.append(f"{n_ok}/{len(report.checks)} checks passed: {verdict}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# Finding libcudart


def libcudart_search_dirs() -> list[Path]:
    """Directories that may hold libcudart.so*, most likely first: torch's own lib, the pip CUDA runtime wheels
    (`nvidia/cuda_runtime/lib` up to CUDA 12, `nvidia/cu13/lib` from 13, any other `nvidia/*/lib`), CUDA_HOME /
    CUDA_PATH, /usr/local/cuda, and LD_LIBRARY_PATH."""
    sites: list[Path] = []
    with contextlib.suppress(Exception):
        import torch

        sites.append(Path(torch.__file__).resolve().parent.parent)
    with contextlib.suppress(Exception):
        sites += [Path(p) for p in site.getsitepackages()]
    with contextlib.suppress(Exception):
        sites.append(Path(site.getusersitepackages()))
    sites += [Path(p) for p in sys.path if p.endswith(("site-packages", "dist-packages"))]

    dirs: list[Path] = []
    for sp in sites:
        dirs.append(sp / "torch" / "lib")
    for sp in sites:
        nv = sp / "nvidia"
        dirs += [nv / "cuda_runtime" / "lib", nv / "cu13" / "lib", nv / "cu12" / "lib"]
        if nv.is_dir():
            dirs += sorted(p / "lib" for p in nv.iterdir() if (p / "lib").is_dir())
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            dirs += [Path(os.environ[var]) / "lib64", Path(os.environ[var]) / "lib"]
    dirs += [Path("/usr/local/cuda/lib64"), Path("/usr/local/cuda/targets/x86_64-linux/lib")]
    dirs += [Path(p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    seen: set[Path] = set()
    return [d for d in dirs if not (d in seen or seen.add(d))]


def loaded_libcudart(maps: str = "/proc/self/maps") -> Path | None:
    """The libcudart this process has already mapped (torch's, once CUDA is initialised), from /proc/self/maps.
    Calling that one shares torch's runtime state; any other copy would still share the device's primary
    context (the driver gives one per device and process), so its allocations land in the same process."""
    paths: set[str] = set()
    try:
        with open(maps) as f:
            for line in f:
                parts = line.split(None, 5)  # address perms offset dev inode pathname
                if len(parts) == 6 and Path(parts[5].strip()).name.startswith("libcudart"):
                    paths.add(parts[5].strip())
    except OSError:
        return None
    found = sorted((p for p in paths if ".so" in p and Path(p).is_file()), key=lambda p: (_is_vendored(p), p))
    return Path(found[0]) if found else None


def _is_vendored(p: str) -> bool:
    """A hashed, vendored copy (e.g. torchvision.libs/libcudart.faf08d9a.so.13): last choice."""
    return not Path(p).name.startswith("libcudart.so")


def _system_libcudart() -> str | None:
    return ctypes.util.find_library("cudart")


def _prefer(p: Path) -> tuple[int, str]:
    major = _torch_cuda_major()
    return (0 if major and p.name.startswith(f"libcudart.so.{major}") else 1, p.name)


def _torch_cuda_major() -> str | None:
    try:
        import torch

        v = torch.version.cuda
    except Exception:
        return None
    return v.split(".")[0] if v else None


def find_libcudart() -> Path:
    """The CUDA runtime library to load: the one already loaded in this process, else the first libcudart.so*
    in `libcudart_search_dirs()` (one matching torch's CUDA major first), else what the system linker finds.
    Raises LibcudartNotFound naming everything looked at."""
    p = loaded_libcudart()
    if p is not None:
        return p
    dirs = libcudart_search_dirs()
    for d in dirs:
        if d.is_dir():
            hits = sorted((h for h in d.glob("libcudart*.so*") if h.is_file() and "static" not in h.name), key=_prefer)
            if hits:
                return hits[0]
    sysname = _system_libcudart()
    if sysname:
        return Path(sysname)
    raise LibcudartNotFound(
        "no CUDA runtime library (libcudart.so*) found: not loaded in this process (/proc/self/maps), "
        f"not in any of {', '.join(map(str, dirs)) or '(no directories)'}, and ctypes.util.find_library('cudart') "
        "found none; install the CUDA runtime wheel (pip install nvidia-cuda-runtime-cu12, or the cu13 one) "
        "or point CUDA_HOME at a CUDA toolkit"
    )


class CudaRuntime:
    """The few CUDA runtime calls check 2 needs, through ctypes: cudaMalloc/cudaFree outside torch."""

    def __init__(self, path: Path, device: int) -> None:
        self.path = path
        lib = ctypes.CDLL(str(path))
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaSetDevice.argtypes = [ctypes.c_int]
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaRuntimeGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
        for fn in (
            lib.cudaSetDevice,
            lib.cudaMalloc,
            lib.cudaFree,
            lib.cudaDeviceSynchronize,
            lib.cudaRuntimeGetVersion,
        ):
            fn.restype = ctypes.c_int
        self._lib = lib
        v = ctypes.c_int(0)
        self._call("cudaRuntimeGetVersion", lib.cudaRuntimeGetVersion(ctypes.byref(v)))
        self.version = v.value
        # Make this runtime instance current on the device and initialise it (cudaFree(NULL) is the idiom),
        # so that any one-off cost of a runtime copy other than torch's is paid before the measurement.
        self._call("cudaSetDevice", lib.cudaSetDevice(device))
        self._call("cudaFree(NULL)", lib.cudaFree(None))
        self.synchronize()

    def _call(self, what: str, rc: int) -> None:
        if rc != 0:
            msg = self._lib.cudaGetErrorString(rc)
            raise CudaRuntimeError(f"{what} failed: error {rc} ({msg.decode() if msg else '?'}) via {self.path}")

    def malloc(self, nbytes: int) -> int:
        ptr = ctypes.c_void_p()
        self._call(f"cudaMalloc({nbytes})", self._lib.cudaMalloc(ctypes.byref(ptr), nbytes))
        if not ptr.value:
            raise CudaRuntimeError(f"cudaMalloc({nbytes}) returned NULL via {self.path}")
        return ptr.value

    def free(self, ptr: int) -> None:
        self._call("cudaFree", self._lib.cudaFree(ctypes.c_void_p(ptr)))

    def synchronize(self) -> None:
        self._call("cudaDeviceSynchronize", self._lib.cudaDeviceSynchronize())


# ---------------------------------------------------------------------------------------------------------------
# The checks (CUDA)


def cuda_unavailable_reason(device: int = 0) -> str | None:
    """Why this process cannot run the checks on `device`, in one line; None when it can. Never creates a
    CUDA context."""
    try:
        import torch
    except ImportError:
        return "no CUDA device visible: torch is not installed"
    if not torch.version.cuda:
        return f"no CUDA device visible: torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        extra = f", CUDA_VISIBLE_DEVICES={cvd!r}" if cvd is not None else ""
        return f"no CUDA device visible (torch.cuda.is_available() is False{extra})"
    n = torch.cuda.device_count()
    if not 0 <= device < n:
        return f"no CUDA device {device} visible: this process sees {n} (0..{n - 1})"
    return None


def _settle(torch: Any) -> None:
    """Free what Python no longer references and hand the caching allocator's free cache back to the driver."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()


def _snap(torch: Any, probe: Probe) -> Snapshot:
    torch.cuda.synchronize()
    return probe.snapshot()


def check_idle(torch: Any, probe: Probe) -> list[Check]:
    """0. Nothing between two snapshots: no layer moves (the first snapshot also initialises NVML)."""
    _settle(torch)
    s0 = _snap(torch, probe)
    s1 = _snap(torch, probe)
    d = deltas(s0, s1)
    exp = {"driver": 0.0, "torch_reserved": 0.0, "torch_allocated": 0.0, "non_torch": 0.0}
    ok = within(d["driver"], 0.0, tolerance_mib(0))
    why = "" if ok else "the driver's free memory moved while idle: another process is using this GPU?"
    return [judge("idle: snapshot costs nothing", 0.0, d, exp, note=why)]


def check_torch_tensor(torch: Any, probe: Probe, device: int) -> list[Check]:
    """1. A torch tensor of known size: reserved = allocated = driver; non-torch 0; given back on free."""
    n = TORCH_ALLOC_MIB
    _settle(torch)  # no cached free segment may serve the request
    s0 = _snap(torch, probe)
    x = torch.empty(n * MIB, dtype=torch.uint8, device=f"cuda:{device}")  # no kernel: no lazy module load
    s1 = _snap(torch, probe)
    del x
    _settle(torch)
    s2 = _snap(torch, probe)
    layers = ("driver", "torch_reserved", "torch_allocated")
    return [
        judge(f"torch tensor {n} MiB", n, deltas(s0, s1), {**dict.fromkeys(layers, float(n)), "non_torch": 0.0}),
        judge(
            f"torch tensor {n} MiB freed",
            n,
            deltas(s1, s2),
            {**dict.fromkeys(layers, float(-n)), "non_torch": 0.0},
            expected_mib=-n,
            note="del + empty_cache",
        ),
    ]


def check_cuda_malloc(torch: Any, probe: Probe, device: int, rt: CudaRuntime) -> list[Check]:
    """2. cudaMalloc behind torch's back: the driver sees it, torch does not, so it is non-torch; cudaFree
    gives it back."""
    n = NON_TORCH_ALLOC_MIB
    _settle(torch)
    s0 = _snap(torch, probe)
    ptr: int | None = rt.malloc(n * MIB)
    try:
        rt.synchronize()
        s1 = _snap(torch, probe)
        rt.free(ptr)
        ptr = None
        rt.synchronize()
        s2 = _snap(torch, probe)
    finally:
        if ptr is not None:
            rt.free(ptr)
    via = f"via {rt.path.name} (CUDA runtime {rt.version // 1000}.{rt.version % 1000 // 10})"
    return [
        judge(
            f"cudaMalloc {n} MiB (non-torch)",
            n,
            deltas(s0, s1),
            {"driver": float(n), "torch_reserved": 0.0, "torch_allocated": 0.0, "non_torch": float(n)},
            note=via,
        ),
        judge(
            f"cudaFree {n} MiB",
            n,
            deltas(s1, s2),
            {"driver": float(-n), "torch_reserved": 0.0, "torch_allocated": 0.0, "non_torch": float(-n)},
            expected_mib=-n,
        ),
    ]


def _mlp(torch: Any, device: int, dtype: Any) -> Any:
    nn = torch.nn
    blocks: list[Any] = []
    for _ in range(LAYERS):
        blocks += [nn.Linear(HIDDEN, FFN), nn.GELU(approximate="tanh"), nn.Linear(FFN, HIDDEN)]
    return nn.Sequential(*blocks).to(device=f"cuda:{device}", dtype=dtype).eval()


def ladder_floor_mib(dtype_bytes: int = 2) -> float:
    """The least the ladder's graph pool can hold: the largest capture's FFN activation, which must be live."""
    return LADDER[0] * ROWS_PER_BS * FFN * dtype_bytes / MIB


def check_graph_ladder(torch: Any, probe: Probe, device: int) -> list[Check]:
    """3. CUDA graphs of batch sizes 64 → 1 captured into one shared pool: per capture, driver Δ = torch
    reserved Δ (the private pool is inside reserved; non-torch 0) and memory never goes down; replaying every
    graph costs nothing, so the per-capture deltas sum to the total.

    Everything with a one-off non-torch cost happens before the baseline: the eager run of every shape on the
    capture stream (kernel modules load lazily on first launch; cuBLAS handle and its per-stream workspace) and
    one throwaway capture (the RNG's graph registration, capture-path kernels), then freed. What remains in the
    driver column is the graph executables' own device memory, KiB for graphs of a dozen nodes."""
    dev = f"cuda:{device}"
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    checks: list[Check] = []
    graphs: list[Any] = []
    outs: list[Any] = []
    with torch.no_grad():
        model = _mlp(torch, device, dtype)
        x = torch.randn(LADDER[0] * ROWS_PER_BS, HIDDEN, device=dev, dtype=dtype)
        stream = torch.cuda.Stream(device=dev)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for bs in LADDER:
                model(x[: bs * ROWS_PER_BS])
        torch.cuda.current_stream().wait_stream(stream)
        g0 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g0, stream=stream):
            y0 = model(x[:ROWS_PER_BS])
        g0.replay()
        del g0, y0
        _settle(torch)
        try:
            pool = torch.cuda.graph_pool_handle()
            base = prev = _snap(torch, probe)
            rungs: list[dict[str, float | None]] = []
            for bs in LADDER:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool, stream=stream):
                    outs.append(model(x[: bs * ROWS_PER_BS]))
                graphs.append(g)
                s = _snap(torch, probe)
                d = deltas(prev, s)
                rungs.append(d)
                prev = s
                r, drv = d["torch_reserved"] or 0.0, d["driver"]
                tol = tolerance_mib(r)
                up = r >= 0 and drv is not None and drv >= -tol
                checks.append(
                    judge(
                        f"graph capture bs={bs}",
                        r,
                        d,
                        {"driver": r, "non_torch": 0.0},
                        also=(up, "memory went down during a capture"),
                        note="expected = torch reserved Δ (graph pool growth); the driver must match"
                        if bs == 64
                        else "",
                    )
                )
            for g in graphs:
                g.replay()
            final = _snap(torch, probe)
            total = deltas(base, final)
            sum_r = sum(d["torch_reserved"] or 0.0 for d in rungs)
            sum_d = sum(d["driver"] or 0.0 for d in rungs)
            floor = ladder_floor_mib(torch.tensor([], dtype=dtype).element_size())
            checks.append(
                judge(
                    f"graph ladder total ({len(LADDER)} graphs, replayed)",
                    sum_r,
                    total,
                    {"driver": sum_d, "torch_reserved": sum_r, "non_torch": 0.0},
                    also=(
                        (total["torch_reserved"] or 0.0) >= floor,
                        f"the ladder reserved less than its bs={LADDER[0]} FFN activation ({floor:.0f} MiB)",
                    ),
                    note="expected = Σ per-capture deltas; replays must allocate nothing",
                )
            )
        finally:
            graphs.clear()
            outs.clear()
            del model, x
            _settle(torch)
    return checks


def check_peak_reset(torch: Any, probe: Probe, device: int) -> list[Check]:
    """4. reset_peaks() drops an earlier peak to the current allocation; a transient tensor allocated and freed
    after the reset shows in torch_peak_allocated_mib (allocated itself is back where it was)."""
    dev = f"cuda:{device}"
    big, n = PEAK_PRIOR_MIB, PEAK_TRANSIENT_MIB
    _settle(torch)
    # Start from peak = current, so that the earlier peak below is exactly `big` above it (the checks before
    # this one peaked higher: the ladder's eager warm-up and graph pool).
    probe.reset_peaks()
    y = torch.empty(big * MIB, dtype=torch.uint8, device=dev)
    del y  # freed, but its segment stays cached: the transient below may reuse it, the peak must not care
    s_pre = _snap(torch, probe)
    probe.reset_peaks()
    s0 = _snap(torch, probe)
    t = torch.empty(n * MIB, dtype=torch.uint8, device=dev)
    del t
    s1 = _snap(torch, probe)
    _settle(torch)
    return [
        judge(
            f"reset_peaks drops a {big} MiB peak",
            big,
            deltas(s_pre, s0),
            {"torch_peak_allocated": float(-big), "torch_allocated": 0.0},
            expected_mib=-big,
        ),
        judge(
            f"transient {n} MiB after reset",
            n,
            deltas(s0, s1),
            {"torch_peak_allocated": float(n), "torch_allocated": 0.0},
            note="allocated and freed between the snapshots",
        ),
    ]


def _guarded(name: str, fn: Callable[[], list[Check]], torch: Any) -> list[Check]:
    """Run one check; an exception becomes a failed check that names it, and the memory is settled after."""
    try:
        return fn()
    except Exception as e:
        return [failed(name, f"could not measure: {type(e).__name__}: {e}")]
    finally:
        with contextlib.suppress(Exception):
            _settle(torch)


def _allocator(torch: Any) -> str:
    try:
        backend = torch.cuda.get_allocator_backend()
    except Exception:
        backend = "?"
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")
    return f"{backend} (PYTORCH_CUDA_ALLOC_CONF={conf})" if conf else backend


def selfcheck(device: int = 0) -> SelfcheckReport:
    """Run every check on `device`. Raises NoCudaDevice when it is not visible."""
    why = cuda_unavailable_reason(device)
    if why:
        raise NoCudaDevice(why)
    import torch

    torch.cuda.set_device(device)
    torch.zeros(1, device=f"cuda:{device}")  # creates the context; the probe never does
    torch.cuda.synchronize()
    props = torch.cuda.get_device_properties(device)
    report = SelfcheckReport(
        device=device,
        device_name=props.name,
        total_mib=props.total_memory / MIB,
        torch_version=torch.__version__,
        allocator=_allocator(torch),
    )
    probe = Probe()
    report.checks += _guarded("idle", lambda: check_idle(torch, probe), torch)
    report.checks += _guarded("torch tensor", lambda: check_torch_tensor(torch, probe, device), torch)

    def nontorch() -> list[Check]:
        rt = CudaRuntime(find_libcudart(), device)
        report.libcudart = f"{rt.path} (runtime {rt.version})"
        return check_cuda_malloc(torch, probe, device, rt)

    report.checks += _guarded(f"cudaMalloc {NON_TORCH_ALLOC_MIB} MiB (non-torch)", nontorch, torch)
    report.checks += _guarded("graph ladder", lambda: check_graph_ladder(torch, probe, device), torch)
    report.checks += _guarded("peak reset", lambda: check_peak_reset(torch, probe, device), torch)
    return report


def run_selfcheck(json_out: bool = False, device: int = 0) -> int:
    """`memfrac selfcheck`: prints the report (a table, or with json_out a JSON list of the checks) and returns
    0 when every check passes, 1 when one fails, 2 when no CUDA device is visible (one line on stderr)."""
    why = cuda_unavailable_reason(device)
    if why:
        print(f"memfrac selfcheck: {why}; nothing to check", file=sys.stderr)
        return 2
    report = selfcheck(device)
    print(json.dumps(report.as_dicts(), indent=1) if json_out else render_text(report))
    return 0 if report.passed else 1
