"""The memory_hook.py patch a sglang maintainer carries upstream from a calibration.

`memfrac calibrate R --emit-patch FILE` writes a unified diff (difflib) against the installed sglang's
`sglang/srt/arg_groups/memory_hook.py` (paths `a/sglang/...`, apply with `patch -p1` in site-packages, or
`-p1 --directory=python` in a sglang checkout), replacing each constant the evidence justifies with a comment
citing it. Runs sized by another release's rules count for a term that release computes exactly as the
installed one does (`term_formula`: the decode graph has been 2 MiB × max_bs since 0.5.3); a term whose
formula differs is left as it is, with the reason. The calibration file itself: `profiler.calibrate.codec`.
"""

from __future__ import annotations

import difflib
import importlib.util
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from profiler.calibrate.codec import ceil_sig, patch_refusal
from profiler.calibrate.fit import SPECS, Calibration, TermResult
from profiler.core.errors import MemfracError
from profiler.model.heuristic.constants import ACTIVATION_MIB_PER_TOKEN, FLOOR_MIB, PREFILL_GRAPH_MLA_MIB
from profiler.model.heuristic.rules import RULE_SETS, RuleSet

HOOK_PATH = "sglang/srt/arg_groups/memory_hook.py"


@dataclass(frozen=True, slots=True)
class Edit:
    """One line of memory_hook.py a fitted constant replaces: found by its text, after an anchor line."""

    key: str
    function: str  # the def the line lives in
    old: str  # the line's stripped text
    after: str | None = None  # a stripped line it follows (for a text that occurs twice in the function)


_ACT = f"reserved_mem += activation_tokens * {ACTIVATION_MIB_PER_TOKEN:g}"
EDITS = (
    Edit("constant", "handle_gpu_memory_settings", "reserved_mem = 512"),
    Edit("activation", "handle_gpu_memory_settings", _ACT),
    Edit("parallel", "handle_gpu_memory_settings", "reserved_mem += cfg.tp_size * cfg.pp_size / 8 * 1024",
         after=_ACT),
    Edit("floor_topup", "handle_gpu_memory_settings", f"reserved_mem = max(reserved_mem, {FLOOR_MIB / 1024:g} * 1024)"),
    Edit("decode_graph", "reserve_for_graph_mb", "reserved_mem += decode_cuda_graph_config.max_bs * 2"),
    Edit("prefill_graph", "reserve_for_graph_mb", "reserved_mem += len(prefill_cuda_graph_config.bs) * 8"),
    Edit("prefill_graph_mla", "reserve_for_graph_mb", f"reserved_mem += {PREFILL_GRAPH_MLA_MIB / 1024:g} * 1024"),
    Edit("deepep_a2a", "reserve_for_deepep_a2a_mb", "return 2 * 1024"),
)  # fmt: skip


def _num(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e6 else f"{v:.0f}"


def _new_line(t: TermResult) -> str:
    f = t.fit
    assert f is not None
    if t.key == "decode_graph" and f.form == "per_hidden":
        return f"reserved_mem += decode_cuda_graph_config.max_bs * model_config_of(server_args).hidden_size * " \
               f"{ceil_sig(f.slope, 4)!r}"  # fmt: skip
    if t.key in ("decode_graph", "prefill_graph", "activation", "parallel") and f.form in ("affine", "affine_scaled"):
        per = {"decode_graph": "decode_cuda_graph_config.max_bs", "prefill_graph": "len(prefill_cuda_graph_config.bs)",
               "activation": "activation_tokens", "parallel": "cfg.tp_size * cfg.pp_size"}[t.key]  # fmt: skip
        if f.form == "affine_scaled":
            per += " * model_config_of(server_args).hidden_size / cfg.tp_size"
        lead = "reserved_mem = " if t.key == "constant" else "reserved_mem += "
        if f.slope == 0:  # the lowest covering line is flat: no per-unit part
            return f"{lead}{_num(ceil_sig(f.constant, 4))}"
        return f"{lead}{_num(ceil_sig(f.constant, 4))} + {per} * {_num(ceil_sig(f.slope, 4))}"
    v = ceil_sig(f.slope if f.form == "per_unit" else f.constant, 4)
    return {
        "constant": f"reserved_mem = {_num(v)}",
        "activation": f"reserved_mem += activation_tokens * {_num(v)}",
        "parallel": f"reserved_mem += cfg.tp_size * cfg.pp_size * {_num(v)}",
        "floor_topup": f"reserved_mem = max(reserved_mem, {_num(v)})",
        "decode_graph": f"reserved_mem += decode_cuda_graph_config.max_bs * {_num(v)}",
        "prefill_graph": f"reserved_mem += len(prefill_cuda_graph_config.bs) * {_num(v)}",
        "prefill_graph_mla": f"reserved_mem += {_num(v)}",
        "deepep_a2a": f"return {_num(v)}",
    }[t.key]


def _comment(t: TermResult, c: Calibration, target: RuleSet) -> list[str]:
    lo = f"LOO {len(t.loo.under)}/{t.loo.tested} under" if t.loo else "no LOO"
    lomo = f"LOMO {len(t.lomo.under)}/{t.lomo.tested} under" if t.lomo else "one model (no LOMO)"
    res = f"{min(t.residuals):+.0f}…{max(t.residuals):+.0f}" if t.residuals else "—"
    q = "max" if c.quantile == 1.0 else f"{c.quantile:g}-quantile"
    today = SPECS[t.key].today
    labels = {o.rules for o in t.observations} - {target.name}
    others = {n for o in t.observations for n in o.rule_sets} - {target.name}
    named = {n for n in others if n in RULE_SETS and term_formula(RULE_SETS[n], t.key)}
    sized = [n for n in RULE_SETS if n in named]  # in release order
    span = sized[0] if len(sized) == 1 else f"{sized[0]} … {sized[-1]}" if sized else ""
    h = c.held_out_reserve
    kv = "" if h is None else ", ".join(f"{m.mode} {m.kv_gained_mib:+,.0f} MiB" for m in h.modes if m.runs)
    return [
        f"memfrac calibrate ({q} of {t.runs} runs, {len(t.models)} model(s), {t.starts} worker start(s); "
        f"was {today:g}):",
        f"  shape {t.fit.form if t.fit else '—'}; held out by model: new OOMs {0 if h is None else h.new_ooms}, "
        f"KV gained {kv or '—'}.",
        f"  {t.formula}; fitted − measured {res} MiB; {lo}; {lomo}.",
    ] + ([f"  {len(t.excluded)} run(s) excluded (defaulted/unknown inputs, estimates, host memory)."]
         if t.excluded else []) + (
        [f"  Runs sized by the sglang {span} rules ({len(labels)} label(s)): each computes the term as",
         f"  {target.name} does, {term_formula(target, t.key)}."]
        if sized else [])  # fmt: skip


def installed_hook(sglang_dir: Path | None = None) -> tuple[str, Path]:
    """(installed sglang version, path of its memory_hook.py)."""
    if sglang_dir is None:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise MemfracError("--emit-patch: sglang is not installed here (pip install 'memfrac[sglang]')")
        sglang_dir = Path(next(iter(spec.submodule_search_locations)))
    try:
        version = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        version = ""
    hook = sglang_dir / "srt" / "arg_groups" / "memory_hook.py"
    if not hook.is_file():
        raise MemfracError(f"--emit-patch: {hook} not found (sglang {version or '?'} has no arg_groups/memory_hook.py)")
    return version, hook


def _find(lines: list[str], e: Edit) -> int | None:
    """Index of the edit's line inside its function (after its anchor), or None."""
    start = next((i for i, ln in enumerate(lines) if ln.startswith(f"def {e.function}(")), None)
    if start is None:
        return None
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("def ", "class "))), len(lines))
    i = start
    if e.after is not None:
        i = next((j for j in range(start, end) if lines[j].strip() == e.after), end)
    return next((j for j in range(i, end) if lines[j].strip() == e.old), None)


@dataclass(frozen=True, slots=True)
class Patch:
    diff: str
    replaced: tuple[str, ...]  # fit keys carried
    left: tuple[tuple[str, str], ...]  # (fit key, why not)
    version: str
    hook: Path


def term_formula(rs: RuleSet, key: str) -> str | None:
    """How a rule set computes one fit's term, in words (None: the rule set has no such term). Two rule sets
    with the same words compute the term from the same x with the same constant, so a constant fitted on runs
    sized by one carries to the other's memory_hook.py; `heuristic/model.py` `evaluate` spells each out."""
    if rs.formula != "terms":
        return None  # pre-0.5.3rc2: a fraction table or a reserve by GPU band, not a sum of terms
    buckets = rs.pcg_term == "buckets"
    tokens = "decode nodes: running requests × draft tokens" if rs.role_aware else "chunked prefill size"
    return {
        "constant": "512 MiB",
        "activation": f"{ACTIVATION_MIB_PER_TOKEN:g} MiB × tokens ({tokens})",
        "parallel": "tp·pp / 8 GiB",
        "decode_graph": "2 MiB × decode max_bs",
        "prefill_graph": "8 MiB × prefill buckets" if buckets else None,
        "prefill_graph_mla": f"{PREFILL_GRAPH_MLA_MIB / 1024:g} GiB flat (MLA)"
        if buckets and rs.pcg_mla_flat
        else (None),
        "floor_topup": "max(terms, 10 GiB) on GPUs > 60 GiB",
        "deepep_a2a": f"{rs.deepep_a2a_mib:g} MiB (DeepEP, after the floor)" if rs.deepep_a2a_mib else None,
    }[key]


def carry_refusal(t: TermResult, target: RuleSet) -> str | None:
    """Why a fitted constant does not carry to `target`'s memory_hook.py (None: every rule set its runs were
    sized with computes the term as `target` does, so the fitted constant means the same there)."""
    want = term_formula(target, t.key)
    if want is None:
        return f"the sglang {target.name} rules have no such term"
    for label, names in sorted({(o.rules, o.rule_sets) for o in t.observations}):
        sets = [RULE_SETS[n] for n in names if n in RULE_SETS]
        if not sets:
            return f"runs sized by unknown rules ({label or 'not recorded'})"
        found = {f for f in (term_formula(rs, t.key) for rs in sets) if f is not None}
        if not found:
            return f"runs sized by the {label} rules, which have no such term"
        other = sorted(found - {want})
        if other:
            return f"runs sized by the {label} rules, whose term is {other[0]}, not {want} as in {target.name}"
    return None


def evaluation_refusal(c: Calibration) -> str | None:
    """Why no patch may be written at all (None: the whole-reserve leave-one-model-out shows no new OOM and a KV
    gain). The evaluation itself is printed by `memfrac calibrate` above the refusal."""
    h = c.held_out_reserve
    if h is None:
        return "the evidence holds fewer than two models: no leave-one-model-out evaluation of the whole reserve"
    if not h.judged:
        return "no run could be judged at the level of the whole reserve (see the reasons in the evaluation)"
    if h.new_ooms:
        bad = [r.run_id for r in h.runs if r.new_oom]
        return f"held out, the calibrated fraction runs {h.new_ooms} run(s) out of memory ({', '.join(bad[:3])})"
    if h.kv_gained_mib <= 0:
        return (f"held out, the calibrated fraction gains no KV cache ({h.kv_gained_mib:+,.0f} MiB over "
                f"{len(h.judged)} judged run(s)): it would move memory from the KV cache for no OOM avoided"
                if not h.ooms_avoided else
                f"held out it avoids {h.ooms_avoided} OOM(s) but gives up {-h.kv_gained_mib:,.0f} MiB of KV cache: "
                "a trade a maintainer decides, not the patch")  # fmt: skip
    return None


def make_patch(c: Calibration, sglang_dir: Path | None = None, version: str | None = None) -> Patch:
    """The unified diff of the installed memory_hook.py with every justified constant replaced (and cited).

    Runs sized by other rules than the installed release's still count for a term that those rules compute
    exactly as the installed release does (`carry_refusal`): sglang's decode-graph term has been 2 MiB × max_bs
    since 0.5.3, so a per-bs constant fitted on 0.5.9 logs is a per-bs constant of 0.5.23's memory_hook.py.
    """
    from profiler.model.heuristic import rules_for

    gate = evaluation_refusal(c)
    if gate is not None:
        raise MemfracError(f"--emit-patch: refused: {gate}")
    installed, hook = installed_hook(sglang_dir)
    installed = version if version is not None else installed
    if not installed:
        raise MemfracError("--emit-patch: the installed sglang's version is unknown; cannot check the release")
    target = rules_for(installed)
    text = hook.read_text()
    lines = text.splitlines(keepends=True)
    new = list(lines)
    by_key = {t.key: t for t in c.terms}
    replaced, left = [], []
    inserts: list[tuple[int, list[str]]] = []
    for e in EDITS:
        t = by_key.get(e.key)
        why = "not fitted" if t is None else patch_refusal(t) or carry_refusal(t, target)
        if why is None and t is not None:
            i = _find(lines, e)
            if i is None:
                raise MemfracError(
                    f"--emit-patch: {hook}: line {e.old!r} not found in {e.function}(); this memory_hook.py is not "
                    f"the {c.rules} one memfrac knows"
                )
            line = _new_line(t)
            if line == e.old:
                left.append((e.key, "the fitted value equals today's"))
                continue
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            new[i] = f"{indent}{line}\n"
            inserts.append((i, [f"{indent}# {x}\n" for x in _comment(t, c, target)]))
            replaced.append(e.key)
        else:
            left.append((e.key, why or "not fitted"))
    for i, block in sorted(inserts, reverse=True):
        new[i:i] = block
    if not replaced:
        why = "; ".join(f"{k}: {w}" for k, w in left)
        raise MemfracError(
            f"--emit-patch: no constant is justified by these results for the installed sglang {installed}'s "
            f"memory_hook.py ({why})"
        )
    diff = "".join(difflib.unified_diff(lines, new, f"a/{HOOK_PATH}", f"b/{HOOK_PATH}"))
    return Patch(diff, tuple(replaced), tuple(left), installed, hook)


# ---------------------------------------------------------------------------------------------------
# A calibrated reserve for one scenario (memfrac explain --calibration)
# ---------------------------------------------------------------------------------------------------
