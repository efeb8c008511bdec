"""The probe's per-process recorder: phase stack, per-phase peaks, JSONL written and flushed per record.

One file per scheduler process (`probe-<pid>.jsonl`); a line is complete or absent, so a worker that
dies mid-capture leaves every finished phase plus a `begin` record naming the phase in flight.
Records (schema `v` 1): start, begin, end, ladder, runtime, error. Nested phases (the DeepEP buffer is
created inside warmup or capture) keep their parent's peak window intact: the parent's peak is the max
of what it saw before, inside and after the child.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from profiler.measurement import Snapshot
from profiler.probe.snapshot import Probe

RECORD_VERSION = 1


@dataclass
class _Frame:
    phase: str
    seq: int
    t0: float
    before: Snapshot
    peak_alloc: float = 0.0
    peak_reserved: float = 0.0
    peak_rss: float = 0.0
    min_free: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def absorb(self, s: Snapshot) -> None:
        """Fold a reading's peaks (and its free memory as a low-water mark) into this window."""
        self.peak_alloc = max(self.peak_alloc, s.torch_peak_allocated_mib or 0.0)
        self.peak_reserved = max(self.peak_reserved, s.torch_peak_reserved_mib or 0.0)
        self.peak_rss = max(self.peak_rss, s.rss_peak_mib or 0.0)
        if s.free_mib is not None:
            self.min_free = s.free_mib if self.min_free is None else min(self.min_free, s.free_mib)


class Recorder:
    """Writes one process's probe records. Thread-safe; never raises into the worker."""

    def __init__(self, out_dir: str, probe: Probe | None = None) -> None:
        os.makedirs(out_dir, exist_ok=True)
        self.pid = os.getpid()
        self.path = os.path.join(out_dir, f"probe-{self.pid}.jsonl")
        self._f = open(self.path, "a", buffering=1)  # noqa: SIM115  (lives as long as the process)
        self.probe = probe or Probe()
        self._stack: list[_Frame] = []
        self._seq = 0
        self._lock = threading.RLock()
        self.ranks: dict[str, int] = {}
        # runtime sampling state
        self._rt_base: Snapshot | None = None
        self._rt_peak: _Frame | None = None
        self._rt_last = 0.0
        self._rt_last_write = 0.0
        self._rt_batches = 0
        self.sample_interval_s = float(os.environ.get("MEMFRAC_PROBE_SAMPLE_S", "0.05"))
        self.self_s = 0.0  # time spent inside the probe itself (reported: it must stay ≪ startup time)
        self._rt_dirty = False
        self._rt_last_snap: Snapshot | None = None
        self._flusher: threading.Thread | None = None

    # ---- output -----------------------------------------------------------------------------------
    def write(self, rec: dict[str, Any]) -> None:
        rec.setdefault("v", RECORD_VERSION)
        rec.setdefault("pid", self.pid)
        rec.setdefault("t", time.time())
        if self.ranks:
            rec.setdefault("ranks", self.ranks)
        try:
            with self._lock:
                self._f.write(json.dumps(rec, default=str) + "\n")
                self._f.flush()
        except Exception as e:  # the probe must never take the worker down
            print(f"memfrac probe: cannot write {self.path}: {e}", file=sys.stderr)

    def error(self, message: str) -> None:
        self.write({"type": "error", "error": message})
        print(f"memfrac probe: {message}", file=sys.stderr, flush=True)

    # ---- phases -----------------------------------------------------------------------------------
    def begin(self, phase: str) -> _Frame:
        t = time.perf_counter()
        try:
            return self._begin(phase)
        finally:
            self.self_s += time.perf_counter() - t

    def end(self, fr: _Frame, error: BaseException | None = None) -> None:
        t = time.perf_counter()
        try:
            self._end(fr, error)
        finally:
            self.self_s += time.perf_counter() - t

    def _begin(self, phase: str) -> _Frame:
        with self._lock:
            if self._stack:  # the parent's window so far, before the child resets the peaks
                self._stack[-1].absorb(self.probe.snapshot())
            self.probe.reset_peaks()
            s = self.probe.snapshot()
            self._seq += 1
            fr = _Frame(phase, self._seq, time.time(), s)
            fr.absorb(s)
            parent = self._stack[-1].phase if self._stack else None
            self._stack.append(fr)
        self.write(
            {"type": "begin", "phase": phase, "seq": fr.seq, "parent": parent, "kind": s.kind, "snap": s.as_dict()}
        )
        return fr

    def _end(self, fr: _Frame, error: BaseException | None = None) -> None:
        t_end = time.perf_counter()
        with self._lock:
            s = self.probe.snapshot()
            fr.absorb(s)
            if self._stack and self._stack[-1] is fr:
                self._stack.pop()
            elif fr in self._stack:
                self._stack.remove(fr)
            if self._stack:  # the child's allocations also belong to the parent's window
                parent = self._stack[-1]
                parent.peak_alloc = max(parent.peak_alloc, fr.peak_alloc)
                parent.peak_reserved = max(parent.peak_reserved, fr.peak_reserved)
                parent.peak_rss = max(parent.peak_rss, fr.peak_rss)
                if fr.min_free is not None:
                    parent.min_free = fr.min_free if parent.min_free is None else min(parent.min_free, fr.min_free)
        peak = {
            "kind": s.kind,
            "torch_peak_allocated_mib": fr.peak_alloc if s.kind == "gpu" else None,
            "torch_peak_reserved_mib": fr.peak_reserved if s.kind == "gpu" else None,
            "rss_peak_mib": fr.peak_rss or None,
            "free_mib": fr.min_free,
        }
        self.write(
            {
                "type": "end",
                "phase": fr.phase,
                "seq": fr.seq,
                "kind": s.kind,
                "before": fr.before.as_dict(),
                "after": s.as_dict(),
                "peak": {k: v for k, v in peak.items() if v is not None},
                "elapsed_s": time.time() - fr.t0,
                "details": fr.details,
                "error": None if error is None else f"{type(error).__name__}: {error}"[:2000],
                "probe_self_s": self.self_s + (time.perf_counter() - t_end),
            }
        )

    def ladder(self, phase: str, bs: int) -> None:
        t = time.perf_counter()
        s = self.probe.snapshot()
        with self._lock:
            if self._stack:
                self._stack[-1].absorb(s)
        self.write({"type": "ladder", "phase": phase, "bs": bs, "kind": s.kind, "snap": s.as_dict()})
        self.self_s += time.perf_counter() - t

    # ---- runtime ----------------------------------------------------------------------------------
    def runtime_sample(self, force: bool = False) -> None:
        """Called after every scheduler batch; reads memory at most every `sample_interval_s`."""
        now = time.monotonic()
        self._rt_batches += 1
        if not force and now - self._rt_last < self.sample_interval_s:
            return
        self._rt_last = now
        t = time.perf_counter()
        try:
            self._sample(now, force)
        finally:
            self.self_s += time.perf_counter() - t

    def _sample(self, now: float, force: bool) -> None:
        with self._lock:
            if self._rt_base is None:  # the post-startup baseline: a fresh peak window starts here
                self.probe.reset_peaks()
                self._rt_base = self.probe.snapshot()
                self._rt_peak = _Frame("runtime", 0, time.time(), self._rt_base)
                self._rt_peak.absorb(self._rt_base)
                self._start_flusher()
                return
            s = self.probe.snapshot(nvml=False)  # never NVML on the scheduler thread per sample
            assert self._rt_peak is not None
            before = (self._rt_peak.peak_reserved, self._rt_peak.peak_rss, self._rt_peak.min_free)
            self._rt_peak.absorb(s)
            grew = before != (self._rt_peak.peak_reserved, self._rt_peak.peak_rss, self._rt_peak.min_free)
            self._rt_last_snap = s
            if force or (grew and now - self._rt_last_write > 1.0) or now - self._rt_last_write > 10.0:
                self._rt_last_write = now
                self._rt_dirty = False
                self._write_runtime(s)
            elif grew:
                self._rt_dirty = True  # the flusher writes it within half a second

    def _start_flusher(self) -> None:
        """A peak reached after the last write must not be lost when serving stops (no more batches)."""

        def loop() -> None:
            while True:
                time.sleep(0.5)
                with self._lock:
                    if self._rt_dirty and self._rt_last_snap is not None:
                        self._rt_dirty = False
                        self._rt_last_write = time.monotonic()
                        self._write_runtime(self._rt_last_snap)

        self._flusher = threading.Thread(target=loop, name="memfrac-probe-flush", daemon=True)
        self._flusher.start()

    def _write_runtime(self, last: Snapshot) -> None:
        fr = self._rt_peak
        if fr is None or self._rt_base is None:
            return
        self.write(
            {
                "type": "runtime",
                "kind": last.kind,
                "base": self._rt_base.as_dict(),
                "last": last.as_dict(),
                "peak": {
                    k: v
                    for k, v in {
                        "torch_peak_allocated_mib": fr.peak_alloc if last.kind == "gpu" else None,
                        "torch_peak_reserved_mib": fr.peak_reserved if last.kind == "gpu" else None,
                        "rss_peak_mib": fr.peak_rss or None,
                        "free_mib": fr.min_free,
                    }.items()
                    if v is not None
                },
                "batches": self._rt_batches,
                "probe_self_s": self.self_s,
            }
        )

    def flush_runtime(self) -> None:
        """Write the last runtime peak (at exit)."""
        if self._rt_base is not None:
            self.runtime_sample(force=True)
