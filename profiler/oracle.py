"""Resolve a scenario with the REAL installed sglang: its argparse, its ServerArgs, its resolution.

This is the ground truth the pure model is checked against. On a machine without a GPU it patches only
what the facts doc names: `get_device_memory_capacity` wherever sglang bound it by name (so the GPU size is
the scenario's) and the default prefill graph backend (breakable, as on CUDA). On a CUDA machine nothing
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
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from profiler.errors import MemfracError


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


class _Patches:
    """The few patches that let the resolver run as on a CUDA node of a given size (undone on exit)."""

    def __init__(self, gpu_mem_mib: int) -> None:
        self.gpu_mem_mib = gpu_mem_mib
        self.undo: list[tuple[Any, str, Any]] = []
        self.names: list[str] = []

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
        return self

    def _set(self, obj: Any, name: str, value: Any, label: str) -> None:
        self.undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)
        self.names.append(label)

    def __exit__(self, *exc: object) -> None:
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

    def resolve(self, argv: list[str], gpu_mem_mib: int | None, env: dict[str, str] | None = None) -> OracleResult:
        """Parse `argv`, build ServerArgs, run its resolution; sglang's own errors come back as `error`."""
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
        with _env(env or {}), _Patches(gpu_mem_mib) if self.patch else contextlib.nullcontext() as p:  # type: ignore[arg-type]
            patched = tuple(p.names) if p else ()
            try:
                sa = self._server_args.from_cli_args(ns)
                if hasattr(sa, "resolve_once"):
                    sa.resolve_once()
            except (ValueError, AssertionError, TypeError, KeyError, NotImplementedError, RuntimeError) as e:
                return OracleResult(self.version, gpu_mem_mib, patched, None, error=f"{type(e).__name__}: {e}")
            resolved = _read_resolved(sa)
        return OracleResult(self.version, gpu_mem_mib, patched, resolved.get("mem_fraction_static"), resolved)


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
    from profiler.launch import server_argv

    r = resolver or Resolver(patch)
    return r.resolve(server_argv(s, r.version), s.gpu.total_mib, s.env_dict)


def resolve_batch_subprocess(
    jobs: list[dict[str, Any]], pythonpath: list[str], python: str = sys.executable
) -> list[OracleResult]:
    """Resolve many argv with another sglang (its directory first on PYTHONPATH), in one subprocess.

    Each job is {"argv": [...], "gpu_mem_mib": int, "env": {...}}.
    """
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, here, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [python, "-m", "profiler.oracle", "--batch", "-"],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        raise MemfracError(f"resolver subprocess failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
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
    for j in jobs:
        with contextlib.redirect_stdout(io.StringIO()):
            r = resolver.resolve(j["argv"], j.get("gpu_mem_mib"), j.get("env"))
        results.append(asdict(r))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
