"""How logs are opened (magic bytes, not names), what a file with no server run says, and `memfrac ingest` on
files and directories: exit status, one warning line per file, parallel reading with identical results."""

from __future__ import annotations

import builtins
import codecs
import gzip
import hashlib
import os
import sys
import warnings
from pathlib import Path

import pytest

from profiler.core.errors import MemfracError, MemfracWarning
from profiler.ingest.core import log_files, run_ingest
from profiler.ingest.pool import read_logs
from profiler.logs import parse_log, read_log
from profiler.logs.inputs import content_kind, is_log_name, open_chunks, sniff
from tests.conftest import LOG_FIXTURES
from tests.logs.test_logs_prefixes import records
from tests.logstyles import COMPRESS

LOG = LOG_FIXTURES / "repo_unknown_qwen3-0.6b_wsl_4gb.log"


@pytest.mark.parametrize("codec", list(COMPRESS))
@pytest.mark.parametrize("name", ["x.log", "x.log.gz", "x.txt.zst", "server.log.1", "noext"])
def test_compression_is_read_from_the_magic_bytes(codec: str, name: str, tmp_path: Path) -> None:
    f = tmp_path / name
    f.write_bytes(COMPRESS[codec](LOG.read_bytes()))
    assert sniff(f) == ("text" if codec == "plain" else codec)
    assert records(parse_log(f)) == records(parse_log(LOG))


def test_concatenated_gzip_members_and_a_cut_off_stream(tmp_path: Path) -> None:
    data = LOG.read_bytes()
    half = data.rfind(b"\n", 0, len(data) // 2) + 1
    f = tmp_path / "rotated.log.gz"
    f.write_bytes(gzip.compress(data[:half]) + gzip.compress(data[half:]))  # `cat a.gz b.gz`
    assert records(parse_log(f)) == records(parse_log(LOG))
    cut = tmp_path / "cut.log.xz"
    cut.write_bytes(COMPRESS["xz"](data)[:-40])  # copied while being written: the text there is kept
    with pytest.warns(MemfracWarning, match=r"cut\.log\.xz: xz-compressed data is truncated"):
        (m,) = parse_log(cut)
    assert m.ranks[0].phase("weights") is not None


@pytest.mark.parametrize("codec", ["gzip", "xz", "bz2", "zstd"])
def test_a_truncated_compressed_log_says_so_and_keeps_what_was_read(codec: str, tmp_path: Path) -> None:
    """Issue 23: a cut .gz/.xz was read silently as a run that stopped early, a cut .zst called "empty"."""
    # hex digests: text that compresses only ~2x, so every codec's cut falls after whole blocks of it
    text = b"".join(b"line %06d %s\n" % (i, hashlib.sha256(b"%d" % i).hexdigest().encode()) for i in range(30000))
    packed = COMPRESS[codec](text)
    f = tmp_path / "cut.log"
    f.write_bytes(packed[: len(packed) * 3 // 4])
    cut = rf"cut\.log: {codec}-compressed data is truncated \(cut off after [\d,]+ bytes"
    with pytest.warns(MemfracWarning, match=cut):
        got = b"".join(open_chunks(f))
    assert 0 < len(got) < len(text) and text.startswith(got)  # the text before the cut, unchanged
    whole = tmp_path / "whole.log"
    whole.write_bytes(packed)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemfracWarning)  # a whole file warns of nothing
        assert b"".join(open_chunks(whole)) == text
    assert content_kind(f) == f"{codec}-compressed text"


def test_ingest_of_a_device_or_fifo_names_what_it_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from profiler.face.cli import main

    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    for path, kind in (("/dev/null", "a character device"), (str(fifo), "a FIFO")):
        assert main(["ingest", path]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"not {kind}" in err and "no such file" not in err, err
    assert main(["ingest", str(tmp_path / "missing.log")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


@pytest.mark.parametrize("bom", [True, False])
def test_utf16_from_powershell_redirection(bom: bool, tmp_path: Path) -> None:
    f = tmp_path / "ps.log"
    f.write_bytes((codecs.BOM_UTF16_LE if bom else b"") + LOG.read_text().encode("utf-16-le"))
    assert sniff(f) == "utf-16"
    assert records(parse_log(f)) == records(parse_log(LOG))


def test_zstd_without_zstandard_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "x.log"
    f.write_bytes(COMPRESS["zstd"](b"[2025-01-01 00:00:00] Load weight begin. avail mem=1 GB\n"))
    real_import = builtins.__import__

    def no_zstd(name: str, *a: object, **k: object) -> object:
        if name == "zstandard":
            raise ImportError("No module named 'zstandard'")
        return real_import(name, *a, **k)  # type: ignore[arg-type]

    monkeypatch.delitem(sys.modules, "zstandard", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_zstd)
    with pytest.raises(MemfracError, match=r"x\.log: zstd-compressed; reading it needs the 'zstandard' package"):
        parse_log(f)


def test_empty_binary_and_runless_files_each_say_what_they_hold(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    binary = tmp_path / "core.log"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8)
    prose = tmp_path / "notes.txt"
    prose.write_text("we restarted the server\nthen it worked\n")
    gz_binary = tmp_path / "blob.gz.log"
    gz_binary.write_bytes(gzip.compress(bytes(range(256)) * 8))
    assert read_log(empty).summary() == f"{empty}: empty file (0 bytes): no server run"
    assert read_log(binary).summary() == f"{binary}: binary data, not a text log (2,056 bytes): no server run"
    assert read_log(prose).summary() == (
        f"{prose}: 2 lines of text, none from an sglang server (no startup, memory or failure line): no server run"
    )
    assert content_kind(gz_binary) == "gzip-compressed binary"
    assert "gzip-compressed binary data, not a text log" in read_log(gz_binary).summary()


def test_ingest_exits_2_when_nothing_is_a_server_run(tmp_path: Path) -> None:
    (tmp_path / "empty.log").write_bytes(b"")
    (tmp_path / "x.log").write_bytes(b"\x00\x01\x02" * 100)
    warned: list[str] = []
    out: list[str] = []
    assert run_ingest([str(tmp_path)], fmt="json", echo=out.append, warn=warned.append) == 2
    assert out == []
    assert warned[0].endswith("empty.log: empty file (0 bytes): no server run")
    assert "x.log: binary data" in warned[1] and warned[2].startswith("no server run in 2 files")


def test_a_directory_is_read_with_rotated_and_compressed_logs_and_warns_per_file(tmp_path: Path) -> None:
    (tmp_path / "server.log").write_bytes(LOG.read_bytes())
    (tmp_path / "server.log.1").write_bytes(LOG.read_bytes())
    (tmp_path / "server.log.2.gz").write_bytes(gzip.compress(LOG.read_bytes()))
    (tmp_path / "old.out.zst").write_bytes(COMPRESS["zstd"](LOG.read_bytes()))
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "plot.png").write_bytes(b"\x89PNG")
    assert [p.name for p in log_files([tmp_path])] == [
        "empty.txt", "old.out.zst", "server.log", "server.log.1", "server.log.2.gz"]  # fmt: skip
    assert is_log_name("a.LOG.GZ") and not is_log_name("a.json") and not is_log_name("log")
    warned: list[str] = []
    out: list[str] = []
    assert run_ingest([str(tmp_path)], fmt="csv", echo=out.append, warn=warned.append, jobs=1) == 0
    assert len(out[0].splitlines()) == 1 + 4 and warned == [
        f"{tmp_path / 'empty.txt'}: empty file (0 bytes): no server run"
    ]


def test_parallel_reading_gives_the_same_runs_in_input_order(tmp_path: Path) -> None:
    files = sorted(LOG_FIXTURES.glob("*.log"))
    serial = [records(lf.runs) for lf in read_logs(files, jobs=1)]
    seen: list[int] = []
    parallel = [records(lf.runs) for lf in read_logs(files, jobs=2, progress=seen.append)]
    assert parallel == serial
    assert seen and seen[-1] == sum(f.stat().st_size for f in files) and seen == sorted(seen)


def test_missing_path_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(MemfracError, match="no such file or directory"):
        log_files([tmp_path / "nope.log"])
