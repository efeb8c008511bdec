"""Put the nvidia-smi test double (tests/fakes/nvidia-smi) first on PATH with a given state."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

FAKE = Path(__file__).resolve().parent / "nvidia-smi"


def gpu(index: int, uuid: str, used: float | list[float], total: int = 81559) -> dict[str, Any]:
    return {"index": index, "uuid": uuid, "memory.used": used, "memory.total": total, "name": "NVIDIA H100 80GB HBM3"}


class FakeSmi:
    def __init__(self, d: Path, state: dict[str, Any]) -> None:
        self.bin = d / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        shutil.copy(FAKE, self.bin / "nvidia-smi")
        self.state_path = d / "smi-state.json"
        self.set(**state)

    def set(self, **state: Any) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.state_path)

    def calls(self) -> list[list[str]]:
        p = Path(str(self.state_path) + ".calls")
        return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def install(monkeypatch: Any, tmp_path: Path, **state: Any) -> FakeSmi:
    """The fake nvidia-smi with `state` (see tests/fakes/nvidia-smi), first on PATH for this test."""
    fake = FakeSmi(tmp_path / "fake-smi", state)
    monkeypatch.setenv("PATH", f"{fake.bin}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SMI_STATE", str(fake.state_path))
    return fake
