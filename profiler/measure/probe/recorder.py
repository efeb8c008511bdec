"""The probe's per-process recorder: phase stack, per-phase peaks, JSONL written and flushed per record.

One file per scheduler process (`probe-<pid>.jsonl`), opened on the first record a hook writes — not when
the plugin loads: sglang's DP controller imports the scheduler module and loads plugins too
(`data_parallel_controller.py`) but runs no phase, so it must leave no file. A line is complete or absent,
so a worker that dies mid-capture leaves every finished phase plus a `begin` record naming the phase in flight.

Records (schema `v` 2): start, begin, end, ladder, runtime, error. `begin`/`end` carry the phase's `role`
(target | draft) and its parent; `ladder` carries the `seq` of the capture it belongs to. Nested phases (the
DeepEP buffer is created inside warmup or capture) keep their parent's peak window intact: the parent's peak
is the max of what it saw before, inside and after the child. A peak reset that sglang itself makes
(`GraphPoolPrecarve.measure`, dflash's sampling prewarm) would clobber every open window: the recorder folds
the current peaks into them first and counts the reset in the phase's details.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from profiler.core.measurement import Snapshot
from profiler.measure.probe.snapshot import Probe

RECORD_VERSION = 2


@dataclass
class _Frame:
    phase: str
    seq: int
    t0: float
    before: Snapshot
    role: str = "target"
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

    def absorb_frame(self, child: _Frame) -> None:
        """A child's window lies inside this one: its peaks are this window's too."""
        self.peak_alloc = max(self.peak_alloc, child.peak_alloc)
        self.peak_reserved = max(self.peak_reserved, child.peak_reserved)
        self.peak_rss = max(self.peak_rss, child.peak_rss)
        if child.min_free is not None:
            self.min_free = child.min_free if self.min_free is None else min(self.min_free, child.min_free)

    def peak_record(self, kind: str) -> dict[str, Any]:
        peak = {
            "torch_peak_allocated_mib": self.peak_alloc if kind == "gpu" else None,
            "torch_peak_reserved_mib": self.peak_reserved if kind == "gpu" else None,
            "rss_peak_mib": self.peak_rss or None,
            "free_mib": self.min_free,
        }
        return {k: v for k, v in peak.items() if v is not None}


class Recorder:
    """Writes one process's probe records. Thread-safe; never raises into the worker."""

    def __init__(self, out_dir: str, probe: Probe | None = None) -> None:
        self.out_dir = out_dir
        self.pid = os.getpid()
        self.path = os.path.join(out_dir, f"probe-{self.pid}.jsonl")
        self._f: Any = None
        self.probe = probe or Probe()
        self._stack: list[_Frame] = []
        self._seq = 0
        self._lock = threading.RLock()
        self.ranks: dict[str, int] = {}
        self.start_record: dict[str, Any] | None = None  # written ahead of the first record of this process
        self.on_open: Any = None  # called once the file is open, before the first record (the hooks record)
        self._own_reset = False
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
    def _file(self) -> Any:
        if self._f is None:
            os.makedirs(self.out_dir, exist_ok=True)
            self._f = open(self.path, "a", buffering=1)  # noqa: SIM115  (lives as long as the process)
            if self.start_record is not None:
                self._f.write(json.dumps(self._stamp(dict(self.start_record)), default=str) + "\n")
            if self.on_open is not None:
                cb, self.on_open = self.on_open, None
                cb()
        return self._f

    def _stamp(self, rec: dict[str, Any]) -> dict[str, Any]:
        rec.setdefault("v", RECORD_VERSION)
        rec.setdefault("pid", self.pid)
        rec.setdefault("t", time.time())
        if self.ranks:
            rec.setdefault("ranks", self.ranks)
        return rec

    def write(self, rec: dict[str, Any]) -> None:
        try:
            with self._lock:
                f = self._file()
                f.write(json.dumps(self._stamp(rec), default=str) + "\n")
                f.flush()
        except Exception as e:  # the probe must never take the worker down
            print(f"memfrac probe: cannot write {self.path}: {e}", file=sys.stderr)

    def error(self, message: str) -> None:
        self.write({"type": "error", "error": message})
        print(f"memfrac probe: {message}", file=sys.stderr, flush=True)

    # ---- peaks ------------------------------------------------------------------------------------
    def _reset_peaks(self) -> None:
        self._own_reset = True
        try:
            self.probe.reset_peaks()
        finally:
            self._own_reset = False

    def guard_peak_resets(self) -> bool:
        """Wrap `torch.cuda.reset_peak_memory_stats` so a reset sglang makes inside a phase first folds the
        peaks so far into every open window (else the window's peak would start again from the reset)."""
        torch = self.probe._torch
        if torch is None or getattr(torch.cuda.reset_peak_memory_stats, "_memfrac_guard", False):
            return False
        original = torch.cuda.reset_peak_memory_stats

        def reset_peak_memory_stats(*a: Any, **k: Any) -> Any:
            if not self._own_reset:
                self.foreign_reset()
            return original(*a, **k)

        reset_peak_memory_stats._memfrac_guard = True  # type: ignore[attr-defined]
        torch.cuda.reset_peak_memory_stats = reset_peak_memory_stats
        return True

    def foreign_reset(self) -> None:
        """Someone else is about to reset torch's peak stats: keep what the open windows have seen."""
        with self._lock:
            if not self._stack and self._rt_peak is None:
                return
            s = self.probe.snapshot()
            for fr in self._stack:
                fr.absorb(s)
                fr.details["foreign_peak_resets"] = int(fr.details.get("foreign_peak_resets", 0)) + 1
            if self._rt_peak is not None:
                self._rt_peak.absorb(s)
                self._rt_peak.details["foreign_peak_resets"] = (
                    int(self._rt_peak.details.get("foreign_peak_resets", 0)) + 1
                )

    # ---- phases -----------------------------------------------------------------------------------
    def begin(self, phase: str, role: str = "target", empty_cache: bool = False) -> _Frame:
        """Open a phase window. `empty_cache`: release torch's cached blocks before the first reading, where
        sglang itself does so at the phase's start (so the freed cache is not charged to this phase)."""
        t = time.perf_counter()
        try:
            return self._begin(phase, role, empty_cache)
        finally:
            self.self_s += time.perf_counter() - t

    def end(self, fr: _Frame, error: BaseException | None = None, empty_cache: bool = False) -> None:
        t = time.perf_counter()
        try:
            self._end(fr, error, empty_cache)
        finally:
            self.self_s += time.perf_counter() - t

    def _empty_cache(self) -> None:
        if self.probe.cuda:
            self.probe._torch.cuda.empty_cache()

    def _begin(self, phase: str, role: str, empty_cache: bool) -> _Frame:
        with self._lock:
            if self._stack or self._rt_peak is not None:  # the open windows so far, before this one resets
                s0 = self.probe.snapshot()  # the peaks (a window opened while serving: the runtime's too)
                if self._stack:
                    self._stack[-1].absorb(s0)
                if self._rt_peak is not None:
                    self._rt_peak.absorb(s0)
            if empty_cache:
                self._empty_cache()
            self._reset_peaks()
            s = self.probe.snapshot()
            self._seq += 1
            fr = _Frame(phase, self._seq, time.time(), s, role=role)
            fr.absorb(s)
            parent = self._stack[-1] if self._stack else None
            self._stack.append(fr)
        self.write(
            {
                "type": "begin",
                "phase": phase,
                "seq": fr.seq,
                "role": role,
                "parent": parent.phase if parent else None,
                "parent_seq": parent.seq if parent else None,
                "kind": s.kind,
                "snap": s.as_dict(),
            }
        )
        return fr

    def _end(self, fr: _Frame, error: BaseException | None, empty_cache: bool) -> None:
        t_end = time.perf_counter()
        with self._lock:
            if empty_cache:
                fr.absorb(self.probe.snapshot())  # the peak before the cache is emptied
                self._empty_cache()
            s = self.probe.snapshot()
            fr.absorb(s)
            if self._stack and self._stack[-1] is fr:
                self._stack.pop()
            elif fr in self._stack:
                self._stack.remove(fr)
            if self._stack:  # the child's allocations also belong to the parent's window
                self._stack[-1].absorb_frame(fr)
            elif self._rt_peak is not None:  # ... and a window opened while serving to the runtime's
                self._rt_peak.absorb_frame(fr)
        self.write(
            {
                "type": "end",
                "phase": fr.phase,
                "seq": fr.seq,
                "role": fr.role,
                "kind": s.kind,
                "before": fr.before.as_dict(),
                "after": s.as_dict(),
                "peak": fr.peak_record(s.kind),
                "elapsed_s": time.time() - fr.t0,
                "details": fr.details,
                "error": None if error is None else f"{type(error).__name__}: {error}"[:2000],
                "probe_self_s": self.self_s + (time.perf_counter() - t_end),
            }
        )

    @property
    def top(self) -> _Frame | None:
        return self._stack[-1] if self._stack else None

    def ladder(self, phase: str, bs: int) -> None:
        """One rung of a capture ladder, right after `bs` was captured, tagged with its capture's seq."""
        t = time.perf_counter()
        s = self.probe.snapshot()
        with self._lock:
            top = self.top
            if top is not None:
                top.absorb(s)
        self.write(
            {
                "type": "ladder",
                "phase": top.phase if top is not None else phase,
                "seq": top.seq if top is not None else None,
                "bs": bs,
                "kind": s.kind,
                "snap": s.as_dict(),
            }
        )
        self.self_s += time.perf_counter() - t

    # ---- runtime ----------------------------------------------------------------------------------
    def runtime_before(self) -> None:
        """Called before every scheduler batch; the first call takes the runtime baseline — before sglang's
        warm-up request runs, so its activations are inside the window, not inside the baseline."""
        if self._rt_base is not None:
            return
        t = time.perf_counter()
        try:
            with self._lock:
                if self._rt_base is not None:
                    return
                self._reset_peaks()
                self._rt_base = self.probe.snapshot()
                self._rt_peak = _Frame("runtime", 0, time.time(), self._rt_base)
                self._rt_peak.absorb(self._rt_base)
                self._rt_last = time.monotonic()
                self._start_flusher()
        finally:
            self.self_s += time.perf_counter() - t

    def runtime_sample(self, force: bool = False) -> None:
        """Called after every scheduler batch; reads memory at most every `sample_interval_s`."""
        now = time.monotonic()
        self._rt_batches += 1
        if self._rt_base is None:
            self.runtime_before()
        if not force and now - self._rt_last < self.sample_interval_s and self._rt_batches > 1:
            return
        self._rt_last = now
        t = time.perf_counter()
        try:
            self._sample(now, force)
        finally:
            self.self_s += time.perf_counter() - t

    def runtime_batch(self, kind: str, requests: int, tokens: int, graph: bool | None) -> None:
        """One scheduler batch's shape (plugin.batch_shape): the runtime window keeps, per kind (decode | extend),
        the largest batch in requests and in tokens, and the largest that ran eager and that replayed a graph —
        what the load reached, set beside what each reserve term is sized for (profiler.analyse.load)."""
        with self._lock:
            fr = self._rt_peak
            if fr is None:
                return
            seen = fr.details.setdefault("batches_seen", {}).setdefault(
                kind, {"batches": 0, "max_requests": 0, "max_tokens": 0, "max_eager_requests": None,
                       "max_graph_requests": None})  # fmt: skip
            seen["batches"] += 1
            grew = requests > seen["max_requests"] or tokens > seen["max_tokens"]
            seen["max_requests"] = max(seen["max_requests"], requests)
            seen["max_tokens"] = max(seen["max_tokens"], tokens)
            if graph is not None:
                key = "max_graph_requests" if graph else "max_eager_requests"
                if seen[key] is None or requests > seen[key]:
                    seen[key], grew = requests, True
            if grew:
                self._rt_dirty = True

    def _sample(self, now: float, force: bool) -> None:
        with self._lock:
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
                "peak": fr.peak_record(last.kind),
                "batches": self._rt_batches,
                "details": fr.details,
                "probe_self_s": self.self_s,
            }
        )

    def close(self) -> None:
        """Close the file (a worker never needs to: its records are flushed one by one; tests and selfcheck do)."""
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None

    def flush_runtime(self) -> None:
        """Write the last runtime peak (at exit). A flush is no batch: `batches` counts run_batch calls only."""
        if self._rt_base is not None:
            t = time.perf_counter()
            try:
                self._rt_last = time.monotonic()
                self._sample(self._rt_last, True)
            finally:
                self.self_s += time.perf_counter() - t
