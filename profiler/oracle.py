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
        import sglang.srt.utils.common as common

        original = common.get_device_memory_capacity
        # Older releases bind it in server_args; newer in several arg_groups modules. Patch every binding.
        for modname in [m for m in list(sys.modules) if m.startswith("sglang.")]:
            mod = sys.modules.get(modname)
            if mod is not None and getattr(mod, "get_device_memory_capacity", None) is original:
                self._set(
                    mod,
                    "get_device_memory_capacity",
                    lambda *a, **k: self.gpu_mem_mib,
                    f"{modname}.get_device_memory_capacity",
                )
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
