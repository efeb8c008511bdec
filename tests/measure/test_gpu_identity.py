"""GPU identity: a sweep's GPU index, the worker's CUDA_VISIBLE_DEVICES and nvidia-smi name the same GPU.

Slurm, containers and Ray start memfrac with a CUDA_VISIBLE_DEVICES of their own (indices, GPU UUIDs or MIG
ids); index i of `--gpus` is its i-th entry. Workers get CUDA_DEVICE_ORDER=PCI_BUS_ID (nvidia-smi's order),
and the release check reads memory.used per GPU UUID, so another job's GPU never stands in for ours. A test
double stands in for nvidia-smi (tests/fakes/nvidia-smi) and for the worker (tests/fakes/fake_sglang.py, "ok").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler.core.errors import MemfracError
from profiler.measure import machine as devices
from profiler.measure.runner.run import check_memory_returned, run_scenario
from profiler.model.scenario import single_scenario
from tests.conftest import FAKE_WORKER
from tests.fakes.smi import gpu, install

FAKE_WORKER = str(FAKE_WORKER)
A, B, C = (f"GPU-{c * 8}-1111-2222-3333-444444444444" for c in "abc")


def _run(tmp_path: Path, monkeypatch, gpus: list[int] | None):
    monkeypatch.setenv("FAKE_BEHAVIOUR", "ok")
    monkeypatch.setattr("profiler.measure.runner.run.RELEASE_WAIT_S", 4.0, raising=False)
    monkeypatch.setattr("profiler.measure.runner.run.RELEASE_POLL_S", 0.2, raising=False)
    s = single_scenario(
        "meta-llama--Llama-3.1-8B-Instruct", "H100", mode="decode",
        run={"startup_timeout_s": 60, "load_timeout_s": 20, "stop_grace_s": 5},
    )  # fmt: skip
    res = run_scenario(s, tmp_path / "run", device="cuda", gpus=gpus, python=FAKE_WORKER)
    env = json.loads((res.out_dir / "command.json").read_text())["env"]
    return res, env


def test_sweep_index_is_an_entry_of_the_parents_list_and_memory_is_read_by_uuid(tmp_path, monkeypatch):
    """Parent CUDA_VISIBLE_DEVICES=<B>,<C> (UUIDs, as Slurm may give): --gpus 1 is C, nvidia-smi's index 2."""
    install(monkeypatch, tmp_path, gpus=[gpu(0, A, 70000), gpu(1, B, 30000), gpu(2, C, 10)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{B},{C}")
    res, env = _run(tmp_path, monkeypatch, gpus=[1])
    assert env["CUDA_VISIBLE_DEVICES"] == C
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    chk = res.gpu_check
    assert chk["returned"] is True and chk["before_mib"] == {C: 10.0} and chk["gpus"] == {C: C}


def test_integer_parent_entries_compose_too(tmp_path, monkeypatch):
    """Parent CUDA_VISIBLE_DEVICES=2,0: --gpus 0 is physical GPU 2 (PCI order), not GPU 0."""
    install(monkeypatch, tmp_path, gpus=[gpu(0, A, 70000), gpu(1, B, 30000), gpu(2, C, 10)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    res, env = _run(tmp_path, monkeypatch, gpus=[0])
    assert env["CUDA_VISIBLE_DEVICES"] == "2" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert res.gpu_check["before_mib"] == {C: 10.0}


def test_memory_left_on_our_gpu_is_not_returned_whatever_the_other_gpus_do(tmp_path, monkeypatch):
    """Our GPU (C) keeps 9000 MiB after stop; GPU B (index 1, another job's) is steady. By UUID, that is a leak."""
    install(monkeypatch, tmp_path, gpus=[gpu(0, A, 0), gpu(1, B, 500), gpu(2, C, [10, 9000])])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{B},{C}")
    res, _ = _run(tmp_path, monkeypatch, gpus=[1])
    assert res.gpu_check["returned"] is False
    assert res.gpu_check["after_mib"] == {C: 9000.0}


def test_nvidia_smi_failing_after_stop_is_unknown_not_returned(tmp_path, monkeypatch):
    """The first query (before the run) answers; every later one fails: whether memory came back is unknown."""
    smi = install(monkeypatch, tmp_path, gpus=[gpu(0, A, 10)], fail_from_call=2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    res, env = _run(tmp_path, monkeypatch, gpus=[0])
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    chk = res.gpu_check
    assert chk["returned"] is None, chk
    assert "couldn't communicate with the NVIDIA driver" in chk["why"] and "exited 9" in chk["why"]
    assert len(smi.calls()) >= 2


def test_nvidia_smi_failing_before_the_run_is_unknown(tmp_path, monkeypatch):
    install(monkeypatch, tmp_path, gpus=[gpu(0, A, 10)], fail_from_call=1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    res, _ = _run(tmp_path, monkeypatch, gpus=[0])
    assert res.gpu_check["returned"] is None and "exited 9" in res.gpu_check["why"]


# ---- the composition itself ---------------------------------------------------------------------------------


def test_visible_devices_composes_with_the_parent():
    assert devices.visible_devices([1, 0], None) == ["1", "0"]
    assert devices.visible_devices([1], ["3", "5"]) == ["5"]
    assert devices.visible_devices([0], ["MIG-0a1b"]) == ["MIG-0a1b"]
    assert devices.visible_devices(None, ["3", "5"]) == ["3", "5"]
    with pytest.raises(MemfracError, match=r"GPU index 2 is not in this process's CUDA_VISIBLE_DEVICES='3,5'"):
        devices.visible_devices([2], ["3", "5"])
    with pytest.raises(MemfracError, match="no GPU"):
        devices.visible_devices([0], [])


def test_parent_entries_and_worker_env():
    assert devices.parent_entries({}) is None
    assert devices.parent_entries({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert devices.parent_entries({"CUDA_VISIBLE_DEVICES": "GPU-aa, GPU-bb"}) == ["GPU-aa", "GPU-bb"]
    assert devices.worker_env([1], ["4", "6"]) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "6"}
    assert devices.worker_env(None, ["4", "6"]) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # inherits the parent's


def test_resolve_by_index_uuid_prefix_and_mig():
    rows = [devices.SmiGpu(0, A, 1.0), devices.SmiGpu(1, B, 2.0)]
    assert devices.resolve("1", rows) == rows[1]
    assert devices.resolve(A, rows) == rows[0]
    assert devices.resolve("GPU-bbbbbbbb", rows) == rows[1]  # CUDA accepts a unique UUID prefix
    assert devices.resolve("bbbbbbbb-1111", rows) == rows[1]  # …with or without "GPU-"
    assert "matches 2 GPUs" in devices.resolve("GPU-", rows)
    assert "matches no GPU" in devices.resolve("7", rows)
    assert "MIG instance" in devices.resolve("MIG-4f0c", rows)


def test_check_memory_returned_waits_for_the_gpu_to_come_back(tmp_path, monkeypatch):
    """before 10 MiB; after stop 3000, 1500, then 400: back within 512 MiB on the third look."""
    smi = install(monkeypatch, tmp_path, gpus=[gpu(0, A, [10, 3000, 1500, 400])])
    before = devices.gpu_use(["0"])
    assert before.used_mib == {A: 10.0} and before.error is None
    chk = check_memory_returned(before, ["0"], timeout_s=30, poll_s=0.01)
    assert chk["returned"] is True and chk["after_mib"] == {A: 400.0}
    assert len(smi.calls()) == 4


def test_default_gpus_follow_the_parent_then_nvidia_smi(tmp_path, monkeypatch):
    install(monkeypatch, tmp_path, gpus=[gpu(0, A, 0), gpu(1, B, 0), gpu(2, C, 0)])
    assert devices.default_gpus({"CUDA_VISIBLE_DEVICES": "5,7"}) == [0, 1]
    assert devices.default_gpus({}) == [0, 1, 2]
