"""Which run a log shows: model, architecture, mode, parallelism, GPU, release — each with how we know.

Sources in order of trust: the `server_args=` repr, the launch command, then what the lines imply (rank
tags, "Load weight end. type=…", an OOM's "total capacity", the free memory at the first weight load).
Every inferred value is written down in `Measurement.notes`; a value nothing supports stays None.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from profiler.core.measurement import Identity, Measurement, Rank
from profiler.core.units import MIB_PER_GIB
from profiler.logs.formats import BY_KEY as FORMAT_SPANS
from profiler.logs.formats import (
    NEWEST,
    OLDEST,
    ReleaseRange,
    next_release,
    release_key,
    release_range,
    releases_between,
)
from profiler.logs.gpu_evidence import KINDS, GpuClue
from profiler.logs.printed import Fraction, implied_fraction, log_args, printed_fraction
from profiler.logs.run import VersionCue, _Run
from profiler.logs.state import startup_state
from profiler.model.gpus import gpus_near_capacity, log_gpus

_V = r"v?(\d+\.\d+\.\d+(?:\.post\d+|rc\d+|\.dev\d+)?)"
_TOTAL_NOTE = ("GPU total from the OOM message's 'total capacity' (torch's total: about 0.6% below "
               "nvidia-smi memory.total, which the heuristic uses)")  # fmt: skip


# (trust, how, pattern); the first pattern that matches a line wins. Not versions: /sgl-workspace/… paths,
# sgl-kernel / sglang-router packages, "sglang is using nccl==2.21.5".
_CUES = tuple(
    (trust, how, re.compile(rx))
    for trust, how, rx in (
        (0, "server_info sglang_version", r"""["']sglang_version["']\s*:\s*["']""" + _V),
        (0, "server_info version", r"""["']version["']\s*:\s*["']""" + _V + r"""["'](?=.*["']model_path["'])"""),
        (0, "server_info version", r"""["']model_path["'].*["']version["']\s*:\s*["']""" + _V + "[\"']"),
        (1, "version line", r"\bsglang(?:\s+version:?\s*|\s*:\s+)" + _V + r"\b"),
        (1, "installed package path", r"\bsglang-" + _V + r"(?:\.dist-info|-py\d|\.egg)"),
        (1, "pip list", r"^\s*sglang\s+" + _V + r"\s*$"),
        (3, "docker image tag", r"(?:^|[\s=\"'])((?:[\w.-]+/)*sgl(?:ang|-dev)[\w-]*):" + _V + r"([\w.-]*)"),
        (4, "pip install", r"\bpip3?\b.*\bsglang(?:\[[^\]]*\])?\s*(==|>=|~=)\s*" + _V),
        (4, "pip install", r"\buv\s+(?:pip|add)\b.*\bsglang(?:\[[^\]]*\])?\s*(==|>=|~=)\s*" + _V),
        (1, "pinned package", r"(?:^|\s)sglang(?:\[[^\]]*\])?==" + _V + r"\b"),
        (2, "version line", r"\bsglang\s+" + _V + r"\b"),
    )
)


def version_cue(text: str) -> VersionCue | None:
    """The sglang release a line states: a server_info dump, "sglang version: X", "sglang: X" (check_env),
    "sglang X", an installed path (…/sglang-X.dist-info), a docker image tag (lmsysorg/sglang:vX-cu126,
    rocm/sgl-dev:vX-…), a pip command (pip install "sglang[all]==X"). None if it states none."""
    for trust, how, rx in _CUES:
        m = rx.search(text)
        if m is None:
            continue
        if how == "docker image tag":
            repo, ver, rest = m.group(1), m.group(2), m.group(3)
            dev = "sgl-dev" in repo or "dev" in rest or "nightly" in rest
            return VersionCue(ver, f"docker image tag {repo}:v{ver}{rest}", trust, dev=dev)
        if how == "pip install":
            op, ver = m.group(1), m.group(2)
            return VersionCue(ver, f"pip command (sglang{op}{ver})", trust, at_least=op == ">=")
        return VersionCue(m.group(m.lastindex or 1), how, trust)
    return None


def find_version(text: str) -> str | None:
    """An sglang release printed in the log ("sglang==0.4.5", "sglang version: 0.5.23", "sglang: 0.4.5")."""
    cue = version_cue(text)
    return None if cue is None or cue.at_least else cue.version


def finalize_run(run: _Run) -> Measurement:
    """Turn a finished run into its Measurement: args (each with its origin), identity, release, ranks in
    order, run-level failure, the fraction as the log supports it, and how far startup got."""
    m = run.m
    m.args, m.args_source, notes = args_of(run)
    m.args_from = dict.fromkeys(m.args, m.args_source)
    for key, (value, where) in run.quoted_args.items():  # what an error message quotes, when nothing else says
        if key not in m.args:
            m.args[key] = value
            m.args_from[key] = where
    if run.cmd is not None and run.server_args is not None:
        m.args_from.update(dict.fromkeys((k for k in run.cmd.args if k not in run.server_args.args), "launch_command"))
    m.notes.extend(notes)
    m.ranks = sorted((rs.rank for rs in run.ranks.values()), key=_rank_order) or [Rank(label="")]
    m.first_line, m.last_line = run.first_line, run.last_line
    failed = [r.failure for r in m.ranks if r.failure is not None]
    m.failure = min(failed, key=lambda f: f.line or 0) if failed else None
    m.serving = dict(run.serving)
    extra, extra_from, notes = log_args(m, run.resolved)
    m.args.update(extra)
    m.args_from.update(extra_from)
    m.notes.extend(notes)
    _identity(run, m)
    _release(run, m)
    _fraction(run, m)
    m.startup, m.startup_seen = startup_state(m, run.ready_line, run.fired_line)
    return m


def _release(run: _Run, m: Measurement) -> None:
    """The release: stated (the most trusted cue), else the range the log's formats allow."""
    ident = m.identity
    rng = release_range(run.formats)
    spans = "; ".join(f"{k} ({_span(k)}, line {run.formats[k]})" for k in rng.decided_by)
    if rng.conflicts:
        m.notes.append("log formats that contradict the others (a fork, a dev build, or pasted logs): "
                       + ", ".join(f"{k} ({_span(k)})" for k in rng.conflicts))  # fmt: skip
    cues = sorted(run.cues, key=lambda lc: (lc[1].trust, lc[0]))
    exact = [(n, c) for n, c in cues if not c.at_least]
    lo = next((c.version for _, c in cues if c.at_least), None)
    if exact:
        line, cue = exact[0]
        others = sorted({c.version for _, c in exact[1:]} - {cue.version}, key=release_key)
        if others:
            m.notes.append(f"other releases stated in the text: {', '.join(others)} (kept {cue.version}: {cue.how})")
        if cue.dev:
            nxt = next_release(cue.version)
            dev = release_range([])._replace(first=cue.version, last=nxt)
            both = [r for r in releases_between(cue.version, nxt) if _within(r, rng)]
            before = nxt or "the next release"
            how = f"{cue.how} (line {line}): a dev build from main after {cue.version}, before {before}"
            if len(both) == 1:
                ident.sglang_version, ident.sglang_how = both[0], f"{how}; its log formats match {both[0]}"
                return
            ident.sglang_range = [both[0], both[-1]] if both else [dev.first or "", dev.last or ""]
            ident.sglang_how = how + (f"; log formats: {spans}" if spans else "")
            return
        ident.sglang_version, ident.sglang_how = cue.version, f"{cue.how} (line {line})"
        if rng.bounded and not _within(cue.version, rng):
            m.notes.append(f"the stated release {cue.version} does not print every format seen ({rng.label()}: "
                           f"{spans}): a fork or a patched build; its rules are used as stated")  # fmt: skip
        return
    if lo is not None:
        line, cue = next((n, c) for n, c in cues if c.at_least)
        rng = rng._replace(first=max(lo, rng.first or lo, key=release_key))
        spans = (spans + "; " if spans else "") + f"{cue.how} (line {line})"
    if not rng.bounded:
        ident.sglang_how = "unknown: no release stated and no dated log format seen"
        return
    if rng.first is not None and rng.first == rng.last:
        ident.sglang_version, ident.sglang_how = rng.first, f"log formats: only {rng.first} prints {spans}"
        return
    ident.sglang_range = [rng.first or "", rng.last or ""]
    ident.sglang_how = f"log formats: {rng.label()} ({spans})"


def _span(key: str) -> str:
    f = FORMAT_SPANS[key]
    return f"{f.first or '≤' + OLDEST} … {f.last or NEWEST + '+'}"


def _within(v: str, rng: ReleaseRange) -> bool:
    k = release_key(v)
    return (rng.first is None or k >= release_key(rng.first)) and (rng.last is None or k <= release_key(rng.last))


def _fraction(run: _Run, m: Measurement) -> None:
    """mem_fraction_static: printed (and who chose it), else implied from the KV budget, else unknown."""
    has_cmd = run.cmd is not None
    sets = has_cmd and "mem_fraction_static" in run.cmd.args  # type: ignore[union-attr]
    f = printed_fraction(m, has_cmd, sets)
    imp = implied_fraction(m)
    if f is None:
        f = imp if imp is not None and imp.value is not None else None
        if f is not None and has_cmd:
            f = f._replace(how=f.how + "; not on the launch command, so sglang chose it")
        elif f is None:
            why = imp.how if imp is not None else "the log prints no fraction and no KV budget to imply it from"
            f = Fraction(None, "unknown", why)
    elif imp is not None and imp.value is not None and f.value is not None:
        tol = (imp.plus_minus or 0.0) + 0.0005
        lower_ok = imp.bound == "lower" and f.value + tol >= imp.value
        upper_ok = imp.bound == "upper" and f.value <= imp.value + tol
        bounded = lower_ok or upper_ok
        if bounded or abs(f.value - imp.value) <= tol:
            f = f._replace(how=f.how + f"; the KV budget agrees ({imp.how})")
        else:
            m.notes.append(f"printed mem_fraction_static {f.value} differs from the one the KV budget implies "
                           f"({imp.how})")  # fmt: skip
    m.mfs, m.mfs_origin, m.mfs_how = f.value, f.origin, f.how
    m.mfs_plus_minus = f.plus_minus if f.origin == "implied" and not f.bound else None
    if f.value is not None and "mem_fraction_static" not in m.args_from:
        m.args_from["mem_fraction_static"] = f.how


def _rank_order(r: Rank) -> tuple[int, int, int, int, str]:
    return (r.pp or 0, r.dp or 0, r.tp or 0, r.ep or 0, r.label)


def _identity(run: _Run, m: Measurement) -> None:
    ident: Identity = m.identity
    a = m.args
    if isinstance(a.get("model_path"), str):
        ident.model = a["model_path"]
    elif run.model_hint is not None:
        ident.model, line = run.model_hint
        m.notes.append(f"model {ident.model} read from line {line} (no server_args or command)")
    ident.architecture = _architecture(run, m)
    mode = a.get("disaggregation_mode")
    if isinstance(mode, str):
        ident.mode = mode
    elif run.mode_hint is not None:
        ident.mode, line = run.mode_hint
        m.args["disaggregation_mode"] = ident.mode
        m.args_from["disaggregation_mode"] = f"log line {line} (a message only {ident.mode} servers print)"
        m.notes.append(f"mode {ident.mode} from line {line} ('KV cache is forced as chunk cache for decode server')")
    for dim in ("tp", "dp", "pp", "ep"):
        v = a.get(f"{dim}_size")
        if isinstance(v, int) and not isinstance(v, bool):
            setattr(ident, dim, v)
        elif f"{dim}_size" in run.resolved:
            val, line = run.resolved[f"{dim}_size"]
            setattr(ident, dim, val)
            m.notes.append(f"{dim}={val} from sglang's own message at line {line} (resolved value)")
        else:
            _from_tags(m, dim)
    if a.get("enable_dp_attention") is True and isinstance(a.get("dp_size"), int):
        ident.attn_dp = a["dp_size"]
    elif "attn_dp_size" in run.resolved:
        ident.attn_dp = run.resolved["attn_dp_size"][0]
    if run.cmd is not None and run.cmd.hostname:
        ident.hostname = run.cmd.hostname
    _gpu(m, run.gpu_clues)


def _architecture(run: _Run, m: Measurement) -> str | None:
    for r in m.ranks:
        for p in r.phases_named("weights"):
            if "architecture" in p.details:
                return str(p.details["architecture"])
    if run.arch_hint is not None:
        name, line = run.arch_hint
        m.notes.append(f"architecture {name} read from line {line} (no 'Load weight end' line)")
        return name
    return None


def _from_tags(m: Measurement, dim: str) -> None:
    seen = [getattr(r, dim) for r in m.ranks if getattr(r, dim) is not None]
    if not seen:
        return
    size = max(seen) + 1
    setattr(m.identity, dim, size)
    m.notes.append(
        f"{dim}={size} inferred from rank tags (highest {dim.upper()} index {size - 1}); no server_args or "
        f"command gives it (a lower bound if the run spans nodes or the excerpt omits ranks)"
    )


#: GiB a GPU's memory.total may exceed the free memory seen before NCCL init (CUDA context, driver
#: reservations), and — when the log does not print what NCCL init used — the free memory at weight load.
TOLERANCE_GIB = 1.5
TOLERANCE_NO_INIT_GIB = 3.0
#: When no GPU lies that close: the widest gap, as a share of the capacity, between the free memory at start and
#: a GPU that still counts as the estimate (sglang-4417.log: 16 H100s over two nodes start with 75.98 GiB of
#: 79.65 free, 4.6% below; a bound further below every GPU names none).
ESTIMATE_GAP = 0.05
_RESOLUTION_GIB = 0.005  # sglang prints GiB with two decimals


def _gpu(m: Measurement, clues: list[GpuClue]) -> None:
    """The GPU capacity, from every piece of evidence the log gives, strongest first:

    read — a capacity the machine printed (nvidia-smi memory.total), a GPU it named (check_env, an nvidia-smi
    table, rocminfo, a kernel-config path; an instance type when the free memory agrees), the OOM message's
    total; estimated — the GPUs whose capacity is at least the free memory at start: the one or the smallest
    of several within the tolerance (all of them stay candidates: the reservation becomes a range), else the
    smallest within ESTIMATE_GAP. A clue the free memory contradicts (a capacity below it) is noted, not used.
    """
    ident = m.identity
    seen = _first_load_free(m)
    start_gib = None if seen is None else (seen[0] + (seen[1] or 0.0)) / MIB_PER_GIB
    if _gpu_from_clues(m, clues, start_gib):
        return
    totals = [r.failure.total_capacity_mib for r in m.ranks if r.failure and r.failure.total_capacity_mib]
    if totals:
        ident.gpu_total_mib = totals[0]
        ident.gpu_total_how = "oom total capacity"
        cands = gpus_near_capacity(totals[0] / MIB_PER_GIB)
        fits = ", ".join(g.name for g in cands) or "none bundled"
        m.notes.append(f"{_TOTAL_NOTE}; GPUs of that size: {fits} (name not set from this)")
        # The heuristic reads nvidia-smi's memory.total: the bundled capacities this total fits are its candidates.
        ident.gpu_candidates_mib = sorted({g.total_mib for g in cands})
        if len(cands) == 1:
            ident.gpu_name = cands[0].name
        return
    if seen is None or start_gib is None:
        top = _largest_free(m)
        if top is not None:
            m.notes.append(f"GPU capacity unknown: at least {top[0] / MIB_PER_GIB:.2f} GiB, the largest free figure "
                           f"the log shows ({top[1]}); no reading at start to estimate it from")  # fmt: skip
        return
    _, init_mib, how = seen
    tol = TOLERANCE_GIB if init_mib is not None else TOLERANCE_NO_INIT_GIB
    cands = gpus_near_capacity(start_gib, tol)
    caps = sorted({g.total_mib for g in cands})
    names = " / ".join(g.name for g in cands)
    rule = f"within {tol} GiB above {how}" + ("" if init_mib is not None else " (NCCL init usage not printed)")
    if len(cands) == 1:
        g = cands[0]
        ident.gpu_name, ident.gpu_total_mib = g.name, float(g.total_mib)
        ident.gpu_total_how = f"{how} ≈ {g.name}"
        if init_mib is not None or tol != TOLERANCE_GIB:
            m.notes.append(f"GPU {g.name} ({g.total_mib} MiB): the only bundled GPU {rule}")
    elif len(caps) == 1:
        ident.gpu_total_mib = float(caps[0])
        ident.gpu_total_how = f"{how} ≈ {caps[0]} MiB ({names})"
        m.notes.append(f"GPU capacity {caps[0]} MiB: every bundled GPU {rule} has it ({names}); name unknown")
    elif cands:
        ident.gpu_candidates_mib = caps
        listed = ", ".join(f"{g.name} ({g.total_mib} MiB)" for g in cands)
        small = [g.name for g in cands if g.total_mib == caps[0]]
        ident.gpu_total_mib = float(caps[0])
        ident.gpu_total_how = f"{how} ≤ capacity: estimated {caps[0]} MiB, the smallest of {listed}"
        m.notes.append(f"GPU not identified: {how} fits several GPUs: {listed} ({rule}); estimated as the smallest, "
                       f"{' / '.join(small)} ({caps[0]} MiB), every candidate kept")  # fmt: skip
    else:
        wide = [g for g in log_gpus() if 0 <= g.total_gib - start_gib <= ESTIMATE_GAP * g.total_gib]
        if not wide:
            m.notes.append(f"GPU not identified: no bundled GPU {rule}, nor within {ESTIMATE_GAP:.0%} of its "
                           "capacity above it")  # fmt: skip
            return
        cap = wide[0].total_mib
        small = " / ".join(g.name for g in wide if g.total_mib == cap)
        gap = cap / MIB_PER_GIB - start_gib
        ident.gpu_total_mib = float(cap)
        ident.gpu_total_how = (f"{how} ≤ capacity: estimated {cap} MiB ({small}), the smallest GPU above it "
                               f"({gap:.2f} GiB above, within {ESTIMATE_GAP:.0%} of its capacity)")  # fmt: skip
        m.notes.append(f"GPU not identified: no bundled GPU {rule}; estimated {small} ({cap} MiB), the smallest "
                       f"above it, {gap:.2f} GiB (≤ {ESTIMATE_GAP:.0%} of its capacity)")  # fmt: skip


def _gpu_from_clues(m: Measurement, clues: list[GpuClue], start_gib: float | None) -> bool:
    """Set the capacity from the strongest clue the free memory at start does not contradict; True if set."""
    ident = m.identity
    usable: list[GpuClue] = []
    for c in sorted(clues, key=lambda c: (KINDS.index(c.kind), c.line)):
        if c.total_mib is None:
            m.notes.append(f"GPU {c.text!r} named by {c.kind} at line {c.line} is not a known GPU: capacity from "
                           "memory lines")  # fmt: skip
            continue
        gib = c.total_mib / MIB_PER_GIB
        if start_gib is not None and gib < start_gib - _RESOLUTION_GIB:
            m.notes.append(f"{c.label()} says {c.total_mib:.0f} MiB, less than the {start_gib:.2f} GiB free at start: "
                           "another machine's; not used")  # fmt: skip
            continue
        # an instance type: prose may name several; only one the free memory fits
        far = start_gib is not None and gib - start_gib > max(TOLERANCE_NO_INIT_GIB, ESTIMATE_GAP * gib)
        if not c.printed and far:
            m.notes.append(f"{c.label()} ({c.total_mib:.0f} MiB) is far above the {start_gib:.2f} GiB free at start: "
                           "not this run's GPU")  # fmt: skip
            continue
        usable.append(c)
    if not usable:
        return False
    best = [c for c in usable if c.kind == usable[0].kind]
    if not usable[0].printed and len({c.total_mib for c in best}) > 1:
        m.notes.append("instance types of different GPUs named (" + ", ".join(c.label() for c in best) + "): none used")
        return False
    c = min(best, key=lambda c: (c.total_mib or 0.0, c.line))  # sglang reads the smallest visible GPU
    named = next((d for d in usable if d.gpu is not None and d.gpu.total_mib == c.total_mib), None)
    ident.gpu_total_mib = c.total_mib
    ident.gpu_name = named.gpu.name if named is not None and named.gpu is not None else None
    ident.gpu_count = ident.gpu_count or c.gpus
    ident.gpu_total_how = _read_how(c)
    if len({d.total_mib for d in best}) > 1:
        m.notes.append(f"GPUs of different capacities listed ({', '.join(d.label() for d in best)}): the smallest "
                       "counts (sglang reads the minimum over the visible GPUs)")  # fmt: skip
    if start_gib is None:
        m.notes.append(f"GPU capacity {c.total_mib:.0f} MiB from {c.label()}; no free memory at start to check it")
    return True


def _read_how(c: GpuClue) -> str:
    g = f" → {c.gpu.name} {c.gpu.total_mib} MiB" if c.gpu is not None else ""
    if c.kind == "kernel-config path":
        return f"device_name {c.text!r} at line {c.line} (a kernel-config path)"
    if c.kind == "check_env":
        return f"torch device name {c.text!r} (check_env, line {c.line}){g}"
    if c.kind == "nvidia-smi memory.total":
        return f"nvidia-smi memory.total {c.total_mib:.0f} MiB ({c.text!r}, line {c.line})"
    return f"{c.kind} {c.text!r} (line {c.line}){g}"


def _largest_free(m: Measurement) -> tuple[float, str] | None:
    """(the largest free MiB any phase of any rank shows, where): a lower bound on the capacity."""
    best: tuple[float, str] | None = None
    for r in m.ranks:
        for p in r.phases:
            for end, snap in (("begin", p.before), ("end", p.after)):
                if snap is not None and snap.free_mib is not None and (best is None or snap.free_mib > best[0]):
                    best = (snap.free_mib, f"{p.name} {end}, {r.label or 'untagged'}, line {p.line}")
    return best


def _first_load_free(m: Measurement) -> tuple[float, float | None, str] | None:
    """(free MiB at the first weight load, MiB NCCL init had used on that rank or None, how it was read)."""
    best: tuple[int, float, Rank, str] | None = None
    for r in m.ranks:
        for p in r.phases_named("weights"):
            line = p.line or 0
            if p.before is not None and p.before.free_mib is not None:
                cand = (line, p.before.free_mib, r, f"first avail mem {p.before.free_mib / MIB_PER_GIB:.2f} GiB")
            elif p.after is not None and p.after.free_mib is not None and p.usage_mib is not None:
                free = p.after.free_mib + p.usage_mib
                cand = (line, free, r, f"avail mem after weights + their mem usage {free / MIB_PER_GIB:.2f} GiB")
            else:
                continue
            if best is None or cand[0] < best[0]:
                best = cand
    if best is None:
        return None
    _, free, r, how = best
    init = r.phase("init_parallel")
    init_mib = init.usage_mib if init is not None else None
    if init_mib is not None:
        how = f"{how} + init {init_mib / MIB_PER_GIB:.2f} GiB"
    return free, init_mib, how


def args_of(run: _Run) -> tuple[dict[str, Any], str, list[str]]:
    """The run's args (server_args first, then command-only flags), their source, and notes."""
    notes: list[str] = []
    args: dict[str, Any] = {}
    source = "none"
    if run.server_args is not None:
        args.update(_copied(run.server_args.args))
        source = "server_args"
    if run.cmd is not None:
        extra = {k: v for k, v in _copied(run.cmd.args).items() if k not in args}
        if source == "server_args" and extra:
            notes.append(f"from the launch command (absent from server_args): {', '.join(sorted(extra))}")
        args.update(extra)
        if source == "none":
            source = "launch_command"
        if run.cmd.env:
            env = ", ".join(f"{k}={v}" for k, v in run.cmd.env.items())
            notes.append(f"launch environment: {env}")
        if run.cmd.leftovers:
            notes.append(f"launch command words not read as flags: {' '.join(run.cmd.leftovers)[:200]}")
    return args, source, notes


def _copied(args: dict[str, Any]) -> dict[str, Any]:
    """A copy the Measurement owns (the parsed args are cached and shared between runs)."""
    return {k: copy.deepcopy(v) if isinstance(v, list | dict | set) else v for k, v in args.items()}
