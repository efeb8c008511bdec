"""`memfrac upstream-tests`: the sglang unit tests PR #29615 shipped without (issue 25).

The fast tests pin the grid, the arithmetic comment and the calibrated values by hand. The proofs run the
generated module under plain pytest in a subprocess, with the release it was generated for first on PYTHONPATH:
0.5.23 (installed) passes; with a calibration it fails exactly the cases its header lists on the unpatched
sglang and passes on sglang with `calibrate --emit-patch`'s memory_hook.py patch; generated for 0.5.15.post1
(the release that shipped the PR) it passes there, and against 0.5.14 it fails exactly the cases that changed.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from profiler.calibrate import upstream_tests as ut
from profiler.core.errors import MemfracError
from profiler.engine.oracle import OracleResult
from profiler.engine.validation import installed_version
from profiler.face.cli import main
from profiler.model.heuristic import inputs_from_scenario, reserve, rules_for
from profiler.model.heuristic.constants import DEEPEP_A2A_MIB
from tests.conftest import RELEASES_DIR, needs_sglang


def _case(release: str, cid: str, cal: dict | None = None) -> ut.Case:
    cases, _ = ut.build_cases(release, "full", cal)
    return next(c for c in cases if c.id == cid)


# ------------------------------------------------------------------------------------------------ fast
def test_grids() -> None:
    small, full = ut.grid("small"), ut.grid("full")
    assert (len(small), len(full)) == (32, 3 * 5 * 15)
    ids = [c[0] for c in full]
    assert len(set(ids)) == len(ids) and {c[0] for c in small} <= set(ids)
    assert all(re.fullmatch(r"(null|prefill|decode)-(rtx_4090|l40s|h100_80gb|h200|b200)-(llama3_8b|dsv3)-tp\d.*", i)
               for i in ids)  # fmt: skip
    # the small grid: every role on every GPU class, and each knob the issue names at least once
    assert {(s.mode, s.gpu.name) for _, m, _, s in small if m == "llama3_8b"} >= {
        (mode, g) for g, _ in ut.GPUS for mode in ut.MODES
    }
    knobs = {
        "mla": lambda s: s.shape.is_mla,
        "dp attention": lambda s: s.attn_dp > 1,
        "deepep + decode graph": lambda s: s.moe_a2a_backend == "deepep" and s.decode_graph.backend is None,
        "deepep, no decode graph": lambda s: s.moe_a2a_backend == "deepep" and s.decode_graph.backend == "disabled",
        "draft tokens": lambda s: (s.speculative_num_draft_tokens or 0) > 1,
        "max_running_requests": lambda s: s.max_running_requests is not None,
        "decode graph disabled": lambda s: s.decode_graph.backend == "disabled",
    }
    for name, has in knobs.items():
        assert any(has(s) for *_, s in small), name
    # the GPU classes sit on both sides of the 35 GiB and 60 GiB thresholds
    mib = sorted(s.gpu.total_mib for *_, s in small)
    assert mib[0] < 35 * 1024 < 46068 < 60 * 1024 < mib[-1]
    with pytest.raises(MemfracError, match="--grid huge: choose small"):
        ut.grid("huge")


def test_arithmetic_by_hand() -> None:
    """The PR's headline, H100 decode node, Llama-3.1-8B: 0.835 (0.5.14) → 0.874 (0.5.15+)."""
    new = ut.arithmetic(_case("0.5.23", "decode-h100_80gb-llama3_8b-tp1").reservation)
    # 512 + max(256 × 1, 2048) × 1.5 + 1·1/8·1024 + 256 × 2 = 4224 → floor 10240; (81559 − 10240)/81559 = 0.87445
    assert new == [
        "(decode node: prefill graph backend disabled (the user did not set it))",
        "  constant              512 MiB  constant metadata (attention backends etc.)",
        "+ activation           3072 MiB  decode node: max(decode max_bs 256 × draft tokens 1, 2048) = 2048 tokens "
        "× 1.5",
        "+ parallel              128 MiB  tp 1 × pp 1 / 8 × 1024",
        "+ decode_graph          512 MiB  decode max_bs 256 × 2 MiB",
        "=                      4224 MiB",
        "floor (81559 MiB > 60 GiB): max(4224, 10240) = 10240 MiB",
        "round((81559 - 10240) / 81559, 3) = round(0.87445, 3) = 0.874",
    ]
    old = ut.arithmetic(_case("0.5.14", "decode-h100_80gb-llama3_8b-tp1").reservation)
    # before the PR a decode node's activation is the chunk: 512 + 8192 × 1.5 + 128 + 512 = 13440 → 0.83521
    assert old[-4:] == ["+ decode_graph          512 MiB  decode max_bs 256 × 2 MiB (added unconditionally before "
                        "PR #29615)", "=                     13440 MiB",
                        "floor (81559 MiB > 60 GiB): max(13440, 10240) = 13440 MiB",
                        "round((81559 - 13440) / 81559, 3) = round(0.83521, 3) = 0.835"]  # fmt: skip
    # a post-floor term: 512 + 12288 + 1024 + 1024 + 1536 (MLA) + 1024 (breakable + DeepEP) = 17408, + 2048 after
    # the floor = 19456; (143771 − 19456)/143771 = 0.86467
    dsv3 = ut.arithmetic(_case("0.5.23", "null-h200-dsv3-tp8-deepep").reservation)
    assert dsv3[-5:] == [
        "=                     17408 MiB",
        "floor (143771 MiB > 60 GiB): max(17408, 10240) = 17408 MiB",
        "+ deepep_a2a           2048 MiB  DeepEP buffers in the decode graph: hard-coded 2 GiB, added after the floor",
        "=                     19456 MiB",
        "round((143771 - 19456) / 143771, 3) = round(0.86467, 3) = 0.865",
    ]
    # below 60 GiB no floor: 512 + 4096 × 1.5 + 128 + 48 × 2 + 50 buckets × 8 = 7280; (24564 − 7280)/24564 = 0.70363
    small = ut.arithmetic(_case("0.5.23", "null-rtx_4090-llama3_8b-tp1").reservation)
    assert small[-3:] == ["=                      7280 MiB", "no floor (24564 MiB ≤ 60 GiB)",
                          "round((24564 - 7280) / 24564, 3) = round(0.70363, 3) = 0.704"]  # fmt: skip


def test_calibrated_value_by_hand() -> None:
    """B200 decode node, Llama-3.1-8B, a decode graph of 24 MiB/bs: 512 + 3072 + 128 + 512 × 24 = 16000 MiB, above
    the floor; (183359 − 16000)/183359 = 0.91273 → 0.913 (today 0.944)."""
    cal = {"schema_version": 1, "rules": "0.5.23", "terms": {"decode_graph": {"params": {"mib_per_bs": 24.0}}}}
    c = _case("0.5.23", "decode-b200-llama3_8b-tp1", cal)
    assert (c.reservation.mem_fraction_static, c.expected) == (0.944, 0.913)
    assert ut.calibrated_arithmetic(c) == [
        "decode_graph 1024 → 12288 MiB (per_unit: 24 MiB × bs 512)",
        "floor_topup 5504 → 0 MiB (floor_mib − pre-floor terms)",  # today 10240 − 4736; calibrated above the floor
        "= 16000 MiB; round((183359 - 16000) / 183359, 3) = 0.913",
    ]


def test_terms_the_patch_does_not_carry_stay_as_today() -> None:
    cal = {"schema_version": 1, "rules": "0.5.23", "terms": {
        "decode_graph": {"params": {"mib_per_bs": 24.0}, "evidence": {"decode_graph": {"patch": True}}},
        "activation": {"params": {"mib_per_token": 0.75},
                       "evidence": {"activation": {"patch": False, "patch_note": "under-reserves 1 run(s) (r2)"}}},
    }}  # fmt: skip
    applied, left = ut.carried(cal)
    assert list(applied["terms"]) == ["decode_graph"]
    assert left == [("activation", "under-reserves 1 run(s) (r2)")]
    # through the calibrated reserve: the activation stays 3072 MiB, so only the decode graph moves the fraction
    c = _case("0.5.23", "decode-b200-llama3_8b-tp1", applied)
    assert c.expected == 0.913


def test_a_case_the_resolver_disagrees_on_is_left_out() -> None:
    cases, _ = ut.build_cases("0.5.23", "small")
    a, b, c = cases[:3]
    res = [
        OracleResult("0.5.23", 1, ("sglang.srt.arg_groups.memory_hook.get_device_memory_capacity",),
                     a.reservation.mem_fraction_static),
        OracleResult("0.5.23", 1, (), round(b.reservation.mem_fraction_static - 0.001, 3)),
        OracleResult("0.5.23", 1, (), None, error="ValueError: no"),
    ]  # fmt: skip
    kept, left, patches = ut.confirm([a, b, c], res, "0.5.23")
    assert kept == [a] and patches == ("sglang.srt.arg_groups.memory_hook.get_device_memory_capacity",)
    assert left == [
        (b.id, f"sglang 0.5.23 resolves {round(b.expected - 0.001, 3)}, memfrac {b.expected}"),
        (c.id, "sglang 0.5.23 refuses it: ValueError: no"),
    ]


def test_rendered_module_imports_only_sglang_stdlib_and_pytest() -> None:
    cases, _ = ut.build_cases("0.5.23", "small")
    patches = ("sglang.srt.arg_groups.memory_hook.get_device_memory_capacity",
               "sglang.srt.utils.common.get_device_memory_capacity",
               "sglang.srt.model_executor.cuda_graph_config.default_prefill_backend")  # fmt: skip
    text = ut.render(cases, [("x-id", "sglang 0.5.23 refuses it: E")], "0.5.23", "small", patches)
    tree = ast.parse(text)
    mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {m for m in mods if not m.startswith("sglang.")} == {"argparse", "contextlib", "importlib", "json",
                                                                 "unittest.mock", "pytest"}  # fmt: skip
    assert "from sglang.srt.arg_groups.overrides import resolution_result" in text  # 0.5.20+: resolved beside
    # the capacity patched where the resolver looks it up, not at its definition
    assert 'GPU_CAPACITY_LOOKUPS = ("sglang.srt.arg_groups.memory_hook.get_device_memory_capacity",)' in text
    assert text.count("pytest.param(") == 32 and 'id="decode-h100_80gb-llama3_8b-tp1",' in text
    assert "    x-id: sglang 0.5.23 refuses it: E" in text
    assert "Release: sglang 0.5.23. Grid: small (32 cases: 10 unified, 7 prefill, 15 decode)\n" in text
    # each case: its arithmetic right above it, ending in the rounding that gives the value asserted
    for c in cases:
        before = text[: text.index(f'id="{c.id}"')]
        comment = before[: before.rfind("    pytest.param(")].rstrip("\n").splitlines()[-1]
        assert comment.startswith("    # round(") and comment.endswith(f"= {c.expected}"), c.id
    old = ut.render(cases[:1], [], "0.5.15.post1", "small", patches[:2])
    assert "resolution_result" not in old and "return server_args.mem_fraction_static" in old


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("MEMFRAC_SGLANG_RELEASES", str(tmp_path / "none"))
    assert main(["upstream-tests", "--out", str(tmp_path / "no" / "t.py")]) == 2
    assert "--out" in capsys.readouterr().err
    if installed_version() is not None:
        assert main(["upstream-tests", "--out", str(tmp_path / "t.py"), "--rules", "0.5.14"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("memfrac: error: --rules 0.5.14: sglang 0.5.14 is neither the installed sglang")
        assert len(err.splitlines()) == 1
        assert main(["upstream-tests", "--out", str(tmp_path / "t.py"), "--calibration", str(tmp_path / "c.json")]) == 2
        assert "--calibration" in capsys.readouterr().err and not (tmp_path / "t.py").exists()
    assert main(["upstream-tests", "--out", str(tmp_path / "t.py"), "--rules", "0.4.7"]) == 2
    assert "--rules 0.4.7: before 0.5.3rc2 sglang's fraction is not a sum of terms" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["upstream-tests", "--out", "x.py", "--grid", "huge"])


# ------------------------------------------------------------------------------------------------ proofs
def _pytest(modules: list[Path], pythonpath: list[str], cwd: Path) -> dict[str, dict[str, str | None]]:
    """Run generated modules under plain pytest (memfrac's plugin off) in one subprocess, so sglang is imported
    once: {module stem: {case id: None when it passed, else the assertion's message}}."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    cwd.mkdir(parents=True, exist_ok=True)
    xml = cwd / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:memfrac", "-p", "no:cacheprovider", "-q", f"--junitxml={xml}",
         *map(str, modules)], cwd=cwd, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert xml.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    out: dict[str, dict[str, str | None]] = {m.stem: {} for m in modules}
    for tc in ET.parse(xml).getroot().iter("testcase"):
        cid = tc.get("name", "")[len("test_mem_fraction_static[") : -1]
        bad = tc.find("failure")
        assert tc.find("error") is None and tc.find("skipped") is None, (cid, ET.tostring(tc)[:2000])
        out[tc.get("classname", "").rsplit(".", 1)[-1]][cid] = None if bad is None else bad.get("message", "")
    return out


def _got(message: str | None) -> float | None:
    """The fraction the release resolved, from pytest's `assert 0.835 == 0.874`."""
    m = re.search(r"assert (-?[0-9.]+) == (-?[0-9.]+)", message or "")
    return float(m.group(1)) if m else None


def _generate(tmp: Path, release: str, calibration: Path | None = None) -> tuple[Path, ut.Module]:
    m = ut.generate(release, "small", str(calibration) if calibration else None)
    path = tmp / f"test_mfs_{release.replace('.', '_')}{'_cal' if calibration else ''}.py"
    path.write_text(m.text)
    return path, m


def _patched_sglang(patch: Path, root: Path) -> Path:
    """The installed sglang with the patch applied to a copy of memory_hook.py alone: a tree of symlinks to the
    installed package (nothing in it is written) in which sglang/srt/arg_groups/memory_hook.py is a patched copy."""
    import importlib.util
    import shutil

    src = Path(next(iter(importlib.util.find_spec("sglang").submodule_search_locations)))
    dest = root / "sglang"
    for rel in ("", "srt", "srt/arg_groups"):
        (dest / rel).mkdir(parents=True, exist_ok=True)
        nxt = {"": "srt", "srt": "arg_groups", "srt/arg_groups": "memory_hook.py"}[rel]
        for p in (src / rel).iterdir():
            if p.name not in (nxt, "__pycache__"):
                (dest / rel / p.name).symlink_to(p)
    hook = dest / "srt" / "arg_groups" / "memory_hook.py"
    shutil.copy(src / "srt" / "arg_groups" / "memory_hook.py", hook)
    subprocess.run(["git", "apply", str(patch)], cwd=root, check=True, capture_output=True)
    assert hook.read_text() != (src / "srt" / "arg_groups" / "memory_hook.py").read_text()
    return root


@needs_sglang
def test_generated_for_the_installed_sglang_passes_and_travels_with_the_patch(tmp_path: Path) -> None:
    """0.5.23's small grid passes on 0.5.23. With a calibration (tests/calibrate/test_upstream.py's runs: constant
    676 MiB and decode graph 5 MiB/bs carried by the patch, activation 0.75 MiB/token not) the module fails, on the
    unpatched sglang, exactly the cases its header says the patch changes — each at today's value — and passes on
    sglang with `memfrac calibrate --emit-patch`'s patch applied."""
    from tests.calibrate.test_upstream import judgeable
    from tests.fixtures.results.handmade import calibration_results

    if installed_version() != "0.5.23":
        pytest.skip("the proof is written for sglang 0.5.23 installed")
    results = judgeable(calibration_results(tmp_path / "res"))
    cal, patch = tmp_path / "calibration.json", tmp_path / "memory_hook.patch"
    assert main(["calibrate", str(results), "--out", str(cal), "--emit-patch", str(patch)]) == 0
    with ThreadPoolExecutor(max_workers=2) as pool:
        plain_f, cal_f = pool.submit(_generate, tmp_path, "0.5.23"), pool.submit(_generate, tmp_path, "0.5.23", cal)
        (plain, m), (calibrated, mc) = plain_f.result(), cal_f.result()
    assert len(m.cases) == 32 and not m.left_out
    note = json.loads(cal.read_text())["terms"]["activation"]["evidence"]["activation"]["patch_note"]
    assert mc.not_carried == (("activation", note),) and note.startswith("it would lower today's reserve")
    changed = {c.id: (c.reservation.mem_fraction_static, c.expected) for c in mc.cases
               if c.expected != c.reservation.mem_fraction_static}  # fmt: skip
    assert len(changed) == 25 and all(f"    {i}: {a} -> {b} " in mc.text for i, (a, b) in changed.items())
    assert "The patch changes 25 of the 32 cases:" in mc.text
    # hand check of one: H100 unified, Llama-3.1-8B: 676 + 12288 + 128 + 256 × 5 + 464 = 14836 MiB (today 13904)
    # → (81559 − 14836)/81559 = 0.81810 → 0.818
    assert changed["null-h100_80gb-llama3_8b-tp1"] == (0.83, 0.818)
    tree = _patched_sglang(patch, tmp_path / "patched")
    with ThreadPoolExecutor(max_workers=2) as pool:
        unpatched = pool.submit(_pytest, [plain, calibrated], [], tmp_path / "run-installed")
        patched = pool.submit(_pytest, [calibrated], [str(tree)], tmp_path / "run-patched")
        on_plain, cal_unpatched = (unpatched.result()[m.stem] for m in (plain, calibrated))
        cal_patched = patched.result()[calibrated.stem]
    assert len(on_plain) == 32 and not any(on_plain.values())
    assert {i for i, msg in cal_unpatched.items() if msg} == set(changed)
    assert all(_got(cal_unpatched[i]) == today for i, (today, _) in changed.items())
    assert len(cal_patched) == 32 and not any(cal_patched.values())


#: The unified cases the 0.5.15.post1 module fails on 0.5.14, and why (read from both releases' server_args.py
#: `_handle_gpu_memory_settings` and checked below against the rule sets): PR #29615 changed some unified nodes
#: too, and one unified change is not the PR's.
UNIFIED_CHANGED = {
    "null-l40s-llama3_8b-tp1-no_decode_graph": "PR #29615: the decode-graph term is skipped when the decode graph "
    "backend is disabled, on every role (0.5.14 added max_bs × 2 unconditionally)",
    "null-h200-dsv3-tp8-deepep": "PR #29615: + 2 GiB DeepEP after the floor on every role but prefill",
    "null-h200-dsv3-tp8-deepep-no_decode_graph": "PR #29615: the decode-graph term skipped with the graph disabled "
    "(so no DeepEP term either)",
    "null-l40s-dsv3-tp8": "not PR #29615: 0.5.15 made the breakable prefill graph the default and turns it off for "
    "MLA models, so the flat 1.5 GiB MLA prefill-graph term goes (0.5.14: tc_piecewise kept it); no floor on 48 GB",
}


def _pr_29615_alone():
    """0.5.14's rules with PR #29615 alone: decode activation sizing and role-gated terms (`role_aware`) and the
    2 GiB DeepEP term after the floor — not 0.5.15's other change, the breakable prefill graph by default."""
    return replace(rules_for("0.5.14"), name="0.5.14+PR29615", role_aware=True, deepep_a2a_mib=DEEPEP_A2A_MIB)


@pytest.mark.oldreleases
@needs_sglang
def test_generated_for_0_5_15_passes_there_and_fails_on_0_5_14_where_the_pr_changed_it(tmp_path: Path) -> None:
    dirs = {r: RELEASES_DIR / r for r in ("0.5.14", "0.5.15.post1")}
    from profiler.engine.validation import side_by_side

    dirs = {r: side_by_side(r) or d for r, d in dirs.items()}
    for r, d in dirs.items():
        if not (d / ".installed").exists():
            pytest.skip(f"sglang {r} not installed side by side: run `make old-releases`")
    path, m = _generate(tmp_path, "0.5.15.post1")
    assert len(m.cases) == 32 and not m.left_out
    assert 'GPU_CAPACITY_LOOKUPS = ("sglang.srt.server_args.get_device_memory_capacity",)' in m.text
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = {r: pool.submit(_pytest, [path], [str(d)], tmp_path / f"run-{r}") for r, d in dirs.items()}
        on = {r: f.result()[path.stem] for r, f in runs.items()}
    assert len(on["0.5.15.post1"]) == 32 and not any(on["0.5.15.post1"].values())
    failed = {i for i, msg in on["0.5.14"].items() if msg}
    r14, r15, pr = rules_for("0.5.14"), rules_for("0.5.15.post1"), _pr_29615_alone()

    def mfs(c: ut.Case, rules) -> float:
        return reserve(inputs_from_scenario(c.scenario), rules).mem_fraction_static

    # exactly the cases whose fraction moved from 0.5.14 to 0.5.15, each failing with 0.5.14's own value
    moved = {c.id for c in m.cases if mfs(c, r14) != mfs(c, r15)}
    assert failed == moved
    assert all(_got(on["0.5.14"][c.id]) == mfs(c, r14) for c in m.cases if c.id in failed)
    # every prefill/decode case that failed is one PR #29615 changed: the PR alone gives 0.5.15's value
    pd = {c.id: c for c in m.cases if c.scenario.mode != "null" and c.id in failed}
    assert len(pd) == 19
    assert all(mfs(c, pr) == mfs(c, r15) != mfs(c, r14) for c in pd.values())
    # the unified cases: all pass but the four named, each for the reason named
    unified = {c.id: c for c in m.cases if c.scenario.mode == "null"}
    assert failed & set(unified) == set(UNIFIED_CHANGED)
    for cid, why in UNIFIED_CHANGED.items():
        c = unified[cid]
        if why.startswith("PR #29615"):  # the PR alone moves it all the way
            assert mfs(c, r14) != mfs(c, pr) == mfs(c, r15), cid
        else:  # the PR alone leaves it as 0.5.14 had it
            assert mfs(c, r14) == mfs(c, pr) != mfs(c, r15), cid
    assert len(set(unified) - failed) == 6
