"""Loopback HTTP through httpx: plain, chunked, the load driver's bound, and inside a network namespace.

Real HTTP servers on 127.0.0.1 (the standard library's, and the worker double tests/fakes/fake_sglang.py
inside `unshare -n`, as prefill workers run on a CPU machine); nothing here imitates httpx.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from profiler.measure.runner.load import LoadPlan, run_load
from profiler.measure.runner.net import NetThread, free_ports, get
from profiler.measure.runner.patience import Patience
from tests.conftest import FAKE_WORKER

FAKE_WORKER = FAKE_WORKER


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/chunked":  # what a streaming ASGI response sends
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b'{"max_total', b'_num_tokens": ', b"8192}"):
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        body = b'{"ok": true}'
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # /generate that never answers (a stuck worker)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(30)

    def log_message(self, *a: object) -> None:
        pass


@contextmanager
def server() -> Iterator[int]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def test_get_plain_and_chunked():
    with server() as port:
        r = get(NetThread(), port, "/health", timeout=10)
        assert r.status_code == 200 and r.json() == {"ok": True}
        r = get(NetThread(), port, "/chunked", timeout=10)
        assert r.status_code == 200 and r.json() == {"max_total_num_tokens": 8192}
        assert get(NetThread(), port, "/nothing", timeout=10).status_code == 404


def test_proxy_variables_are_ignored(monkeypatch):
    """Loopback only: an HTTP_PROXY in the environment must not route the worker's requests elsewhere."""
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    with server() as port:
        assert get(NetThread(), port, "/health", timeout=10).status_code == 200


def test_load_bound_cancels_requests_still_in_flight():
    """/generate never answers: with a 1 s bound the burst ends within seconds, every request timed out."""
    with server() as port:
        plan = LoadPlan("decode", requests=3, concurrency=3, input_len=4, output_len=2)
        t0 = time.monotonic()
        (res,) = run_load(NetThread(), port, "decode", [plan], timeout_s=1.0)
        took = time.monotonic() - t0
    assert res.timed_out and res.sent == 3 and res.ok == 0 and res.failed == 3
    assert res.errors[0].startswith("timed out: load:") and "limit 1 s" in res.errors[0]
    assert took < 1.0 * 8 + 5  # the bound at the slowness cap, plus the client's close


def test_connection_refused_is_an_httpx_error():
    (port,) = free_ports(1)
    with pytest.raises(httpx.ConnectError):
        get(NetThread(), port, "/health", timeout=5)


def _netns_possible() -> str | None:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return "a network namespace needs root, unshare and ip"
    return None


@pytest.mark.skipif(_netns_possible() is not None, reason=_netns_possible() or "")
def test_requests_from_inside_a_workers_network_namespace(tmp_path):
    """The worker double serves in a loopback-only namespace: reachable through NetThread(pid) only."""
    (port,) = free_ports(1)
    env = {**os.environ, "FAKE_BEHAVIOUR": "ok", "MEMFRAC_PROBE_DIR": str(tmp_path / "probe")}
    cmd = ["unshare", "-n", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
           sys.executable, str(FAKE_WORKER), "-m", "sglang.launch_server", "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        net = NetThread(proc.pid)
        seen: list[str] = []

        def healthy() -> bool:
            try:
                return get(net, port, "/health", timeout=5).status_code == 200
            except httpx.HTTPError as e:
                seen.append(type(e).__name__)
                return False

        p = Patience(30, "fake worker /health in its namespace")
        assert p.until(healthy, poll_s=0.1), f"{p.describe()}; last seen: {seen[-1:]}"
        info = get(net, port, "/server_info", timeout=10).json()
        assert info["max_running_requests"] == 4
        with pytest.raises(httpx.ConnectError):  # outside the namespace nothing listens on that port
            get(NetThread(), port, "/health", timeout=5)
        plan = LoadPlan("decode", requests=4, concurrency=4, input_len=8, output_len=5)
        (res,) = run_load(net, port, "decode", [plan], timeout_s=30)
        assert (res.ok, res.failed, res.output_tokens) == (4, 0, 20) and not res.timed_out, json.dumps(res.as_dict())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
