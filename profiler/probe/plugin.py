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
            "targets": [
                {"phase": r.target.phase, "path": r.target.path, "ok": r.ok, "note": r.note} for r in resolutions
            ],
        }
    )
    missing = [r for r in resolutions if not r.ok and r.target.required]
    if missing:
        rec.error("hook targets missing in the installed sglang: " + "; ".join(r.note for r in missing))
        return
    for r in resolutions:
        if r.ok:
            HookRegistry.register(r.target.path, _HOOKS[r.target.kind](rec, r.target.phase), HookType.AROUND)
    atexit.register(rec.flush_runtime)


Hook = Callable[..., Any]


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


def _deepep_hook(rec: Any, phase: str) -> Hook:
    """Measure only the first creation (later calls return the cached buffer: the hot path stays cheap)."""

    def hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        try:
            first = args[0]._state().buffer is None
        except Exception:
            first = False
        if not first:
            return original(*args, **kwargs)
        names = (
            "group",
            "hidden_size",
            "param_bytes",
            "deepep_mode",
            "num_max_dispatch_tokens_per_rank",
            "num_experts",
        )
        given = dict(zip(names, args[1:], strict=False)) | kwargs

        def after(fr: Any, _r: Any, _a: tuple, _k: dict) -> None:
            grp = given.get("group")
            fr.details.update(
                hidden=given.get("hidden_size"),
                param_bytes=given.get("param_bytes"),
                mode=str(getattr(given.get("deepep_mode"), "value", given.get("deepep_mode"))),
                tokens_per_rank=given.get("num_max_dispatch_tokens_per_rank"),
                num_experts=given.get("num_experts"),
                num_ranks=grp.size() if grp is not None and hasattr(grp, "size") else None,
            )

        return _phase_hook(rec, phase, after)(original, *args, **kwargs)

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
    "deepep": _deepep_hook,
    "runtime": _runtime_hook,
}
