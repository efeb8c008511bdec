"""The GPU acceptance test's skip logic (tests/measure/test_run_gpu.py), checked on any machine.

A GPU machine may lack sglang, or (for a prefill worker) mooncake or libibverbs: the GPU test must then skip
and say what to install, not fail inside the worker start. CUDA, the package finder and the library finder
are passed in, so each missing piece is checked on its own.
"""

from __future__ import annotations

import pytest

from tests.measure.test_run_gpu import gpu_run_missing


def finder(*present: str):
    return lambda name: object() if name in present else None


ALL = finder("sglang", "mooncake", "nixl")
LIB = {"ibverbs": "libibverbs.so.1"}.get


def test_a_complete_gpu_machine_runs_every_role():
    for mode in ("null", "decode", "prefill"):
        assert gpu_run_missing(mode, cuda=lambda: None, find_spec=ALL, find_library=LIB) is None


def test_no_cuda_is_the_first_reason():
    why = gpu_run_missing("null", cuda=lambda: "torch sees no CUDA device", find_spec=ALL, find_library=LIB)
    assert why == "needs a CUDA device: torch sees no CUDA device"


@pytest.mark.parametrize("mode", ["null", "decode", "prefill"])
def test_gpu_without_sglang_skips_naming_the_install(mode):
    why = gpu_run_missing(mode, cuda=lambda: None, find_spec=finder("mooncake"), find_library=LIB)
    assert why is not None and "sglang is not installed" in why and "pip install 'memfrac[sglang]'" in why


def test_prefill_without_mooncake_skips_but_other_roles_run():
    kw = {"cuda": lambda: None, "find_spec": finder("sglang"), "find_library": str}
    why = gpu_run_missing("prefill", **kw)
    assert why is not None and "mooncake_tcp transfer engine" in why and "pip install mooncake-transfer-engine" in why
    assert gpu_run_missing("decode", **kw) is None and gpu_run_missing("null", **kw) is None


def test_prefill_without_libibverbs_skips():
    why = gpu_run_missing("prefill", cuda=lambda: None, find_spec=ALL, find_library=lambda n: None)
    assert why is not None and "apt-get install libibverbs1" in why
