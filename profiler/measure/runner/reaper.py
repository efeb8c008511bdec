"""Nothing left behind: every process memfrac starts is stopped, whichever way memfrac itself ends.

A worker lives in its own process group (its own session: a terminal's Ctrl-C reaches memfrac, not sglang).
memfrac stops it itself on a normal end, an exception, SIGINT and SIGTERM (Worker.stop; the CLI's interrupt path
calls `stop_children`). For memfrac's own death by SIGKILL — which runs no code of its — each group gets a
watchdog: this file run as a tiny process in its own session, reading a pipe whose write end only memfrac
holds. The kernel closes that end when memfrac dies, however it dies; the watchdog reads end-of-file and stops
the group (SIGTERM, then SIGKILL after the grace). memfrac writes `done` when it stopped the group itself.

Each started group is also recorded in its run directory (`worker.json`: pid, process group, start time), so a
later `--resume` can stop a worker that outlived even its watchdog (`stop_recorded`).

Process trees are psutil's. Only the standard library and psutil are imported: the watchdog runs this file as a
script, without the profiler package on its path.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

RECORD = "worker.json"  # in a run directory: the process group a worker started there runs in


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of process group `pgid`."""
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                out.append(p)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return out


def _tree(pgid: int) -> list[psutil.Process]:
    """The group and every descendant of its members (a child that left the group with setsid is still theirs)."""
    seen: dict[int, psutil.Process] = {}
    for p in group_members(pgid):
        seen[p.pid] = p
        with contextlib.suppress(psutil.Error):
            for c in p.children(recursive=True):
                seen.setdefault(c.pid, c)
    return list(seen.values())


def _gone(p: psutil.Process) -> bool:
    """Exited: no such process, or a zombie (our own child, reaped by its Popen; never waited on here, so that
    its Popen keeps the exit status)."""
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _wait(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if not _gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if not _gone(p)]
    return alive


def stop_group(pgid: int, grace_s: float, first: int | None = None, term: bool = True) -> dict[str, object]:
    """SIGTERM (to `first` only when given: sglang's main process drains and takes its children down; else to
    the whole group; none when `term` is False: already sent), wait up to `grace_s`, then SIGKILL the group and
    its descendants. Returns how long it took, whether SIGKILL was needed and what is still alive."""
    t0 = time.monotonic()
    procs = _tree(pgid)
    if term:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if first is not None:
                os.kill(first, signal.SIGTERM)
            else:
                os.killpg(pgid, signal.SIGTERM)
    alive = _wait(procs, max(0.0, grace_s))
    alive += [p for p in _tree(pgid) if p not in alive and not _gone(p)]
    killed = bool(alive)
    if alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        alive = _wait(alive, 10.0)
    return {"stop_s": round(time.monotonic() - t0, 2), "sigkill": killed, "left_behind": [p.pid for p in alive]}


class Watchdog:
    """The watchdog of one process group (see the module docstring). `release()` once the group is stopped."""

    def __init__(self, pgid: int, grace_s: float) -> None:
        r, self._w = os.pipe()  # both ends close-on-exec: no other child of memfrac inherits the write end
        try:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, str(pgid), str(grace_s)], stdin=r, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
            )  # fmt: skip
        finally:
            os.close(r)

    def release(self) -> None:
        """The group was stopped by memfrac: the watchdog exits without touching anything."""
        if self._w < 0:
            return
        with contextlib.suppress(OSError):
            os.write(self._w, b"done\n")
        os.close(self._w)
        self._w = -1
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def watch(pgid: int, grace_s: float, poll_s: float = 1.0) -> None:
    """The watchdog's loop: stop the group when stdin (the pipe from memfrac) ends; leave when told `done` or
    when the group is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while True:
        ready, _, _ = select.select([0], [], [], poll_s)
        if ready:
            data = os.read(0, 64)
            if data.startswith(b"done"):
                return
            if not data:  # memfrac is gone, however it died
                stop_group(pgid, grace_s)
                return
        if not group_members(pgid):
            return


def record(run_dir: Path, proc: subprocess.Popen[bytes]) -> None:
    """Write `worker.json`: enough for a later process to find this group again and know it is the same one."""
    try:
        created = psutil.Process(proc.pid).create_time()
    except psutil.Error:
        created = None
    rec = {"pid": proc.pid, "pgid": proc.pid, "create_time": created, "memfrac_pid": os.getpid(), "argv": proc.args}
    tmp = run_dir / f".{RECORD}.tmp"
    tmp.write_text(json.dumps(rec, default=str))
    tmp.replace(run_dir / RECORD)


def stop_recorded(run_dir: Path, grace_s: float = 10.0) -> list[int]:
    """Stop every group recorded under `run_dir` (worker.json, any depth) whose leader or members still run;
    return the process groups stopped. A recorded pid now used by another process (its start time differs) is
    left alone."""
    stopped = []
    for f in sorted(run_dir.rglob(RECORD)):
        try:
            rec = json.loads(f.read_text())
            pgid, pid, created = int(rec["pgid"]), int(rec["pid"]), rec.get("create_time")
        except (OSError, ValueError, KeyError, TypeError):
            continue
        members = group_members(pgid)
        if not members:
            continue
        leader = next((p for p in members if p.pid == pid), None)
        if leader is not None and created is not None:
            with contextlib.suppress(psutil.Error):
                if abs(leader.create_time() - float(created)) > 1.0:
                    continue  # the pid was reused: not our worker
        stop_group(pgid, grace_s)
        stopped.append(pgid)
    return stopped


def stop_children(grace_s: float = 10.0) -> dict[str, object]:
    """Stop every process group this process started (each child's group and its descendants; watchdogs too):
    the CLI's interrupt path, where a sweep's workers run in executor threads that will not get to stop them."""
    me = psutil.Process()
    own = os.getpgid(0)
    groups = set()
    for c in me.children():
        with contextlib.suppress(ProcessLookupError, psutil.Error):
            groups.add(os.getpgid(c.pid))
    groups.discard(own)  # what runs in memfrac's own group (a test runner's other children) is not memfrac's
    for g in groups:  # SIGTERM to all at once: a sweep's workers drain side by side
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(g, signal.SIGTERM)
    left: list[int] = []
    for g in sorted(groups):
        left += stop_group(g, grace_s, term=False)["left_behind"]  # type: ignore[operator]
    return {"groups": sorted(groups), "left_behind": left}


if __name__ == "__main__":  # the watchdog process: reaper.py PGID GRACE_S
    watch(int(sys.argv[1]), float(sys.argv[2]))
