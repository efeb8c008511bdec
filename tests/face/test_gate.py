"""The gate and its pytest plugin on stored results built by hand (numbers chosen to be checked by eye)."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from profiler.analyse.compare import Comparison, TermComparison
from profiler.core.measurement import Failure, Identity, Measurement
from profiler.face.gate import gate, run_gate, write_baseline
from profiler.results.store import RunContext, Store


def _run(name: str, decode_measured: float, *, failure: Failure | None = None, kind: str = "gpu",
         room: float = 9940.0) -> tuple:  # fmt: skip
    """A decode run: its decode graph measured as given, activation 1,000; the worker needs decode + 1,000 after the
    KV pool of `room` (the slack 9,940 less nothing: no request pools recorded)."""
    m = Measurement(
        id=f"{name}@1",
        source="probe",
        memory_kind=kind,
        scenario=name,
        failure=failure,
        identity=Identity(model="m", gpu_name="H200", gpu_total_mib=143771, mode="decode", tp=1),
    )
    terms = (
        TermComparison(
            "decode_graph", 512.0, decode_measured, "under" if decode_measured > 512 else "fits", "decode capture Δ"
        ),
        TermComparison("activation", 3072.0, 1000.0, "over", "runtime peak"),
    )
    verdict = "oom_during_capture" if failure else "ok"
    c = Comparison(
        measurement_id=m.id,
        scenario=name,
        source="probe",
        memory_kind=kind,
        rules="0.5.23",
        mfs=0.929,
        mfs_origin="auto",
        heuristic_fraction=0.929,
        gpu_total_mib=143771,
        free_at_start_mib=140000.0,
        slack_mib=9940.0,
        reserved_terms_mib=10240.0,
        weights_mib=15360.0,
        kv_pool_mib=100000.0,
        kv_tokens=800000,
        kv_bytes_per_token=131072,
        used_after_kv_mib=decode_measured + 1000,
        headroom_mib=room - decode_measured - 1000,
        headroom_startup_mib=None,
        wasted_kv_tokens=None,
        recommended_mfs=None,
        margin_mib=1024.0,
        verdict=verdict,
        reason="by hand",
        terms=terms,
        failure_kind=failure.kind if failure else None,
        room_mib=room,
        need_mib=decode_measured + 1000,
    )
    return m, c, RunContext(group=name)


def _store(tmp_path, *runs) -> str:
    s = Store(tmp_path / "r")
    s.init()
    s.add(list(runs), run_key="k")
    return str(s.root)


def test_a_term_over_its_constant_is_a_finding_and_a_worker_out_of_room_fails(tmp_path, capsys):
    """Issue 26.3: the gate judges the worker as a whole. Decode graph 600 > its 512 while the worker needs 600 +
    1,000 = 1,600 of its 9,940 room: a calibration finding, shown, passed (above 60 GiB the 10 GiB floor tops the
    terms up first). The same worker with a room of 1,500: 1,600 > 1,500 fails, in MiB."""
    clean = _store(tmp_path / "a", _run("llama-decode", 400.0))
    assert run_gate(clean, None, "5%", None) == 0
    assert capsys.readouterr().out.startswith("PASS")
    over = _store(tmp_path / "o", _run("llama-decode", 600.0))
    assert run_gate(over, None, "5%", None) == 0
    finding = next(c for c in gate(over) if c.name == "term decode_graph")
    assert finding.passed and finding.message == ("calibration finding: measured 600 MiB > its constant 512 MiB, "
                                                  "covered by the worker's room (decode capture Δ)")  # fmt: skip
    capsys.readouterr()
    bad = _store(tmp_path / "b", _run("llama-decode", 600.0, room=1500.0))
    assert run_gate(bad, None, "5%", str(tmp_path / "j.xml")) == 1
    out = capsys.readouterr().out
    # off a terminal the failed checks are a Markdown table (profiler.core.ui): one row per failed check
    assert out.splitlines()[0] == "FAIL: 4 checks over 1 scenarios, 1 failed"
    assert [c.strip() for c in out.splitlines()[1].split("|")[1:-1]] == ["scenario", "check", "why it failed"]
    assert ("| llama-decode | worker room | needs 1,600 MiB after the KV pool where its fraction leaves 1,500 MiB "
            "(used after the KV pool, vs free_at_start × (1 − mfs) − the request pools) |") in out  # fmt: skip
    suite = ET.parse(tmp_path / "j.xml").getroot()
    assert suite.get("failures") == "1"
    fail = suite.find(".//testcase[@name='worker room']/failure")
    assert fail is not None and "1,600 MiB" in fail.get("message")


def test_failed_run_fails_and_host_runs_are_not_gated(tmp_path):
    r = _store(
        tmp_path,
        _run("oom", 100.0, failure=Failure("oom_during_capture", phase="decode_graph")),
        _run("cpu-smoke", 900.0, kind="host"),
    )
    checks = {(c.scenario, c.name): c for c in gate(r)}
    assert not checks[("oom", "run")].passed
    assert checks[("cpu-smoke", "run")].skipped and ("cpu-smoke", "term decode_graph") not in checks


def test_regression_against_a_baseline(tmp_path):
    base_dir = _store(tmp_path / "base", _run("llama-decode", 400.0))
    bl = tmp_path / "baseline.json"
    write_baseline(base_dir, bl)
    # 400 → 430 MiB: +7.5% and +30 MiB → under the 32 MiB noise floor: passes
    ok = _store(tmp_path / "ok", _run("llama-decode", 430.0))
    assert all(c.passed for c in gate(ok, bl))
    # 400 → 460: +15%, +60 MiB → regression (both limits exceeded)
    worse = _store(tmp_path / "worse", _run("llama-decode", 460.0))
    reg = [c for c in gate(worse, bl) if c.name == "regression decode_graph"]
    assert len(reg) == 1 and not reg[0].passed and "+60 MiB, +15.0%" in reg[0].message
    # a scenario the baseline had, missing now
    other = _store(tmp_path / "other", _run("qwen-decode", 400.0))
    assert any(c.name == "regression" and not c.passed for c in gate(other, bl))


def test_baseline_needs_gpu_numbers(tmp_path):
    from profiler.core.errors import MemfracError

    r = _store(tmp_path, _run("cpu-smoke", 10.0, kind="host"))
    with pytest.raises(MemfracError, match="no GPU measurements"):
        write_baseline(r, tmp_path / "b.json")


@pytest.mark.parametrize(("room", "rc"), [(9940.0, 0), (1500.0, 1)])
def test_pytest_plugin(tmp_path, room, rc):
    r = _store(tmp_path, _run("llama-decode", 600.0, room=room))
    empty = tmp_path / "nothing"
    empty.mkdir()
    p = subprocess.run(
        [sys.executable, "-m", "pytest", str(empty), "--memfrac-results", r, "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert p.returncode == rc, p.stdout[-2000:]
    if rc:
        assert "llama-decode · worker room: needs 1,600 MiB" in p.stdout
    else:
        assert "passed" in p.stdout


def test_a_run_that_never_started_fails_the_gate(tmp_path) -> None:
    """A nightly sweep whose GPUs stayed busy records the run as not started (executors.py): it measured
    nothing, so the gate must not pass it."""
    st = Store(tmp_path / "R")
    st.init()
    st.add([_run("ok-run", 400.0)], run_key="ok-run")
    st.add([], run_key="busy", status="not_started", extra={"reason": "waited 600 s for 1 free GPU: GPU 0 busy"})
    checks = gate(tmp_path / "R")
    bad = [c for c in checks if not c.passed]
    assert [(c.scenario, c.name) for c in bad] == [("busy", "run")] and "waited 600 s" in bad[0].message


def test_skipped_checks_are_counted_by_kind():
    """Issue 23: incomplete logs were counted as "host-memory runs"."""
    from profiler.face.gate import Check, render, skipped_kinds

    checks = [Check("cpu", "run", True, "host-memory run (CPU): reported, not gated", skipped=True),
              Check("log1", "run", True, "incomplete: the log ends before the KV pool", skipped=True),
              Check("log2", "run", True, "incomplete: the log ends while loading weights", skipped=True),
              Check("gpu", "run", True, "ok: fits")]  # fmt: skip
    assert skipped_kinds(checks) == {"host-memory runs": 1, "incomplete logs": 2}
    assert render(checks).splitlines()[-1] == "(1 host-memory runs, 2 incomplete logs: reported, not gated)"
