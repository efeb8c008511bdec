"""The probe against the installed sglang: every hook target resolves; every bundled scenario's launch argv
is accepted by sglang's own argument parser; the plugin is discoverable from a generated dist-info."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from profiler.measure.probe.targets import TARGETS, Target, TargetError, resolve, resolve_all
from profiler.model.scenario import load_scenarios
from tests.conftest import ROOT, needs_sglang

pytestmark = needs_sglang


def _cpu_env() -> dict[str, str]:
    from profiler.measure.runner.worker import _cache_dir, _cpu_env

    return {**os.environ, **_cpu_env(_cache_dir() / "cudastub")}


def test_every_hook_target_resolves_in_the_installed_sglang():
    code = (
        "import json; from profiler.measure.probe.targets import TARGETS, resolve;"
        "print(json.dumps([[t.path, r.ok, r.note] for t in TARGETS for r in [resolve(t)]]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_cpu_env(), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = {p: (ok, note) for p, ok, note in json.loads(out.stdout.strip().splitlines()[-1])}
    for t in TARGETS:
        ok, note = got[t.path]
        if t.required:
            assert ok, f"{t.path}: {note}"
        else:  # deep_ep needs a CUDA device even to import: here the module may not load
            assert ok or "cannot import" in note


def test_a_missing_target_fails_loudly_with_the_names_that_exist():
    r = resolve(Target("weights", "profiler.measure.probe.targets.Target.no_such_method"))
    assert not r.ok and "has no 'no_such_method'" in r.note and "phase" in r.note
    with pytest.raises(TargetError, match="hook targets missing"):
        resolve_all((Target("x", "profiler.measure.probe.targets.nope"),))


def test_every_bundled_scenario_argv_is_accepted_by_sglangs_parser(tmp_path):
    from profiler.engine.oracle import Resolver
    from profiler.measure.runner.worker import build_spec

    parser = Resolver(patch=True).parser
    files = sorted((ROOT / "scenarios").glob("*.toml"))
    assert len(files) >= 5
    n = 0
    for f in files:
        for s in load_scenarios(f):
            for device in ("cuda", "cpu"):
                if device == "cpu" and s.tp > 1:
                    continue
                spec = build_spec(s, tmp_path / f"{s.name}-{device}", device=device, transfer_backend="mooncake_tcp")
                argv = spec.argv[3:]  # after: python -m sglang.launch_server
                parser.parse_args(argv)  # sglang's argparse exits (SystemExit) on anything it rejects
                n += 1
    assert n > 30


def test_generated_dist_info_is_a_discoverable_plugin(tmp_path):
    from profiler.measure.probe.activate import probe_env

    env = {**os.environ, **probe_env(tmp_path / "plugin", tmp_path / "probe")}
    code = (
        "from importlib.metadata import entry_points;"
        "print([ep.value for ep in entry_points(group='sglang.srt.plugins') if ep.name == 'memfrac_probe'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "['profiler.measure.probe.plugin:register']"
    assert (tmp_path / "plugin").is_dir() and Path(env["MEMFRAC_PROBE_DIR"]) == tmp_path / "probe"
