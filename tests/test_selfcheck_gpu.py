"""`memfrac selfcheck` on a real CUDA device: every check passes, and the layers say what the checks claim.

Run by the hardware CI (`pytest -m gpu`); skipped where torch sees no CUDA device. On failure the assertion
message is the whole report table, so a run nobody watches still says which layer disagreed and by how much.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from profiler import selfcheck as sc


def _cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="needs a CUDA device (torch sees none)")]


@pytest.fixture(scope="module")
def report() -> sc.SelfcheckReport:
    return sc.selfcheck(0)


def _by_name(report: sc.SelfcheckReport) -> dict[str, sc.Check]:
    return {c.name: c for c in report.checks}


def test_every_check_passes(report):
    assert report.passed, "\n" + sc.render_text(report)


def test_every_check_ran(report):
    names = [c.name for c in report.checks]
    assert names == [
        "idle: snapshot costs nothing",
        f"torch tensor {sc.TORCH_ALLOC_MIB} MiB",
        f"torch tensor {sc.TORCH_ALLOC_MIB} MiB freed",
        f"cudaMalloc {sc.NON_TORCH_ALLOC_MIB} MiB (non-torch)",
        f"cudaFree {sc.NON_TORCH_ALLOC_MIB} MiB",
        *(f"graph capture bs={bs}" for bs in sc.LADDER),
        f"graph ladder total ({len(sc.LADDER)} graphs, replayed)",
        f"reset_peaks drops a {sc.PEAK_PRIOR_MIB} MiB peak",
        f"transient {sc.PEAK_TRANSIENT_MIB} MiB after reset",
    ], "\n" + sc.render_text(report)
    assert report.libcudart, "no libcudart was loaded for the cudaMalloc check"


def test_exact_torch_layers(report):
    """What torch's own books must say exactly, whatever the driver's granularity: a 512 MiB tensor is 512 MiB
    allocated (block sizes are rounded to 512 bytes only), and a cudaMalloc behind torch's back moves neither
    allocated nor reserved by a single byte."""
    by = _by_name(report)
    t = by[f"torch tensor {sc.TORCH_ALLOC_MIB} MiB"].measured_mib
    assert t["torch_allocated"] == sc.TORCH_ALLOC_MIB, "\n" + sc.render_text(report)
    c = by[f"cudaMalloc {sc.NON_TORCH_ALLOC_MIB} MiB (non-torch)"].measured_mib
    assert c["torch_reserved"] == 0 and c["torch_allocated"] == 0, "\n" + sc.render_text(report)


def test_graph_ladder_measures_real_memory(report):
    """The ladder is not vacuous: its pool held at least the bs=64 FFN activation, and it is all torch's."""
    total = _by_name(report)[f"graph ladder total ({len(sc.LADDER)} graphs, replayed)"]
    assert (total.measured_mib["torch_reserved"] or 0) >= sc.ladder_floor_mib(2), "\n" + sc.render_text(report)
    rungs = [c for c in report.checks if c.name.startswith("graph capture bs=")]
    assert all((c.measured_mib["torch_reserved"] or 0) >= 0 for c in rungs)


def test_run_selfcheck_exit_status_and_json(capsys):
    rc = sc.run_selfcheck(json_out=True)
    out = capsys.readouterr().out
    checks = json.loads(out)
    assert isinstance(checks, list) and all(isinstance(c, dict) for c in checks)
    assert rc == 0, out
    assert all(c["passed"] for c in checks)
    rc = sc.run_selfcheck()
    text = capsys.readouterr().out
    assert rc == 0 and text.rstrip().endswith("checks passed: all pass"), text
