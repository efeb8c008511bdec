"""Loopback HTTP to a worker, optionally from inside its network namespace, with no dependencies.

Prefill workers on a CPU machine run in a loopback-only network namespace (mooncake listens on every
interface); Linux network namespaces are per thread, so calls run on a dedicated thread that first
joins the worker's namespace (setns). Everything stays on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
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


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    elapsed_s: float

    def json(self) -> Any:
        return json.loads(self.body.decode() or "null")


async def http_request(
    port: int, method: str, path: str, body: Any = None, timeout: float = 30.0, host: str = "127.0.0.1"
) -> Response:
    """One HTTP/1.1 request (Connection: close) to host:port; raises OSError/TimeoutError on failure."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    payload = b"" if body is None else json.dumps(body).encode()
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode()

    async def go() -> Response:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(head + payload)
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
        header, _, rest = raw.partition(b"\r\n\r\n")
        lines = header.split(b"\r\n")
        try:
            status = int(lines[0].split()[1])
        except (IndexError, ValueError):
            raise OSError(f"bad HTTP response from port {port}: {lines[0][:80]!r}") from None
        if any(h.lower().startswith(b"transfer-encoding: chunked") for h in lines[1:]):
            rest = _unchunk(rest)
        return Response(status, rest, loop.time() - t0)

    return await asyncio.wait_for(go(), timeout)


def _unchunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size_line, _, data = data.partition(b"\r\n")
        try:
            n = int(size_line.split(b";")[0], 16)
        except ValueError:
            break
        if n == 0:
            break
        out += data[:n]
        data = data[n + 2 :]
    return bytes(out)


def get(net: NetThread, port: int, path: str, timeout: float = 10.0) -> Response:
    """A blocking GET through `net` (inside the worker's namespace when needed)."""
    return net.call(lambda: asyncio.run(http_request(port, "GET", path, timeout=timeout)))
