"""LogBuilder, runs and ranks: where one server start ends and the next begins, which rank a line is.

The split rules are in build.py's docstring; a new reason to split a run goes in `RunsAndRanks._split_reason`."""

from __future__ import annotations

import calendar
import time

from profiler.logs.build_base import (
    GIB,
    MEMORY_BACK_MIB,
    BuilderState,
    _ArgsWindow,
)
from profiler.logs.build_phases import _draft_capture, _draft_init
from profiler.logs.launchcmd import parse_launch_command
from profiler.logs.patterns import GRAPH_PHASES, Event
from profiler.logs.placement import run_holding
from profiler.logs.run import VersionCue, _RankState, _Run
from profiler.logs.serverargs import parse_server_args

_QUIET_KINDS = frozenset({"end", "note", "kv", "ladder"})  # events that never start a run by themselves


class RunsAndRanks(BuilderState):
    """Runs, ranks, launch commands and server_args lines."""

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
        if ev.phase == "init_parallel" and rs.rank.phases and not _draft_init(run, rs):
            return f"torch distributed initialised again on rank '{label}'"
        if ev.kind == "begin" and ev.phase in GRAPH_PHASES and not (ev.phase == "decode_graph" and _draft_capture(rs)):
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

    def _assign_cues(self, runs: list[_Run]) -> None:
        """Release cues go to the run whose lines they sit among, else to the run they precede (a header
        before the start), else to the last run before them (an issue's environment block after its log)."""
        for lineno, cue in self._cues:
            target = run_holding(runs, lineno)
            if target is not None:
                target.cues.append((lineno, cue))
        stated: list[tuple[int, VersionCue]] = []
        for run in runs:  # a later start in the same file without its own cue: the same install, said so
            if run.cues:
                stated = run.cues
            elif stated:
                run.cues = [(n, c._replace(how=f"{c.how}, stated for an earlier run in this file")) for n, c in stated]


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


def _midnight(prev: str, cur: str) -> bool:
    """Time-only prefixes ("[23:59:59 TP0]") wrap at midnight; that is not time going back."""
    p, c = prev.strip(), cur.strip()
    return len(p) <= 8 and p >= "20" and c < "04"


def _bare_command(run: _Run) -> bool:
    """A run that is only a launch command: no server_args, no phase, no failure, no traffic. Text around a log
    (an issue's "Reproduction" section, a script quoted in prose) is not a server start of its own."""
    return (
        run.cmd is not None
        and run.server_args is None
        and not run.has_phases()
        and run.floating is None
        and not any(rs.fs is not None for rs in run.ranks.values())
        and not run.serving
        and run.ready_line is None
        and run.fired_line is None
        and run.server_pid is None
    )


def _fold_commands(runs: list[_Run]) -> list[_Run]:
    """Each run that is only a launch command joins the run it describes: the one before it when that has no
    command of its own (a log, then the command that produced it), else the one after it (a command, then its
    log, split by something in between). Beside a run whose own command sets the same args it is that command
    quoted again: noted there and dropped. A command with other args stays a run (another attempt whose output
    was not pasted; runs never merge across attempts)."""
    out: list[_Run] = []
    pending: _Run | None = None  # a command-only run at the head, waiting for the run after it
    for run in runs:
        if pending is not None:
            if run.cmd is None and not _bare_command(run):
                _take_command(run, pending, "before")
            elif _same_command(run, pending):
                run.m.notes.append(f"launch command at line {pending.first_line} repeats this run's own command: "
                                   "not read as a run of its own")  # fmt: skip
            else:
                out.append(pending)
            pending = None
        if _bare_command(run) and len(runs) > 1:
            prev = out[-1] if out else None
            if prev is not None and prev.cmd is None and (prev.failed_at() is None or _args_agree(prev, run)):
                _take_command(prev, run, "after")  # after a failure only when its server_args agree: else a
                continue  # new attempt (issue 11)
            if prev is not None and _same_command(prev, run):
                prev.m.notes.append(f"launch command at line {run.first_line} repeats this run's own command: "
                                    "not read as a run of its own")  # fmt: skip
                continue
            if prev is None:
                pending = run
                continue
        out.append(run)
    if pending is not None:
        out.append(pending)
    return out


def _args_agree(run: _Run, bare: _Run) -> bool:
    """The run's server_args state every arg the command sets, with the same values (model path included)."""
    sa, cmd = run.server_args, bare.cmd
    if sa is None or cmd is None or "model_path" not in cmd.args:
        return False
    return all(k in sa.args and str(sa.args[k]) == str(v) for k, v in cmd.args.items())


def _same_command(run: _Run, bare: _Run) -> bool:
    return run.cmd is not None and bare.cmd is not None and run.cmd.args == bare.cmd.args


def _take_command(run: _Run, bare: _Run, where: str) -> None:
    run.cmd = bare.cmd
    run.cues.extend(bare.cues)
    run.m.notes.append(f"launch command at line {bare.first_line}, {where} this run's log lines, taken as the one that "
                       "started it (a command alone, with no log lines of its own, is not a run)")  # fmt: skip
