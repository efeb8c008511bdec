"""Events of one log → `Measurement`s: runs, ranks, phases, ladders, failures.

A log can hold several server starts, and runs never merge across attempts. A new run begins at a second
`server_args=` line or launch command (when the current run already has one, has phases or has failed), at
a repeated startup sequence (a "Load weight begin" after the ready line, or with more memory free than the
phases before it left: a new process; a capture phase that begins again after it ended; "Init torch
distributed ends" on a rank that already has phases; a second ready line), at startup lines on a rank that
has failed, at a new process id (uvicorn's "Started server process [PID]", or the pid in a journald/ray
prefix), and when a rank's timestamps go back in time (one process writes its lines in order, so that is
another paste). Splits that are inferred (not a command or args line) say so in the run's notes: separately
pasted excerpts of one server stay separate runs.
Each line first loses whatever stands in front of sglang's record (`PrefixLearner`); messages wrapped over
several lines (an OOM message, a server_args repr, a command with backslash continuations) are joined before
they are read.
Lines without a rank tag (tracebacks, tqdm bars, CUDA errors) go to the rank that logged last, which is how
they interleave in real output; where that is an inference, the run's notes say so.

LogBuilder is assembled from one part per concern: build_runs (runs and ranks: where a run splits), build_phases
(phase lines, target vs speculative draft), build_capture (tqdm capture ladders), build_failures (failure evidence
and its kind); build_base holds the fields they share. This module reads the lines and hands them out.
"""

from __future__ import annotations

import re

from profiler.core.measurement import Measurement
from profiler.core.units import BYTES_PER_MIB
from profiler.logs.build_base import _ArgsWindow
from profiler.logs.build_capture import CaptureLadders, _adopt_orphan
from profiler.logs.build_failures import Failures
from profiler.logs.build_phases import Phases
from profiler.logs.build_runs import RunsAndRanks, _fold_commands, _merge_quoted
from profiler.logs.failures import ExceptionDetail, OomWindow, evidence
from profiler.logs.gpu_evidence import GpuClues
from profiler.logs.identity import finalize_run, version_cue
from profiler.logs.launchcmd import is_launch_command
from profiler.logs.lines import LineScanner
from profiler.logs.patterns import KNOWN, MEMORYISH, TRAFFIC_HEADS, Event, classify, traffic
from profiler.logs.prefixes import Prefixed, PrefixLearner, split_glued
from profiler.logs.run import VersionCue, _RankState, _Run

MAX_EXAMPLES = 5
MAX_CONTINUATION_LINES = 200

# A line that may state a release (traceback frames' ".../sglang/srt/..." paths do not): see identity.version_cue.
_MAY_STATE_RELEASE = re.compile(r"sglang(?:[-\s:=\[\]'\"]|_version)|sgl-dev|\"version\"|'version'")
_PEAKS = {k: f"peak_{k}" for k in ("running_req", "queue_req", "tokens", "token_usage", "full_token_usage",
                                     "swa_token_usage")}  # fmt: skip


class LogBuilder(RunsAndRanks, Phases, CaptureLadders, Failures):
    """Feed it every line the scanner yields (`line`), then take the runs (`finish`)."""

    def __init__(self, file_name: str, origin: str, scanner: LineScanner) -> None:
        self._file = file_name
        self._origin = origin
        self._scanner = scanner
        self._runs: list[_Run] = []
        self._run = self._new_run()
        self._last_label: str | None = None
        self._window: OomWindow | None = None
        self._detail: ExceptionDetail | None = None  # the lines an exception message carries on (failures.py)
        self._cont: list[tuple[int, str, Prefixed]] = []  # backslash-continued lines so far
        self._args: _ArgsWindow | None = None  # a server_args repr wrapped over several lines
        self._prefixes = PrefixLearner()
        self._pid: int | None = None  # pid in the prefix of the line being read
        self._ts_cache: dict[str, float | None] = {}
        self._last_arch: tuple[str, int] | None = None
        self._cues: list[tuple[int, VersionCue]] = []  # every release cue in the file (see _assign_cues)
        self._frame_hint: tuple[int, str] | None = None  # a traceback frame's phase seen before its failure line
        self._orphans: list[tuple[_Run, _RankState]] = []  # untagged ranks made for tqdm bars before any rank
        self._gpu = GpuClues()  # every line naming the GPU or printing its capacity (see GpuClues.assign)
        self._wrap: tuple[int, str] | None = None  # a one-line launch command, and what a terminal wrapped of it

    # ---- input ---------------------------------------------------------------------------------------
    def learn(self, head: str) -> None:
        """Learn the file's line prefixes from its first block of text (before any line is read)."""
        self._prefixes.learn_text(head)

    def line(self, lineno: int, text: str) -> None:
        if "it/s]" in text or "s/it]" in text:
            for seg in split_glued(text):
                self._physical(lineno, seg, self._prefixes.split(seg))
        else:
            self._physical(lineno, text, self._prefixes.split(text))

    def _physical(self, lineno: int, text: str, p: Prefixed) -> None:
        if self._detail is not None:
            if self._detail.take(lineno, p.msg, p.hms is not None):
                return
            self._detail = None
        if self._window is not None:
            if self._window.take(p.msg, p.hms is not None):
                if self._window.done():
                    self._close_window()
                return
            self._close_window()
        if self._args is not None:
            if self._args.take(lineno, text, p):
                self._scanner.follow = 1
                if self._args.complete():
                    self._close_args()
                return
            self._close_args()
        if self._wrap is not None:
            if _wrapped_part(p):
                w = self._wrap
                sep = " " if w[1].endswith((" ", "\t")) or p.msg[:1] in (" ", "\t", "-") else ""
                self._wrap = (w[0], w[1] + sep + p.msg)  # a terminal cuts anywhere, a token too ("0.1" / "2")
                self._scanner.follow = 1
                return
            self._close_wrap()
        if (self._cont or p.msg.endswith("\\")) and self._continuation(lineno, text, p):
            return
        self._record(lineno, text, p)

    def _close_wrap(self) -> None:
        w, self._wrap = self._wrap, None
        if w is not None:
            self._command(w[0], w[1])

    def _continuation(self, lineno: int, text: str, p: Prefixed) -> bool:
        """Collect backslash-continued lines (each without its prefix); the joined line is handled at the last."""
        if p.msg.endswith("\\") and len(self._cont) < MAX_CONTINUATION_LINES:
            self._cont.append((lineno, text, p))
            self._scanner.follow = 1
            return True
        parts, self._cont = [*self._cont, (lineno, text, p)], []
        joined = " ".join(q.msg.rstrip("\\").strip() for _, _, q in parts)
        if is_launch_command(joined):
            self._command(parts[0][0], joined)
            return True
        for n, t, q in parts:  # not a command: each line on its own
            self._record(n, t, q)
        return True

    def _record(self, lineno: int, text: str, p: Prefixed) -> None:
        label = p.label
        self._pid = p.pid
        if p.gpu_tag and not self._run.gpu_tagged:
            self._run.gpu_tagged = True
            self._run.m.notes.append(
                f"line {lineno}: rank tag '{p.gpu_tag}' (sglang 0.1.x '[gpu_id=N]' / 0.2.x '[gpu=N]', a worker's GPU "
                "id) read as TP rank N: those releases give TP worker r GPU base + r, base 0 with one data-parallel "
                "group"
            )
        self._dispatch(lineno, text, p.msg, label, p.date, p.hms)
        if label and label not in self._run.ranks:
            self._run.ranks[label] = _RankState(label)  # a rank exists once it logs anything

    def _dispatch(self, lineno: int, text: str, msg: str, label: str | None, date: str | None, hms: str | None) -> None:
        if msg.startswith(TRAFFIC_HEADS):  # the bulk of a serving log: straight to the counters
            ev = traffic(msg)
            if ev is not None:
                self._serve(lineno, label, ev)
                if ev.fmt is not None and ev.fmt not in self._run.formats:
                    self._run.formats[ev.fmt] = lineno
                return
        self._gpu.see(lineno, text, msg)  # check_env, nvidia-smi, kernel-config paths, … (gpu_evidence)
        if ("sgl" in msg or '"version"' in msg) and _MAY_STATE_RELEASE.search(msg) and (cue := version_cue(msg)):
            self._cues.append((lineno, cue))
        if is_launch_command(msg):
            self._wrap = (lineno, msg)  # read once the lines a terminal wrapped it onto are joined (_wrapped_part)
            self._scanner.follow = 1
            return
        if "Started server process [" in msg:
            self._server_process(lineno, msg)
            return
        ev = classify(msg)
        if ev is not None:
            if ev is not KNOWN:
                self._event(lineno, label, date, hms, ev)
            return
        fe = evidence(msg, hms is not None)
        if fe is not None:
            self._failure(lineno, label, fe)
            return
        if MEMORYISH.search(msg):
            m = self._run.m
            m.unparsed_memory_lines += 1
            if len(m.unparsed_examples) < MAX_EXAMPLES:
                m.unparsed_examples.append(f"line {lineno}: {text.strip()[:300]}")

    # ---- events ---------------------------------------------------------------------------------------
    def _event(self, lineno: int, label: str | None, date: str | None, hms: str | None, ev: Event) -> None:
        self._frame_hint = None  # a memory line between: the frames before it are not the next failure's
        self._event_kind(lineno, label, date, hms, ev)
        if ev.fmt is not None:
            self._run.formats.setdefault(ev.fmt, lineno)  # the run that took the line (it may have split)

    def _event_kind(self, lineno: int, label: str | None, date: str | None, hms: str | None, ev: Event) -> None:
        kind = ev.kind
        if kind == "args":
            self._server_args(lineno, ev.details["text"])  # type: ignore[index]
            return
        if kind in ("serve", "retract"):
            self._serve(lineno, label, ev)
            return
        if kind == "registered":
            self._registered(lineno, label, ev)
            return
        if kind == "fired":
            self._run.touch(lineno)
            if self._run.fired_line is None:
                self._run.fired_line = lineno
            return
        if kind == "mode":
            if self._run.mode_hint is None:
                self._run.mode_hint = (ev.details["mode"], lineno)  # type: ignore[index]
            return
        if kind == "host_mem":
            d = ev.details or {}
            mib = d["gb_decimal"] * 1e9 / BYTES_PER_MIB
            self._run.m.notes.append(
                f"line {lineno}: {d['gb_decimal']} GB (decimal, {mib:.0f} MiB) of HOST memory for "
                f"{d['what']}: host RAM, not GPU memory"
            )
            return
        if kind == "arch":
            self._last_arch = (ev.details["architecture"], lineno)  # type: ignore[index]
            if self._run.arch_hint is None:
                self._run.arch_hint = self._last_arch
            return
        if kind == "resolved":
            for k, v in (ev.details or {}).items():
                self._run.resolved.setdefault(k, (v, lineno))
            return
        if kind == "model":
            if self._run.model_hint is None:
                self._run.model_hint = (ev.details["model"], lineno)  # type: ignore[index]
            return
        if kind == "ladder" and label is None:
            self._ladder(lineno, ev)
            return
        key = f"{date or ''} {hms}" if hms else None
        if not label and len(self._run.ranks) == 1 and "" not in self._run.ranks:
            label = next(iter(self._run.ranks))  # an untagged line in a one-rank log (a bare ready line) is its
        if self._run.floating is not None and ev.phase in ("init_parallel", "weights") and kind in ("begin", "end"):
            self._drop_floating(lineno)
        rs = self._rank_for_phase(lineno, label or "", key, ev)
        self._run.touch(lineno)
        self._last_label = rs.rank.label
        t = self._t(date, hms)
        if kind == "begin":
            self._begin(rs, lineno, t, ev)
        elif kind == "end":
            self._end(rs, lineno, t, ev)
        elif kind in ("note", "kv"):
            self._note(rs, lineno, t, ev)
        elif kind == "ready":
            self._ready(rs, lineno, t, ev)
        elif kind == "ladder":
            self._ladder(lineno, ev, rs)

    def _drop_floating(self, lineno: int) -> None:
        """Failure text seen before any rank logged, then a startup line: it preceded this start (an earlier attempt's
        traceback quoted in prose, an error summary above the log), so it is not this run's failure."""
        fs, self._run.floating = self._run.floating, None
        if fs is not None:
            self._run.m.notes.append(
                f"line {fs.failure.line}: failure text before the startup at line {lineno} "
                f"('{fs.failure.message[:120]}') is not this run's failure: quoted before its start (an earlier "
                "attempt, or a summary)"
            )

    # ---- serving traffic ---------------------------------------------------------------------------------
    def _serve(self, lineno: int, label: str | None, ev: Event) -> None:
        """Scheduler stats and retractions while serving: keep the peaks and counts, not every line."""
        run = self._run
        run.touch(lineno)
        sv = run.serving
        d = ev.details or {}
        if ev.kind == "retract":
            sv["retractions"] = int(sv.get("retractions", 0)) + 1  # type: ignore[call-overload]
            sv["retracted_reqs"] = int(sv.get("retracted_reqs", 0)) + (d.get("retracted") or 0)  # type: ignore[call-overload]
            sv.setdefault("first_retraction_line", lineno)
            return
        sv["batches"] = sv.get("batches", 0) + 1  # type: ignore[operator]
        if "first_line" not in sv:
            sv["first_line"] = lineno
        sv["last_line"] = lineno
        for key, v in d.items():
            peak = _PEAKS.get(key)
            if peak is not None and v > sv.get(peak, -1):  # type: ignore[operator]
                sv[peak] = v
                sv[peak + "_line"] = lineno
        if label and label not in run.serving_ranks and len(run.serving_ranks) < 64:
            run.serving_ranks.add(label)

    # ---- output ---------------------------------------------------------------------------------------
    def finish(self) -> list[Measurement]:
        if self._wrap is not None:
            self._close_wrap()
        if self._window is not None:
            self._close_window()
        if self._args is not None:
            self._close_args()
        if self._cont:
            n, t, p = self._cont[-1]
            self._cont.pop()
            self._continuation(n, t, p._replace(msg=p.msg.rstrip("\\")))
        runs = [r for r in self._runs if r.first_line is not None or r.ranks or r.m.unparsed_memory_lines]
        # (a run with nothing seen is e.g. the placeholder before the first command)
        merged = _fold_commands(_merge_quoted(runs))
        if len(merged) != len(runs):  # keep run ids consecutive (file#0, file#1, …)
            for k, r in enumerate(merged):
                r.index, r.m.id = k, f"{self._file}#{k}"
        runs = merged
        self._assign_cues(runs)
        self._gpu.assign(runs)
        for run, rs in self._orphans:
            _adopt_orphan(run, rs)
        out = []
        for run in runs:
            self._settle_failures(run)
            out.append(finalize_run(run))
        return out


def _wrapped_part(p: Prefixed) -> bool:
    """A line right after a one-line launch command that is more of it, wrapped by a terminal: no record prefix,
    not blank, not a command or failure line of its own ("launch_server.py: error: … --bogus"), and carrying a flag
    ("ormat dummy     --dtype bfloat16 …")."""
    msg = p.msg
    return (p.hms is None and p.label is None and bool(msg.strip()) and (" --" in msg or msg.lstrip().startswith("--"))
            and not is_launch_command(msg) and not msg.endswith("\\") and evidence(msg) is None)  # fmt: skip
