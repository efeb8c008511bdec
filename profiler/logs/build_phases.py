"""LogBuilder, phases: begin/end/note/ready lines into a rank's `Phase`s, and which model runner (target or
speculative draft) a repeated pool or load belongs to."""

from __future__ import annotations

from profiler.core.measurement import Phase, Snapshot
from profiler.logs.build_base import (
    GIB,
    RESOLUTION_MIB,
    BuilderState,
    _mib,
    _mib_key,
)
from profiler.logs.patterns import GRAPH_PHASES, Event
from profiler.logs.run import _RankState, _Run
from profiler.model.modelcfg import is_draft_architecture


class Phases(BuilderState):
    """Phase lines of one rank."""

    def _begin(self, rs: _RankState, lineno: int, t: float | None, ev: Event) -> None:
        name = ev.phase or "runtime"
        rank = rs.rank
        if name == "weights" and rank.phase("weights") is not None:
            # A second load in one run (memory did not come back: `_memory_back`): the speculative draft model
            # (eagle_worker / DSPARK build a second ModelRunner that loads into what the target left).
            ev = ev._replace(details={**(ev.details or {}), "load_index": len(rank.phases_named("weights")) + 1,
                                      "role": "draft"})  # fmt: skip
            self._run.m.notes.append(
                f"line {lineno}: second weight load on rank '{rank.label}' in one run, with no more memory free "
                "than the target left: read as the speculative draft model's (role draft)"
            )
        if name == "init_parallel" and rank.phase("init_parallel") is not None:
            ev = ev._replace(details={**(ev.details or {}), "role": "draft"})
            self._run.m.notes.append(f"line {lineno}: torch distributed initialised again on rank '{rank.label}' "
                                     "after its pool ended, before the server was ready: the speculative draft "
                                     "model runner's (role draft)")  # fmt: skip
        if name == "decode_graph" and _draft_capture(rs):
            self._run.m.notes.append(
                f"line {lineno}: a capture on rank '{rank.label}' after the draft model's weights loaded and the "
                "target's capture ended: the draft model's graph"
            )
            ev = ev._replace(details={**(ev.details or {}), "role": "draft"})  # its end line closes it (open[name])
        ph = Phase(name=name, before=Snapshot(t=t, free_mib=_mib(ev.free)), line=lineno)
        if name in GRAPH_PHASES and ev.free is not None:
            ph.details["begin_avail_mib"] = ev.free * GIB  # the capture-begin line's own reading
        rank.phases.append(ph)
        rs.open[name] = ph
        self._apply(ph, ev)
        if ev.details and "bs_list" in ev.details:
            ph.details["bs_list_line"] = lineno

    def _end(self, rs: _RankState, lineno: int, t: float | None, ev: Event) -> None:
        name = ev.phase or "runtime"
        ph = rs.open.pop(name, None)
        if ph is None:
            ph = Phase(name=name, line=lineno)
            if _draft_repeat(rs, name):
                ph.details["role"] = "draft"
                self._run.m.notes.append(f"line {lineno}: a second '{name}' end on rank '{rs.rank.label}' with "
                                         "none open: the draft model runner's (role draft)")  # fmt: skip
            rs.rank.phases.append(ph)
        arch = (ev.details or {}).get("architecture")
        if name == "weights" and arch and is_draft_architecture(arch) and ph.role != "draft":
            # The load's own type names a draft head (sglang renames a draft's architecture: DeepseekV3ForCausalLM
            # -> ...NextN; sglang-30609 prints only the draft's load): the draft's weights, whatever came before.
            ph.details["role"] = "draft"
            self._run.m.notes.append(f"line {lineno}: weight load on rank '{rs.rank.label}' of type {arch}, "
                                     "a speculative draft architecture: the draft's weights (role draft)")  # fmt: skip
        ph.after = Snapshot(t=t, free_mib=_mib(ev.free))
        if ev.usage is not None:
            ph.usage_mib = ev.usage * GIB
        if ev.elapsed is not None:
            ph.elapsed_s = ev.elapsed
        self._apply(ph, ev)
        if ev.details and "bs_list" in ev.details:
            ph.details["bs_list_line"] = lineno

    def _note(self, rs: _RankState, lineno: int, t: float | None, ev: Event) -> None:
        name = ev.phase or "runtime"
        ph = rs.open.get(name)
        d = ev.details or {}
        if ph is None:
            last = rs.rank.phases[-1] if rs.rank.phases else None
            ended = _ended(rs, name)
            if last is not None and last.name == name and not _pool_after_pool(last, ev):
                ph = last
            elif name == "kv_pool" and _draft_pool(rs, ev):
                # The draft model runner's pool: its weights loaded after the target's pool ended (eagle /
                # DSPARK build a second ModelRunner); the target's pool and its end reading stay as they are.
                ph = Phase(name=name, line=lineno, details={"role": "draft"})
                self._run.m.notes.append(f"line {lineno}: a KV pool on rank '{rs.rank.label}' after the draft "
                                         "model's weights loaded: the draft model's (role draft)")  # fmt: skip
                rs.rank.phases.append(ph)
                rs.open[name] = ph
            elif ended is not None and ev.kind == "note":
                ph = ended  # a note on a phase that already ended (a capture began since): it keeps its readings
            else:
                ph = Phase(name=name, line=lineno)
                if last is not None and _pool_after_pool(last, ev):
                    # "KV Cache is allocated" again after the rank's pool ended ("Memory pool end"): the draft
                    # model runner's own pool (club-3090-1261: target K=V 3.46 GB, then draft K=V 1.08 GB)
                    ph.details["role"] = "draft"
                    self._run.m.notes.append(f"line {lineno}: a second KV pool on rank '{rs.rank.label}' after its "
                                             "pool ended: the draft model's (role draft)")  # fmt: skip
                rs.rank.phases.append(ph)
                rs.open[name] = ph
        if ev.kind == "kv" and _second_pool(ph, d):
            # A second "KV Cache is allocated" on one rank (hybrid SWA models allocate a full and a window
            # pool): kept beside the first, summed where the budget is read, never overwriting it.
            k, v, kv = d.get("k_gib"), d.get("v_gib"), d.get("kv_gib")
            mib = ((k or 0.0) + (v or 0.0) + (kv or 0.0)) * GIB
            ph.details.setdefault("extra_pools", []).append(
                {"line": lineno, "kv_tokens": d.get("kv_tokens"), "mib": mib, "k_mib": _mib(k), "v_mib": _mib(v),
                 "kv_mib": _mib(kv)}
            )  # fmt: skip
            return
        self._apply(ph, ev)
        if "bs_list" in d:
            ph.details["bs_list_line"] = lineno
        if "pre_model_load_gib" in d:
            base = rs.rank.phase("baseline")
            if base is None:
                base = Phase(name="baseline", line=lineno)
                rs.rank.phases.insert(max(0, len(rs.rank.phases) - 1), base)
            base.details["pre_model_load_mib"] = d["pre_model_load_gib"] * GIB
            base.resolution_mib = RESOLUTION_MIB
        if "free_after_weights_gib" in d and ph.before is None:
            ph.before = Snapshot(t=t, free_mib=d["free_after_weights_gib"] * GIB)

    def _ready(self, rs: _RankState, lineno: int, t: float | None, ev: Event) -> None:
        ph = Phase(name="ready", after=Snapshot(t=t, free_mib=_mib(ev.free)), line=lineno)
        rs.rank.phases.append(ph)
        self._apply(ph, ev)
        if ev.free is not None:
            key = "available_cpu_mem_mib" if (ev.details or {}).get("host") else "available_gpu_mem_mib"
            ph.details.pop("host", None)
            ph.details[key] = ev.free * GIB
            if key == "available_cpu_mem_mib":
                self._run.m.memory_kind = "host"
        if self._run.ready_line is None:
            self._run.ready_line = lineno

    @staticmethod
    def _apply(ph: Phase, ev: Event) -> None:
        if ev.free is not None or ev.usage is not None:
            ph.resolution_mib = RESOLUTION_MIB
        d = ev.details
        if not d:
            return
        if "label" in d:  # a labelled extra pool (e.g. an index cache): kept apart from the main K/V
            extra = {_mib_key(k): v * GIB if k.endswith("_gib") else v for k, v in d.items() if k != "label"}
            ph.details.setdefault("labelled_pools", []).append({"label": d["label"], **extra})
            return
        for k, v in d.items():
            if k.endswith("_gib"):
                if k in ("pre_model_load_gib", "free_after_weights_gib"):
                    continue  # placed on the baseline phase / as the pool's before (see _note)
                ph.details[_mib_key(k)] = v * GIB
                ph.resolution_mib = RESOLUTION_MIB
            else:
                ph.details[k] = list(v) if isinstance(v, list) else v


def _draft_init(run: _Run, rs: _RankState) -> bool:
    """ "Init torch distributed" again on a rank whose pool (or capture) ended, before the server was ready and with
    nothing failed: the speculative draft ModelRunner initialising (eagle_worker builds it after the target's).
    A new process would show itself at its weight load (memory back: build_runs._memory_back) or its timestamps."""
    phases = [p for p in rs.rank.phases if p.name not in ("baseline",)]
    if run.ready_line is not None or rs.fs is not None or not phases or rs.rank.phase("weights", "draft") is not None:
        return False
    last = phases[-1]
    return (last.name == "kv_pool" or last.name in GRAPH_PHASES) and (
        last.after is not None or last.elapsed_s is not None
    )


def _draft_capture(rs: _RankState) -> bool:
    """A plain capture begin after the target's decode capture ended and the draft's weights loaded after it: the
    draft model runner capturing its own graphs (older eagle workers print the same begin line)."""
    rank = rs.rank
    draft_w = rank.phase("weights", "draft")
    if draft_w is None:
        return False
    done = [p for p in rank.phases_named("decode_graph") if p.after is not None or p.elapsed_s is not None]
    return bool(done) and (done[-1].line or 0) < (draft_w.line or 0) and rank.phase("decode_graph", "draft") is None


def _ended(rs: _RankState, name: str) -> Phase | None:
    """The rank's last phase of `name` (either role) when it has ended, else None."""
    for p in reversed(rs.rank.phases):
        if p.name == name:
            return p if p.after is not None else None
    return None


def _draft_pool(rs: _RankState, ev: Event) -> bool:
    """A K/V allocation after the draft model's weights loaded, on a rank whose target pool ended and that has no
    draft pool yet: the draft model runner's pool."""
    d = ev.details or {}
    if ev.kind != "kv" or d.get("label") or d.get("va_upper_bound"):
        return False
    rank = rs.rank
    draft_w, target = rank.phase("weights", "draft"), rank.phase("kv_pool")
    return (draft_w is not None and target is not None and target.after is not None
            and (target.line or 0) < (draft_w.line or 0) and rank.phase("kv_pool", "draft") is None)  # fmt: skip


def _pool_after_pool(last: Phase, ev: Event) -> bool:
    """A K/V allocation line after the rank's target pool ended: another model runner's pool (the draft's)."""
    d = ev.details or {}
    return (
        ev.kind == "kv"
        and last.name == "kv_pool"
        and last.role == "target"
        and last.after is not None
        and not d.get("label")
        and not d.get("va_upper_bound")
        and "kv_tokens" in d
        and any(k in d for k in ("k_gib", "v_gib", "kv_gib"))
    )


def _draft_repeat(rs: _RankState, name: str) -> bool:
    """An end line with no phase open, on a rank whose draft weights loaded and whose target `name` ended: the
    draft's repeat of it (DSPARK prints 'Memory pool end' once per model runner)."""
    if name not in ("kv_pool", "weights"):
        return False
    rank = rs.rank
    if name == "weights":
        done = rank.phase("weights")
        return done is not None and done.after is not None and rank.phase("weights", "draft") is None
    target = rank.phase("kv_pool")
    return (rank.phase("weights", "draft") is not None and target is not None and target.after is not None
            and rank.phase("kv_pool", "draft") is None)  # fmt: skip


def _second_pool(ph: Phase, d: dict) -> bool:
    """True when `d` is another allocated K/V pool for a pool phase that already has one."""
    if d.get("label") or d.get("va_upper_bound") or not any(k in d for k in ("k_gib", "v_gib", "kv_gib")):
        return False
    return any(k in ph.details for k in ("k_mib", "v_mib", "kv_mib")) and "va_upper_bound" not in ph.details
