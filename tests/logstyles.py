"""How real logs reach memfrac: line prefixes and packagings, applied to fixture text (for the test matrix and
the fuzz tests). Each style is what a tool really writes in front of every line."""

from __future__ import annotations

import bz2
import gzip
import lzma
from collections.abc import Callable

import zstandard


def _ts(i: int) -> str:
    return f"2026-02-0{1 + i // 86400 % 9}T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}"


PREFIXES: dict[str, Callable[[int], str]] = {
    "docker-desktop": lambda i: f"2026-02-01 {i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d} ",
    "rfc3339": lambda i: f"{_ts(i)}.{i * 7919 % 1_000_000_000:09d}Z ",  # kubectl logs --timestamps
    "cri": lambda i: f"{_ts(i)}.{i % 1000:03d}456789Z stdout F ",  # /var/log/pods/*/0.log
    "journald": lambda i: (
        f"Feb {1 + i % 9:2d} {i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d} gpu-node-7 python3[41234]: "
    ),
    "compose": lambda i: "sglang-1  | ",
    "github-quote": lambda i: "> ",
    "indent-4": lambda i: "    ",
    "tab": lambda i: "\t",
    "github-actions": lambda i: f"{_ts(i)}.{i % 10_000_000:07d}Z ",
}


def prefixed(text: str, style: str) -> str:
    fn = PREFIXES[style]
    return "".join(fn(i) + line for i, line in enumerate(text.splitlines(keepends=True)))


def fenced(text: str) -> str:
    """A markdown code block as pasted in an issue; the opening fence is glued to the first line."""
    return "```log " + text.rstrip("\n") + "\n```\n"


COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "plain": lambda b: b,
    "gzip": gzip.compress,
    "xz": lzma.compress,
    "bz2": bz2.compress,
    "zstd": lambda b: zstandard.ZstdCompressor().compress(b),
}


#: Request traffic in real sglang formats (decode and prefill batch lines, an HTTP access line), with {r}
#: running requests, {t} tokens and {u} token usage to fill in: what sits between memory lines in a served log.
SERVING = [
    "[2026-03-01 10:00:00 TP0] Decode batch, #running-req: {r}, #token: {t}, token usage: {u:.2f}, cuda graph: True, "
    "gen throughput (token/s): 1234.56, #queue-req: 0",
    "[2026-03-01 10:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: {u:.2f}, "
    "#running-req: {r}, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 99.00",
    '[2026-03-01 10:00:00] INFO:     127.0.0.1:4{r} - "POST /generate HTTP/1.1" 200 OK',
]
