"""The reservation a logged run got: its release's own rules, or every rule set its release range allows.

Why: the heuristic changed many times since 0.4 (a formula by TP size, then GPU bands, then terms), so a
log must be judged with the rules of the release that wrote it — never silently with the newest. When the
log states its release (`Identity.sglang_version`), that release's rules are used. Otherwise the formats it
prints bound a range (`Identity.sglang_range`), every distinct rule set in that range is evaluated, and the
reservation is shown as a range. A fraction the log prints (or implies) that only some candidates reproduce
narrows the range and says so. The GPU capacity works the same way: several consistent capacities give
several reservations. A reservation computed without the GPU size uses the heuristic's fallback defaults;
its fraction is never reported as the run's.

The heuristic's inputs are the run's args, with each value's origin in `Measurement.args_from`; values
sglang resolved after the heuristic ran (the ready line's max_running_requests) are left out of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from profiler.core.errors import MemfracError
from profiler.core.measurement import Measurement
from profiler.logs import formats
from profiler.logs.printed import RESOLVED_AFTER_HEURISTIC
from profiler.model.heuristic import (
    DEFAULT_RULES,
    TERM_NAMES,
    Reservation,
    RuleSet,
    inputs_from_args,
    reserve,
    rules_for,
)
from profiler.model.heuristic.rules import RULE_SETS

_MATCH_TOL = 0.0005  # sglang rounds its auto fraction to 3 decimals (0.4.x printed it unrounded)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One rule set (with the releases it stands for) at one GPU capacity, and what it reserves."""

    rule_set: RuleSet
    releases: tuple[str, ...]
    gpu_mib: int | None
    res: Reservation

    @property
    def fallback(self) -> bool:
        """The GPU size was unknown: sglang's fallback defaults, not an answer for this GPU."""
        return "gpu_mem_unknown" in self.res.flags


@dataclass(frozen=True, slots=True)
class LogReservation:
    """The rules a run was judged with, why, and the reservation (one, or a range over candidates)."""

    rules: str  # "0.4.10" | "0.5.9 … 0.5.12.post1 (3 rule sets)" | "none": for display (`rule_sets` is the list)
    rules_why: str
    release: str | None
    release_how: str
    headline: Reservation | None  # the candidate compare() is given (rules_why names it)
    candidates: tuple[Candidate, ...] = ()
    mfs: float | None = None
    mfs_origin: str = "unknown"
    mfs_how: str = ""
    notes: tuple[str, ...] = field(default=())
    estimate: Reservation | None = None  # the newest rules' reservation, for the activation yardstick only
    rule_sets: tuple[str, ...] = ()  # the candidates' rule sets, in release order (never parsed back from `rules`)

    @property
    def reserved_mib_range(self) -> tuple[float, float] | None:
        vals = [c.res.reserved_mib for c in self.candidates]
        return (min(vals), max(vals)) if vals else None

    @property
    def fraction_range(self) -> tuple[float, float] | None:
        """What the heuristic would pick, over the candidates that knew the GPU size."""
        vals = [c.res.heuristic_fraction for c in self.candidates if not c.fallback]
        return (min(vals), max(vals)) if vals else None

    def activation_mib(self) -> tuple[float, str] | None:
        """The heuristic's activation reserve (the largest over candidates) and what it rests on. When no
        candidate has that term (rules that are one formula, post-capture sizing, or no modelled rules), the
        newest rules' activation term for the same inputs stands in, and the basis says so."""
        on = TERM_NAMES.index("activation")
        cands = [c for c in self.candidates if c.res.term_on[on]]
        if cands:
            best = max(cands, key=lambda c: c.res.mib("activation"))
            rs = "" if len(self.candidates) == 1 else f", largest over {len(self.candidates)} candidates"
            return best.res.mib("activation"), f"{best.rule_set.name} rules, {_basis(best.res, best.fallback)}{rs}"
        est = self.estimate
        if est is None or not est.term_on[on]:
            return None
        which = "no candidate rule set has an activation term" if self.candidates else "no modelled rules"
        fallback = "gpu_mem_unknown" in est.flags
        return est.mib("activation"), f"{est.rules} rules' activation term ({which}), {_basis(est, fallback)}"


def _basis(res: Reservation, fallback: bool) -> str:
    inp = res.inputs
    if inp.mode == "decode":
        basis = "decode batch sizing"
    elif inp.chunked_prefill_size is not None:
        basis = f"chunked_prefill_size {inp.chunked_prefill_size}"
    else:
        basis = "the GPU-size default chunk"
    return basis + (", GPU size unknown: the heuristic's fallback defaults" if fallback else "")


def _versions_between(first: str | None, last: str | None) -> list[str]:
    """Releases in [first, last], from the release table when memfrac has one, else the log-format table."""
    try:
        from profiler.model.heuristic import releases as rel  # type: ignore[attr-defined]
    except ImportError:
        return formats.releases_between(first, last)
    lo, hi = first or rel.RELEASES[0].version, last or rel.RELEASES[-1].version
    return [r.version for r in rel.releases_between(lo, hi)]


def _rule_sets(versions: list[str]) -> tuple[list[tuple[RuleSet, list[str]]], list[str]]:
    """Distinct rule sets for `versions` (release order), and the versions no modelled rule set covers."""
    groups: dict[int, tuple[RuleSet, list[str]]] = {}
    missing: list[str] = []
    for v in versions:
        try:
            rs = rules_for(v)
        except MemfracError:
            missing.append(v)
            continue
        groups.setdefault(id(rs), (rs, []))[1].append(v)
    return list(groups.values()), missing


def _capacities(m: Measurement) -> tuple[list[int | None], str]:
    ident = m.identity
    if ident.gpu_candidates_mib:
        caps: list[int | None] = list(ident.gpu_candidates_mib)
        if len(caps) == 1:
            return caps, f"GPU {caps[0]} MiB ({ident.gpu_total_how})"
        return caps, f"GPU capacity one of {', '.join(map(str, caps))} MiB"
    if ident.gpu_total_mib is not None:
        return [int(ident.gpu_total_mib)], f"GPU {int(ident.gpu_total_mib)} MiB ({ident.gpu_total_how})"
    return [None], "GPU size unknown"


def heuristic_args(m: Measurement) -> tuple[dict, list[str]]:
    """The args the heuristic reads — everything known except values sglang resolved after it ran — and
    notes on what was filled from the run's identity (parallelism from rank tags, a role-only message)."""
    args = {
        k: v
        for k, v in m.args.items()
        if not (k in RESOLVED_AFTER_HEURISTIC and "resolved by sglang" in m.args_from.get(k, ""))
    }
    filled = []
    for dim in ("tp", "pp"):
        v = getattr(m.identity, dim)
        if f"{dim}_size" not in args and isinstance(v, int) and v > 1:
            args[f"{dim}_size"] = v
            filled.append(f"{dim}_size={v}")
    if filled:
        return args, [f"heuristic inputs from the run's identity (rank tags): {', '.join(filled)}"]
    return args, []


def log_reservation(m: Measurement) -> LogReservation:
    """Choose the rules for a logged run and compute its reservation (or one per candidate)."""
    ident = m.identity
    notes: list[str] = []
    if ident.sglang_version:
        versions, rel_how = [ident.sglang_version], ident.sglang_how
    else:
        lo, hi = [*ident.sglang_range, "", ""][:2]
        versions = _versions_between(lo or None, hi or None)
        rel_how = ident.sglang_how
    groups, missing = _rule_sets(versions)
    base = _base(m, rel_how)
    caps, cap_how = _capacities(m)
    args, filled = heuristic_args(m)
    est_inp = inputs_from_args(args, gpu_mem_mib=max((c for c in caps if c), default=None),
                               architecture=ident.architecture, mode=ident.mode)  # fmt: skip
    estimate = reserve(est_inp._replace(mem_fraction_static=m.mfs), DEFAULT_RULES)
    if not groups:
        why = ("no modelled rule set: " + _versions_label(missing) + " " + ("is" if len(missing) == 1 else "are")
               + " not modelled by this memfrac")  # fmt: skip
        return LogReservation("none", why, **base, headline=None, **_fraction_of(m), estimate=estimate)
    if missing:
        notes.append(f"releases in the range without a modelled rule set (left out): {_versions_label(missing)}")
    notes.extend(filled)
    if not m.args:
        notes.append("no server arguments in the text (no server_args, command or scheduler line): the "
                     "heuristic's inputs are sglang's defaults, an estimate")  # fmt: skip
    cands: list[Candidate] = []
    for rs, vs in groups:
        for cap in caps:
            inp = inputs_from_args(args, gpu_mem_mib=cap, architecture=ident.architecture, mode=ident.mode)
            inp = inp._replace(mem_fraction_static=m.mfs)
            cands.append(Candidate(rs, tuple(vs), cap, reserve(inp, rs)))
    mfs, origin, how = m.mfs, m.mfs_origin, m.mfs_how
    matched = _matching(cands, m)
    narrowed = ""
    if matched is not None:
        if matched and len(matched) < len(cands):
            narrowed = (f"; narrowed to the candidates whose rule reproduces the fraction {mfs:.3f}: "
                        f"{_label(matched)}")  # fmt: skip
            cands = matched
        if matched and origin == "unknown":
            if _round(mfs):  # 0.88, 0.9: what a user types as often as what a rule gives
                how += (f"; the {_label(matched)} rule gives the same value: consistent with sglang choosing it, "
                        "but a round value a user may have set")  # fmt: skip
            else:
                origin = "auto"
                how += f"; the {_label(matched)} rule gives the same value, so sglang chose it"
        elif not matched and origin in ("unknown", "auto"):
            notes.append(f"no candidate rule set reproduces the printed fraction {mfs}: given by the user, or "
                         "the release is outside the range the formats allow")  # fmt: skip
    exact_gpu = caps != [None] and len(caps) == 1
    if mfs is None and len(cands) == 1 and exact_gpu and _command_leaves_it_to_sglang(m):
        c = cands[0]
        mfs, origin = c.res.heuristic_fraction, "auto"
        how = (f"computed with the {c.rule_set.name} rules for {cap_how} (not printed; the launch command "
               "does not set it)")  # fmt: skip
    headline = _headline(cands, mfs)
    label = _label(cands) + (f" (+{len(missing)} releases not modelled)" if missing else "")
    why = _why(ident.sglang_version, rel_how, cands, headline, cap_how) + narrowed
    return LogReservation(label, why, **base, headline=headline.res if headline else None, candidates=tuple(cands),
                          mfs=mfs, mfs_origin=origin, mfs_how=how, notes=tuple(notes), estimate=estimate,
                          rule_sets=tuple(dict.fromkeys(c.rule_set.name for c in cands)))  # fmt: skip


def _base(m: Measurement, rel_how: str) -> dict:
    ident = m.identity
    if ident.sglang_version:
        release = ident.sglang_version
    elif ident.sglang_range:
        release = f"{ident.sglang_range[0] or '≤' + formats.OLDEST} … {ident.sglang_range[1] or formats.NEWEST + '+'}"
    else:
        release = None
    return {"release": release, "release_how": rel_how}


def _fraction_of(m: Measurement) -> dict:
    return {"mfs": m.mfs, "mfs_origin": m.mfs_origin, "mfs_how": m.mfs_how}


def _matching(cands: list[Candidate], m: Measurement) -> list[Candidate] | None:
    """Candidates whose auto fraction equals the run's (None when the comparison says nothing)."""
    if m.mfs is None or m.mfs_origin == "given" or (m.mfs_origin == "implied" and m.mfs_plus_minus is None):
        return None  # given: nothing to reproduce; a bound: it narrows nothing
    usable = [c for c in cands if not c.fallback and c.gpu_mib is not None]
    if not usable or m.identity.gpu_total_how.startswith("oom"):
        return None
    tol = _MATCH_TOL + (0.0 if m.mfs_origin != "implied" else _implied_tol(m))
    return [c for c in usable if abs(c.res.heuristic_fraction - m.mfs) <= tol]


def _round(v: float | None) -> bool:
    """A fraction of at most two decimals (0.88, 0.9): equality with a rule's value is no proof of auto."""
    return v is not None and abs(v * 100 - round(v * 100)) < 1e-9


def _implied_tol(m: Measurement) -> float:
    if m.mfs_plus_minus is None:  # a bound: it narrows nothing
        return 1.0
    return m.mfs_plus_minus


def _command_leaves_it_to_sglang(m: Measurement) -> bool:
    return "launch_command" in set(m.args_from.values()) and "mem_fraction_static" not in m.args


def _headline(cands: list[Candidate], mfs: float | None) -> Candidate | None:
    if not cands:
        return None
    if mfs is not None:
        for c in reversed(cands):
            if not c.fallback and abs(c.res.heuristic_fraction - mfs) <= _MATCH_TOL:
                return c
    return cands[-1]  # the newest rule set (and largest capacity): named in rules_why


def _label(cands: list[Candidate]) -> str:
    sets = list(dict.fromkeys(c.rule_set.name for c in cands))
    if len(sets) == 1:
        return sets[0]
    return f"{sets[0]} … {sets[-1]} ({len(sets)} rule sets)"


def rule_sets_named(label: str) -> list[RuleSet]:
    """The rule sets a stored `rules` label (`_label`'s, e.g. a results.parquet column) names: one ("0.5.9"), or a
    range ("0.5.3 … 0.5.8 (6 rule sets)": every rule set between its ends, a superset when candidates were left
    out); empty for "none". A record in hand carries the exact list: `LogReservation.rule_sets`."""
    names = list(RULE_SETS)
    m = _RANGE_LABEL.match(label)
    if m and m[1] in RULE_SETS and m[2] in RULE_SETS:
        return [RULE_SETS[n] for n in names[names.index(m[1]) : names.index(m[2]) + 1]]
    return [RULE_SETS[label]] if label in RULE_SETS else []


_RANGE_LABEL = re.compile(r"^(\S+) … (\S+) \(\d+ rule sets\)")


def _versions_label(vs: list[str]) -> str:
    return vs[0] if len(vs) == 1 else f"{vs[0]} … {vs[-1]} ({len(vs)} releases)"


def _why(version: str | None, rel_how: str, cands: list[Candidate], head: Candidate | None, cap_how: str) -> str:
    sets = list(dict.fromkeys(c.rule_set.name for c in cands))
    if version:
        base = f"the {sets[0]} rules ({_releases_of(cands[0])}) of sglang {version}: {rel_how}"
    else:
        base = f"{len(sets)} rule set{'s' if len(sets) > 1 else ''} ({', '.join(sets)}) for {rel_how}"
    multi = len(cands) > 1
    if multi and head is not None:
        base += f"; terms shown for {head.rule_set.name}" + (f" at {head.gpu_mib} MiB" if head.gpu_mib else "")
    return f"{base}; {cap_how}"


def _releases_of(c: Candidate) -> str:
    rs = c.rule_set
    return getattr(rs, "releases", "") or c.releases[0]
