"""Resolve a scenario with the REAL installed sglang: its argparse, its ServerArgs, its resolution.

This is the ground truth the pure model is checked against. On a machine without a GPU it patches only
what the facts doc names: `get_device_memory_capacity` wherever sglang bound it by name (so the GPU size is
the scenario's) and the default prefill graph backend (breakable, as on CUDA); and, for a bundled GPU,
sglang's own platform facts (`runtime_context.override_platform`: CUDA, the GPU's compute capability), so
checks such as MegaMoE's "needs an SM90 or SM100 GPU" see the scenario's GPU. On a CUDA machine nothing
is patched unless asked, and the result then describes the real GPU.

Older releases run in a subprocess with their own directory first on PYTHONPATH (`resolve_batch_subprocess`),
since two sglang versions cannot share one interpreter.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from profiler.core.errors import MemfracError


@dataclass(frozen=True)
class OracleResult:
    """What the real sglang resolved for one argv on one GPU size."""

    sglang_version: str
    gpu_mem_mib: int | None
    patched: tuple[str, ...]
    mem_fraction_static: float | None
    resolved: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


_RESOLVED_KEYS = (
    "mem_fraction_static", "chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "cuda_graph_config",
    "cuda_graph_max_bs", "cuda_graph_bs", "disaggregation_mode", "tp_size", "dp_size", "attn_dp_size", "ep_size",
    "moe_a2a_backend", "deepep_mode", "speculative_algorithm", "speculative_num_draft_tokens",
    "disable_cuda_graph", "piecewise_cuda_graph_max_tokens", "piecewise_cuda_graph_tokens",
    "disable_piecewise_cuda_graph", "enable_piecewise_cuda_graph",
)  # fmt: skip


def sglang_version() -> str:
    try:
        import sglang
    except ImportError:
        raise MemfracError(
            "sglang is not installed here; install memfrac with the extra: pip install 'memfrac[sglang]'"
        ) from None
    return getattr(sglang, "__version__", "unknown")


@contextlib.contextmanager
def _env(env: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


#: Compute capability of each bundled GPU (NVIDIA's CUDA GPU list), for sglang's platform facts.
GPU_CAPABILITY: dict[str, tuple[int, int]] = {
    "T4": (7, 5), "RTX-5080": (12, 0), "A10": (8, 6), "L4": (8, 9), "RTX-4090": (8, 9), "RTX-3090": (8, 6),
    "RTX-5090": (12, 0), "A100-40GB": (8, 0), "L40S": (8, 9), "L40": (8, 9), "H100-80GB": (9, 0), "H800": (9, 0),
    "A100-80GB": (8, 0), "H100-NVL": (9, 0), "H20": (9, 0), "H200": (9, 0), "H20-3e": (9, 0), "B200": (10, 0),
    "B300": (10, 3),
}  # fmt: skip


def platform_facts(capability: tuple[int, int]) -> dict[str, Any]:
    """sglang's platform facts on a CUDA GPU of this compute capability (srt/utils/common.py probes, CUDA ≥ 12.8)."""
    major, minor = capability
    return {
        "is_cuda": True, "is_hip": False, "is_npu": False, "is_xpu": False, "is_musa": False, "is_mps": False,
        "is_sm90": major == 9, "is_sm100": major == 10, "is_sm100_or_sm110": major in (10, 11),
        "is_sm110": major == 11, "is_sm120": major == 12, "is_blackwell": major in (10, 11, 12),
        "is_hopper_with_cuda_12_3": major == 9, "device_sm": major * 10 + minor, "device_capability": (major, minor),
    }  # fmt: skip


class _Patches:
    """The few patches that let the resolver run as on a CUDA node of a given size (undone on exit)."""

    def __init__(self, gpu_mem_mib: int, capability: tuple[int, int] | None = None) -> None:
        self.gpu_mem_mib = gpu_mem_mib
        self.capability = capability
        self.undo: list[tuple[Any, str, Any]] = []
        self.names: list[str] = []
        self._platform: Any = None

    def __enter__(self) -> _Patches:
        # Older releases bind it in server_args; newer in several arg_groups modules. Patch every binding.
        for name, original in _capacity_functions():
            for modname in [m for m in list(sys.modules) if m.startswith("sglang.")]:
                mod = sys.modules.get(modname)
                if mod is not None and getattr(mod, name, None) is original:
                    self._set(mod, name, lambda *a, **k: self.gpu_mem_mib, f"{modname}.{name}")
        sa_mod = sys.modules.get("sglang.srt.server_args")
        if sa_mod is not None and getattr(sys.modules.get("sglang"), "__version__", "") == "0.4.7":
            # 0.4.7 server_args.py:268, its only is_cuda() call: the > 180 GB branch applies on CUDA alone
            self._set(sa_mod, "is_cuda", lambda: True, "sglang.srt.server_args.is_cuda")
        try:
            import sglang.srt.model_executor.cuda_graph_config as cgc

            if hasattr(cgc, "default_prefill_backend"):
                self._set(
                    cgc,
                    "default_prefill_backend",
                    lambda *a, **k: cgc.Backend.BREAKABLE,
                    f"{cgc.__name__}.default_prefill_backend",
                )
        except ImportError:
            pass
        if self.capability is not None:
            try:
                from sglang.srt import runtime_context as rc
            except ImportError:  # releases before the platform context: nothing reads these facts there
                rc = None
            if rc is not None and hasattr(rc, "override_platform"):
                known = set(getattr(rc, "_PLATFORM_PROBES", {})) | set(getattr(rc, "_PLATFORM_VALUES", {}))
                facts = {k: v for k, v in platform_facts(self.capability).items() if not known or k in known}
                self._platform = rc.override_platform(**facts)
                self._platform.install()
                self.names.append(
                    f"sglang.srt.runtime_context.override_platform(sm{self.capability[0]}{self.capability[1]})"
                )
        return self

    def _set(self, obj: Any, name: str, value: Any, label: str) -> None:
        self.undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)
        self.names.append(label)

    def __exit__(self, *exc: object) -> None:
        if self._platform is not None:
            self._platform.restore()
        for obj, name, value in reversed(self.undo):
            setattr(obj, name, value)


def _capacity_functions() -> list[tuple[str, Any]]:
    """sglang's GPU-capacity readers: `get_device_memory_capacity` (0.4.6+; `srt/utils.py` until the
    `srt/utils/` package) and `get_nvgpu_memory_capacity`, which 0.4.0–0.4.5 call directly in server_args."""
    out = []
    for modname in ("sglang.srt.utils.common", "sglang.srt.utils"):
        with contextlib.suppress(ImportError):
            mod = __import__(modname, fromlist=["_"])
            for name in ("get_device_memory_capacity", "get_nvgpu_memory_capacity"):
                fn = getattr(mod, name, None)
                if fn is not None and (name, fn) not in out:
                    out.append((name, fn))
    return out


def _import_resolver_modules() -> None:
    """Import every module that binds get_device_memory_capacity, so the patch can reach them all."""
    for name in (
        "sglang.srt.server_args",
        "sglang.srt.arg_groups.pipeline",
        "sglang.srt.arg_groups.memory_hook",
        "sglang.srt.arg_groups.kv_shard_hook",
        "sglang.srt.arg_groups.model_overrides.qwen3_vl",
    ):
        with contextlib.suppress(ImportError):
            __import__(name)


def _plain(v: Any) -> Any:
    if hasattr(v, "__dataclass_fields__"):
        return {k: _plain(x) for k, x in asdict(v).items()}
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v if isinstance(v, str | int | float | bool | type(None)) else str(v)


class Resolver:
    """sglang's own argument parser and resolution, set up once for many argv (the parser is costly)."""

    def __init__(self, patch: bool | None = None) -> None:
        self.version = sglang_version()
        logging.disable(logging.WARNING)
        warnings.filterwarnings("ignore")
        _import_resolver_modules()
        from sglang.srt.server_args import ServerArgs

        self._server_args = ServerArgs
        self.patch = (not _cuda_available()) if patch is None else patch
        self.parser = argparse.ArgumentParser(prog="sglang")
        ServerArgs.add_cli_args(self.parser)

    def resolve(
        self,
        argv: list[str],
        gpu_mem_mib: int | None,
        env: dict[str, str] | None = None,
        capability: tuple[int, int] | None = None,
    ) -> OracleResult:
        """Parse `argv`, build ServerArgs, run its resolution; sglang's own errors come back as `error`.

        `capability` (patched runs only) is the GPU's compute capability for sglang's platform facts.
        """
        if self.patch and gpu_mem_mib is None:
            raise MemfracError("no GPU here: give the GPU size (MiB) the resolver should see")
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = self.parser.parse_args(argv)
        except SystemExit:
            msg = err.getvalue().strip().splitlines()
            return OracleResult(self.version, gpu_mem_mib, (), None, error=msg[-1] if msg else "bad arguments")
        ns.device = "cuda"
        patches = _Patches(gpu_mem_mib, capability) if self.patch else contextlib.nullcontext()  # type: ignore[arg-type]
        with _env(env or {}), patches as p:
            patched = tuple(p.names) if p else ()
            try:
                sa = self._server_args.from_cli_args(ns)
                if hasattr(sa, "resolve_once"):
                    sa.resolve_once()
            except (ValueError, AssertionError, TypeError, KeyError, NotImplementedError, RuntimeError) as e:
                return OracleResult(self.version, gpu_mem_mib, patched, None, error=sglang_error(e))
            resolved = _read_resolved(sa)
        return OracleResult(self.version, gpu_mem_mib, patched, resolved.get("mem_fraction_static"), resolved)


def sglang_error(e: BaseException) -> str:
    """sglang's own error in one line; a bare `assert` gets the failing line of sglang's source, which is
    the only thing it says (e.g. "AssertionError at sglang/srt/arg_groups/parallel_hook.py:326:
    assert cfg.tp_size % cfg.attn_dp_size == 0")."""
    import linecache
    import traceback

    text = " ".join(str(e).split())
    if text:
        return f"{type(e).__name__}: {text}"
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "sglang" in f.filename]
    if not frames:
        return type(e).__name__
    f = frames[-1]
    n = f.lineno or 0
    start = n  # a multi-line assert reports one of its continuation lines: walk up to the statement
    for k in range(n, max(0, n - 12), -1):
        if linecache.getline(f.filename, k).strip().startswith("assert"):
            start = k
            break
    stmt, depth = [], 0
    for k in range(start, start + 12):
        text = linecache.getline(f.filename, k).strip()
        stmt.append(text)
        depth += text.count("(") + text.count("[") - text.count(")") - text.count("]")
        if depth <= 0 and k >= n:
            break
    line = " ".join(" ".join(stmt).replace("( ", "(").replace(" )", ")").split()) or (f.line or "").strip()
    where = f.filename[f.filename.rfind("sglang/") :] if "sglang/" in f.filename else f.filename
    return f"{type(e).__name__} at {where}:{start}: {line}"


def resolve_argv(
    argv: list[str], gpu_mem_mib: int | None, env: dict[str, str] | None = None, patch: bool | None = None
) -> OracleResult:
    """Resolve one argv with the installed sglang (`patch=None`: patch only when no CUDA device is present)."""
    return Resolver(patch).resolve(argv, gpu_mem_mib, env)


def _read_resolved(sa: Any) -> dict[str, Any]:
    try:
        from sglang.srt.arg_groups.overrides import resolution_result

        def get(k: str) -> Any:
            return resolution_result(sa, k)
    except ImportError:  # ≤ 0.5.19: resolution writes the fields themselves

        def get(k: str) -> Any:
            return getattr(sa, k)

    out: dict[str, Any] = {}
    for k in _RESOLVED_KEYS:
        with contextlib.suppress(Exception):
            if hasattr(sa, k):
                out[k] = _plain(get(k))
    return out


def resolve_scenario(s: Any, patch: bool | None = None, resolver: Resolver | None = None) -> OracleResult:
    """Resolve a `Scenario` with the installed sglang (pass a `Resolver` to reuse it across many)."""
    from profiler.engine.launch import server_argv

    r = resolver or Resolver(patch)
    return r.resolve(server_argv(s, r.version), s.gpu.total_mib, s.env_dict, GPU_CAPABILITY.get(s.gpu.name))


#: The line prefix of the batch subprocess's progress reports on stderr.
_PROGRESS = "memfrac-oracle-progress "


def resolve_batch_subprocess(
    jobs: list[dict[str, Any]],
    pythonpath: list[str],
    python: str = sys.executable,
    progress: Callable[[int, int], None] | None = None,
) -> list[OracleResult]:
    """Resolve many argv with another sglang (its directory first on PYTHONPATH), in one subprocess.

    Each job is {"argv": [...], "gpu_mem_mib": int, "env": {...}, "capability": [major, minor] (optional)}.
    `progress(done, total)` is called as the subprocess reports (importing sglang there takes most of the time).
    """
    import tempfile
    import threading

    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, here, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    argv = [python, "-m", "profiler.engine.oracle", "--batch", "-"] + (["--progress"] if progress else [])
    with tempfile.TemporaryFile("w+") as out_f:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out_f, stderr=subprocess.PIPE, text=True, env=env)
        err: list[str] = []

        def read_err() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                if progress and line.startswith(_PROGRESS):
                    done, total = line[len(_PROGRESS) :].split("/")
                    progress(int(done), int(total))
                else:
                    err.append(line)

        reader = threading.Thread(target=read_err, daemon=True)
        reader.start()
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # it died before reading its jobs: its stderr says why
            proc.stdin.write(json.dumps(jobs))
            proc.stdin.close()
        rc = proc.wait()
        reader.join()
        out_f.seek(0)
        stdout = out_f.read()
    if rc != 0:
        raise MemfracError(f"resolver subprocess failed ({rc}): {''.join(err).strip()[-2000:]}")
    out = json.loads(stdout.strip().splitlines()[-1])
    return [OracleResult(**{**r, "patched": tuple(r["patched"])}) for r in out]


def _release_on_path() -> str:
    """The version of the sglang first on sys.path, read from its `version.py` without importing sglang."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("sglang")
    for d in (spec.submodule_search_locations or []) if spec else []:
        with contextlib.suppress(OSError), open(os.path.join(d, "version.py")) as f:
            m = re.search(r"__version__\s*=\s*[\"']([^\"']+)", f.read())
            if m:
                return m.group(1)
    return ""


def _old_release_shims() -> None:
    """Stand-ins for what releases before 0.5.12 import at module level and today's stack no longer has.

    - `triton.runtime.cache.default_cache_dir` & co. (0.4.0–0.4.6 `srt/utils.py`, a kernel cache path);
    - `torch._C._cpu._is_amx_tile_supported` (0.4.9+ `srt/custom_op.py`, CPU AMX detection, renamed in torch);
    - `vllm._custom_ops` (0.4.9 … 0.5.2 `layers/quantization/fp8.py` off CUDA), `decord` (0.4.4.post4 …
      0.4.5.post1 `srt/utils.py`, video decoding) and `sgl_kernel` (0.5.2 … 0.5.9 `layers/moe/…` import its
      kernels unguarded; today's sgl_kernel raises without libcuda): modules whose functions refuse to run.
    Their heuristics (`ServerArgs.__post_init__`) read none of these: the import chain reaches them through
    `ModelConfig` (read for is_multimodal / MLA). Nothing that imports is replaced, and releases from 0.5.12
    on get no stand-in at all, so the conformance of the modern releases runs on the unmodified stack.
    """
    import importlib.util
    import types

    from packaging.version import InvalidVersion, Version

    try:
        if Version(_release_on_path()) >= Version("0.5.12"):
            return
    except InvalidVersion:
        return
    with contextlib.suppress(ImportError):
        import triton.runtime.cache as cache

        for name in ("default_cache_dir", "default_dump_dir", "default_override_dir"):
            if not hasattr(cache, name):
                setattr(cache, name, lambda: os.path.join(os.path.expanduser("~"), ".triton", "cache"))
    with contextlib.suppress(ImportError):
        import torch

        cpu = getattr(torch._C, "_cpu", None)
        if cpu is not None and not hasattr(cpu, "_is_amx_tile_supported"):
            cpu._is_amx_tile_supported = lambda: False

    def absent(modname: str) -> types.ModuleType:
        def getattr_(name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)

            def fn(*a: Any, **k: Any) -> Any:
                raise NotImplementedError(f"{modname}.{name} is not available (memfrac resolver subprocess)")

            return fn

        mod = types.ModuleType(modname)
        mod.__getattr__ = getattr_  # type: ignore[method-assign]
        return mod

    if importlib.util.find_spec("vllm") is None:
        for modname in ("vllm", "vllm._custom_ops"):
            sys.modules[modname] = absent(modname)
    if importlib.util.find_spec("decord") is None:  # 0.4.4.post4 … 0.4.5.post1 `srt/utils.py`: video decoding
        sys.modules["decord"] = absent("decord")
    try:
        import sgl_kernel  # noqa: F401
    except ImportError:
        for k in [k for k in sys.modules if k == "sgl_kernel" or k.startswith("sgl_kernel.")]:
            del sys.modules[k]
        sys.modules["sgl_kernel"] = absent("sgl_kernel")


def _main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="resolve sglang argv with the sglang on PYTHONPATH (used by tests)")
    ap.add_argument("--batch", required=True, help="JSON file of jobs, or - for stdin")
    ap.add_argument("--progress", action="store_true", help=f"write '{_PROGRESS}DONE/TOTAL' lines to stderr")
    a = ap.parse_args(argv)
    if a.batch == "-":
        jobs = json.load(sys.stdin)
    else:
        with open(a.batch) as f:
            jobs = json.load(f)
    results = []
    _old_release_shims()
    with contextlib.redirect_stdout(io.StringIO()):
        resolver = Resolver(patch=True)
    for i, j in enumerate(jobs, 1):
        with contextlib.redirect_stdout(io.StringIO()):
            cap = j.get("capability")
            r = resolver.resolve(j["argv"], j.get("gpu_mem_mib"), j.get("env"), tuple(cap) if cap else None)
        results.append(asdict(r))
        if a.progress:
            print(f"{_PROGRESS}{i}/{len(jobs)}", file=sys.stderr, flush=True)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
