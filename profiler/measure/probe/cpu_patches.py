"""Test-only patches that let real SGLang workers run their disaggregation paths on a CPU-only machine.

memfrac's end-to-end tests start real prefill/decode workers with `--device cpu`. A few code paths in
SGLang assume CUDA even then; these patches switch them to the host fallbacks SGLang already has.
They change no memory accounting (the thing memfrac measures) and are applied only when
MEMFRAC_CPU_PATCHES=1, from the memfrac general plugin, i.e. inside every SGLang process that loads
plugins (the scheduler is the one that matters). Never enable them on a GPU run.

Patches are installed lazily: if the target module is not imported yet, an import hook patches it
right after it is first imported, so processes that never need it do not pay for importing it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable
from types import ModuleType

ENV_VAR = "MEMFRAC_CPU_PATCHES"

_MOONCAKE_CONN = "sglang.srt.disaggregation.mooncake.conn"


def _mooncake_host_indices(conn: ModuleType) -> None:
    # SchedulerDisaggregationPrefillMixin.send_kv_chunk (disaggregation/prefill.py) copies the page
    # indices into *pinned* host memory and records a torch.cuda.Event when the sender has
    # `supports_host_tensor_indices`; both need CUDA. False selects its plain host path
    # (kv_to_page_indices), which is what every other transfer backend uses.
    conn.MooncakeKVSender.supports_host_tensor_indices = False


# module name -> (label reported by apply_cpu_patches, patch function)
_PATCHES: dict[str, tuple[str, Callable[[ModuleType], None]]] = {
    _MOONCAKE_CONN: (
        f"{_MOONCAKE_CONN}.MooncakeKVSender.supports_host_tensor_indices=False",
        _mooncake_host_indices,
    ),
}


def enabled() -> bool:
    """True when MEMFRAC_CPU_PATCHES=1 (set by memfrac for CPU-only test workers only)."""
    return os.environ.get(ENV_VAR) == "1"


def apply_cpu_patches() -> list[str]:
    """Apply (now, or on first import of the target module) the CPU-only patches; return their labels.

    Returns [] and changes nothing unless MEMFRAC_CPU_PATCHES=1. Idempotent: a second call in the
    same process reports the same labels without patching twice.
    """
    if not enabled():
        return []
    labels = []
    for module_name, (label, patch) in _PATCHES.items():
        module = sys.modules.get(module_name)
        if module is not None:
            patch(module)
        elif not any(isinstance(f, _PatchOnImport) and f.name == module_name for f in sys.meta_path):
            sys.meta_path.insert(0, _PatchOnImport(module_name, patch))
        labels.append(label)
    return labels


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the real loader of one module so `patch` runs right after it executes."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, self.patch)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, patch: Callable[[ModuleType], None]) -> None:
        self.loader, self.patch = loader, patch

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.loader, name)  # get_source, get_filename ... (tracebacks, inspect)

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.patch(module)
