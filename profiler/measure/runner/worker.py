"""One real sglang worker process: build its command for the scenario's PD role, start, wait, stop.

Roles (facts §6): decode-only runs with `--disaggregation-transfer-backend fake`; prefill-only needs a real
backend (mooncake over TCP by default, or nixl) and answers requests for sglang's fake bootstrap host;
null is the unified server. Weights are always `--load-format dummy` with the scenario's real config.json.
Each worker gets its own free ports, its own process group, its own log file and probe directory.

On a machine without CUDA the same worker runs on the CPU (`--device cpu`, a stub libcuda so sglang-kernel
imports, sglang's CPU fallbacks) and every number is host memory; prefill workers then run in a
loopback-only network namespace because mooncake listens on every interface.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from profiler.core.errors import MemfracError
from profiler.engine.launch import server_argv
from profiler.measure.machine import VISIBLE, cuda_machine, parent_entries, worker_env
from profiler.measure.probe.activate import absolute_list, probe_env
from profiler.measure.runner.net import NetThread, free_ports, get
from profiler.measure.runner.patience import Patience
from profiler.measure.runner.reaper import Watchdog, group_members, record, stop_group
from profiler.model.heuristic.releases import DEFAULT_RELEASE
from profiler.model.scenario import GraphSettings, Scenario

TRANSFER_PACKAGES = {
    "mooncake_tcp": ("mooncake", "mooncake-transfer-engine-cuda13 (GPU nodes) or mooncake-transfer-engine-non-cuda"),
    "mooncake": ("mooncake", "mooncake-transfer-engine-cuda13"),
    "nixl": ("nixl", "nixl"),
}
CPU_MAX_TOTAL_TOKENS = 8192


def check_transfer_backend(
    backend: str,
    find_spec: Callable[[str], object] | None = None,
    find_library: Callable[[str], str | None] | None = None,
) -> None:
    """Fail before starting anything when the prefill transfer engine cannot load; name what to install.

    `find_spec`/`find_library` default to importlib's and ctypes' finders (passed in to check another machine's
    answers)."""
    import ctypes.util

    find_spec = find_spec or importlib.util.find_spec
    find_library = find_library or ctypes.util.find_library
    mod, package = TRANSFER_PACKAGES.get(backend, (None, None))
    if mod is None:
        return
    if find_spec(mod) is None:
        raise MemfracError(f"prefill workers need the {backend} transfer engine: pip install {package}")
    if mod == "mooncake" and find_library("ibverbs") is None:
        raise MemfracError(
            "mooncake needs libibverbs even over TCP: apt-get install libibverbs1 (make test installs it)"
        )


@dataclass
class WorkerSpec:
    """Everything needed to start one worker: the command, its environment and where its files go."""

    scenario: Scenario
    device: str  # "cuda" | "cpu"
    out_dir: Path
    gpus: list[int] | None = None
    transfer_backend: str = "mooncake_tcp"
    isolate_network: bool = False
    netns_pid: int | None = None  # a pair's workers share one namespace, held by this process (pair.py)
    paired: bool = False  # one worker of a real prefill/decode pair (pair.py): a real transfer backend on both
    ready_path: str = "/health"  # what wait_ready polls (a pair's Rust router: /readiness)
    python: str = sys.executable
    port: int = 0
    bootstrap_port: int = 0
    nccl_port: int = 0
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def log_path(self) -> Path:
        return self.out_dir / "sglang.log"

    @property
    def probe_dir(self) -> Path:
        return self.out_dir / "probe"

    @property
    def visible_devices(self) -> list[str] | None:
        """The CUDA_VISIBLE_DEVICES entries the worker sees (None: every GPU of the node)."""
        raw = self.env.get(VISIBLE, os.environ.get(VISIBLE))
        return None if raw is None else [e.strip() for e in raw.split(",") if e.strip()]


def build_spec(
    s: Scenario,
    out_dir: Path,
    *,
    device: str | None = None,
    gpus: list[int] | None = None,
    transfer_backend: str = "mooncake_tcp",
    release: str = DEFAULT_RELEASE,
    stub_dir: Path | None = None,
    python: str | None = None,
    paired: bool = False,
) -> WorkerSpec:
    """The launch command and environment for scenario `s` in its role (nothing started yet).

    `paired`: the worker is one side of a real PD pair (profiler.measure.runner.pair): decode gets the same real
    transfer backend as prefill instead of `fake`, both hash each request's KV rows (probe/kv_hash.py)."""
    device = device or ("cuda" if cuda_machine() else "cpu")
    out_dir = Path(os.path.abspath(out_dir))  # every path a worker gets is absolute: it starts in out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    port, bport, nport = free_ports(3)
    spec = WorkerSpec(s, device, out_dir, gpus, transfer_backend, port=port, bootstrap_port=bport, nccl_port=nport,
                      paired=paired)  # fmt: skip
    if python:  # another environment's interpreter (or a launcher script that execs one)
        spec.python = os.path.abspath(python) if os.sep in python else python
    served = s
    if device == "cpu":  # sglang's CPU engine: no graphs, a bounded pool
        served = s.with_(
            decode_graph=GraphSettings(), prefill_graph=GraphSettings(), disable_cuda_graph=True,
            max_total_tokens=CPU_MAX_TOTAL_TOKENS,
        )  # fmt: skip
    a = [spec.python, "-m", "sglang.launch_server", *server_argv(served, release)]
    a += ["--load-format", "dummy", "--skip-tokenizer-init", "--host", "127.0.0.1", "--port", str(port)]
    a += ["--nccl-port", str(nport)]
    if s.mode == "decode" and not paired:
        a += ["--disaggregation-transfer-backend", "fake"]
    elif s.mode == "decode":
        check_transfer_backend(transfer_backend)
        a += ["--disaggregation-transfer-backend", transfer_backend]
    elif s.mode == "prefill":
        check_transfer_backend(transfer_backend)
        a += ["--disaggregation-transfer-backend", transfer_backend, "--disaggregation-bootstrap-port", str(bport)]
    env = dict(s.env_dict)
    if paired:
        env["MEMFRAC_KV_HASH"] = "1"  # probe/kv_hash.py: per-request proof of transfer
    if device == "cpu":
        a += ["--device", "cpu"]
        if s.mode == "decode":
            a += ["--disaggregation-decode-retraction-backup", "cpu_tensor"]
        env.update(_cpu_env(stub_dir or _cache_dir() / "cudastub"))
        if s.mode == "prefill" or paired:
            env["SGLANG_HOST_IP"] = "127.0.0.1"
            spec.isolate_network = _can_isolate() and not paired  # a pair shares its namespace (pair.py)
        if paired:
            # sglang 0.5.23 disaggregation/prefill.py:1743-1760 (_send_kv_chunk): a sender with
            # supports_host_tensor_indices copies the page indices into pinned memory and records a
            # torch.cuda.Event — CUDA only. This switch makes the KV manager transfer from every CP rank
            # (common/conn.py:385-386), which selects the plain host path (kv_to_page_indices); at CP size 1 it
            # changes nothing else.
            env.setdefault("SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER", "1")
        if s.mode == "prefill":
            # sglang 0.5.23 disaggregation/prefill.py:1496 (maybe_send_cached_prefix_chunk) records a
            # torch.cuda.Event on the forward stream, which on the CPU is no CUDA stream: the scheduler dies as
            # soon as a request starts with a cached prefix (a radix hit, or the second chunk of a request that
            # shared a batch). The early send is an optional optimisation ("the regular final send covers the
            # full range"); off on the CPU unless the scenario sets it.
            env.setdefault("SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX", "0")
    else:  # sweep index i = the i-th entry of the parent's CUDA_VISIBLE_DEVICES; PCI order, as nvidia-smi
        env.update(worker_env(gpus, parent_entries()))
    env.update(probe_env(out_dir / "plugin", spec.probe_dir, {**os.environ, **env}))
    spec.argv, spec.env = a, env
    return spec


def _cpu_env(stub_dir: Path) -> dict[str, str]:
    from profiler.measure.runner.cudastub import build_cuda_stub

    stub = os.path.abspath(build_cuda_stub(stub_dir))
    ld = os.environ.get("LD_LIBRARY_PATH", "")
    return {
        "SGLANG_USE_CPU_ENGINE": "1",
        "LD_LIBRARY_PATH": stub + (os.pathsep + absolute_list(ld) if ld else ""),
        "MEMFRAC_CPU_PATCHES": "1",
    }


def _last_line(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "memfrac"


def _can_isolate() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None and shutil.which("ip") is not None


class Worker:
    """A started worker. Always stop() it (or use it as a context manager): stop leaves no process behind."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.ready_at: float | None = None
        self.returncode: int | None = None
        self.stop_report: dict[str, object] = {}
        self.last_seen: dict[str, str] = {}  # what the worker last answered, per endpoint
        self.timeout_detail: str | None = None  # set when wait_ready ran out of time
        self.watchdog: Watchdog | None = None  # stops the group if memfrac dies without stopping it (reaper.py)

    def __enter__(self) -> Worker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def net(self) -> NetThread:
        if self.spec.netns_pid is not None:
            return NetThread(self.spec.netns_pid)
        return NetThread(self.proc.pid if self.spec.isolate_network and self.proc else None)

    def command(self) -> list[str]:
        a = self.spec.argv
        if self.spec.netns_pid is not None:
            return ["nsenter", f"--net=/proc/{self.spec.netns_pid}/ns/net", "--", *a]
        if self.spec.isolate_network:
            return ["unshare", "-n", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *a]
        return a

    def start(self) -> None:
        self.spec.probe_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.spec.env, "PYTHONUNBUFFERED": "1"}
        log = open(self.spec.log_path, "ab")  # noqa: SIM115  (owned by the child for its whole life)
        try:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True, cwd=str(self.spec.out_dir),
            )  # fmt: skip
        finally:
            log.close()
        self.started_at = time.monotonic()
        record(self.spec.out_dir, self.proc)  # a later --resume finds the group again (reaper.stop_recorded)
        self.watchdog = Watchdog(self.proc.pid, self.spec.scenario.run.stop_grace_s)

    def alive(self) -> bool:
        if self.proc is None:
            return False
        rc = self.proc.poll()
        if rc is not None:
            self.returncode = rc
        return rc is None

    def wait_ready(self, timeout_s: float, progress: object = None) -> bool:
        """Poll /health until 200 (sglang answers 503 until its warm-up request has finished) while the process
        lives. The limit is machine-normalised (Patience); on timeout `timeout_detail` says what was last seen."""
        patience = Patience(timeout_s, "startup")
        while True:
            if not self.alive():
                self.last_seen["process"] = f"exited with status {self.returncode}"
                return False
            try:
                path = self.spec.ready_path
                r = get(self.net, self.spec.port, path, timeout=min(10.0, max(1.0, patience.remaining_wall())))
                self.last_seen[path] = f"HTTP {r.status_code}"
                if r.status_code == 200:
                    self.ready_at = time.monotonic()
                    return True
            except (httpx.HTTPError, OSError) as e:
                self.last_seen[self.spec.ready_path] = f"{type(e).__name__}: {e}"[:200]
            if callable(progress):
                progress(time.monotonic() - self.started_at)
            if patience.spent():
                self.timeout_detail = self.seen(patience)
                return False
            time.sleep(0.5)

    def seen(self, patience: Patience) -> str:
        """The limit that ran out and what the worker last showed: its HTTP answers, the probe, its log."""
        from profiler.measure.probe.reader import read_probe_dir

        parts = [f"{k} → {v}" for k, v in self.last_seen.items()]
        try:
            probe = read_probe_dir(self.spec.probe_dir)
            flying = next(iter(probe.in_flight.values()), None)
            last = probe.ranks[0].phases[-1].name if probe.ranks and probe.ranks[0].phases else None
            if flying or last:
                parts.append(f"probe: in phase {flying}" if flying else f"probe: last phase ended {last}")
        except Exception:  # a half-written probe file says nothing more
            pass
        tail = _last_line(self.spec.log_path)
        if tail:
            parts.append(f"log: {tail[:200]}")
        return f"{patience.describe()}; last seen: " + ("; ".join(parts) or "nothing")

    def server_info(self, timeout_s: float = 60.0) -> dict[str, object] | None:
        """/server_info, asked again while the worker lives (a loaded machine may answer slowly)."""
        patience = Patience(timeout_s, "/server_info")
        while self.alive():
            try:
                wait = min(30.0, max(5.0, patience.remaining_wall()))
                r = get(self.net, self.spec.port, "/server_info", timeout=wait)
                if r.status_code == 200:
                    return r.json()
                self.last_seen["/server_info"] = f"HTTP {r.status_code}"
            except (httpx.HTTPError, OSError, ValueError) as e:
                self.last_seen["/server_info"] = f"{type(e).__name__}: {e}"[:200]
            if patience.spent():
                return None
            time.sleep(0.5)
        return None

    def group_pids(self) -> list[int]:
        """Live (non-zombie) processes of the worker's process group."""
        return [] if self.proc is None else [p.pid for p in group_members(self.proc.pid)]

    def stop(self, grace_s: float | None = None) -> dict[str, object]:
        """SIGTERM the main process (sglang drains and takes its children down), then SIGKILL the group and its
        descendants; then release the watchdog."""
        if self.proc is None or self.stop_report:
            return self.stop_report
        grace = Patience(self.spec.scenario.run.stop_grace_s if grace_s is None else grace_s, "stop")
        running = self.proc.poll() is None
        rep = stop_group(self.proc.pid, grace.remaining_wall(), first=self.proc.pid if running else None, term=running)
        if self.proc.poll() is None:
            self.proc.kill()
        self.returncode = self.proc.wait()
        if self.watchdog is not None:
            self.watchdog.release()
        self.stop_report = {**rep, "left_behind": self.group_pids(), "returncode": self.returncode}
        return self.stop_report
