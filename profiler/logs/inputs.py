"""Opening a log as it reaches users: plain or compressed, chosen by the file's first bytes, never its name.

    kind = sniff(path)                       # "gzip" | "xz" | "bz2" | "zstd" | "text" | "utf-16" | "empty" | "binary"
    for chunk in open_chunks(path):           # decompressed UTF-8 bytes, fixed-size chunks, constant memory
    log_files(["logs/", "x.log.gz"])          # what a directory stands for: *.log/.txt/.out/.err, rotated, compressed

Why magic bytes: rotated logs are renamed (`server.log.1`), CI artefacts and issue attachments keep or lose
`.gz` at random, and `docker logs > x.log` on Windows PowerShell writes UTF-16. gzip, xz and bz2 come with
Python; zstd needs the `zstandard` package (a clear error names it when it is missing). A file whose first
block is mostly NUL or control bytes is "binary" and is not parsed.
"""

from __future__ import annotations

import bz2
import codecs
import lzma
import os
import re
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from profiler.core.errors import MemfracError, MemfracWarning
from profiler.core.validate import readable_file

CHUNK_BYTES = 4 << 20
SNIFF_BYTES = 8192

MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"BZh", "bz2"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)
COMPRESSED = frozenset(k for _, k in MAGIC)
LOG_SUFFIXES = (".log", ".txt", ".out", ".err")
COMPRESSED_SUFFIXES = (".gz", ".gzip", ".xz", ".lzma", ".bz2", ".zst", ".zstd")
# "server.log", "server.log.1" (logrotate), "server.log.2.gz", "server-2026-01-01.log.zst", "job.out.xz".
_LOG_NAME = re.compile(
    r".*(?:" + "|".join(re.escape(s) for s in LOG_SUFFIXES) + r")(?:\.\d+)?"
    r"(?:" + "|".join(re.escape(s) for s in COMPRESSED_SUFFIXES) + r")?",
    re.IGNORECASE,
)
_TEXT_CONTROL = frozenset(b"\t\n\r\x0c\x1b\x08")


def is_log_name(name: str) -> bool:
    """Whether a directory entry is read as a log (by name; its content decides how it is opened)."""
    return _LOG_NAME.fullmatch(name) is not None


def log_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The files to read: a directory stands for its log files (sorted, not recursive); missing paths are errors."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(x for x in p.iterdir() if x.is_file() and is_log_name(x.name))
        else:  # a missing path, a device (/dev/null) or a FIFO: one line that says which
            out.append(readable_file(p, "", "a log file (or a directory of logs)"))
    return out


def sniff(path: str | os.PathLike[str]) -> str:
    """What the file is, from its first bytes (after decompression for the text/binary call)."""
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    if not head:
        return "empty"
    for magic, kind in MAGIC:
        if head.startswith(magic):
            return kind
    return _text_kind(head)


def _text_kind(head: bytes) -> str:
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    if len(head) >= 8:
        odd, even = head[1::2], head[0::2]
        if odd.count(0) >= 0.9 * len(odd) and even.count(0) <= 0.1 * len(even) and _text_kind(even) == "text":
            return "utf-16"  # UTF-16-LE without a BOM (ASCII text: every odd byte is NUL)
    bad = sum(1 for b in head if b < 32 and b not in _TEXT_CONTROL)
    return "binary" if bad * 20 > len(head) else "text"  # >5% control bytes: not a text log


def open_chunks(
    path: str | os.PathLike[str], size: int = CHUNK_BYTES, progress: Callable[[int], None] | None = None
) -> Iterator[bytes]:
    """The file's text as UTF-8 byte chunks of about `size`, decompressed and transcoded as needed.
    `progress(n)` is told the bytes of the file itself read so far (compressed bytes for compressed files)."""
    kind = sniff(path)
    if kind == "empty":
        return iter(())
    raw = _decompressed(path, kind, size, progress)
    if kind in COMPRESSED:
        first = next(raw, b"")
        if first and _text_kind(first[:SNIFF_BYTES]) == "utf-16":
            return _utf16(_chain(first, raw))
        return _chain(first, raw)
    if kind == "utf-16":
        return _utf16(raw)
    return raw


def content_kind(path: str | os.PathLike[str]) -> str:
    """ "gzip text", "text", "binary", "xz binary", "empty", ... for messages about what a file holds."""
    kind = sniff(path)
    if kind not in COMPRESSED:
        return kind
    it = _decompressed(path, kind, SNIFF_BYTES)
    try:
        first = next(it, b"")
    except MemfracError:
        return f"{kind}-compressed (damaged)"
    finally:
        it.close()  # type: ignore[attr-defined]
    return f"{kind}-compressed " + (_text_kind(first[:SNIFF_BYTES]) if first else "empty")


def _decompressed(
    path: str | os.PathLike[str], kind: str, size: int, progress: Callable[[int], None] | None = None
) -> Iterator[bytes]:
    f = _Counting(open(path, "rb"), progress)  # noqa: SIM115 - closed by _stream
    if kind == "gzip":
        return _incremental(f, str(path), size, lambda: zlib.decompressobj(wbits=47), kind)
    if kind == "xz":
        return _incremental(f, str(path), size, lzma.LZMADecompressor, kind)
    if kind == "bz2":
        return _incremental(f, str(path), size, bz2.BZ2Decompressor, kind)
    if kind == "zstd":
        try:
            import zstandard
        except ImportError as e:
            f.close()
            raise MemfracError(
                f"{path}: zstd-compressed; reading it needs the 'zstandard' package (pip install zstandard), "
                "or decompress it first (zstd -d)"
            ) from e
        # frame by frame like the others: a stream reader says nothing of a cut-off frame (it reads as empty)
        return _incremental(f, str(path), size, lambda: zstandard.ZstdDecompressor().decompressobj(), kind)
    return _stream(f, str(path), size, f)  # type: ignore[arg-type]


class _Counting:
    """A file object that tells how many of its bytes have been read (progress on compressed input)."""

    def __init__(self, f: BinaryIO, progress: Callable[[int], None] | None) -> None:
        self._f, self._progress, self.done = f, progress, 0

    def read(self, n: int = -1) -> bytes:
        b = self._f.read(n)
        self.done += len(b)
        if self._progress is not None and b:
            self._progress(self.done)
        return b

    def readinto(self, buf: bytearray) -> int:
        n = self._f.readinto(buf)
        self.done += n
        if self._progress is not None and n:
            self._progress(self.done)
        return n

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._f.close()

    @property
    def closed(self) -> bool:
        return self._f.closed


def _stream(f: BinaryIO, name: str, size: int, raw: _Counting) -> Iterator[bytes]:
    got = False
    try:
        while chunk := f.read(size):
            got = True
            yield chunk
    except EOFError as e:  # a stream cut off (a log rotated or copied while written): keep what was there
        if not got:
            raise MemfracError(f"{name}: compressed data is cut off before any text ({e})") from e
    except (OSError, lzma.LZMAError, zlib.error) as e:
        raise MemfracError(f"{name}: compressed data is damaged or cut off ({e})") from e
    except Exception as e:  # zstandard.ZstdError and friends
        if type(e).__module__.startswith("zstandard"):
            raise MemfracError(f"{name}: zstd-compressed data is damaged or cut off ({e})") from e
        raise
    finally:
        if f is not raw:
            f.close()
        raw.close()


def _incremental(f: _Counting, name: str, size: int, new: Callable[[], Any], kind: str = "") -> Iterator[bytes]:
    """Decompress block by block: every member/stream/frame of a concatenation (`cat a.gz b.gz`), and what a
    stream cut off (copied while being written) holds up to the cut — kept, with a MemfracWarning naming the
    file, so a truncated log is never read silently as a run that stopped early."""
    d = new()
    got = 0
    what = f"{kind}-compressed" if kind else "compressed"
    try:
        while block := f.read(size):
            try:
                out = d.decompress(block)
                while d.eof and d.unused_data:
                    rest = d.unused_data
                    d = new()
                    out += d.decompress(rest)
            except Exception as e:  # zlib.error, LZMAError, OSError, EOFError, zstandard.ZstdError
                if not isinstance(e, zlib.error | lzma.LZMAError | OSError | EOFError) and not type(
                    e
                ).__module__.startswith("zstandard"):
                    raise
                raise MemfracError(f"{name}: {what} data is damaged ({e})") from e
            if out:
                got += len(out)
                yield out
        tail = d.flush() if hasattr(d, "flush") else b""
        if tail:
            got += len(tail)
            yield tail
        if not d.eof:
            if not got:
                raise MemfracError(f"{name}: {what} data is cut off before any text")
            warnings.warn(
                MemfracWarning(f"{name}: {what} data is truncated (cut off after {got:,} bytes of text); what was "
                               "read is kept, the rest of the log is missing"),
                stacklevel=2,
            )  # fmt: skip
    finally:
        f.close()


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from rest


def _utf16(raw: Iterator[bytes]) -> Iterator[bytes]:
    """UTF-16 (PowerShell redirection) → UTF-8, incrementally; the BOM, if any, says the byte order."""
    dec: codecs.IncrementalDecoder | None = None
    for chunk in raw:
        if dec is None:
            if chunk.startswith(codecs.BOM_UTF16_BE):
                dec = codecs.getincrementaldecoder("utf-16-be")("replace")
                chunk = chunk[2:]
            else:
                if chunk.startswith(codecs.BOM_UTF16_LE):
                    chunk = chunk[2:]
                dec = codecs.getincrementaldecoder("utf-16-le")("replace")
        text = dec.decode(chunk)
        if text:
            yield text.encode("utf-8", "replace")
    if dec is not None:
        tail = dec.decode(b"", final=True)
        if tail:
            yield tail.encode("utf-8", "replace")
