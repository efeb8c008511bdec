"""memfrac's SGLang general plugin (entry-point group `sglang.srt.plugins`, name `memfrac_probe`).

sglang calls `register()` at the start of every process that loads plugins; the probe only acts in the
scheduler (the process that owns the GPU), when `MEMFRAC_PROBE_DIR` is set — i.e. only for workers memfrac
started. It wraps each startup phase (AROUND hooks) and the scheduler's batch loop, and writes what it
sees to `$MEMFRAC_PROBE_DIR/probe-<pid>.jsonl`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from collections.abc import Callable
from typing import Any

ENV_DIR = "MEMFRAC_PROBE_DIR"
PLUGIN_NAME = "memfrac_probe"


def register() -> None:
    """The entry point. Never raises into sglang (a failing plugin is only logged there)."""
    out = os.environ.get(ENV_DIR)
    if not out:
        return
    patches: list[str] = []
    if os.environ.get("MEMFRAC_CPU_PATCHES") == "1":
        from profiler.probe.cpu_patches import apply_cpu_patches

        patches = apply_cpu_patches()
    if "sglang.srt.managers.scheduler" not in sys.modules:
        return  # the HTTP/tokenizer and detokenizer processes hold no GPU memory of their own
    from profiler.probe.recorder import Recorder

    rec = Recorder(out)
    try:
        _install(rec, patches)
    except Exception as e:  # report, never crash the worker from here
        rec.error(f"probe failed to install: {type(e).__name__}: {e}")


def _install(rec: Any, patches: list[str]) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from profiler.probe.targets import TARGETS, resolve

    try:
        import sglang

        version = getattr(sglang, "__version__", "unknown")
    except Exception:
        version = "unknown"
    resolutions = [resolve(t) for t in TARGETS]
    rec.write(
        {
            "type": "start",
            "kind": rec.probe.kind,
            "argv": sys.argv[:1],
            "ppid": os.getppid(),
            "sglang_version": version,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "pytorch_cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            "patches": patches,
            "targets": [_target_record(r) for r in resolutions],
        }
    )
    missing = [r for r in resolutions if not r.ok and r.target.required]
    if missing:
        rec.error("hook targets missing in the installed sglang: " + "; ".join(r.note for r in missing))
        return
    for r in resolutions:
        if r.ok:
            t = r.target
            hook = _a2a_hook(rec, t) if t.kind == "a2a" else _HOOKS[t.kind](rec, t.phase)
            HookRegistry.register(t.path, hook, HookType.AROUND)
    atexit.register(rec.flush_runtime)


Hook = Callable[..., Any]


def _target_record(r: Any) -> dict[str, Any]:
    t = r.target
    return {"phase": t.phase, "path": t.path, "ok": r.ok, "note": r.note, "required": t.required,
            "backend": t.backend or None}  # fmt: skip


def _phase_hook(rec: Any, phase: str, after: Callable[[Any, Any, tuple, dict], None] | None = None) -> Hook:
    def hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        fr = rec.begin(phase)
        try:
            result = original(*args, **kwargs)
        except BaseException as e:
            rec.end(fr, e)
            raise
        if after is not None:
            try:
                after(fr, result, args, kwargs)
            except Exception as e:
                fr.details["probe_note"] = f"{type(e).__name__}: {e}"
        rec.end(fr)
        return result

    return hook


def _ranks_after(rec: Any) -> Callable[[Any, Any, tuple, dict], None]:
    def after(fr: Any, _result: Any, _a: tuple, _k: dict) -> None:
        from sglang.srt.runtime_context import get_parallel

        p = get_parallel()
        ranks = {}
        for key, attr in (("tp", "tp_rank"), ("pp", "pp_rank"), ("dp", "attn_dp_rank"), ("ep", "moe_ep_rank")):
            v = getattr(p, attr, None)
            if isinstance(v, int):
                ranks[key] = v
        sizes = {}
        for key, attr in (("tp", "tp_size"), ("pp", "pp_size"), ("dp", "attn_dp_size"), ("ep", "moe_ep_size")):
            v = getattr(p, attr, None)
            if isinstance(v, int):
                sizes[key] = v
        rec.ranks = ranks
        fr.details["sizes"] = sizes
        if rec.probe.cuda:
            import torch

            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            fr.details["device_name"] = props.name
            fr.details["device_total_mib"] = props.total_memory / 2**20

    return after


def _baseline_after(fr: Any, result: Any, _a: tuple, _k: dict) -> None:
    if isinstance(result, int | float):
        fr.details["pre_model_load_mib"] = float(result) * 1024  # sglang returns GiB


def _budget_hook(rec: Any, phase: str) -> Hook:
    def hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            top = rec._stack[-1] if rec._stack else None
            if top is not None and isinstance(result, int | float):
                top.details["budget_mib"] = float(result) / 2**20  # KV byte budget
        except Exception:
            pass
        return result

    return hook


def _ladder_hook(rec: Any, phase: str) -> Hook:
    def hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            bs = kwargs.get("size", args[1] if len(args) > 1 else None)
            if isinstance(bs, int):
                rec.ladder(phase, bs)
        except Exception:
            pass
        return result

    return hook


def _scalar(v: Any) -> Any:
    """An argument as JSON: numbers, strings, enums by value, process groups by size; None otherwise."""
    if isinstance(v, bool | int | float | str) or v is None:
        return v
    if hasattr(v, "value") and isinstance(v.value, str | int):
        return v.value
    if hasattr(v, "itemsize"):  # torch dtypes
        return str(v)
    return None


def _a2a_hook(rec: Any, target: Any) -> Hook:
    """Measure the first creation of one backend's all-to-all buffer (later calls return the cached buffer,
    so the hot path stays one flag check). Details: backend, the arguments sglang passed, the EP group size,
    memfrac's analytic size from those arguments (`profiler.a2a.size_from_call`) and, where the library says
    what it allocated, reported_bytes."""
    import inspect

    done = [False]
    sig: list[Any] = []

    def hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        if done[0]:
            return original(*args, **kwargs)
        done[0] = True
        given: dict[str, Any] = {}
        try:
            if not sig:
                sig.append(inspect.signature(original))
            bound = sig[0].bind_partial(*args, **kwargs).arguments
            group = bound.get("group")
            if group is not None and hasattr(group, "size"):
                given["num_ranks"] = int(group.size())
            for k, v in bound.items():
                if k not in ("self", "cls", "group") and _scalar(v) is not None:
                    given[k] = _scalar(v)
        except Exception as e:
            given["probe_note"] = f"arguments not read: {type(e).__name__}: {e}"

        def after(fr: Any, result: Any, a: tuple, _k: dict) -> None:
            from profiler.a2a import reported_bytes, size_from_call

            fr.details.update(backend=target.backend, args=given)
            size = size_from_call(target.backend, given)
            if size is not None:
                fr.details.update(analytic_bytes=size.analytic_bytes, device_bytes=size.device_bytes,
                                  analytic_source=size.source, fails=size.fails or None)  # fmt: skip
            rep = reported_bytes(target.backend, result, a)
            if rep is not None:
                fr.details["reported_bytes"] = rep

        return _phase_hook(rec, target.phase, after)(original, *args, **kwargs)

    return hook


def _runtime_hook(rec: Any, phase: str) -> Hook:
    def hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        with contextlib.suppress(Exception):
            rec.runtime_sample()
        return result

    return hook


def _plain_phase(rec: Any, phase: str) -> Hook:
    return _phase_hook(rec, phase)


_HOOKS: dict[str, Callable[[Any, str], Hook]] = {
    "phase": _plain_phase,
    "ranks": lambda rec, phase: _phase_hook(rec, phase, _ranks_after(rec)),
    "baseline": lambda rec, phase: _phase_hook(rec, phase, _baseline_after),
    "budget": _budget_hook,
    "ladder": _ladder_hook,
    "runtime": _runtime_hook,
}
