"""LogBuilder, failures: failure evidence (tracebacks, OOM messages, exits) onto the rank that failed, and its kind
once the run is complete."""

from __future__ import annotations

from profiler.logs.build_base import (
    MAX_FRAME_HINT_LINES,
    BuilderState,
)
from profiler.logs.failures import (
    DEFINITIVE,
    DETAIL_LINES,
    OOM_FIELDS,
    OOM_WINDOW_LINES,
    Evidence,
    ExceptionDetail,
    FailureState,
    OomWindow,
    failure_kind,
    quoted_fraction,
)
from profiler.logs.oom import is_complete, parse_oom
from profiler.logs.run import _RankState, _Run


class Failures(BuilderState):
    """Failure evidence per rank, settled at the end of the run."""

    def _failure(self, lineno: int, label: str | None, ev: Evidence) -> None:
        run = self._run
        if ev.what in ("no_kv", "exception", "tail", "oom") and (q := quoted_fraction(ev.message)) is not None:
            run.quoted_args.setdefault("mem_fraction_static", (q, f"log line {lineno} (quoted by an error message)"))
        if label:  # tagged with ranks: that rank (created if new)
            rs = run.ranks.get(label)
            if rs is None:
                rs = run.ranks[label] = _RankState(label)
            self._last_label = label
        else:
            target = self._last_label
            rs = run.ranks.get(target) if target is not None else None
        run.touch(lineno)
        if ev.what == "frame" and ev.phase_hint and (rs is None or rs.fs is None) and self._frame_hint is None:
            # The outermost frame that names a phase, before any failure line: an excerpt cut above the traceback
            # header still says where the code was (gpustack-4761, sglang-12496: memory_pool.py → kv_pool).
            self._frame_hint = (lineno, ev.phase_hint)
        elif ev.what == "traceback":
            self._frame_hint = None
        if ev.what == "sigquit" and (rs is None or rs.fs is None) and self._any_failure(run):
            run.m.notes.append(f"line {lineno}: launcher received sigquit (a child failed)")
            return
        if rs is None:
            self._floating(run, lineno, ev)
            return
        if ev.what == "traceback":
            rs.tb = True
            return
        if ev.what == "frame":
            if rs.fs is not None and (rs.tb or rs.fs.hint is None):
                rs.fs.absorb(ev)
            return
        if ev.what == "tail" and rs.fs is None and not rs.tb:
            return  # an exception line outside any traceback we saw: not evidence of a failure
        if ev.what == "exit" and ev.exit_code == 0:
            return
        if rs.fs is None:
            rs.fs = FailureState(lineno, ev.message)
            self._take_frame_hint(rs.fs, lineno)
            rs.fs.tentative = ev.what == "tail"
            rs.fs.failure.phase = _in_flight(rs, run, lineno)
            if run.floating is not None:
                rs.fs.merge(run.floating)
                run.floating = None
        elif ev.what in DEFINITIVE:
            rs.fs.tentative = False
        rs.fs.absorb(ev)
        if ev.what == "tail" and rs.fs.failure.message == ev.message[:2000]:
            self._detail = ExceptionDetail(rs.fs, lineno)
            self._scanner.follow = DETAIL_LINES
        if ev.what in ("exception", "traceback"):
            rs.tb = True
        elif ev.what == "tail":
            rs.tb = False
        if ev.what in ("oom", "capture"):
            self._open_window(rs.fs, ev.message)

    def _floating(self, run: _Run, lineno: int, ev: Evidence) -> None:
        """Failure text before any rank has logged: kept aside, given to the first rank that fails."""
        if ev.what in ("traceback", "frame") and run.floating is None:
            return
        if run.floating is None:
            run.floating = FailureState(lineno, ev.message)
            self._take_frame_hint(run.floating, lineno)
            run.floating.tentative = ev.what == "tail"
        elif ev.what in DEFINITIVE:
            run.floating.tentative = False
        run.floating.absorb(ev)
        if ev.what in ("oom", "capture"):
            self._open_window(run.floating, ev.message)

    def _take_frame_hint(self, fs: FailureState, lineno: int) -> None:
        hint, self._frame_hint = self._frame_hint, None
        if hint is not None and fs.hint is None and lineno - hint[0] <= MAX_FRAME_HINT_LINES:
            fs.hint = hint[1]

    def _open_window(self, fs: FailureState, text: str) -> None:
        self._apply_oom(fs, text)
        if not is_complete(text):
            self._window = OomWindow(fs, text)
            self._scanner.follow = OOM_WINDOW_LINES

    def _close_window(self) -> None:
        w, self._window = self._window, None
        self._scanner.follow = 0
        if w is not None and len(w.parts) > 1:
            joined = "".join(w.parts)
            compact = "".join(joined.split())
            if "outofmemory" in compact or "OutOfMemory" in compact:
                w.fs.oom = True  # the words themselves were wrapped
            self._apply_oom(w.fs, joined)

    def _apply_oom(self, fs: FailureState, text: str) -> None:
        nums = parse_oom(text)
        f = fs.failure
        for name in OOM_FIELDS:
            v = getattr(nums, name, None)
            if v is not None:
                setattr(f, name, v)
        for note in nums.notes:
            if note not in self._run.m.notes:
                self._run.m.notes.append(note)

    @staticmethod
    def _any_failure(run: _Run) -> bool:
        return run.floating is not None or any(rs.fs is not None for rs in run.ranks.values())

    def _settle_failures(self, run: _Run) -> None:
        if run.floating is not None:
            label = next(iter(run.ranks)) if len(run.ranks) == 1 else ""
            rs = run.ranks.get(label) or run.ranks.setdefault(label, _RankState(label))
            if rs.fs is None:
                rs.fs = run.floating
                rs.fs.failure.phase = _in_flight(rs, run, rs.fs.failure.line or 0)
            else:
                rs.fs.merge(run.floating)
            run.floating = None
        for rs in run.ranks.values():
            fs = rs.fs
            if fs is None:
                continue
            f = fs.failure
            if fs.tentative and any((p.line or 0) > (f.line or 0) for p in rs.rank.phases):
                run.m.notes.append(
                    f"line {f.line}: a traceback on rank '{rs.rank.label}' did not stop startup "
                    "(later phases follow); not counted as a failure"
                )
                continue
            if f.phase is None and fs.hint is not None:
                f.phase = fs.hint
                run.m.notes.append(
                    f"failure phase on rank '{rs.rank.label}' ({fs.hint}) read from the failing code "
                    "(traceback frames / 'Capture … failed'): no phase line was open"
                )
            ready = _serving_at(run, f.line or 0)
            f.kind = failure_kind(
                oom=fs.oom,
                capture=fs.capture,
                phase=f.phase,
                ready=ready,
                timeout=fs.timeout,
                bad_args=fs.bad_args,
            )
            rs.rank.failure = f


def _in_flight(rs: _RankState, run: _Run, line: int) -> str | None:
    """The phase running on this rank at `line`: serving once the run was ready, else the most recently
    begun startup phase that has not ended (None when none is open)."""
    if _serving_at(run, line):
        return "runtime"
    if not rs.open:
        return None
    return max(rs.open.values(), key=lambda p: p.line or 0).name


def _serving_at(run: _Run, line: int) -> bool:
    """The server was serving at `line`: after its ready line, or after a batch of request traffic (an excerpt
    of a serving worker that starts after its ready line: an OOM inside a decode batch is a runtime OOM)."""
    if run.ready_line is not None and line > run.ready_line:
        return True
    first = run.serving.get("first_line")
    return isinstance(first, int) and line > first
