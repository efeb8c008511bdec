"""The model against the REAL resolver: 0.5.23 in process, older releases side by side in subprocesses.

Each older release is installed without dependencies into .cache/sglang-releases/<release> (`make test`
does it) and put first on PYTHONPATH; the argv are built for that release's flag spellings. From 0.4.0 to
0.5.11 one representative per rule-set group is checked (the groups and which release stands for each:
README "Release coverage"); a scenario a release cannot express (a flag it lacks, a choice it does not
know, a model config its transformers cannot read) or refuses outright is left out, and the test says how
many were compared.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from packaging.version import Version

from profiler.core.errors import MemfracError
from profiler.engine.launch import server_argv
from profiler.model.heuristic import inputs_from_scenario, reserve, rules_for
from profiler.model.heuristic.grid import A2A_GRAPHS, conformance_grid
from profiler.model.heuristic.rules import version_tuple
from profiler.model.scenario import single_scenario
from tests.conftest import RELEASES_DIR, needs_sglang

#: Releases 0.5.12 … 0.5.22, one per release (0.5.23 runs in process).
MODERN = (
    "0.5.12",
    "0.5.13",
    "0.5.14",
    "0.5.15.post1",
    "0.5.16",
    "0.5.17",
    "0.5.18",
    "0.5.19",
    "0.5.20",
    "0.5.21",
    "0.5.22",
)
#: One release per rule-set group from 0.4.0 to 0.5.11 (rule set → release); keep in step with the Makefile.
REPRESENTATIVES = {
    "0.4.0": "0.4.0",
    "0.4.0.post1": "0.4.1",
    "0.4.4.post4": "0.4.5",
    "0.4.5.post3": "0.4.6",
    "0.4.6.post2": "0.4.6.post4",
    "0.4.6.post5": "0.4.6.post5",
    "0.4.7": "0.4.7",
    "0.4.7.post1": "0.4.8",
    "0.4.9": "0.4.9",
    "0.4.9.post3": "0.4.10",
    "0.5.2": "0.5.2",
    "0.5.3": "0.5.3",
    "0.5.3.post1": "0.5.4",
    "0.5.4.post1": "0.5.5",
    "0.5.5.post1": "0.5.6",
    "0.5.7": "0.5.7",
    "0.5.8": "0.5.8.post1",
    "0.5.9": "0.5.9",
    "0.5.10": "0.5.10",
    "0.5.11": "0.5.11",
}
OLD_RELEASES = (*REPRESENTATIVES.values(), *MODERN)
#: What a release may answer instead of a fraction for a grid scenario it cannot take (sglang's own words).
NOT_EXPRESSIBLE = (
    "invalid choice",  # argparse: e.g. --speculative-algorithm NGRAM before it existed
    "contains custom code",  # transformers cannot read the kimi_k2 config without the release's own registry
)
REFUSED = (
    "DeepEP MoE `auto` mode is not supported with DP Attention",  # 0.4.5 … 0.5.2 server_args assertions
    "Prefill round robin balance is required",  # 0.5.3 … 0.5.7: PD decode node with DP > 1
)
LLAMA = "meta-llama--Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def grid():
    g = conformance_grid()
    assert len(g) >= 400
    return g


@pytest.fixture(scope="module")
def resolver():
    from profiler.engine.oracle import Resolver

    return Resolver(patch=True)


def _mismatches(scenarios, results, rules):
    bad = []
    for s, o in zip(scenarios, results, strict=True):
        m = reserve(inputs_from_scenario(s), rules).mem_fraction_static
        if o.error or o.mem_fraction_static != m:
            bad.append(f"{s.name}: real {o.mem_fraction_static} {o.error or ''} model {m}")
    return bad


@needs_sglang
def test_installed_release_equals_model_on_grid(grid, resolver):
    from profiler.engine.oracle import resolve_scenario

    assert resolver.version == "0.5.23"
    results = [resolve_scenario(s, resolver=resolver) for s in grid]
    assert all(r.patched for r in results), "a CPU machine must patch the device capacity"
    bad = _mismatches(grid, results, rules_for(resolver.version))
    assert not bad, f"{len(bad)}/{len(grid)} differ:\n" + "\n".join(bad[:20])


@needs_sglang
@pytest.mark.parametrize(
    ("gpu", "mode", "keys", "expected"),
    [  # the facts doc's verified outputs of the real 0.5.23 resolver
        ("H200", "null", {}, 0.903), ("H200", "prefill", {}, 0.907), ("H200", "decode", {}, 0.929),
        ("H200", "decode", {"model": "Qwen--Qwen3-30B-A3B", "tp": 2, "moe_a2a_backend": "deepep"}, 0.915),
        ("H200", "null", {"tp": 8, "attn_dp": 8}, 0.765), ("H100-80GB", "null", {}, 0.830),
        ("B200", "null", {}, 0.854), ("RTX-4090", "null", {"chunked_prefill_size": 16384}, -0.055),
    ],
)  # fmt: skip
def test_facts_doc_outputs(resolver, gpu, mode, keys, expected):
    from profiler.engine.oracle import resolve_scenario

    keys = dict(keys)
    model = keys.pop("model", LLAMA)
    s = single_scenario(model, gpu, mode=mode, **keys)
    assert resolve_scenario(s, resolver=resolver).mem_fraction_static == expected
    assert reserve(inputs_from_scenario(s)).mem_fraction_static == expected


@needs_sglang
def test_bad_argument_comes_back_as_sglangs_message(resolver):
    o = resolver.resolve(["--model-path", "x", "--disaggregation-mode", "both"], 81559)
    assert o.mem_fraction_static is None and "invalid choice: 'both'" in o.error


def _jobs(grid, release):
    """The grid as this release can express it; before 0.5.12 PD decode is left out (not read by those rules)."""
    from profiler.engine.oracle import GPU_CAPABILITY

    old = Version(release) < Version("0.5.12")
    out = []
    for s in grid:
        if old and s.mode == "decode":  # ≤ 0.5.11 read no PD role; prefill covers the PD resolution paths
            continue
        try:
            out.append((s, {"argv": server_argv(s, release), "gpu_mem_mib": s.gpu.total_mib, "env": s.env_dict,
                            "capability": list(GPU_CAPABILITY[s.gpu.name])}))  # fmt: skip
        except MemfracError:
            continue  # a flag this release does not have (launch.FLAG_SINCE)
    return out


def _a2a_grid_for(release):
    """The all-to-all grid from 0.5.12 on (older releases spell DeepEP --enable-deepep-moe), on two GPUs."""
    from profiler.model.heuristic.grid import a2a_grid

    return a2a_grid(gpus=("L40S", "H200")) if version_tuple(release) >= (0, 5, 12) else []


@pytest.fixture(scope="module")
def old_results(grid, request):
    """Every selected, installed older release resolved on its grid and its all-to-all grid, in one subprocess
    per release (its import dominates the cost), two at a time (one per core)."""
    from profiler.engine.oracle import resolve_batch_subprocess

    tests = ("test_older_release_equals_its_rule_set", "test_older_release_a2a_backends_equal_its_rule_set")
    selected = {
        item.callspec.params["release"] for item in request.session.items if getattr(item, "originalname", "") in tests
    }
    installed = [r for r in OLD_RELEASES if r in selected and (RELEASES_DIR / r / ".installed").exists()]

    def run(release):
        jobs = _jobs(grid, release)
        a2a = _jobs(_a2a_grid_for(release), release)
        try:
            res = resolve_batch_subprocess([j for _, j in (*jobs, *a2a)], [str(RELEASES_DIR / release)])
        except MemfracError as e:  # reported by that release's tests alone
            return release, ([], e), ([], e)
        return release, ([s for s, _ in jobs], res[: len(jobs)]), ([s for s, _ in a2a], res[len(jobs) :])

    with ThreadPoolExecutor(max_workers=2) as pool:
        return {rel: (main, a2a) for rel, main, a2a in pool.map(run, installed)}


@pytest.mark.oldreleases
@needs_sglang
@pytest.mark.parametrize("release", OLD_RELEASES)
def test_older_release_equals_its_rule_set(old_results, release):
    if release not in old_results:
        pytest.skip(f"sglang {release} not installed side by side: run `make old-releases`")
    scenarios, results = old_results[release][0]
    if isinstance(results, MemfracError):
        raise results
    assert {r.sglang_version for r in results} == {release}
    old = Version(release) < Version("0.5.12")
    if not old:
        assert len(scenarios) >= 600, "0.5.12+ must take the whole grid"
    rules = rules_for(release)
    bad, compared, left_out = [], 0, {}
    allowed = (*NOT_EXPRESSIBLE, *REFUSED) if old else ()
    for s, o in zip(scenarios, results, strict=True):
        why = next((w for w in allowed if o.error and w in o.error), None)
        if why:
            left_out[why] = left_out.get(why, 0) + 1
            continue
        compared += 1
        m = reserve(inputs_from_scenario(s), rules).mem_fraction_static
        if o.error or o.mem_fraction_static != m:
            bad.append(f"{s.name}: real {o.mem_fraction_static} {o.error or ''} model {m}")
    assert not bad, f"{len(bad)}/{compared} differ ({rules.name} rules):\n" + "\n".join(bad[:20])
    assert compared >= 100, f"only {compared} scenarios compared; left out: {left_out}"


def test_representatives_cover_every_group_before_0_5_12():
    from profiler.model.heuristic.releases import RELEASES

    old = [n for n in dict.fromkeys(r.rules for r in RELEASES) if Version(n) < Version("0.5.12")]
    assert list(REPRESENTATIVES) == old
    assert all(rules_for(rel).name == group for group, rel in REPRESENTATIVES.items())


@pytest.mark.oldreleases
@needs_sglang
def test_pr_29615_headline_with_the_real_releases():
    """H100, Llama-3.1-8B decode node: 0.835 (0.5.14) → 0.874 (0.5.15.post1), as the PR says."""
    from profiler.engine.oracle import resolve_batch_subprocess

    s = single_scenario(LLAMA, "H100-80GB", mode="decode")
    got = {}
    for rel in ("0.5.14", "0.5.15.post1"):
        d = RELEASES_DIR / rel
        if not (d / ".installed").exists():
            pytest.skip(f"sglang {rel} not installed side by side: run `make old-releases`")
        (r,) = resolve_batch_subprocess([{"argv": server_argv(s, rel), "gpu_mem_mib": s.gpu.total_mib}], [str(d)])
        got[rel] = r.mem_fraction_static
    assert got == {"0.5.14": 0.835, "0.5.15.post1": 0.874}


# ---------------------------------------------------------------- every all-to-all backend (profiler.model.a2a)
@pytest.fixture(scope="module")
def a2a():
    from profiler.model.heuristic.grid import a2a_grid

    return a2a_grid()


def _a2a_outcomes(scenarios, results, rules):
    """(mismatches, accepted (backend, role, graph) cells, refusals by backend)."""
    bad, cells, refused = [], set(), {}
    for s, o in zip(scenarios, results, strict=True):
        graph = next(g for g, _ in A2A_GRAPHS if f"-{g}-" in s.name)
        if o.error:
            refused.setdefault(s.moe_a2a_backend, []).append(o.error)
            continue
        cells.add((s.moe_a2a_backend, s.mode, graph))
        m = reserve(inputs_from_scenario(s), rules).mem_fraction_static
        if o.mem_fraction_static != m:
            bad.append(f"{s.name}: real {o.mem_fraction_static} model {m}")
    return bad, cells, refused


@needs_sglang
def test_every_a2a_backend_role_and_graph_setting_equals_the_real_resolver(a2a, resolver):
    from profiler.engine.oracle import resolve_scenario
    from profiler.model.a2a import A2A_BACKENDS

    results = [resolve_scenario(s, resolver=resolver) for s in a2a]
    bad, cells, refused = _a2a_outcomes(a2a, results, rules_for(resolver.version))
    assert not bad, f"{len(bad)} differ:\n" + "\n".join(bad[:20])
    assert len(a2a) - sum(map(len, refused.values())) >= 900
    for b in A2A_BACKENDS:
        if b == "flashinfer_megamoe":
            continue
        for mode in ("null", "prefill", "decode"):
            for g, _ in A2A_GRAPHS:
                assert (b, mode, g) in cells, f"no configuration of {b} / {mode} / {g} was accepted by sglang"
    # sglang refuses flashinfer_megamoe for every bundled model (no MXFP8/NVFP4 experts): its own message
    fm = refused["flashinfer_megamoe"]
    assert len(fm) == sum(s.moe_a2a_backend == "flashinfer_megamoe" for s in a2a)
    assert all("FlashInfer MegaMOE currently supports only" in e for e in fm)
    # megamoe needs SM90/SM100: refused on the L40S (sm89) only, through the platform facts the oracle sets
    mm = [s for s, o in zip(a2a, results, strict=True) if s.moe_a2a_backend == "megamoe" and o.error]
    assert {s.gpu.name for s in mm} == {"L40S"}


@pytest.mark.oldreleases
@needs_sglang
@pytest.mark.parametrize("release", OLD_RELEASES)
def test_older_release_a2a_backends_equal_its_rule_set(old_results, release):
    """Each release's parser says which backends it knows ('invalid choice' for the others); every
    configuration it accepts must equal its rule set."""
    if version_tuple(release) < (0, 5, 12):
        pytest.skip("all-to-all backends are checked from 0.5.12 on")
    if release not in old_results:
        pytest.skip(f"sglang {release} not installed side by side: run `make old-releases`")
    scenarios, results = old_results[release][1]
    if isinstance(results, MemfracError):
        raise results
    bad, cells, _ = _a2a_outcomes(scenarios, results, rules_for(release))
    assert not bad, f"{len(bad)} differ:\n" + "\n".join(bad[:20])
    assert {b for b, _, _ in cells} >= {"none", "deepep", "mooncake", "nixl", "ascend_fuseep"}
