"""A short human summary of one run: status, phases, runtime peak, failure, where the artifacts are."""

from __future__ import annotations

from profiler.core import ui
from profiler.measure.runner.run import RunResult


def _f(x: float | None) -> str:
    return "—" if x is None else f"{x:,.1f}"


def render_run(res: RunResult) -> str:
    m = res.measurement
    unit = "MiB (host RSS)" if m.memory_kind == "host" else "MiB (GPU)"
    lines = [
        f"{res.scenario}: {res.status} on {res.device}" + (f", ready in {res.startup_s:.0f} s" if res.startup_s else "")
    ]
    if m.memory_kind == "host":
        lines.append("  host-memory measurement (no CUDA): numbers are the scheduler's RSS, not GPU memory")
    for r in m.ranks:
        rows = []
        for p in r.phases:
            peak = None
            if p.peak is not None:
                peak = p.peak.torch_peak_reserved_mib if m.memory_kind == "gpu" else p.peak.rss_mib
            el = f"{p.elapsed_s:.2f} s" if p.elapsed_s is not None else None
            rows.append([p.name, _f(p.used_mib), _f(peak), el, f"{len(p.ladder)} sizes" if p.ladder else ""])
        head = ["phase", f"used {unit}", "peak", "elapsed", "decode ladder"]
        title = f"rank {r.label or '(single)'} pid {r.pid}"
        lines.append(ui.table(head, rows, right=[False, True, True, True, False], title=title))
    for lr in res.load:
        lines.append(f"  load {lr.plan.kind}: {lr.ok}/{lr.plan.requests} ok, {lr.elapsed_s:.1f} s")
    if res.failure:
        f = res.failure
        lines.append(f"  FAILED: {f.kind}" + (f" in {f.phase}" if f.phase else "") + f": {f.message[:300]}")
    lines.append(f"  artifacts: {res.out_dir}")
    return "\n".join(lines)


def render_pair(pair: object) -> str:
    """A PD pair (a profiler.measure.runner.pair.PairResult): both workers' summaries, then the per-request proof
    of transfer (transfer.json)."""
    from typing import Any

    res: Any = pair
    lines = [f"pair {res.name}: {res.status}" + (f" — {res.failure}" if res.failure else "")]
    for side in (res.prefill, res.decode):
        if side is not None:
            lines.append(render_run(side))
    t = res.transfer or {}
    rows = [[r["rid"], r["kind"], r["tokens"], r.get("send_calls"), r.get("prefill_cached_tokens"),
             (r["send_sha256"] or "—")[:16], (r["recv_sha256"] or "—")[:16], "yes" if r["equal"] else "NO"]
            for r in t.get("requests", [])]  # fmt: skip
    lines.append(ui.table(["request", "kind", "KV tokens", "chunk sends", "prefill cached", "sha256 at send",
                           "sha256 at receive", "equal"], rows, title="KV transfer, per request"))  # fmt: skip
    ctl = [c for c in t.get("negative_control", []) if c["side"] == "decode"]
    kinds = ", ".join(t.get("kinds_proven", []))
    lines.append(f"  transfer proven for {t.get('proven')}/{t.get('of')} requests ({kinds}); "
                 f"negative control (warm-up / health checks to the fake host, rows never written on decode): "
                 f"{sum(1 for c in ctl if c['zero'])}/{len(ctl)} all zeros")  # fmt: skip
    lines.append(f"  artifacts: {res.out_dir} (pair.json, transfer.json, prefill/, decode/, router/)")
    return "\n".join(lines)
