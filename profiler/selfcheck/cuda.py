"""The CUDA side of `memfrac selfcheck`: find libcudart, take the readings each check judges (torch is imported only
here, inside the functions that touch the device).

The judges, records and tolerances these readings feed are plain Python in `checks`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import os
import site
import sys
from pathlib import Path
from typing import Any

from profiler.core.measurement import Snapshot
from profiler.measure.probe.snapshot import Probe
from profiler.selfcheck.checks import (
    FFN,
    HIDDEN,
    LADDER,
    LAYERS,
    MIB,
    NON_TORCH_ALLOC_MIB,
    PEAK_PRIOR_MIB,
    PEAK_TRANSIENT_MIB,
    ROWS_PER_BS,
    TORCH_ALLOC_MIB,
    AllocReadings,
    CudaRuntimeError,
    IdleReadings,
    LadderReadings,
    LibcudartNotFound,
    PeakReadings,
)


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
# The attribution checks' CUDA part: take the readings


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


def settle(torch: Any) -> None:
    """Free what Python no longer references and hand the caching allocator's free cache back to the driver."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()


def _snap(torch: Any, probe: Probe) -> Snapshot:
    torch.cuda.synchronize()
    return probe.snapshot()


def read_idle(torch: Any, probe: Probe) -> IdleReadings:
    """Two snapshots with nothing between them (the first also initialises NVML)."""
    settle(torch)
    return IdleReadings(_snap(torch, probe), _snap(torch, probe))


def read_torch_tensor(torch: Any, probe: Probe, device: int) -> AllocReadings:
    n = TORCH_ALLOC_MIB
    settle(torch)  # no cached free segment may serve the request
    s0 = _snap(torch, probe)
    x = torch.empty(n * MIB, dtype=torch.uint8, device=f"cuda:{device}")  # no kernel: no lazy module load
    s1 = _snap(torch, probe)
    del x
    settle(torch)
    return AllocReadings(float(n), s0, s1, _snap(torch, probe), "del + empty_cache")


def read_cuda_malloc(torch: Any, probe: Probe, rt: CudaRuntime) -> AllocReadings:
    n = NON_TORCH_ALLOC_MIB
    settle(torch)
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
    return AllocReadings(float(n), s0, s1, s2, via)


def _mlp(torch: Any, device: int, dtype: Any) -> Any:
    nn = torch.nn
    blocks: list[Any] = []
    for _ in range(LAYERS):
        blocks += [nn.Linear(HIDDEN, FFN), nn.GELU(approximate="tanh"), nn.Linear(FFN, HIDDEN)]
    return nn.Sequential(*blocks).to(device=f"cuda:{device}", dtype=dtype).eval()


def ladder_floor_mib(dtype_bytes: int = 2) -> float:
    """The least the ladder's graph pool can hold: the largest capture's FFN activation, which must be live."""
    return LADDER[0] * ROWS_PER_BS * FFN * dtype_bytes / MIB


def read_graph_ladder(torch: Any, probe: Probe, device: int) -> LadderReadings:
    """CUDA graphs of batch sizes 64 → 1 captured into one shared pool, a reading after each, then every graph
    replayed. Everything with a one-off non-torch cost happens before the baseline: the eager run of every
    shape on the capture stream (kernel modules load lazily on first launch; cuBLAS handle and its per-stream
    workspace) and one throwaway capture (the RNG's graph registration, capture-path kernels), then freed.
    What remains in the driver column is the graph executables' own device memory, KiB for graphs of a dozen
    nodes."""
    dev = f"cuda:{device}"
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
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
        settle(torch)
        try:
            pool = torch.cuda.graph_pool_handle()
            base = _snap(torch, probe)
            rungs: list[tuple[int, Snapshot]] = []
            for bs in LADDER:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool, stream=stream):
                    outs.append(model(x[: bs * ROWS_PER_BS]))
                graphs.append(g)
                rungs.append((bs, _snap(torch, probe)))
            for g in graphs:
                g.replay()
            final = _snap(torch, probe)
            floor = ladder_floor_mib(torch.tensor([], dtype=dtype).element_size())
            return LadderReadings(floor, base, tuple(rungs), final)
        finally:
            graphs.clear()
            outs.clear()
            del model, x
            settle(torch)


def read_peak_reset(torch: Any, probe: Probe, device: int) -> PeakReadings:
    dev = f"cuda:{device}"
    big, n = PEAK_PRIOR_MIB, PEAK_TRANSIENT_MIB
    settle(torch)
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
    settle(torch)
    return PeakReadings(float(big), float(n), s_pre, s0, s1)


# ---------------------------------------------------------------------------------------------------------------
# The run
