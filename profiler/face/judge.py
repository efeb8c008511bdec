"""`memfrac judge PROBE_DIR --scenario FILE [--name NAME] [--json]`: re-judge a recorded run without a GPU.

Reads the probe JSONL a run left (its `raw/<run>/probe/` directory, the run directory above it, or any directory
of `probe-*.jsonl`) with the same reader, ledger and comparison a live run uses, against the reservation sglang
made for the scenario. Where the run directory holds `server_info.json`, the fraction the worker really used
comes from it (and a difference from memfrac's reconstruction is a finding in the reason). This is how an old
GPU recording is judged again after upgrading memfrac, and how every simulated worker life is checked from the
outside (tests/measure/test_probe_truth2.py).

Beside the probe files it reads what `memfrac run` stored: server_info.json (the worker's fraction and resolved
arguments, what it admits), load.json (what each burst of the load was meant to reach: profiler.analyse.load) and
run.json's failure (a worker that died keeps its recorded failure when re-judged). `--out R` stores the re-judged run
in a results directory, so `memfrac report R` and `memfrac gate R` work on it.

`--json`: one object — used_after_kv_mib, headroom_mib, recommended_mfs (and its basis), kv_pool_mib, kv_tokens,
verdict, reason, the load reached, terms [{term, reserved_mib, measured_mib, verdict}] and ledger {rank, lines:
[{name, mib}], headroom_mib}.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from profiler.core.errors import MemfracError


def probe_dir_of(path: str | Path) -> Path:
    """The directory holding the probe files: PATH itself, PATH/probe, or the one raw/<run>/probe under PATH."""
    p = Path(path)
    if not p.is_dir():
        raise MemfracError(f"{p}: no such directory (give a run's probe/ directory or a directory of probe-*.jsonl)")
    for d in (p, p / "probe"):
        if any(d.glob("probe-*.jsonl")):
            return d
    found = sorted({f.parent for f in p.glob("raw/*/probe/probe-*.jsonl")})
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise MemfracError(f"{p}: {len(found)} runs recorded ({', '.join(d.parent.name for d in found[:4])}…): "
                           "give one run's probe/ directory")  # fmt: skip
    raise MemfracError(f"{p}: no probe-*.jsonl in it, in {p / 'probe'} or under {p / 'raw'}/*/probe")


def measurement_of(probe_dir: Path, scenario: Any) -> Any:
    """The run's Measurement from its probe files (and /server_info beside them when it was stored)."""
    from profiler.core.measurement import Identity, Measurement
    from profiler.measure.probe.reader import read_probe_dir
    from profiler.model.scenario import scenario_dict

    run = read_probe_dir(probe_dir)
    if not run.ranks:
        raise MemfracError(f"{probe_dir}: the probe files hold no phase (nothing to judge)")
    info: dict[str, Any] | None = None
    si = probe_dir.parent / "server_info.json"
    if si.is_file():
        try:
            info = json.loads(si.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise MemfracError(f"{si}: not readable JSON ({e})") from None
    host = run.kind == "host"
    ident = Identity(
        model=scenario.model, architecture=scenario.shape.architecture,
        gpu_name="cpu" if host else (run.device_name or scenario.gpu.name),
        gpu_total_mib=None if host else (run.device_total_mib or float(scenario.gpu.total_mib)),
        gpu_total_how="host run: no GPU" if host else ("torch" if run.device_total_mib else "scenario"),
        mode=scenario.mode, tp=scenario.tp, pp=scenario.pp, dp=scenario.dp, attn_dp=scenario.attn_dp, ep=scenario.ep,
        sglang_version=run.sglang_version or (str(info["version"]) if info and info.get("version") else None),
    )  # fmt: skip
    args = {k: v for k, v in (info or {}).items() if isinstance(v, str | int | float | bool | type(None))}
    if info:
        from profiler.measure.runner.run import ready_phase

        run.ranks[0].phases.append(ready_phase(info))
    m = Measurement(
        id=f"{scenario.name}@{probe_dir}", source="probe", memory_kind="host" if host else "gpu",
        origin=str(probe_dir), scenario=scenario.name, identity=ident, args=args or scenario_dict(scenario),
        args_source="server_info" if info else "scenario",
        mfs_origin="given" if scenario.mem_fraction_static is not None else "auto", ranks=run.ranks,
    )  # fmt: skip
    if run.errors:
        m.notes.append("probe errors: " + "; ".join(run.errors))
    lj = probe_dir.parent / "load.json"
    if lj.is_file():  # what the driver meant each burst to reach (profiler.analyse.load)
        from profiler.measure.runner.load import serving_of

        try:
            load = json.loads(lj.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise MemfracError(f"{lj}: not readable JSON ({e})") from None
        if not isinstance(load, list):
            raise MemfracError(f"{lj}: expected a list of bursts (memfrac run's load.json), got {type(load).__name__}")
        m.serving.update(serving_of(load))
    m.failure = _recorded_failure(probe_dir.parent / "run.json")
    return m


def _recorded_failure(path: Path) -> Any:
    """The failure `memfrac run` recorded for the run (run.json), or None."""
    from dataclasses import fields

    from profiler.core.measurement import Failure

    if not path.is_file():
        return None
    try:
        f = json.loads(path.read_text()).get("failure")
    except (OSError, json.JSONDecodeError, AttributeError) as e:
        raise MemfracError(f"{path}: not a memfrac run.json ({e})") from None
    if not isinstance(f, dict) or not isinstance(f.get("kind"), str):
        return None
    names = {x.name for x in fields(Failure)}
    return Failure(**{k: v for k, v in f.items() if k in names})


def judge(path: str | Path, scenario: Any, out: str | Path | None = None) -> Any:
    """(Measurement, Comparison) of a recorded run against `scenario`'s reservation; stored in the results
    directory `out` when given."""
    from profiler.analyse.compare import compare, reservation_for

    probe_dir = probe_dir_of(path)
    m = measurement_of(probe_dir, scenario)
    res, notes = reservation_for(m, scenario)
    m.notes.extend(notes)
    c = compare(m, res)
    if out is not None:
        store_judged(out, m, c, scenario, res, probe_dir)
    return m, c


def store_judged(out: str | Path, m: Any, c: Any, scenario: Any, res: Any, probe_dir: Path) -> None:
    """One re-judged run into a results directory, as a sweep stores a run (its key: the scenario's name)."""
    from dataclasses import replace

    from profiler.results.store import Store
    from profiler.sweep.sweep import context_for, post_capture_columns

    rv = getattr(res, "resolved", None)
    ctx = context_for(scenario, getattr(rv, "decode_max_bs", None), getattr(rv, "chunked_prefill_size", None))
    st = Store(out)
    st.init()
    st.add([(m, c, replace(ctx, group=scenario.name, **post_capture_columns(scenario, c, res)))],
           run_key=scenario.name, status="ok" if m.failure is None else "failed",
           extra={"judged_from": str(probe_dir)})  # fmt: skip


def as_json(c: Any) -> dict[str, Any]:
    L = c.ledger
    return {
        "measurement_id": c.measurement_id,
        "used_after_kv_mib": c.used_after_kv_mib,
        "headroom_mib": c.headroom_mib,
        "recommended_mfs": c.recommended_mfs,
        "recommended_basis": c.recommended_basis,
        "mfs": c.mfs,
        "room_mib": c.room_mib,
        "request_pools_mib": c.request_pools_mib,
        "pending_mib": c.pending_mib,
        "load": list(c.load),
        "load_reached": c.load_reached,
        "kv_pool_mib": c.kv_pool_mib,
        "kv_tokens": c.kv_tokens,
        "kv_upper_bound_mib": c.kv_upper_bound_mib,
        "kv_upper_bound_tokens": c.kv_upper_bound_tokens,
        "verdict": c.verdict,
        "reason": c.reason,
        "terms": [{"term": t.term, "reserved_mib": t.reserved_mib, "measured_mib": t.measured_mib,
                   "verdict": t.verdict} for t in c.terms],
        "ledger": None if L is None else {
            "rank": L.rank, "lines": [{"name": x.name, "mib": x.mib, "how": x.how} for x in L.lines],
            "headroom_mib": L.headroom_mib, "residual_mib": L.residual_mib, "closes": L.closes,
        },
    }


def _mib(v: float | None) -> str:
    return "—" if v is None else f"{v:,.0f}"


def render(c: Any) -> str:
    from profiler.core import ui

    head = [
        f"verdict: {c.verdict} — {c.reason}",
        f"used after KV {_mib(c.used_after_kv_mib)} MiB · headroom {_mib(c.headroom_mib)} MiB · fraction "
        f"{c.mfs if c.mfs is not None else '—'} → recommended {c.recommended_mfs if c.recommended_mfs else '—'}"
        + (f" ({c.recommended_basis})" if c.recommended_basis else ""),
        *(f"load: {x}" for x in c.load),
        f"KV pool {_mib(c.kv_pool_mib)} MiB, {c.kv_tokens if c.kv_tokens is not None else '—'} tokens"
        + (f" (VA upper bound {_mib(c.kv_upper_bound_mib)} MiB, {c.kv_upper_bound_tokens} tokens)"
           if c.kv_upper_bound_mib is not None else ""),
    ]
    terms = ui.table(["term", "reserved MiB", "measured MiB", "verdict"],
                     [(t.term, _mib(t.reserved_mib), _mib(t.measured_mib), t.verdict) for t in c.terms],
                     title="reserved vs measured, per term")  # fmt: skip
    out = "\n".join(head) + "\n\n" + terms
    L = c.ledger
    if L is not None:
        rows = [(x.name, _mib(x.mib), x.how, x.source[:90]) for x in L.lines]
        closes = "closes" if L.closes else f"does not close by {_mib(L.residual_mib)} MiB"
        out += "\n\n" + ui.table(["line", "MiB", "how", "source"], rows,
                                 title=f"ledger of the judged rank {L.rank or '(single)'}: opening "
                                       f"{_mib(L.opening_mib)} MiB, {closes}")  # fmt: skip
    return out


def pick(path: str, name: str | None) -> Any:
    """The recorded scenario of `path` (`--name` picks one of several)."""
    from profiler.model.scenario import pick_scenario

    return pick_scenario(path, name, "--name", " (the one recorded)")


def cmd_judge(a: Any) -> int:
    s = pick(a.scenario, a.name)
    _, c = judge(a.probe_dir, s, out=a.out)
    print(json.dumps(as_json(c), indent=1, default=str) if a.json else render(c))
    if a.out and not a.json:
        print(f"stored in {a.out} (memfrac report {a.out}; memfrac gate {a.out})")
    return 0
