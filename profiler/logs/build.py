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
"""

from __future__ import annotations

import bisect
import calendar
import re
import time

from profiler.core.measurement import LadderPoint, Measurement, Phase, Snapshot
from profiler.core.units import BYTES_PER_MIB, MIB_PER_GIB
from profiler.logs.failures import (
    DEFINITIVE,
    OOM_FIELDS,
    OOM_WINDOW_LINES,
    Evidence,
    FailureState,
    OomWindow,
    evidence,
    failure_kind,
    quoted_fraction,
)
from profiler.logs.gpu_evidence import GpuClues
from profiler.logs.identity import finalize_run, version_cue
from profiler.logs.launchcmd import is_launch_command, parse_launch_command
from profiler.logs.lines import LineScanner
from profiler.logs.oom import is_complete, parse_oom
from profiler.logs.patterns import GRAPH_PHASES, KNOWN, MEMORYISH, TRAFFIC_HEADS, Event, classify, traffic
from profiler.logs.prefixes import Prefixed, PrefixLearner, shape, split_glued
from profiler.logs.run import VersionCue, _RankState, _Run
from profiler.logs.serverargs import ServerArgsRepr, parse_server_args

GIB = MIB_PER_GIB  # sglang's "GB" is GiB (profiler.core.units)
RESOLUTION_MIB = 10.24  # sglang prints GiB with two decimals: ±0.005 GiB, a step of 10.24 MiB
MAX_EXAMPLES = 5
MAX_CONTINUATION_LINES = 200
MAX_FRAME_HINT_LINES = 200  # a traceback's frames name the phase of a failure line at most this far below them
MAX_ARGS_LINES = 400  # a server_args repr wrapped by a terminal, or split by docker/CRI at 16 KiB
MAX_ARGS_CHARS = 400_000
MEMORY_BACK_MIB = 1024.0  # a new weight load with this much more free than the last phase left: a new process

# A line that may state a release (traceback frames' ".../sglang/srt/..." paths do not): see identity.version_cue.
_MAY_STATE_RELEASE = re.compile(r"sglang(?:[-\s:=\[\]'\"]|_version)|sgl-dev|\"version\"|'version'")
_PEAKS = {k: f"peak_{k}" for k in ("running_req", "queue_req", "tokens", "token_usage", "full_token_usage",
                                     "swa_token_usage")}  # fmt: skip
_QUIET_KINDS = frozenset({"end", "note", "kv", "ladder"})  # events that never start a run by themselves


class LogBuilder:
    """Feed it every line the scanner yields (`line`), then take the runs (`finish`)."""

    def __init__(self, file_name: str, origin: str, scanner: LineScanner) -> None:
        self._file = file_name
        self._origin = origin
        self._scanner = scanner
        self._runs: list[_Run] = []
        self._run = self._new_run()
        self._last_label: str | None = None
        self._window: OomWindow | None = None
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
        if (self._cont or p.msg.endswith("\\")) and self._continuation(lineno, text, p):
            return
        self._record(lineno, text, p)

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
            self._command(lineno, msg)
            return
        if "Started server process [" in msg:
            self._server_process(lineno, msg)
            return
        ev = classify(msg)
        if ev is not None:
            if ev is not KNOWN:
                self._event(lineno, label, date, hms, ev)
            return
        fe = evidence(msg)
        if fe is not None:
            self._failure(lineno, label, fe)
            return
        if MEMORYISH.search(msg):
            m = self._run.m
            m.unparsed_memory_lines += 1
            if len(m.unparsed_examples) < MAX_EXAMPLES:
                m.unparsed_examples.append(f"line {lineno}: {text.strip()[:300]}")

    # ---- runs ----------------------------------------------------------------------------------------
    def _new_run(self, line: int | None = None, why: str = "") -> _Run:
        prev = self._runs[-1] if self._runs else None
        run = _Run(len(self._runs), self._file, self._origin)
        if why:
            run.m.notes.append(f"new server run at line {line}: {why}")
            if not why.startswith(("launch command", "server_args line")):
                run.m.notes.append(
                    f"the split at line {line} is inferred from the lines (no command or server_args line): if "
                    "this is another excerpt of the same server, pasted separately, it stays a run of its own"
                )
        if prev is not None and self._last_arch is not None and self._last_arch[1] > (prev.last_line or 0):
            run.arch_hint = self._last_arch  # printed while this run's args were resolved, before its header
        self._runs.append(run)
        self._run = run
        self._last_label = None
        return run

    def _command(self, lineno: int, text: str) -> None:
        cmd = parse_launch_command(text)
        if cmd is None:
            return
        run = self._run
        if run.cmd is not None or run.server_args is not None or run.has_phases() or run.failed_at() is not None:
            run = self._new_run(lineno, "launch command")
        run.cmd = cmd
        run.touch(lineno)

    def _server_process(self, lineno: int, msg: str) -> None:
        """uvicorn's "Started server process [PID]": a different PID in one run is another server start."""
        try:
            pid = int(msg.rsplit("[", 1)[1].split("]", 1)[0])
        except (IndexError, ValueError):
            return
        run = self._run
        if run.server_pid is not None and run.server_pid != pid:
            run = self._new_run(lineno, f"a new server process (pid {run.server_pid} → {pid})")
        run.server_pid = pid
        run.touch(lineno)

    def _server_args(self, lineno: int, text: str) -> None:
        sa = parse_server_args(text)
        if sa is None:
            return
        run = self._run
        if run.server_args is not None or run.has_phases() or run.failed_at() is not None:
            run = self._new_run(lineno, "server_args line")
        run.server_args = sa
        run.touch(lineno)
        if not sa.complete:
            self._args = _ArgsWindow(lineno, text, sa)
            self._scanner.follow = 1

    def _close_args(self) -> None:
        """End of a wrapped server_args repr: the joined text if it reads complete, else the cut original."""
        w, self._args = self._args, None
        if w is None:
            return
        run = self._run
        joined = w.joined()
        sa = parse_server_args(joined) if w.parts else None
        if sa is not None and sa.complete and len(sa.args) >= len(w.first.args):
            run.server_args = sa
            run.m.notes.append(f"server_args line {w.line} wrapped over {len(w.parts) + 1} lines; read joined")
            return
        if sa is not None and len(sa.args) > len(w.first.args):
            # wrapped AND cut before its end (sglang-27351: broken at "max_total_tokens" / "=None", never
            # closed): the joined text reads further than its first line
            run.server_args = sa
            where = f" inside '{sa.cut_at}'" if sa.cut_at else ""
            run.m.notes.append(f"server_args line {w.line} wrapped over {len(w.parts) + 1} lines and cut off{where}; "
                               "read joined, later fields unknown")  # fmt: skip
            return
        where = f" inside '{w.first.cut_at}'" if w.first.cut_at else ""
        run.m.notes.append(f"server_args line {w.line} is cut off{where}; later fields unknown")
        for n, t, p in w.parts:  # not the repr's continuation: each line on its own
            self._physical(n, t, p)

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

    def _rank_for_phase(self, lineno: int, label: str, key: str | None, ev: Event) -> _RankState:
        run = self._run
        rs = run.ranks.get(label)
        pid = self._pid
        if rs is not None:
            last = rs.last_key
            if (
                ev.kind in _QUIET_KINDS
                and ev.phase != "init_parallel"
                and (key is None or last is None or key >= last)
                and (pid is None or rs.pid is None or pid == rs.pid)
                and rs.fs is None
            ):
                if key is not None:
                    rs.last_key = key
                return rs  # the common case: nothing that could start a new run
            why = self._split_reason(run, rs, key, ev, pid)
            if why:
                run = self._new_run(lineno, why)
                rs = None
        elif run.ready_line is not None and (
            ev.phase == "init_parallel" or (ev.kind, ev.phase) == ("begin", "weights")
        ):
            run = self._new_run(lineno, f"a new rank starts '{ev.phase}' after the server was ready")
        if rs is None:
            rs = run.ranks[label] = _RankState(label)
        if key is not None:
            rs.last_key = key
        if pid is not None and rs.pid is None:
            rs.pid = pid
        return rs

    @staticmethod
    def _split_reason(run: _Run, rs: _RankState, key: str | None, ev: Event, pid: int | None = None) -> str:
        label = rs.rank.label
        if pid is not None and rs.pid is not None and pid != rs.pid:
            return f"rank '{label}' is another process (pid {rs.pid} → {pid} in the line prefix)"
        if key is not None and rs.last_key is not None and key < rs.last_key and not _midnight(rs.last_key, key):
            return f"rank '{label}' timestamps go back ({rs.last_key.strip()} → {key.strip()})"
        startup = ev.phase == "init_parallel" or (ev.kind == "begin" and ev.phase == "weights")
        if startup and rs.fs is not None and not rs.fs.tentative:
            return f"startup lines on rank '{label}' after it failed at line {rs.fs.failure.line}"
        if ev.kind == "begin" and ev.phase == "weights":
            if run.ready_line is not None:
                return f"'Load weight begin' on rank '{label}' after the server was ready"
            back = _memory_back(rs, ev)
            if back:
                return back
        if ev.phase == "init_parallel" and rs.rank.phases:
            return f"torch distributed initialised again on rank '{label}'"
        if ev.kind == "begin" and ev.phase in GRAPH_PHASES:
            done = [p for p in rs.rank.phases_named(ev.phase) if p.after is not None or p.elapsed_s is not None]
            if done:
                return f"'{ev.phase}' capture begins again on rank '{label}' after it ended at line {done[-1].line}"
        if ev.kind == "ready" and rs.rank.phase("ready") is not None:
            return f"second ready line on rank '{label}'"
        return ""

    def _t(self, date: str | None, hms: str | None) -> float | None:
        if date is None or hms is None:
            return None
        key = date + hms
        t = self._ts_cache.get(key, -1.0)
        if t == -1.0:
            try:
                t = float(calendar.timegm(time.strptime(f"{date} {hms}", "%Y-%m-%d %H:%M:%S")))
            except ValueError:
                t = None
            if len(self._ts_cache) > 4096:
                self._ts_cache.clear()
            self._ts_cache[key] = t
        return t

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
            if last is not None and last.name == name and not _pool_after_pool(last, ev):
                ph = last
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

    def _registered(self, lineno: int, label: str | None, ev: Event) -> None:
        """A "Registering N cuda graph addresses" line: the capture context closed with N graph buffers (0: none)."""
        rs = self._run.ranks.get(label or "") if label is not None else None
        if rs is None:
            rs = self._run.ranks.get(self._last_label or "")
        if rs is None:
            return
        self._run.touch(lineno)
        open_graphs = [p for n, p in rs.open.items() if n in GRAPH_PHASES]
        ph = max(open_graphs, key=lambda p: p.line or 0) if open_graphs else None
        if ph is None:
            graphs = [p for p in rs.rank.phases if p.name in GRAPH_PHASES]
            ph = graphs[-1] if graphs else None
        if ph is not None:
            ph.details["graph_addresses"] = (ev.details or {}).get("graph_addresses")
            ph.details["graph_addresses_line"] = lineno

    # ---- tqdm ladder -----------------------------------------------------------------------------------
    def _ladder(self, lineno: int, ev: Event, rs: _RankState | None = None) -> None:
        """A tqdm "Capturing batches (bs=… avail_mem=… GB)" point: printed by TP rank 0, untagged."""
        run = self._run
        if rs is None:
            rs = self._ladder_rank(run, ev.phase or "decode_graph")
        run.touch(lineno)
        ph = self._graph_in_flight(rs, ev.phase or "decode_graph")
        if ph is None:
            ph = Phase(name=ev.phase or "decode_graph", line=lineno)
            rs.rank.phases.append(ph)
            rs.open[ph.name] = ph
            run.m.notes.append(f"line {lineno}: tqdm capture progress without a capture-begin line; "
                               f"phase {ph.name} opened on rank '{rs.rank.label}'")  # fmt: skip
        d = ev.details or {}
        bs, n = d.get("bs"), d.get("n")
        free = _mib(ev.free)
        if free is not None:  # the lowest tqdm reading: the worst point seen when the capture never ended
            low = ph.details.get("min_ladder_avail_mib")
            if low is None or free < low:
                ph.details["min_ladder_avail_mib"] = free
        if ph.ladder:
            last = ph.ladder[-1]
            if bs is not None and last.bs == bs:
                rs.last_n = n
                if n is not None:
                    ph.details["progress"] = [n, d.get("total")]
                return
            if bs is None and last.free_mib == free and (n is None or rs.last_n is None or n == rs.last_n + 1):
                rs.last_n = n
                if n is not None:
                    ph.details["progress"] = [n, d.get("total")]
                return
        rs.last_n = n
        if n is not None:
            ph.details["progress"] = [n, d.get("total")]
        used = None
        if ph.before is not None and ph.before.free_mib is not None and free is not None:
            used = ph.before.free_mib - free
        ph.ladder.append(LadderPoint(bs=bs, free_mib=free, used_mib=used))  # bs None: the bar did not print it
        ph.resolution_mib = RESOLUTION_MIB

    def _ladder_rank(self, run: _Run, phase: str) -> _RankState:
        want_prefill = phase == "prefill_graph"
        best: tuple[tuple[int, int], _RankState] | None = None
        for rs in run.ranks.values():
            for name, ph in rs.open.items():
                if name in GRAPH_PHASES and (name == "prefill_graph") == want_prefill:
                    score = (1 if rs.rank.tp in (0, None) else 0, ph.line or 0)
                    if best is None or score > best[0]:
                        best = (score, rs)
        if best is not None:
            return best[1]
        for rs in run.ranks.values():
            if rs.rank.tp in (0, None):
                return rs
        label = self._last_label or ""
        rs = run.ranks.get(label)
        if rs is None:
            rs = run.ranks[label] = _RankState(label)
            if not label:  # a bar before any rank logged (an excerpt that starts mid-capture): TP0's, seen later
                self._orphans.append((run, rs))
        return rs

    @staticmethod
    def _graph_in_flight(rs: _RankState, phase: str) -> Phase | None:
        want_prefill = phase == "prefill_graph"
        cands = [p for n, p in rs.open.items() if n in GRAPH_PHASES and (n == "prefill_graph") == want_prefill]
        return max(cands, key=lambda p: p.line or 0) if cands else None

    # ---- failures -----------------------------------------------------------------------------------
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

    # ---- output ---------------------------------------------------------------------------------------
    def finish(self) -> list[Measurement]:
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
        merged = _merge_quoted(runs)
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

    def _assign_cues(self, runs: list[_Run]) -> None:
        """Release cues go to the run whose lines they sit among, else to the run they precede (a header
        before the start), else to the last run before them (an issue's environment block after its log)."""
        seen = [r for r in runs if r.first_line is not None]
        starts = [r.first_line or 0 for r in seen]  # runs are in file order
        for lineno, cue in self._cues:
            i = bisect.bisect_right(starts, lineno) - 1  # the last run starting at or before the cue
            target = None
            if i >= 0 and lineno <= (seen[i].last_line or seen[i].first_line or 0):
                target = seen[i]
            elif i + 1 < len(seen):
                target = seen[i + 1]
            elif i >= 0:
                target = seen[i]
            elif runs:
                target = runs[0]
            if target is not None:
                target.cues.append((lineno, cue))
        stated: list[tuple[int, VersionCue]] = []
        for run in runs:  # a later start in the same file without its own cue: the same install, said so
            if run.cues:
                stated = run.cues
            elif stated:
                run.cues = [(n, c._replace(how=f"{c.how}, stated for an earlier run in this file")) for n, c in stated]

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
            ready = run.ready_line is not None and (f.line or 0) > run.ready_line
            f.kind = failure_kind(
                oom=fs.oom,
                capture=fs.capture,
                phase=f.phase,
                ready=ready,
                timeout=fs.timeout,
                bad_args=fs.bad_args,
            )
            rs.rank.failure = f


class _ArgsWindow:
    """The lines after a server_args repr that was cut at its line end, joined back until it closes."""

    __slots__ = ("chars", "first", "lead", "line", "parts", "text")

    def __init__(self, line: int, text: str, first: ServerArgsRepr) -> None:
        self.line, self.first = line, first
        self.parts: list[tuple[int, str, Prefixed]] = []
        # What stood before "server_args=" on its line (a prefix the file's head was too short to learn): the same
        # shape in front of a continuation line is that prefix again, not repr text.
        at = text.find("server_args=")
        lead = text[:at] if at > 0 else ""
        self.lead = re.compile(shape(lead)) if lead.strip() else None
        self.text = text[len(lead) :] if self.lead is not None else text
        self.chars = len(text)

    def take(self, lineno: int, text: str, p: Prefixed) -> bool:
        msg = p.msg
        if p.hms is not None or not msg.strip() or is_launch_command(msg):
            return False  # a new record, a blank line, a command: the repr ended (cut) before it
        if self.lead is not None and (k := self.lead.match(msg)) is not None and k.end() > 0:
            msg = msg[k.end() :]
            p = p._replace(msg=msg)
        if len(self.parts) >= MAX_ARGS_LINES or self.chars + len(msg) > MAX_ARGS_CHARS:
            return False
        self.parts.append((lineno, text, p))
        self.chars += len(msg)
        return True

    def joined(self) -> str:
        # Terminals and docker's 16 KiB split cut anywhere: the pieces join without a separator.
        return self.text + "".join(p.msg for _, _, p in self.parts)

    def complete(self) -> bool:
        sa = parse_server_args(self.joined())
        return sa is not None and sa.complete


def _memory_back(rs: _RankState, ev: Event) -> str:
    """A weight load that starts with clearly more memory free than the rank's last phase left is a new
    process (a draft model loads into what the target left, so its 'avail mem' is at most that)."""
    if ev.free is None:
        return ""
    later = [p for p in rs.rank.phases if p.name not in ("weights", "init_parallel", "baseline")]
    if not later:
        return ""
    frees = [
        s.free_mib for p in rs.rank.phases for s in (p.before, p.after) if s is not None and s.free_mib is not None
    ]
    if not frees:
        return ""
    last = frees[-1]
    now = ev.free * GIB
    if now <= last + MEMORY_BACK_MIB:
        return ""
    return (f"'Load weight begin' on rank '{rs.rank.label}' with {ev.free:.2f} GB free, more than the "
            f"{last / GIB:.2f} GB its last phase left: memory came back, a new process")  # fmt: skip


def _adopt_orphan(run: _Run, rs: _RankState) -> None:
    """tqdm bars printed before any rank logged went to an untagged rank; once the run shows its ranks, they are
    TP rank 0's (sglang draws the bar on TP0 only): each capture joins TP0's phase of the same name that begins
    or ends after it (sglang-pr12978: the 36/36 bar, then TP0's 'Capture cuda graph end')."""
    if run.ranks.get("") is not rs or rs.fs is not None or not rs.rank.phases:
        return
    if any(p.name not in GRAPH_PHASES for p in rs.rank.phases):
        return
    owners = [r for lbl, r in run.ranks.items() if lbl and r.rank.tp in (0, None)]
    if not owners:
        return
    owner = min(owners, key=lambda r: (r.rank.pp or 0, r.rank.dp or 0, r.rank.ep or 0, r.rank.label))
    for ph in rs.rank.phases:
        later = [p for p in owner.rank.phases if p.name == ph.name and (p.line or 0) >= (ph.line or 0) and not p.ladder]
        if later:
            mine = later[0]
            mine.ladder[:0] = ph.ladder
            for k, v in ph.details.items():
                mine.details.setdefault(k, v)
            if mine.before is None and mine.after is not None:
                mine.line = ph.line
            mine.resolution_mib = mine.resolution_mib or ph.resolution_mib
        else:
            owner.rank.phases.append(ph)
            owner.rank.phases.sort(key=lambda p: p.line or 0)
    del run.ranks[""]
    run.m.notes.append(f"tqdm capture progress before any rank tag (from line {rs.rank.phases[0].line}) given to "
                       f"rank '{owner.rank.label}' (sglang draws the bar on TP rank 0)")  # fmt: skip


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


def _merge_quoted(runs: list[_Run]) -> list[_Run]:
    """A quoted excerpt — lines without timestamps or rank tags, no command, no server_args, no failure — followed
    by a run that is only a launch command: one run, the command that produced the quoted lines (issue posts
    quote the log, then the command they ran). Said in the notes. After a failure, a command is a new attempt."""
    out: list[_Run] = []
    for run in runs:
        prev = out[-1] if out else None
        if (
            prev is not None
            and prev.cmd is None
            and prev.server_args is None
            and run.cmd is not None
            and run.server_args is None
            and not run.has_phases()
            and set(prev.ranks) <= {""}
            and not _timed(prev)
            and prev.floating is None
            and not any(rs.fs is not None for rs in prev.ranks.values())  # a failed run ends there: the command
        ):  # after it starts another attempt (issue 11: runs never merge across attempts)
            prev.cmd = run.cmd
            prev.last_line = max(prev.last_line or 0, run.last_line or 0)
            prev.m.notes.append(
                f"launch command at line {run.first_line} taken as the one that produced the quoted lines before it "
                "(no timestamps, no rank tags, no other start between them)"
            )
            continue
        out.append(run)
    return out


def _timed(run: _Run) -> bool:
    snaps = [s for rs in run.ranks.values() for p in rs.rank.phases for s in (p.before, p.after) if s is not None]
    return any(s.t is not None for s in snaps)


def _second_pool(ph: Phase, d: dict) -> bool:
    """True when `d` is another allocated K/V pool for a pool phase that already has one."""
    if d.get("label") or d.get("va_upper_bound") or not any(k in d for k in ("k_gib", "v_gib", "kv_gib")):
        return False
    return any(k in ph.details for k in ("k_mib", "v_mib", "kv_mib")) and "va_upper_bound" not in ph.details


def _in_flight(rs: _RankState, run: _Run, line: int) -> str | None:
    """The phase running on this rank at `line`: serving once the run was ready, else the most recently
    begun startup phase that has not ended (None when none is open)."""
    if run.ready_line is not None and line > run.ready_line:
        return "runtime"
    if not rs.open:
        return None
    return max(rs.open.values(), key=lambda p: p.line or 0).name


def _mib_key(key: str) -> str:
    return key[:-4] + "_mib" if key.endswith("_gib") else key


def _mib(gib_value: float | None) -> float | None:
    return None if gib_value is None else gib_value * GIB


def _midnight(prev: str, cur: str) -> bool:
    """Time-only prefixes ("[23:59:59 TP0]") wrap at midnight; that is not time going back."""
    p, c = prev.strip(), cur.strip()
    return len(p) <= 8 and p >= "20" and c < "04"
