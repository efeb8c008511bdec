"""Read the probe's JSONL files back into `Measurement` ranks (tolerating a crash mid-write).

Usage per phase is the driver delta on a GPU (free before − free after: every allocation, torch's or
not) and the RSS delta on the host. A `begin` without its `end` is the phase that was in flight when
the worker died.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from profiler.core.errors import FieldError
from profiler.core.measurement import LadderPoint, Phase, Rank, Snapshot
from profiler.core.validate import gpu_mib, in_range


@dataclass
class ProbeRun:
    """Everything the probe wrote for one worker."""

    ranks: list[Rank] = field(default_factory=list)
    kind: str | None = None  # "gpu" | "host"
    starts: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    in_flight: dict[str, str] = field(default_factory=dict)  # rank label → phase that never ended
    bad_lines: int = 0
    device_name: str | None = None
    device_total_mib: float | None = None
    sizes: dict[str, int] = field(default_factory=dict)
    hooks_unapplied: list[str] = field(default_factory=list)  # targets the HookRegistry did not patch

    @property
    def sglang_version(self) -> str | None:
        for s in self.starts:
            if s.get("sglang_version"):
                return str(s["sglang_version"])
        return None


_SNAP_FIELDS = frozenset(f.name for f in fields(Snapshot))


def _snap(d: dict[str, Any] | None, kind: str) -> Snapshot | None:
    """A recorded reading; in a peak record the high-water RSS stands for the RSS (it is the peak)."""
    if not d:
        return None
    kw = {k: v for k, v in d.items() if k in _SNAP_FIELDS}
    kw["kind"] = "host" if kind == "host" else "gpu"
    if "rss_mib" not in kw and kw.get("rss_peak_mib") is not None:
        kw["rss_mib"] = kw["rss_peak_mib"]
    return Snapshot(**kw)


_SNAP_NUMBERS = tuple(sorted(_SNAP_FIELDS - {"kind", "device"}))
_SNAP_KEYS = ("snap", "before", "after", "peak", "base", "last")
_TYPES = ("start", "begin", "end", "ladder", "runtime", "hooks", "error")


def check_record(rec: Any, path: Path, lineno: int) -> None:
    """One well-formed JSON line of a probe file, checked before anything reads it: the fields the reader uses
    have their types, every memory reading is a finite number ≥ 0 (t: finite). A record of another shape is one
    line naming the file, the line, the field and the bad value (a half-written last line is no record: skipped)."""
    where = f"line {lineno}"
    if not isinstance(rec, dict):
        raise FieldError(path, where, rec, "a JSON object (a probe record)")
    t = rec.get("type")
    if t is not None and not isinstance(t, str):  # a type this reader does not know is skipped, as before
        raise FieldError(path, f"{where}: type", t, "a record type: " + " | ".join(_TYPES))
    if rec.get("kind") is not None and rec["kind"] not in ("gpu", "host"):
        raise FieldError(path, f"{where}: kind", rec["kind"], "gpu | host")
    if rec.get("pid") is not None:
        in_range(path, f"{where}: pid", rec["pid"], 0)
    ranks = rec.get("ranks")
    if ranks is not None and (not isinstance(ranks, dict) or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in ranks.values())):  # fmt: skip
        raise FieldError(path, f"{where}: ranks", ranks, 'an object of ranks ≥ 0, e.g. {"tp": 0}')
    if t in ("begin", "end"):
        if isinstance(rec.get("seq"), bool) or not isinstance(rec.get("seq"), int) or rec["seq"] < 0:
            raise FieldError(path, f"{where}: seq", rec.get("seq"), "an integer ≥ 0 (the window's number)")
        if not isinstance(rec.get("phase"), str) or not rec["phase"]:
            raise FieldError(path, f"{where}: phase", rec.get("phase"), "a phase name (a non-empty string)")
    if t == "ladder":
        if isinstance(rec.get("bs"), bool) or not isinstance(rec.get("bs"), int) or rec["bs"] < 1:
            raise FieldError(path, f"{where}: bs", rec.get("bs"), "an integer ≥ 1 (the captured batch size)")
        if rec.get("seq") is not None and (isinstance(rec["seq"], bool) or not isinstance(rec["seq"], int)):
            raise FieldError(path, f"{where}: seq", rec["seq"], "an integer ≥ 0 (the capture window's number)")
    for key in ("t", "elapsed_s", "parent_seq"):
        if rec.get(key) is not None:
            in_range(path, f"{where}: {key}", rec[key], 0 if key != "t" else None)
    for key in ("role", "parent", "phase"):
        if rec.get(key) is not None and not isinstance(rec[key], str):
            raise FieldError(path, f"{where}: {key}", rec[key], "a string")
    for key in ("details", "applied"):
        if rec.get(key) is not None and not isinstance(rec[key], dict):
            raise FieldError(path, f"{where}: {key}", rec[key], "a JSON object")
    if rec.get("required") is not None and not isinstance(rec["required"], list):
        raise FieldError(path, f"{where}: required", rec["required"], "a list of hook targets")
    for key in _SNAP_KEYS:
        snap = rec.get(key)
        if snap is None:
            continue
        if not isinstance(snap, dict):
            raise FieldError(path, f"{where}: {key}", snap, "a memory reading (a JSON object)")
        for name in _SNAP_NUMBERS:
            if snap.get(name) is not None:
                lo = None if name == "t" else 0
                in_range(path, f"{where}: {key}.{name}", snap[name], lo, None, "" if name == "t" else "MiB")
        if snap.get("device") is not None and (isinstance(snap["device"], bool) or not isinstance(snap["device"], int)):
            raise FieldError(path, f"{where}: {key}.device", snap["device"], "a CUDA device index (an integer)")
    det = rec.get("details") or {}
    if det.get("sizes") is not None and (not isinstance(det["sizes"], dict) or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in det["sizes"].values())):  # fmt: skip
        raise FieldError(path, f"{where}: details.sizes", det["sizes"], 'an object of sizes ≥ 1, e.g. {"tp": 2}')
    if det.get("device_total_mib") is not None:
        gpu_mib(path, f"{where}: details.device_total_mib", det["device_total_mib"])


def rank_label(ranks: dict[str, int], sizes: dict[str, int]) -> str:
    """sglang's log prefix style: "TP0", "DP1 TP1 EP1", "PP1 TP0"; parts only where the size is > 1."""
    parts = []
    if sizes.get("dp", 1) > 1 and "dp" in ranks:
        parts.append(f"DP{ranks['dp']}")
    if sizes.get("pp", 1) > 1 and "pp" in ranks:
        parts.append(f"PP{ranks['pp']}")
    if "tp" in ranks:
        parts.append(f"TP{ranks['tp']}")
    if sizes.get("ep", 1) > 1 and "ep" in ranks:
        parts.append(f"EP{ranks['ep']}")
    return " ".join(parts)


def _usage(before: Snapshot | None, after: Snapshot | None) -> float | None:
    """The window's usage in its memory kind (driver on a GPU, RSS on the host); None across kinds — e.g.
    init_parallel begins before CUDA exists (no driver reading) and ends with one."""
    if before is None or after is None:
        return None
    return (after - before).used_mib


def read_file(path: Path, run: ProbeRun) -> Rank | None:
    """One process's records → a Rank (phases ordered by when they began); None when the process ran no
    phase (sglang's DP controller loads plugins too; older probes left an empty file for it)."""
    begins: dict[int, dict[str, Any]] = {}
    ends: dict[int, dict[str, Any]] = {}
    ladders: list[dict[str, Any]] = []
    runtime: dict[str, Any] | None = None
    ranks: dict[str, int] = {}
    pid = None
    with open(path, errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                run.bad_lines += 1  # a half-written last line after a crash
                continue
            check_record(rec, path, lineno)
            pid = rec.get("pid", pid)
            ranks = rec.get("ranks") or ranks
            t = rec.get("type")
            if rec.get("kind") and run.kind is None:
                run.kind = rec["kind"]
            if t == "start":
                run.starts.append(rec)
            elif t == "begin":
                begins[rec["seq"]] = rec
            elif t == "end":
                ends[rec["seq"]] = rec
                det = rec.get("details") or {}
                if det.get("sizes"):
                    run.sizes = det["sizes"]
                if det.get("device_name"):
                    run.device_name = det["device_name"]
                    run.device_total_mib = det.get("device_total_mib")
            elif t == "ladder":
                ladders.append(rec)
            elif t == "runtime":
                runtime = rec
            elif t == "hooks":
                applied = rec.get("applied") or {}
                for path in rec.get("required") or []:
                    if applied.get(path) is False:
                        run.errors.append(f"sglang's HookRegistry did not apply the hook on {path}: its phase "
                                          "would go unmeasured")  # fmt: skip
                run.hooks_unapplied += [k for k, v in applied.items() if v is False]
            elif t == "error":
                run.errors.append(str(rec.get("error")))
    if not begins and runtime is None:
        return None
    kind = run.kind or "gpu"
    label = rank_label(ranks, run.sizes)
    rank = Rank(label=label, tp=ranks.get("tp"), dp=ranks.get("dp"), pp=ranks.get("pp"), ep=ranks.get("ep"), pid=pid)
    rungs = _rungs_by_seq(ladders, begins, ends)
    for seq in sorted(begins):
        b = begins[seq]
        e = ends.get(seq)
        details: dict[str, Any] = {"seq": seq}
        if b.get("role") and b["role"] != "target":
            details["role"] = b["role"]
        if b.get("parent"):
            details["parent"] = b["parent"]
            if b.get("parent_seq") is not None:
                details["parent_seq"] = b["parent_seq"]
        if e is None:
            run.in_flight[label] = b["phase"]
            details["in_flight"] = True
            rank.phases.append(Phase(b["phase"], source="probe", before=_snap(b.get("snap"), kind), details=details))
            continue
        before, after = _snap(e.get("before"), kind), _snap(e.get("after"), kind)
        details.update(e.get("details") or {})
        if e.get("error"):
            details["error"] = e["error"]
        ph = Phase(
            e["phase"],
            source="probe",
            before=before,
            after=after,
            peak=_snap(e.get("peak"), kind),
            usage_mib=_usage(before, after),
            elapsed_s=e.get("elapsed_s"),
            details=details,
        )
        ph.ladder = _ladder(rungs.get(seq, []), before, _nested_ends(seq, begins, ends, kind))
        rank.phases.append(ph)
    if runtime is not None:
        base_t = (runtime.get("base") or {}).get("t")
        if isinstance(base_t, int | float):  # windows that began while serving are inside the runtime window
            for ph in rank.phases:
                t0 = (begins[ph.details["seq"]].get("snap") or {}).get("t")  # same clock as the base snapshot
                if not ph.details.get("parent") and isinstance(t0, int | float) and t0 > base_t:
                    ph.details["parent"] = "runtime"
        base, peak = _snap(runtime.get("base"), kind), _snap(runtime.get("peak"), kind)
        last = _snap(runtime.get("last"), kind)
        details = {"batches": runtime.get("batches"), **(runtime.get("details") or {})}
        rank.phases.append(
            Phase("runtime", source="probe", before=base, after=last, peak=peak, usage_mib=_usage(base, peak),
                  details=details)
        )  # fmt: skip
    return rank


def _rungs_by_seq(
    ladders: list[dict[str, Any]], begins: dict[int, dict[str, Any]], ends: dict[int, dict[str, Any]]
) -> dict[int, list[dict[str, Any]]]:
    """Ladder records per capture phase: by the `seq` they carry (v2), else (v1) by the time window of the
    innermost phase of their name that was open when they were written."""
    out: dict[int, list[dict[str, Any]]] = {}
    for r in ladders:
        seq = r.get("seq")
        if seq is None:
            t = r.get("t", 0.0)
            cands = [
                s for s, b in begins.items()
                if b["phase"] == r.get("phase") and b.get("t", 0.0) <= t <= ends.get(s, {}).get("t", float("inf"))
            ]  # fmt: skip
            seq = max(cands) if cands else None
        if seq is not None:
            out.setdefault(int(seq), []).append(r)
    return out


def _nested_ends(
    seq: int, begins: dict[int, dict[str, Any]], ends: dict[int, dict[str, Any]], kind: str
) -> list[tuple[float, float]]:
    """(end time, usage) of every window nested directly in window `seq` (the DeepEP buffer that the first MoE
    dispatch creates inside the largest-bs capture, deepep.py get_deepep_buffer)."""
    out = []
    for s, b in begins.items():
        e = ends.get(s)
        if b.get("parent_seq") != seq or e is None:
            continue
        cb, ca = _snap(e.get("before"), kind), _snap(e.get("after"), kind)
        used = _usage(cb, ca)
        t = (e.get("after") or {}).get("t", e.get("t"))
        if used is not None and isinstance(t, int | float):
            out.append((float(t), used))
    return out


def _ladder(
    recs: list[dict[str, Any]], before: Snapshot | None, nested: list[tuple[float, float]] | None = None
) -> list[LadderPoint]:
    """Per batch size, in capture order (sglang captures the largest first: `reversed(self.capture_bs)`,
    decode_cuda_graph_runner.py): memory right after its capture, cumulative since the phase began (the
    last reading when a size has variants — lora / attention variants capture one shape several times),
    less the windows nested in the capture that ended before the rung's reading: they are another line's
    memory (an all-to-all buffer), not the graph's — scaled with the rungs they made `derive_variant` charge a
    capped ladder for a buffer it does not scale with."""
    by_bs: dict[int, LadderPoint] = {}
    for r in recs:
        s = _snap(r.get("snap"), "host" if r.get("kind") == "host" else "gpu")
        used = None if before is None or s is None else (s - before).used_mib
        if used is not None and nested and s is not None and s.t is not None:
            used -= sum(u for t, u in nested if t <= s.t)
        bs = int(r["bs"])
        by_bs.pop(bs, None)  # keep capture order of the last reading
        by_bs[bs] = LadderPoint(
            bs=bs,
            free_mib=s.free_mib if s else None,
            used_mib=used,
            torch_reserved_mib=s.torch_reserved_mib if s else None,
        )
    return list(by_bs.values())


def read_probe_dir(d: str | Path) -> ProbeRun:
    """All `probe-*.jsonl` of a worker, one Rank each, ordered by rank label."""
    run = ProbeRun()
    files = sorted(Path(d).glob("probe-*.jsonl"))
    run.ranks = [r for r in (read_file(p, run) for p in files) if r is not None]
    run.ranks.sort(key=lambda r: (r.dp or 0, r.pp or 0, r.tp or 0, r.pid or 0))
    return run
