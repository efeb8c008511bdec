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

from profiler.measurement import LadderPoint, Phase, Rank, Snapshot


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
    if before is None or after is None:
        return None
    if before.free_mib is not None and after.free_mib is not None:
        return before.free_mib - after.free_mib
    if before.rss_mib is not None and after.rss_mib is not None:
        return after.rss_mib - before.rss_mib
    return None


def read_file(path: Path, run: ProbeRun) -> Rank:
    """One process's records → a Rank (phases ordered by when they began)."""
    begins: dict[int, dict[str, Any]] = {}
    ends: dict[int, dict[str, Any]] = {}
    ladders: list[dict[str, Any]] = []
    runtime: dict[str, Any] | None = None
    ranks: dict[str, int] = {}
    pid = None
    with open(path, errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                run.bad_lines += 1  # a half-written last line after a crash
                continue
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
            elif t == "error":
                run.errors.append(str(rec.get("error")))
    kind = run.kind or "gpu"
    label = rank_label(ranks, run.sizes)
    rank = Rank(label=label, tp=ranks.get("tp"), dp=ranks.get("dp"), pp=ranks.get("pp"), ep=ranks.get("ep"), pid=pid)
    for seq in sorted(begins):
        b = begins[seq]
        e = ends.get(seq)
        if e is None:
            run.in_flight[label] = b["phase"]
            rank.phases.append(
                Phase(b["phase"], source="probe", before=_snap(b.get("snap"), kind), details={"in_flight": True})
            )
            continue
        before, after = _snap(e.get("before"), kind), _snap(e.get("after"), kind)
        details = dict(e.get("details") or {})
        if e.get("error"):
            details["error"] = e["error"]
        if b.get("parent"):
            details["parent"] = b["parent"]
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
        if ph.name == "decode_graph":
            ph.ladder = _ladder(ladders, before)
        rank.phases.append(ph)
    if runtime is not None:
        base, peak = _snap(runtime.get("base"), kind), _snap(runtime.get("peak"), kind)
        usage = None
        if base is not None and peak is not None:
            if base.free_mib is not None and peak.free_mib is not None:
                usage = base.free_mib - peak.free_mib
            elif base.rss_mib is not None and peak.rss_mib is not None:
                usage = peak.rss_mib - base.rss_mib
        rank.phases.append(
            Phase("runtime", source="probe", before=base, peak=peak, usage_mib=usage,
                  details={"batches": runtime.get("batches")})
        )  # fmt: skip
    return rank


def _ladder(recs: list[dict[str, Any]], before: Snapshot | None) -> list[LadderPoint]:
    """Per batch size: memory right after its capture (the last reading when a size has variants)."""
    by_bs: dict[int, LadderPoint] = {}
    for r in recs:
        s = r.get("snap") or {}
        free = s.get("free_mib")
        used = None
        if before is not None and before.free_mib is not None and free is not None:
            used = before.free_mib - free
        elif before is not None and before.rss_mib is not None and s.get("rss_mib") is not None:
            used = s["rss_mib"] - before.rss_mib
        by_bs[int(r["bs"])] = LadderPoint(
            bs=int(r["bs"]), free_mib=free, used_mib=used, torch_reserved_mib=s.get("torch_reserved_mib")
        )
    return list(by_bs.values())


def read_probe_dir(d: str | Path) -> ProbeRun:
    """All `probe-*.jsonl` of a worker, one Rank each, ordered by rank label."""
    run = ProbeRun()
    files = sorted(Path(d).glob("probe-*.jsonl"))
    run.ranks = [read_file(p, run) for p in files]
    run.ranks.sort(key=lambda r: (r.dp or 0, r.pp or 0, r.tp or 0, r.pid or 0))
    return run
