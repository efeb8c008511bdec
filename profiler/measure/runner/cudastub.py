"""A stand-in `libcuda.so.1` so CUDA-linked wheels import on a machine without an NVIDIA driver.

SGLang imports sglang-kernel (and, depending on the path, deep_ep, flash_mla, torch_memory_saver ...)
whose extension modules list `libcuda.so.1` as DT_NEEDED. Python dlopens them with RTLD_NOW, so on a
driverless machine the import fails ("libcuda.so.1: cannot open shared object file") even when the
worker runs with `--device cpu`. A stub library that exports every driver symbol those modules link
against, and whose functions all report "no device", lets the imports succeed while nothing can ever
reach a GPU: `torch.cuda.is_available()` stays False.

The symbol list is derived at build time from the installed libraries (DT_NEEDED read from their ELF
headers, symbols from `nm -D --undefined-only`), so it follows whatever versions are installed. The
built stub is cached under a directory named by a hash of that list; the returned directory goes on
LD_LIBRARY_PATH of the worker. Needs `gcc` and `nm` (binutils).

Only for machines without an NVIDIA driver: on a GPU host the stub, being first on LD_LIBRARY_PATH,
would hide the real driver and the worker would see no GPU.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import struct
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

SONAME = "libcuda.so.1"
CUDA_ERROR_NO_DEVICE = 100
# Bump when the generated C source changes, so old cached builds are not reused.
_STUB_ABI = "1"
# Driver API entry points: `cu` + upper case (cudart is `cuda*`, cuBLAS `cublas*` ...). cuFile* is
# libcufile's API, not the driver's; a stub copy could shadow the real one, so it is never exported.
_DRIVER_SYMBOL = re.compile(r"^cu[A-Z]\w*$")
_NOT_DRIVER = ("cuFile",)
# Looked up with dlsym by cudart/torch rather than linked, so nm cannot see them: always exported.
_ALWAYS = (
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuGetErrorString",
    "cuGetErrorName",
    "cuGetExportTable",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
)
# Functions whose out-parameters callers read even on failure; the rest just return the error.
_SPECIAL_C = """\
int cuInit(unsigned int flags) { (void)flags; return NO_DEVICE; }
int cuDeviceGetCount(int *count) { if (count) *count = 0; return 0; }
int cuDriverGetVersion(int *version) { if (version) *version = 0; return NO_DEVICE; }
int cuGetErrorString(int err, const char **s) { (void)err; if (s) *s = MSG; return 0; }
int cuGetErrorName(int err, const char **s) { (void)err; if (s) *s = "CUDA_ERROR_NO_DEVICE"; return 0; }
int cuGetExportTable(const void **table, const void *id) {
  (void)id; if (table) *table = 0; return NO_DEVICE; }
int cuGetProcAddress(const char *sym, void **fn, int ver, unsigned long long flags) {
  (void)sym; (void)ver; (void)flags; if (fn) *fn = 0; return NO_DEVICE; }
int cuGetProcAddress_v2(const char *sym, void **fn, int ver, unsigned long long flags, int *status) {
  (void)sym; (void)ver; (void)flags; if (fn) *fn = 0; if (status) *status = 1; return NO_DEVICE; }
"""
_SPECIAL = frozenset(re.findall(r"^int (\w+)\(", _SPECIAL_C, re.MULTILINE))


class CudaStubError(RuntimeError):
    """The stub could not be built (a missing tool or a compiler failure); the message says which."""


def build_cuda_stub(cache_dir: Path, search_dirs: Iterable[Path] | None = None) -> Path:
    """Build (or reuse) the stub `libcuda.so.1`; return the directory to prepend to LD_LIBRARY_PATH.

    `search_dirs` are scanned recursively for shared libraries that need `libcuda.so.1`; by default
    this interpreter's site-packages (run it with the worker's interpreter, or pass the worker venv's).
    Every exported function returns CUDA_ERROR_NO_DEVICE (100); `cuDeviceGetCount` succeeds with 0 and
    the error-string/proc-address lookups fill their out-parameters, so callers fail cleanly.
    """
    nm, gcc = _require("nm"), _require("gcc")
    dirs = list(search_dirs) if search_dirs is not None else _site_dirs()
    symbols = sorted(set(_ALWAYS) | _linked_driver_symbols(nm, _libs_needing_cuda(dirs)))
    source = _c_source(symbols)
    digest = hashlib.sha256(f"{_STUB_ABI}\n{source}".encode()).hexdigest()[:16]
    out_dir = Path(cache_dir) / f"cuda-stub-{digest}"
    target = out_dir / SONAME
    if target.is_file():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        src, lib = Path(tmp) / "cuda_stub.c", Path(tmp) / SONAME
        src.write_text(source)
        cmd = [gcc, "-shared", "-fPIC", "-O1", f"-Wl,-soname,{SONAME}", "-o", str(lib), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise CudaStubError(f"gcc failed to build the CUDA driver stub:\n{proc.stderr.strip()}")
        (out_dir / "cuda_stub.c").write_text(source)  # kept next to the library, for debugging
        os.replace(lib, target)  # atomic: concurrent builders never see a half-written file
    return out_dir


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pkg = "gcc" if tool == "gcc" else "binutils"
        raise CudaStubError(
            f"'{tool}' not found on PATH: it is needed to build the stub libcuda.so.1 that lets "
            f"sglang import without an NVIDIA driver (install it, e.g. `apt-get install {pkg}`)"
        )
    return path


def _site_dirs() -> list[Path]:
    paths = sysconfig.get_paths()
    return sorted({Path(paths["purelib"]), Path(paths["platlib"])})


def _shared_libs(dirs: Iterable[Path]) -> Iterator[Path]:
    for d in dirs:
        for root, _subdirs, files in os.walk(d):
            for name in files:
                if name.endswith(".so") or ".so." in name:
                    p = Path(root, name)
                    if p.is_file() and not p.is_symlink():
                        yield p


def _libs_needing_cuda(dirs: Iterable[Path]) -> list[Path]:
    return sorted(p for p in _shared_libs(dirs) if SONAME in _elf_needed(p))


def _elf_needed(path: Path) -> list[str]:
    """DT_NEEDED entries of a 64-bit little-endian ELF file, read from its section headers only.

    Reading just the headers keeps the scan fast (libtorch_cuda is ~1 GB) and avoids needing readelf.
    Anything that is not such an ELF file yields [].
    """
    try:
        with path.open("rb") as f:
            ident = f.read(64)
            if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
                return []
            (shoff,) = struct.unpack_from("<Q", ident, 0x28)
            shentsize, shnum = struct.unpack_from("<HH", ident, 0x3A)
            if not shoff or not shnum or shentsize < 64:
                return []
            f.seek(shoff)
            table = f.read(shentsize * shnum)
            sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
            for _name, sh_type, _fl, _addr, offset, size, link, _info, _al, _ent in sections:
                if sh_type != 6 or link >= shnum:  # SHT_DYNAMIC; sh_link is its string table
                    continue
                f.seek(offset)
                dyn = f.read(size)
                str_off, str_size = sections[link][4], sections[link][5]
                f.seek(str_off)
                strtab = f.read(str_size)
                needed = []
                for tag, val in struct.iter_unpack("<qQ", dyn[: len(dyn) // 16 * 16]):
                    if tag == 0:  # DT_NULL
                        break
                    if tag == 1 and val < len(strtab):  # DT_NEEDED
                        needed.append(strtab[val : strtab.index(b"\0", val)].decode(errors="replace"))
                return needed
    except (OSError, struct.error, ValueError):
        return []
    return []


def _linked_driver_symbols(nm: str, libs: list[Path]) -> set[str]:
    symbols: set[str] = set()
    for i in range(0, len(libs), 64):
        batch = [str(p) for p in libs[i : i + 64]]
        proc = subprocess.run([nm, "-D", "--undefined-only", *batch], capture_output=True, text=True, check=False)
        for line in proc.stdout.splitlines():
            parts = line.split()
            if len(parts) != 2 or parts[0] not in ("U", "w"):
                continue
            name, _, version = parts[1].partition("@")
            if version and not version.lstrip("@").startswith("libcuda"):
                continue
            if _DRIVER_SYMBOL.match(name) and not name.startswith(_NOT_DRIVER):
                symbols.add(name)
    return symbols


def _c_source(symbols: list[str]) -> str:
    lines = [
        "/* Generated by memfrac (profiler/measure/runner/cudastub.py): a libcuda.so.1 with no devices. */",
        f"#define NO_DEVICE {CUDA_ERROR_NO_DEVICE}",
        '#define MSG "CUDA_ERROR_NO_DEVICE: no CUDA-capable device (memfrac stub libcuda.so.1)"',
        _SPECIAL_C,
    ]
    # Any other driver call: the x86-64/aarch64 C ABIs let a no-argument definition ignore its arguments.
    lines += [f"int {s}(void) {{ return NO_DEVICE; }}" for s in symbols if s not in _SPECIAL]
    return "\n".join(lines) + "\n"
