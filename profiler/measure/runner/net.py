"""Loopback HTTP to a worker (httpx), optionally from inside its network namespace.

Prefill workers on a CPU machine run in a loopback-only network namespace (mooncake listens on every
interface); Linux network namespaces are per thread, so calls run on a dedicated thread that first joins the
worker's namespace (setns), and the httpx client is created and used on that thread — its sockets are
opened inside the namespace. Everything stays on 127.0.0.1.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

import httpx

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
HOST = "127.0.0.1"
# Plain http:// on loopback: no TLS is ever spoken, so no CA bundle is loaded (that costs ~75 ms of CPU per
# client, paid on every /health poll); proxy variables are ignored.
_OPTS = {"verify": False, "trust_env": False}


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _join_netns(pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into the network namespace of pid {pid}: {os.strerror(err)}")
    finally:
        os.close(fd)


class NetThread:
    """Runs callables on one thread, inside pid's network namespace when `netns_pid` is given."""

    def __init__(self, netns_pid: int | None = None) -> None:
        self.netns_pid = netns_pid

    def call(self, fn: Callable[[], T]) -> T:
        if self.netns_pid is None:
            return fn()
        fut: Future[T] = Future()

        def run() -> None:
            try:
                _join_netns(self.netns_pid)  # type: ignore[arg-type]
                fut.set_result(fn())
            except BaseException as e:
                fut.set_exception(e)

        th = threading.Thread(target=run, name="memfrac-netns", daemon=True)
        th.start()
        return fut.result()


def base_url(port: int) -> str:
    return f"http://{HOST}:{port}"


def client(port: int, timeout: float) -> httpx.Client:
    """A blocking client for one worker (create it on the thread that uses it: see NetThread)."""
    return httpx.Client(base_url=base_url(port), timeout=timeout, **_OPTS)


def async_client(port: int, connections: int) -> httpx.AsyncClient:
    """An asyncio client for the load driver: `connections` requests in flight at once, no client timeout
    (the driver bounds the whole burst)."""
    limits = httpx.Limits(max_connections=max(1, connections), max_keepalive_connections=max(1, connections))
    return httpx.AsyncClient(base_url=base_url(port), timeout=None, limits=limits, **_OPTS)


def get(net: NetThread, port: int, path: str, timeout: float = 10.0) -> httpx.Response:
    """A blocking GET through `net` (inside the worker's namespace when needed); raises httpx.HTTPError."""

    def go() -> httpx.Response:
        with client(port, timeout) as c:
            return c.get(path)

    return net.call(go)
