"""`memfrac upstream-tests`: the sglang unit tests that pin `mem_fraction_static` per disaggregation mode.

PR #29615 (sglang 0.5.15) changed the reserve of every prefill-only and decode-only node and shipped without a
test. This writes one pytest module in sglang's unit-test style for a maintainer to carry upstream: each case
builds `ServerArgs` from sglang's own parser on the CPU (the GPU capacity patched where that release looks it
up, the default prefill graph backend pinned to breakable as on CUDA — the patches `engine/oracle.py` applies)
and asserts the resolved `mem_fraction_static`. Every expected value is computed term by term by memfrac (the
comment above each case shows the arithmetic) AND confirmed by the real resolver of that release at generation
(one subprocess per release); a case the two disagree on, or that sglang refuses, is not written, and the
command says so. With a calibration the expected values are the calibrated reserve's (`reserve.py`, the one
every reader uses), so the module and `calibrate --emit-patch`'s patch travel together.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profiler.core.errors import MemfracError
from profiler.model.heuristic import Reservation, inputs_from_scenario, reserve, rules_for
from profiler.model.heuristic.constants import FLOOR_GPU_MIB, FLOOR_MIB, POST_FLOOR_TERMS, PRE_FLOOR_TERMS
from profiler.model.heuristic.grid import DSV3, LLAMA8
from profiler.model.heuristic.rules import version_tuple
from profiler.model.scenario import Scenario, single_scenario

#: The GPU classes on both sides of sglang's 35 GiB and 60 GiB thresholds: (memfrac GPU, id slug).
GPUS = (("RTX-4090", "rtx_4090"), ("L40S", "l40s"), ("H100-80GB", "h100_80gb"), ("H200", "h200"), ("B200", "b200"))
MODES = ("null", "prefill", "decode")
#: id slug → (bundled model directory, what the comment calls it).
MODELS = {"llama3_8b": (LLAMA8, "Llama-3.1-8B (dense)"), "dsv3": (DSV3, "DeepSeek-V3 (MLA)")}
_DEEPEP = {"tp": 8, "ep": 8, "moe_a2a_backend": "deepep"}
_NO_DECODE_GRAPH = {"decode_graph": {"backend": "disabled"}}
#: (label, model slug, scenario keys): what PR #29615 and its neighbours decide, one knob at a time.
VARIANTS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("tp1", "llama3_8b", {}),
    ("tp1-mrr24", "llama3_8b", {"max_running_requests": 24}),
    ("tp1-mrr4096", "llama3_8b", {"max_running_requests": 4096}),
    ("tp1-no_decode_graph", "llama3_8b", _NO_DECODE_GRAPH),
    ("tp1-no_cuda_graph", "llama3_8b", {"disable_cuda_graph": True}),
    ("tp1-ngram8", "llama3_8b", {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8}),
    ("tp1-ngram8-mrr1024", "llama3_8b",
     {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8, "max_running_requests": 1024}),
    ("tp2-attndp2", "llama3_8b", {"tp": 2, "attn_dp": 2}),
    ("tp8", "dsv3", {"tp": 8}),
    ("tp8-mrr128", "dsv3", {"tp": 8, "max_running_requests": 128}),
    ("tp8-attndp8", "dsv3", {"tp": 8, "attn_dp": 8}),
    ("tp8-deepep", "dsv3", _DEEPEP),
    ("tp8-deepep-no_decode_graph", "dsv3", {**_DEEPEP, **_NO_DECODE_GRAPH}),
    ("tp8-attndp8-deepep", "dsv3", {**_DEEPEP, "attn_dp": 8}),
    ("tp8-nextn4", "dsv3", {"tp": 8, "speculative_algorithm": "NEXTN", "speculative_num_draft_tokens": 4,
                            "speculative_num_steps": 3, "speculative_eagle_topk": 1}),
)  # fmt: skip
#: What a PR carries (32 cases): every role on every GPU class for the dense default, then each knob where it
#: shows (no floor below 60 GiB, so the small GPUs show the activation and graph terms one by one).
SMALL = (
    *(f"{m}-{g}-llama3_8b-tp1" for _, g in GPUS for m in MODES),
    "decode-rtx_4090-llama3_8b-tp1-mrr24", "decode-l40s-llama3_8b-tp1-mrr4096",
    "null-l40s-llama3_8b-tp1-no_decode_graph", "decode-l40s-llama3_8b-tp1-no_decode_graph",
    "decode-h200-llama3_8b-tp1-ngram8", "decode-l40s-llama3_8b-tp1-ngram8-mrr1024",
    "null-l40s-dsv3-tp8", "prefill-l40s-dsv3-tp8", "decode-l40s-dsv3-tp8",
    "null-h200-dsv3-tp8-attndp8", "decode-h200-dsv3-tp8-attndp8",
    "null-h200-dsv3-tp8-deepep", "prefill-h200-dsv3-tp8-deepep", "decode-h200-dsv3-tp8-deepep",
    "null-h200-dsv3-tp8-deepep-no_decode_graph", "decode-h200-dsv3-tp8-deepep-no_decode_graph",
    "decode-h200-dsv3-tp8-nextn4",
)  # fmt: skip
GRIDS = ("small", "full")


@dataclass(frozen=True, slots=True)
class Case:
    """One pytest.param of the module: its id, the scenario, memfrac's reservation and the value asserted."""

    id: str
    model: str  # MODELS slug
    gpu: str  # GPUS slug
    scenario: Scenario
    argv: tuple[str, ...]  # sglang's flags for it in this release, after --model-path
    reservation: Reservation
    expected: float  # what the module asserts (the calibrated fraction with a calibration)
    calibrated: Any = None  # reserve.CalibratedReserve with a calibration


@dataclass(frozen=True, slots=True)
class Module:
    """A generated module and what went into it."""

    text: str
    release: str
    grid: str
    cases: tuple[Case, ...]
    left_out: tuple[tuple[str, str], ...]  # (case id, why)
    patches: tuple[str, ...]  # what the module patches, as the oracle reported it for this release
    not_carried: tuple[tuple[str, str], ...] = ()  # (term, why) of a calibration's terms the patch leaves as today


def grid(name: str) -> list[tuple[str, str, str, Scenario]]:
    """(id, model slug, GPU slug, scenario) of every case of grid `name` ("small" or "full")."""
    if name not in GRIDS:
        raise MemfracError(f"--grid {name}: choose small (~30 cases, what a PR carries) or full (every combination)")
    out = []
    for gpu, gslug in GPUS:
        for mode in MODES:
            for label, model, keys in VARIANTS:
                cid = f"{mode}-{gslug}-{model}-{label}"
                if name == "small" and cid not in SMALL:
                    continue
                out.append((cid, model, gslug, single_scenario(MODELS[model][0], gpu, name=cid, mode=mode, **keys)))
    if name == "small":  # SMALL in its own order: the reading order of the module
        out.sort(key=lambda c: SMALL.index(c[0]))
    return out


def model_config(slug: str) -> dict[str, Any]:
    """The config.json the module writes for a model (memfrac's bundled copy of the real one)."""
    from profiler.model.scenario import BUNDLED_MODELS

    return json.loads((BUNDLED_MODELS / MODELS[slug][0] / "config.json").read_text())


# ------------------------------------------------------------------------------------------------ arithmetic
def _g(x: float) -> str:
    return f"{x:,.6g}" if abs(x) >= 1e6 else f"{x:g}"


#: Resolution steps that switch a term off or reshape it before the sum (the others are in the terms' words).
_STEPS_SHOWN = ("pd_hook", "graph_compat", "role_gating", "deepep_bucket_alignment")


def arithmetic(r: Reservation) -> list[str]:
    """sglang's sum for one case in words: each term in MiB, the floor, what is added after it, the rounding.

    Raises when the words do not add up to the model's own reserve and fraction (they are the same numbers)."""
    if r.rule_set.formula != "terms":
        raise MemfracError(f"sglang {r.rules}: the fraction is not a sum of terms before 0.5.3rc2; no tests for it")
    gpu = r.inputs.gpu_mem_mib
    assert gpu is not None
    on = [t for t in r.terms if t.on]
    if any(t.name == "vlm_scaling" for t in on):
        raise MemfracError("multimodal models are not in the upstream-tests grid (the VLM scaling multiplies)")
    pre = [t for t in on if t.name in PRE_FLOOR_TERMS]
    post = [t for t in on if t.name in POST_FLOOR_TERMS]
    lines = [f"({st.detail})" for st in r.steps if st.name in _STEPS_SHOWN]
    lines += [f"{'  ' if i == 0 else '+ '}{t.name:<18}{_g(t.mib):>7} MiB  {t.reason}" for i, t in enumerate(pre)]
    pre_sum = sum(t.mib for t in pre)
    lines.append(f"= {'':<18}{_g(pre_sum):>7} MiB")
    total = pre_sum
    if gpu > FLOOR_GPU_MIB:
        total = max(pre_sum, FLOOR_MIB)
        lines.append(f"floor ({gpu} MiB > 60 GiB): max({_g(pre_sum)}, {_g(FLOOR_MIB)}) = {_g(total)} MiB")
    else:
        lines.append(f"no floor ({gpu} MiB ≤ 60 GiB)")
    for t in post:
        total += t.mib
        lines += [f"+ {t.name:<18}{_g(t.mib):>7} MiB  {t.reason}", f"= {'':<18}{_g(total):>7} MiB"]
    exact = (gpu - total) / gpu
    frac = round(exact, 3)
    lines.append(f"round(({gpu} - {_g(total)}) / {gpu}, 3) = round({exact:.5f}, 3) = {frac}")
    if abs(total - r.reserved_mib) > 1e-6 or frac != r.mem_fraction_static:
        raise MemfracError(
            f"internal: the arithmetic ({_g(total)} MiB → {frac}) is not the model's "
            f"({_g(r.reserved_mib)} MiB → {r.mem_fraction_static})"
        )  # fmt: skip
    return lines


def calibrated_arithmetic(c: Case) -> list[str]:
    """The calibrated terms that differ from today's, and the calibrated sum and fraction."""
    cr = c.calibrated
    gpu = c.scenario.gpu.total_mib
    lines = [f"{t.name} {_g(t.today_mib)} → {_g(t.calibrated_mib)} MiB ({t.how})" for t in cr.terms
             if t.how != "unchanged" and t.today_mib != t.calibrated_mib]  # fmt: skip
    lines.append(
        f"= {_g(cr.calibrated_mib)} MiB; round(({gpu} - {_g(cr.calibrated_mib)}) / {gpu}, 3) = {cr.calibrated_fraction}"
    )
    return lines + [f"note: {n}" for n in cr.notes]


# ------------------------------------------------------------------------------------------------ generation
def carried(cal: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The calibration as `calibrate --emit-patch` carries it: a term whose evidence says the patch leaves it
    (`"patch": false`, e.g. too few runs, or held-out runs it would under-reserve) keeps today's constant, so the
    module expects what sglang computes with the patch applied. A term without evidence (a hand-written file)
    is taken as given. Returns (the calibration to apply, [(term, why it stays as today)])."""
    terms, out = {}, []
    for term, entry in cal["terms"].items():
        ev = entry.get("evidence") or {}
        refused = [(f"{fit}: " if fit != term else "") + str(e.get("patch_note", "not carried"))
                   for fit, e in ev.items() if e.get("patch") is False]  # fmt: skip
        if refused:
            out.append((term, "; ".join(refused)))
        else:
            terms[term] = entry
    return {**cal, "terms": terms}, out


def _release_path(release: str) -> list[str]:
    """PYTHONPATH for the release's resolver: [] for the installed sglang, its side-by-side directory otherwise."""
    from profiler.engine.validation import installed_version, releases_dir, side_by_side

    installed = installed_version()
    if installed is None:
        raise MemfracError("upstream-tests confirms every case with sglang's resolver: pip install 'memfrac[sglang]'")
    if release == installed:
        return []
    d = side_by_side(release)
    if d is None or d.name != release:
        raise MemfracError(
            f"--rules {release}: sglang {release} is neither the installed sglang ({installed}) nor installed side by "
            f"side in {releases_dir()} (make old-releases; MEMFRAC_SGLANG_RELEASES names another directory of them)"
        )  # fmt: skip
    return [str(d)]


def _argv_tail(argv: list[str]) -> list[str]:
    assert argv[:1] == ["--model-path"]
    return argv[2:]


def confirm(
    cases: list[Case], results: list[Any], release: str
) -> tuple[list[Case], list[tuple[str, str]], tuple[str, ...]]:
    """(cases the real resolver confirms, (id, why) of the others, the patches the resolver applied)."""
    kept, left = [], []
    patches: set[str] = set()
    for c, o in zip(cases, results, strict=True):
        model = c.reservation.mem_fraction_static
        if o.error:
            left.append((c.id, f"sglang {release} refuses it: {o.error}"))
        elif o.mem_fraction_static != model:
            left.append((c.id, f"sglang {release} resolves {o.mem_fraction_static}, memfrac {model}"))
        else:
            kept.append(c)
            patches.update(o.patched)
    return kept, left, tuple(sorted(patches))


def build_cases(release: str, grid_name: str, cal: dict[str, Any] | None = None) -> tuple[list[Case], list[tuple]]:
    """memfrac's side of every case (no sglang): the reservation under `release`'s rules and the value asserted."""
    from profiler.engine.launch import server_argv

    rules = rules_for(release)
    cases, left = [], []
    for cid, model, gslug, s in grid(grid_name):
        try:
            argv = _argv_tail(server_argv(s, release))
        except MemfracError as e:
            left.append((cid, f"sglang {release} cannot express it: {e}"))
            continue
        r = reserve(inputs_from_scenario(s), rules)
        cr = None
        expected = r.mem_fraction_static
        if cal is not None:
            from profiler.calibrate.reserve import calibrated_reserve

            cr = calibrated_reserve(s, r, cal)
            expected = cr.calibrated_fraction
        cases.append(Case(cid, model, gslug, s, tuple(argv), r, expected, cr))
    return cases, left


def generate(
    release: str,
    grid_name: str = "small",
    calibration: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Module:
    """Build every case with memfrac, confirm them all with the release's real resolver (one subprocess), render."""
    from profiler.engine.oracle import resolve_batch_subprocess

    cal, kept_out = None, []
    if calibration is not None:
        from profiler.calibrate.codec import load_calibration

        cal, kept_out = carried(load_calibration(calibration))
    path = _release_path(release)
    cases, left = build_cases(release, grid_name, cal)
    with tempfile.TemporaryDirectory(prefix="memfrac-upstream-") as tmp:
        dirs = {}
        for slug, (name, _) in MODELS.items():  # the very files the module writes, at the same base names
            d = Path(tmp) / name
            d.mkdir()
            (d / "config.json").write_text(json.dumps(model_config(slug)))
            dirs[slug] = str(d)
        jobs = [{"argv": ["--model-path", dirs[c.model], *c.argv],
                 "gpu_mem_mib": c.scenario.gpu.total_mib, "env": c.scenario.env_dict} for c in cases]  # fmt: skip
        results = resolve_batch_subprocess(jobs, path, progress=progress) if jobs else []
    if any(o.sglang_version != release for o in results):
        got = sorted({o.sglang_version for o in results})
        raise MemfracError(f"--rules {release}: the resolver subprocess ran sglang {', '.join(got)}, not {release}")
    kept, refused, patches = confirm(cases, results, release)
    left = [*left, *refused]
    if not kept:
        raise MemfracError(f"no case of the {grid_name} grid was confirmed by sglang {release}: " + "; ".join(
            f"{i}: {w}" for i, w in left[:3]))  # fmt: skip
    text = render(kept, left, release, grid_name, patches, calibration, _has_register_cpu_ci(path), kept_out)
    return Module(text, release, grid_name, tuple(kept), tuple(left), patches, tuple(kept_out))


def _has_register_cpu_ci(path: list[str]) -> bool:
    """Whether this release ships `sglang.test.ci.ci_register.register_cpu_ci` (sglang's CPU-suite marker)."""
    import importlib.util

    if path:
        return (Path(path[0]) / "sglang" / "test" / "ci" / "ci_register.py").is_file()
    spec = importlib.util.find_spec("sglang")
    locs = list(spec.submodule_search_locations or []) if spec else []
    return bool(locs) and (Path(locs[0]) / "test" / "ci" / "ci_register.py").is_file()


# ------------------------------------------------------------------------------------------------ rendering
_LICENSE = """\
# Copyright 2023-2026 SGLang Team
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ==============================================================================
"""

_HELPERS = '''

def _patch_where_present(stack, target, **kwargs):
    """Patch `target` if this sglang has it (the module also runs against the release before, which lacks
    some of these lookups: there the resolver reads no such function)."""
    module_name, attr = target.rsplit(".", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return
    if hasattr(module, attr):
        stack.enter_context(patch.object(module, attr, **kwargs))


def _resolved_mem_fraction_static(argv, gpu_mem_mb):
    """Parse `argv` with sglang's own parser, resolve `ServerArgs` as on a CUDA node of `gpu_mem_mb`
    MiB, and return the `mem_fraction_static` the heuristic chose."""
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    args.device = "cuda"
    with contextlib.ExitStack() as stack:
        for target in GPU_CAPACITY_LOOKUPS:
            _patch_where_present(stack, target, return_value=gpu_mem_mb)
        # Off CUDA, sglang picks another default prefill graph backend; pin the CUDA one.
        _patch_where_present(
            stack,
            "sglang.srt.model_executor.cuda_graph_config.default_prefill_backend",
            side_effect=_breakable_prefill_backend,
        )
        server_args = ServerArgs.from_cli_args(args)
        if hasattr(server_args, "resolve_once"):
            server_args.resolve_once()
{read}


def _breakable_prefill_backend(*args, **kwargs):
    from sglang.srt.model_executor.cuda_graph_config import Backend

    return Backend.BREAKABLE


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    dirs = {{}}
    for name, config in MODEL_CONFIGS.items():
        path = root / MODEL_DIR_NAMES[name]
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config))
        dirs[name] = str(path)
    return dirs
'''

_CAPACITY_READERS = ("get_device_memory_capacity", "get_nvgpu_memory_capacity")
_CAPACITY_ORIGINS = ("sglang.srt.utils", "sglang.srt.utils.common")
_READ_NEW = """    # Resolution writes its results beside the fields, not into them.
    return resolution_result(server_args, "mem_fraction_static")"""
_READ_OLD = """    return server_args.mem_fraction_static"""


def _has_resolution_result(release: str) -> bool:
    """`arg_groups.overrides.resolution_result` holds resolved values from 0.5.20 (≤ 0.5.19 writes the fields)."""
    return version_tuple(release) >= (0, 5, 20)


def _docstring(
    cases: list[Case],
    left: list[tuple[str, str]],
    release: str,
    grid_name: str,
    calibration: str | None,
    not_carried: list[tuple[str, str]] | tuple[tuple[str, str], ...] = (),
) -> str:
    modes = {m: sum(c.scenario.mode == m for c in cases) for m in MODES}
    cmd = f"memfrac upstream-tests --out FILE --rules {release} --grid {grid_name}" + (
        f" --calibration {Path(calibration).name}" if calibration else ""
    )
    out = [
        '"""`mem_fraction_static` per disaggregation mode, pinned on the resolver of sglang ' + release + ".",
        "",
        "PR #29615 (0.5.15) sized the reserve of prefill-only and decode-only nodes by their role (decode",
        "activation from running requests x draft tokens, the graph and DP-attention terms gated by role, +2 GiB",
        "for DeepEP after the floor) and came without a test. Each case below builds `ServerArgs` from sglang's",
        "own parser, resolves it as on a CUDA node of the given capacity, and asserts the resolved fraction; the",
        "comment above it is the heuristic's arithmetic (every term in MiB, the 10 GiB floor above 60 GiB, the",
        "rounding), so a change to the heuristic shows here as the cases it moves.",
        "",
        f"Release: sglang {release}. Grid: {grid_name} ({len(cases)} cases: {modes['null']} unified, "
        f"{modes['prefill']} prefill, {modes['decode']} decode)",
        "over GPUs of 24 / 48 / 80 / 141 / 180 GB (both sides of the 35 GiB and 60 GiB thresholds), a dense and",
        "an MLA model, DP attention, DeepEP with and without a decode graph, speculative draft tokens,",
        "max_running_requests and graphs disabled.",
    ]
    if calibration is None:
        out.append("Calibration: none; the expected values are today's constants.")
    else:
        changed = [c for c in cases if c.expected != c.reservation.mem_fraction_static]
        out += [
            f"Calibration: {Path(calibration).name} (`memfrac calibrate --out`): the expected values are the ones",
            "the calibrated constants give, i.e. sglang with `memfrac calibrate --emit-patch`'s memory_hook.py patch",
            f"applied. The patch changes {len(changed)} of the {len(cases)} cases" + (":" if changed else "."),
        ]
        out += [f"    {c.id}: {c.reservation.mem_fraction_static} -> {c.expected} "
                f"({c.expected - c.reservation.mem_fraction_static:+.3f})" for c in changed]  # fmt: skip
        if not_carried:
            out.append("Terms the patch leaves as they are (so do these tests):")
            out += [f"    {t}: {why}" for t, why in not_carried]
    out += [
        "",
        "Every expected value was computed term by term by memfrac and confirmed by sglang " + release + "'s own",
        "resolver when this file was generated"
        + (" (with a calibration: today's value; the calibrated one is the patch's)." if calibration else "."),
    ]
    if left:
        out.append(f"Left out ({len(left)}): memfrac and that resolver disagree, or sglang refuses the configuration:")
        out += [f"    {i}: {w}" for i, w in left]
    out += [
        "CPU only: the GPU capacity is patched where this release looks it up (GPU_CAPACITY_LOOKUPS) and the",
        "default prefill graph backend pinned to breakable, as on CUDA; whether a model is MLA comes from its",
        "config.json (written to a temporary directory), read by sglang itself.",
        "",
        f"Generated by `{cmd}`;",
        "regenerate rather than edit.",
        "",
        "    python -m pytest test/registered/unit/server_args/test_mem_fraction_static_by_disaggregation_mode.py -v",
        '"""',
    ]
    return "\n".join(out)


def _py(v: Any, indent: int = 0) -> str:
    """A Python literal the way black writes it: double quotes, one item a line when it does not fit."""
    pad = " " * indent
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, bool) or v is None or isinstance(v, int | float):
        return repr(v)
    if isinstance(v, dict):
        items = [f"{json.dumps(k)}: {_py(x, indent + 4)}" for k, x in v.items()]
        open_, close = "{", "}"
    elif isinstance(v, list | tuple):
        items = [_py(x, indent + 4) for x in v]
        open_, close = ("[", "]") if isinstance(v, list) else ("(", ")")
    else:
        raise TypeError(type(v))
    flat = open_ + ", ".join(items) + ("," if isinstance(v, tuple) and len(items) == 1 else "") + close
    if len(flat) + indent <= 80 and "\n" not in flat:
        return flat
    return open_ + "\n" + "".join(f"{pad}    {x},\n" for x in items) + pad + close


def _literal(name: str, value: Any) -> str:
    return f"{name} = {_py(value)}\n"


def render(
    cases: list[Case],
    left: list[tuple[str, str]],
    release: str,
    grid_name: str,
    patches: tuple[str, ...],
    calibration: str | None = None,
    register_cpu_ci: bool = False,
    not_carried: list[tuple[str, str]] | tuple[tuple[str, str], ...] = (),
) -> str:
    """The pytest module's text (sglang's style: license header, docstring, helpers, one parametrized test)."""
    readers = [p for p in patches if p.rsplit(".", 1)[-1] in _CAPACITY_READERS]
    # the resolver's lookups of the capacity, not its definition (sglang.srt.utils.common, re-exported by utils)
    capacity = tuple(p for p in readers if p.rsplit(".", 1)[0] not in _CAPACITY_ORIGINS)
    unknown = [p for p in patches if p not in readers and not p.endswith(".default_prefill_backend")]
    if unknown:
        raise MemfracError(f"internal: the resolver patched {unknown[0]}, which the generated module does not")
    new_read = _has_resolution_result(release)
    parts = [_LICENSE + _docstring(cases, left, release, grid_name, calibration, not_carried), ""]
    parts.append("import argparse\nimport contextlib\nimport importlib\nimport json\n"
                 "from unittest.mock import patch\n\nimport pytest\n")  # fmt: skip
    if new_read:
        parts.append("from sglang.srt.arg_groups.overrides import resolution_result")
    parts.append("from sglang.srt.server_args import ServerArgs")
    if register_cpu_ci:
        parts.append("from sglang.test.ci.ci_register import register_cpu_ci\n")
        parts.append(f'register_cpu_ci(est_time={30 + len(cases) // 4}, suite="base-a-test-cpu")')
    parts.append("")
    gpus = {slug: single_scenario(LLAMA8, gpu).gpu for gpu, slug in GPUS if any(c.gpu == slug for c in cases)}
    parts.append("# nvidia-smi memory.total (MiB): what get_device_memory_capacity() returns on each GPU.")
    parts.append(_literal("GPU_MEM_MB", {slug: g.total_mib for slug, g in gpus.items()}))
    parts.append(f"# Where sglang {release} looks the GPU capacity up (patch the name there, not its origin).")
    parts.append(_literal("GPU_CAPACITY_LOOKUPS", capacity))
    used = [m for m in MODELS if any(c.model == m for c in cases)]
    parts.append("# The models' config.json (sglang reads the architecture, and from it MLA, from here).")
    parts.append(_literal("MODEL_DIR_NAMES", {m: MODELS[m][0] for m in used}))
    parts.append(_literal("MODEL_CONFIGS", {m: model_config(m) for m in used}))
    parts.append(_HELPERS.format(read=_READ_NEW if new_read else _READ_OLD).rstrip("\n") + "\n")
    parts.append("")
    parts.append("CASES = [")
    for c in cases:
        parts.append(_case_text(c))
    parts.append("]\n")
    parts.append("""
@pytest.mark.parametrize(("gpu", "model", "argv", "expected"), CASES)
def test_mem_fraction_static(model_dirs, gpu, model, argv, expected):
    argv = ["--model-path", model_dirs[model], *argv]
    assert _resolved_mem_fraction_static(argv, GPU_MEM_MB[gpu]) == expected
""")
    return "\n".join(parts)


def _case_text(c: Case) -> str:
    s = c.scenario
    head = (f"{s.mode} node" if s.mode != "null" else "unified node") + f", {MODELS[c.model][1]}, " + \
        f"{s.gpu.name} ({s.gpu.total_mib} MiB)"  # fmt: skip
    lines = [head, *arithmetic(c.reservation)]
    if c.calibrated is not None:
        lines += ["calibrated:", *(f"  {x}" for x in calibrated_arithmetic(c))]
    body = [f"    # {x}" for x in lines]
    body += [
        "    pytest.param(",
        f"        {json.dumps(c.gpu)},",
        f"        {json.dumps(c.model)},",
        f"        {_py(list(c.argv), 8)},",
        f"        {c.expected!r},",
        f"        id={json.dumps(c.id)},",
        "    ),",
    ]
    return "\n".join(body)


# ------------------------------------------------------------------------------------------------ the command
def run_upstream_tests(out: str, release: str | None, calibration: str | None, grid_name: str) -> int:
    """`memfrac upstream-tests`: generate, say what was left out and why, write the module."""
    from profiler.core.ui import progress as bar
    from profiler.engine.validation import installed_version

    rel = release or installed_version()
    if rel is None:
        raise MemfracError("upstream-tests confirms every case with sglang's resolver: pip install 'memfrac[sglang]'")
    if rules_for(rel).formula != "terms":  # an unknown release is refused before anything is imported
        raise MemfracError(f"--rules {rel}: before 0.5.3rc2 sglang's fraction is not a sum of terms; upstream-tests "
                           "pins the term-by-term heuristic (0.5.3rc2 on)")  # fmt: skip
    target = Path(out)
    if not target.parent.is_dir():
        raise MemfracError(f"--out {out}: directory {target.parent} does not exist")
    _release_path(rel)  # refused before anything starts: a release there is no resolver for, a bad calibration
    if calibration is not None:
        from profiler.calibrate.codec import load_calibration

        load_calibration(calibration)
    n = len(grid(grid_name))
    print(f"upstream-tests: {n} cases of the {grid_name} grid, confirming each with sglang {rel}'s resolver "
          "(one subprocess; importing sglang takes a while)", file=sys.stderr)  # fmt: skip
    with contextlib.ExitStack() as stack:
        live: list[Any] = []

        def report(done: int, total: int) -> None:  # the bar starts with the first case, after sglang's import
            if not live:
                live.append(stack.enter_context(bar(total=total, what=f"sglang {rel} resolver", unit="cases")))
            live[0].update(done)

        m = generate(rel, grid_name, calibration, progress=report)
    for cid, why in m.left_out:
        print(f"upstream-tests: left out {cid}: {why}", file=sys.stderr)
    for term, why in m.not_carried:
        print(f"upstream-tests: calibration term {term} is not carried by --emit-patch ({why}): today's constant "
              "expected", file=sys.stderr)  # fmt: skip
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(m.text)
    tmp.replace(target)
    changed = [c for c in m.cases if c.expected != c.reservation.mem_fraction_static]
    cal = f"; the calibration changes {len(changed)}" if calibration else ""
    print(f"wrote {target}: {len(m.cases)} cases confirmed by sglang {rel} ({len(m.left_out)} left out{cal})")
    return 0
