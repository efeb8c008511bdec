"""`memfrac selfcheck` on a real CUDA device: every check passes, and the layers say what the checks claim.

Run by the hardware CI (`pytest -m gpu`) and by scripts/gpu-acceptance.sh; skipped, with the reason, where torch
sees no CUDA device. On failure the assertion message is the whole report, so a run nobody watches still says which
layer or ledger line disagreed and by how much.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from profiler.selfcheck import checks as sc
from profiler.selfcheck import cuda as scc
from profiler.selfcheck import life
from profiler.selfcheck import run as scr


def _cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="needs a CUDA device (torch sees none)")]


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("selfcheck-probe")


@pytest.fixture(scope="module")
def report(probe_dir) -> sc.SelfcheckReport:
    return scr.selfcheck(0, probe_dir=probe_dir)


def _text(report: sc.SelfcheckReport) -> str:
    return "\n" + sc.render_text(report, rich_look=False)


def _by_name(report: sc.SelfcheckReport) -> dict[str, sc.Check]:
    return {c.name: c for c in report.checks}


def test_every_check_passes(report):
    assert report.passed, _text(report)


def test_every_check_ran(report):
    names = [c.name for c in report.checks]
    assert names[:15] == [
        "idle: snapshot costs nothing",
        f"torch tensor {sc.TORCH_ALLOC_MIB} MiB",
        f"torch tensor {sc.TORCH_ALLOC_MIB} MiB freed",
        f"cudaMalloc {sc.NON_TORCH_ALLOC_MIB} MiB (non-torch)",
        f"cudaFree {sc.NON_TORCH_ALLOC_MIB} MiB",
        *(f"graph capture bs={bs}" for bs in sc.LADDER),
        f"graph ladder total ({len(sc.LADDER)} graphs, replayed)",
        f"reset_peaks drops a {sc.PEAK_PRIOR_MIB} MiB peak",
        f"transient {sc.PEAK_TRANSIENT_MIB} MiB after reset",
    ], _text(report)
    assert [n for n in names[15:] if n.startswith(("life:", "comparison:"))] == names[15:], _text(report)
    assert len(names) == 15 + 16, _text(report)
    assert report.libcudart, "no libcudart was loaded for the cudaMalloc check"


def test_exact_torch_layers(report):
    """What torch's own books must say exactly, whatever the driver's granularity: a 512 MiB tensor is 512 MiB
    allocated (block sizes are rounded to 512 bytes only), and a cudaMalloc behind torch's back moves neither
    allocated nor reserved by a single byte."""
    by = _by_name(report)
    t = by[f"torch tensor {sc.TORCH_ALLOC_MIB} MiB"].measured
    assert t["torch_allocated"] == sc.TORCH_ALLOC_MIB, _text(report)
    c = by[f"cudaMalloc {sc.NON_TORCH_ALLOC_MIB} MiB (non-torch)"].measured
    assert c["torch_reserved"] == 0 and c["torch_allocated"] == 0, _text(report)


def test_graph_ladder_measures_real_memory(report):
    """The ladder is not vacuous: its pool held at least the bs=64 FFN activation, and it is all torch's."""
    total = _by_name(report)[f"graph ladder total ({len(sc.LADDER)} graphs, replayed)"]
    assert (total.measured["torch_reserved"] or 0) >= scc.ladder_floor_mib(2), _text(report)
    rungs = [c for c in report.checks if c.name.startswith("graph capture bs=")]
    assert all((c.measured["torch_reserved"] or 0) >= 0 for c in rungs)


def test_life_ledger_closes_and_books_the_serving_peak(report):
    L = report.ledger
    assert L is not None and L.closes and L.worst_point == "serving peak" and not L.after_worst, _text(report)
    lines = {x.name: x.mib for x in L.lines}
    assert {
        "weights",
        "kv_pool",
        "constant",
        "prefill_graph",
        "decode_graph",
        "deepep_a2a",
        "parallel",
        "activation",
        "headroom",
    } <= set(lines), _text(report)


def test_life_torch_layers_are_exact(report):
    """torch's reserved counter moves by exactly what the life's explicit tensors hold (multiples of 20 MiB), and
    the DeepEP stand-in (a cudaMalloc) by nothing."""
    by = _by_name(report)
    assert by["life: weights"].measured["torch_reserved"] == life.WEIGHTS_MIB, _text(report)
    assert by["life: kv_pool"].measured["torch_reserved"] == life.KV_MIB, _text(report)
    assert by["life: constant"].measured["torch_reserved"] == life.EAGER_STATIC_MIB, _text(report)
    assert by["life: deepep_a2a"].measured["torch_reserved"] == 0.0, _text(report)


def test_life_probe_file_is_kept(report, probe_dir):
    files = list(probe_dir.glob("probe-*.jsonl"))
    assert len(files) == 1 and files[0].stat().st_size > 0
    types = [json.loads(x)["type"] for x in files[0].read_text().splitlines()]
    assert types[0] == "start" and types.count("ladder") == len(life.DECODE_BS) and "runtime" in types


def test_recorded_readings_rejudge_to_the_same_checks(report):
    """The JSON report's readings re-judge on any machine to what this GPU judged."""
    doc = json.loads(json.dumps(report.as_dict(), default=str))
    checks, ledger = scr.judge_readings(doc["readings"])
    assert [c.as_dict() for c in checks] == doc["checks"]
    assert ledger.as_dict() == doc["ledger"]


def test_run_selfcheck_exit_status_and_json(capsys, tmp_path):
    rc = scr.run_selfcheck(json_out=True, probe_dir=str(tmp_path))
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert doc["schema"] == sc.SCHEMA and isinstance(doc["checks"], list) and doc["ledger"] is not None
    assert rc == 0 and doc["passed"], out
    rc = scr.run_selfcheck()
    text = capsys.readouterr().out
    assert rc == 0 and text.rstrip().endswith("checks passed: all pass"), text
