"""What a maintainer carries upstream: calibration.json, the memory_hook.py patch, `explain --calibration`.

The results are tests/fixtures/results/handmade.py's `calibration_results` (its docstring has the table):
decode 3, 4, 5 MiB/bs → 5; activation 0.5, 0.75, 0.5 MiB/token → 0.75; constant max(300, 420, 380) + 256 = 676.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from profiler.calibrate.codec import ceil_sig, load_calibration
from profiler.calibrate.fit import calibrate
from profiler.calibrate.upstream import installed_hook, make_patch
from profiler.core.errors import MemfracError
from profiler.face.cli import main
from tests.conftest import ROOT
from tests.fixtures.results.handmade import calibration_results, run_rows, write_frame


def judgeable(root: Path, gpu: float = 46068.0, free: float = 45000.0, used: float = 1000.0) -> Path:
    """Give every run what the whole-reserve evaluation needs (an L40S: no floor; free at start; a measured need
    after the KV pool), so the patch gate can judge it."""
    import pandas as pd

    from profiler.results.store import RESULT_COLUMNS

    df = pd.read_parquet(root / "results.parquet")
    df["gpu_total_mib"], df["free_at_start_mib"] = gpu, free
    df.loc[df["term"] == "total", "used_after_kv_mib"] = used
    df.astype({k: v for k, v in RESULT_COLUMNS.items() if k in df.columns}).to_parquet(root / "results.parquet")
    return root


@pytest.fixture()
def results(tmp_path: Path) -> Path:
    return judgeable(calibration_results(tmp_path / "res"))


def test_calibration_json(results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "calibration.json"
    assert main(["calibrate", str(results), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"wrote {out}: 3 term(s) fitted (constant, activation, decode_graph), rules 0.5.23" in said
    d = json.loads(out.read_text())
    assert (d["schema_version"], d["rules"], d["sglang_version"]) == (1, "0.5.23", "0.5.23")
    assert {t: e["params"] for t, e in d["terms"].items()} == {
        "constant": {"constant_mib": 676.0},
        "activation": {"mib_per_token": 0.75},
        "decode_graph": {"mib_per_bs": 5.0},
    }
    dg = d["terms"]["decode_graph"]
    assert dg["today"] == {"mib_per_bs": 2.0} and dg["formula"] == "5 MiB/bs"
    ev = dg["evidence"]["decode_graph"]
    assert (ev["runs"], ev["models"], ev["worker_starts"]) == (["r1", "r2", "r3"], ["A", "B"], 3)
    # residuals (fitted − measured): r1 5 × 256 − 768 = 512, r2 5 × 160 − 640 = 160, r3 5 × 256 − 1280 = 0
    assert ev["residuals_mib"] == {"per_run": {"r1": 512.0, "r2": 160.0, "r3": 0.0}, "min": 0.0, "max": 512.0,
                                   "mean": 224.0}  # fmt: skip
    # LOO: r3's start held out → max(3, 4) = 4 → 1024 < 1280; LOMO: model B held out → the same
    assert ev["loo"]["under"] == ["r3"] and ev["lomo"]["under"] == ["r3"] and ev["lomo"]["sets"] == 2
    assert ev["patch"] is True  # it raises today's reserve: held-out misses do not stop it
    act = d["terms"]["activation"]["evidence"]["activation"]
    # 0.75 lowers r1's and r3's reserve (6144 < 12288, 1536 < 3072) and held out r2 is under (0.5 × 4096 < 3072)
    assert act["patch"] is False and "under-reserves 1 run(s) (r2)" in act["patch_note"]
    assert set(d["not_fitted"]) >= {"parallel", "floor_topup", "deepep_a2a", "dp_padding"}
    assert load_calibration(out)["terms"]["constant"]["params"]["constant_mib"] == 676.0


def _apply(patch: Path, tmp_path: Path) -> Path:
    """A copy of the installed sglang's memory_hook.py at sglang/srt/arg_groups/, patched (checked first)."""
    _, hook = installed_hook()
    tree = tmp_path / "tree"
    dest = tree / "sglang" / "srt" / "arg_groups" / "memory_hook.py"
    dest.parent.mkdir(parents=True)
    shutil.copy(hook, dest)
    check = subprocess.run(["git", "apply", "--check", "-v", str(patch)], cwd=tree, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    if shutil.which("patch"):
        dry = subprocess.run(["patch", "-p1", "--dry-run", "-i", str(patch)], cwd=tree, capture_output=True, text=True)
        assert dry.returncode == 0, dry.stdout + dry.stderr
    subprocess.run(["git", "apply", str(patch)], cwd=tree, check=True)
    return dest


def test_patch_applies_to_the_installed_memory_hook(results: Path, tmp_path: Path) -> None:
    version, hook = installed_hook()
    assert version == "0.5.23"  # the release the fixture's runs were sized with
    patch = tmp_path / "memory_hook.patch"
    assert main(["calibrate", str(results), "--emit-patch", str(patch)]) == 0
    text = patch.read_text()
    assert text.startswith("--- a/sglang/srt/arg_groups/memory_hook.py\n+++ b/sglang/srt/arg_groups/memory_hook.py\n")
    patched = _apply(patch, tmp_path)
    new = patched.read_text()
    compile(new, str(patched), "exec")  # still Python
    old = hook.read_text().splitlines()
    lines = new.splitlines()
    # the constant and the decode graph replaced, each with its evidence in a comment above it
    i = lines.index("            reserved_mem = 676")
    assert lines[i - 3].strip() == "# memfrac calibrate (max of 3 runs, 2 model(s), 3 worker start(s); was 512):"
    # the whole reserve held out by model (judgeable(): L40S, 45000 MiB free, 1000 MiB need): no new OOM, and
    # the KV the calibrated fraction gains on the three decode runs
    assert lines[i - 2].strip().startswith("#   shape flat; held out by model: new OOMs 0, KV gained decode +")
    assert "LOO 0/3 under; LOMO 0/3 under" in lines[i - 1]
    j = lines.index("        reserved_mem += decode_cuda_graph_config.max_bs * 5")
    assert lines[j - 2].strip().startswith("#   shape per_unit; held out by model: new OOMs 0")
    assert "5 MiB/bs; fitted − measured +0…+512 MiB; LOO 1/3 under; LOMO 1/3 under." in lines[j - 1]
    # activation not carried (see test_calibration_json); everything else untouched
    assert "            reserved_mem += activation_tokens * 1.5" in lines
    removed = [x for x in old if x not in lines]
    assert removed == ["            reserved_mem = 512", "        reserved_mem += decode_cuda_graph_config.max_bs * 2"]
    assert len(lines) == len(old) + 6  # three comment lines per replaced constant


def _old_release_results(root: Path) -> Path:
    """Runs sized by older rules, as ingested logs are: decode 3 and 5 MiB/bs (→ 5) under 0.5.9 and a range of
    0.5.3 … 0.5.8 rule sets — every terms-era rule computes the decode graph as 2 MiB × max_bs, as 0.5.23 does;
    activation under 0.5.14, whose tokens are the chunk size even on a decode node (0.5.23: running requests ×
    draft tokens since PR #29615), measured above the reserve (1.0 MiB/token, raising it: nothing stops it but
    the rules)."""
    rows = []
    for run_id, model, rules, (dr, dm), (ar, am) in (
        ("o1", "a/A", "0.5.9", (512.0, 768.0), (12288.0, 8192.0)),
        ("o2", "b/B", "0.5.3 … 0.5.8 (6 rule sets)", (320.0, 800.0), (6144.0, 4096.0)),
    ):
        terms = {"decode_graph": (dr, dm, "under"), "activation": (ar, am, "under")}
        rows += run_rows(run_id, terms, model=model, group=run_id, rules=rules, mode="decode",
                         architecture="LlamaForCausalLM")  # fmt: skip
    for r in rows:
        if r["term"] == "activation":
            r["rules"] = "0.5.14"
    return judgeable(write_frame(root, rows))


def test_patch_carries_a_term_computed_the_same_way(tmp_path: Path) -> None:
    """Results sized by 0.5.9 and 0.5.3 … 0.5.8 rules patch 0.5.23's memory_hook.py where the term is the same
    (decode: 2 MiB × max_bs in all of them) and leave it where it is not (activation's tokens changed)."""
    cal = calibrate([str(_old_release_results(tmp_path / "res"))])
    p = make_patch(cal, version="0.5.23")
    assert p.replaced == ("decode_graph",)
    left = dict(p.left)
    assert left["activation"] == (
        "runs sized by the 0.5.14 rules, whose term is 1.5 MiB × tokens (chunked prefill size), not 1.5 MiB × "
        "tokens (decode nodes: running requests × draft tokens) as in 0.5.23"
    )
    # 768 MiB at bs 256, 800 at bs 160 (3 and 5 MiB/bs), two models. Held out by model:
    #   ratio: o1 by 5 → 1280 (+512), o2 by 3 → 480 (−320, under): 1 under, mean |err| 416
    #   fixed + per bs: one point left, all fixed: o1 by 800 (+32), o2 by 768 (−32): 1 under, 32 → chosen;
    #   on both the line through the two points falls with bs, so the lowest covering line is flat: 800 MiB.
    # The comment names the rules the runs were sized with.
    assert "+        reserved_mem += 800\n" in p.diff
    assert ("+        #   Runs sized by the sglang 0.5.3 … 0.5.9 rules (2 label(s)): each computes the term as\n"
            "+        #   0.5.23 does, 2 MiB × decode max_bs.\n") in p.diff  # fmt: skip
    patch = tmp_path / "m.patch"
    patch.write_text(p.diff)
    _apply(patch, tmp_path)


def test_patch_refuses_a_term_the_target_computes_otherwise(results: Path, tmp_path: Path) -> None:
    """The hand-made 0.5.23 results against a pre-0.5.3 release (a fraction table, no terms): nothing carries."""
    cal = calibrate([str(results)])
    match = r"no constant is justified by these results for the installed sglang 0\.4\.10's"
    with pytest.raises(MemfracError, match=match) as e:
        make_patch(cal, version="0.4.10")
    assert "decode_graph: the sglang 0.4.9.post3 rules have no such term" in str(e.value)


def test_patch_refuses_without_a_justified_constant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # one run: nothing was tested on a start it was not fitted on
    res = write_frame(tmp_path / "one", run_rows("r", {"decode_graph": (512.0, 768.0, "under")}))
    rc = main(["calibrate", str(res), "--emit-patch", str(tmp_path / "p.patch")])
    err = capsys.readouterr().err
    assert rc == 2 and "refused: the evidence holds fewer than two models" in err
    assert not (tmp_path / "p.patch").exists()


def test_ceil_sig_never_rounds_down() -> None:
    assert ceil_sig(2.34375) == 2.344 and ceil_sig(47.1) == 47.1 and ceil_sig(1155.2) == 1156.0
    assert ceil_sig(0.00390625) == 0.003907 and ceil_sig(676.0) == 676.0


# ----------------------------------------------------------------------------------- explain --calibration

L40S = 'name = "llama8b-l40s-decode"\nmodel = "meta-llama--Llama-3.1-8B-Instruct"\ngpu = "L40S"\nmode = "decode"\n'


def test_explain_with_calibration(results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cal = tmp_path / "calibration.json"
    main(["calibrate", str(results), "--out", str(cal)])
    scen = tmp_path / "l40s.toml"
    scen.write_text(L40S)
    capsys.readouterr()
    assert main(["explain", str(scen), "--calibration", str(cal)]) == 0
    out = capsys.readouterr().out
    # L40S 46068 MiB, decode node, max_bs 32: today 512 + 2048 × 1.5 + 128 + 32 × 2 = 3776 → round(42292/46068, 3)
    # = 0.918; calibrated 676 + 2048 × 0.75 + 128 + 32 × 5 = 2500 → round(43568/46068, 3) = 0.946.
    assert "| decode_graph |        64 |            160 |     96 | per_unit: 5 MiB × bs 32 " in out  # 5 × 32 = 160
    assert "| reserved     |     3,776 |          2,500 | -1,276 |" in out
    assert "| fraction     |     0.918 |          0.946 | +0.028 |" in out
    # KV: 46068 × (0.946 − 0.918) MiB more ≈ 1289.9 MiB × 2^20 / 131072 B per token ≈ 10,319 tokens
    assert "today 215,795 → calibrated 226,114 (+10,319)" in out
    assert "gives 1,276 MiB back to the KV cache" in out


def test_explain_calibration_that_avoids_an_oom(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a hand-written calibration: 40 MiB/bs → decode 32 × 40 = 1280; reserved 512 + 3072 + 128 + 1280 = 4992,
    # 1216 MiB above today's 3776 → round((46068 − 4992) / 46068, 3) = 0.892
    cal = tmp_path / "c.json"
    cal.write_text(json.dumps({"schema_version": 1, "rules": "0.5.23", "terms": {"decode_graph": {
        "formula": "40 MiB/bs", "params": {"mib_per_bs": 40.0}}}}))  # fmt: skip
    scen = tmp_path / "l40s.toml"
    scen.write_text(L40S)
    assert main(["explain", str(scen), "--calibration", str(cal)]) == 0
    out = capsys.readouterr().out
    assert "| fraction     |     0.918 |          0.892 | -0.026 |" in out
    assert "today's reserve is 1,216 MiB short of what the measured runs need" in out
    assert main(["explain", str(scen), "--calibration", str(cal), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["calibrated"]["calibrated_mib"] == 4992.0 and d["calibrated"]["calibrated_fraction"] == 0.892


def test_bad_calibration_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scen = str(ROOT / "scenarios/llama8b-h200-decode.toml")
    bad = tmp_path / "bad.json"
    for text, msg in (("{", "not JSON"), ('{"terms": {}}', "schema_version: bad value None"),
                      ('{"schema_version": 1, "terms": {"x": {"params": {"a": "b"}}}}', "terms.x: bad value 'x'"),
                      ('{"schema_version": 1, "terms": {"decode_graph": {"params": {"mib_per_bs": "b"}}}}',
                       "terms.decode_graph.params.mib_per_bs: bad value 'b'; allowed: a number ≥ 0")):  # fmt: skip
        bad.write_text(text)
        assert main(["explain", scen, "--calibration", str(bad)]) == 2
        assert msg in capsys.readouterr().err
    assert main(["explain", scen, "--calibration", str(tmp_path / "none.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_patch_from_the_bundled_real_logs(tmp_path: Path, capsys, ingested: Path) -> None:
    """The bundled real logs: the decode graph's held-out-chosen shape (ratio: 17.92 MiB/bs, 71.68 MiB over max_bs 4)
    raises every judged run's reserve; held out by model it avoids no OOM and gives up KV cache on the 10 runs that can
    be judged (4 before issue 24 estimated a GPU capacity from the free memory and added a fixture), so --emit-patch
    refuses and prints the evaluation (issue 18). calibration.json is still written, with the evidence and the
    candidates. Still 10 with another rank's start reading taken where the judged rank printed none (issue 24
    follow-up): the runs it gives a start to measured no need after the KV pool (cut-off logs), so none more is judged.
    """
    res = ingested
    patch, cal = tmp_path / "p.patch", tmp_path / "c.json"
    assert main(["calibrate", str(res), "--out", str(cal), "--emit-patch", str(patch)]) == 2
    said = capsys.readouterr()
    assert "the whole reserve, leave-one-model-out" in said.out and "| unknown   |          10 |" in said.out
    assert "refused: held out, the calibrated fraction gains no KV cache" in said.err
    assert not patch.exists()
    d = json.loads(cal.read_text())
    assert d["rules"] == "0.5.9" and d["terms"]["decode_graph"]["params"] == {"mib_per_bs": 17.92}
    ev = d["terms"]["decode_graph"]["evidence"]["decode_graph"]
    assert [c["shape"] for c in ev["candidates"]] == ["ratio", "fixed + per unit"]
    assert d["held_out_reserve"]["summary"]["new_ooms"] == 0
