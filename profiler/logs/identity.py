"""Which run a log shows: model, architecture, mode, parallelism, GPU, release — each with how we know.

Sources in order of trust: the `server_args=` repr, the launch command, then what the lines imply (rank
tags, "Load weight end. type=…", an OOM's "total capacity", the free memory at the first weight load).
Every inferred value is written down in `Measurement.notes`; a value nothing supports stays None.
"""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING, Any

from profiler.gpus import gpus_near_capacity
from profiler.measurement import Identity, Measurement, Rank

if TYPE_CHECKING:
    from profiler.logs.build import _Run

_VERSION = re.compile(r"\bsglang(?:==|\s+version:?\s*|:\s+)v?(\d+\.\d+\.\d+(?:\.post\d+|rc\d+|\.dev\d+)?)\b")
_TOTAL_NOTE = ("GPU total from the OOM message's 'total capacity' (torch's total: about 0.6% below "
               "nvidia-smi memory.total, which the heuristic uses)")  # fmt: skip


def find_version(text: str) -> str | None:
    """An sglang release printed in the log ("sglang==0.4.5", "sglang version: 0.5.23", "sglang: 0.4.5")."""
    m = _VERSION.search(text)
    return m.group(1) if m else None


def finalize_run(run: _Run) -> Measurement:
    """Turn a finished run into its Measurement: args, identity, ranks in order, run-level failure."""
    m = run.m
    m.args, m.args_source, notes = args_of(run)
    m.notes.extend(notes)
    m.ranks = sorted((rs.rank for rs in run.ranks.values()), key=_rank_order) or [Rank(label="")]
    m.first_line, m.last_line = run.first_line, run.last_line
    failed = [r.failure for r in m.ranks if r.failure is not None]
    m.failure = min(failed, key=lambda f: f.line or 0) if failed else None
    _identity(run, m)
    _mfs_origin(run, m)
    return m


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
    _gpu(m)


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


def _gpu(m: Measurement) -> None:
    ident = m.identity
    totals = [r.failure.total_capacity_mib for r in m.ranks if r.failure and r.failure.total_capacity_mib]
    if totals:
        ident.gpu_total_mib = totals[0]
        ident.gpu_total_how = "oom total capacity"
        fits = ", ".join(g.name for g in gpus_near_capacity(totals[0] / 1024)) or "none bundled"
        m.notes.append(f"{_TOTAL_NOTE}; GPUs of that size: {fits} (name not set from this)")
        return
    first = _first_load_free(m)
    if first is None:
        return
    free_gib = first / 1024
    cands = gpus_near_capacity(free_gib)
    if len(cands) == 1:
        g = cands[0]
        ident.gpu_name, ident.gpu_total_mib = g.name, float(g.total_mib)
        ident.gpu_total_how = f"first avail mem {free_gib:.2f} GiB ≈ {g.name}"
    elif cands:
        names = ", ".join(f"{g.name} ({g.total_mib} MiB)" for g in cands)
        m.notes.append(f"GPU not identified: first avail mem {free_gib:.2f} GiB fits several GPUs: {names}")
    else:
        m.notes.append(f"GPU not identified: no bundled GPU within 1.5 GiB above the first avail mem "
                       f"{free_gib:.2f} GiB")  # fmt: skip


def _first_load_free(m: Measurement) -> float | None:
    best: tuple[int, float] | None = None
    for r in m.ranks:
        for p in r.phases_named("weights"):
            if p.before is not None and p.before.free_mib is not None:
                cand = (p.line or 0, p.before.free_mib)
                if best is None or cand[0] < best[0]:
                    best = cand
    return None if best is None else best[1]


def _mfs_origin(run: _Run, m: Measurement) -> None:
    if run.cmd is not None:
        given = "mem_fraction_static" in run.cmd.args
        m.mfs_origin = "given" if given else "auto"
        m.notes.append("mem_fraction_static " + ("set on the launch command" if given else
                       "not on the launch command: chosen by sglang"))  # fmt: skip
    elif "mem_fraction_static" in m.args:
        m.notes.append("mem_fraction_static from server_args; whether the user set it is unknown (no command)")


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
