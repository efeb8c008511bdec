"""One file on several cores: byte ranges scanned apart (`scan_range`) and replayed in order (`RangeReplay`) give
exactly the serial scan's lines and records. Ranges are forced tiny, so that wrapped OOM messages, backslash
continuations, wrapped server_args, tqdm CR segments, CRLF/ANSI bodies and a last line without a newline
straddle range boundaries; traffic peaks and the rank-label rule carry across ranges; a line longer than a
chunk cannot be split and the file is read in one pass instead; worker processes give the same files, in
order. Every matcher (aho, hyperscan, re) is checked where it imports."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiler.ingest.pool import _plan, read_logs
from profiler.logs import _head_text, prefixes, ranges, read_log, read_ranges
from profiler.logs import lines as L
from profiler.logs.build import LogBuilder
from profiler.logs.lines import LineScanner
from profiler.logs.matchers import MATCHERS, ReMatcher
from profiler.logs.ranges import RangeReplay, scan_range, split_ranges
from tests.logs.test_logs_prefixes import LOGS, TEXT, records
from tests.logstyles import COMPRESS, SERVING, prefixed


def _matchers() -> list[ReMatcher]:
    out = []
    for cls in MATCHERS.values():
        with contextlib.suppress(ImportError):
            out.append(cls())
    return out


MATCHER_OBJS = _matchers()
IDS = [m.name for m in MATCHER_OBJS]
STYLES: dict[str, Any] = {
    "plain": lambda t: t,
    "crlf": lambda t: t.replace("\n", "\r\n"),
    "ansi": lambda t: "".join(f"\x1b[32m{ln}\x1b[0m\n" for ln in t.splitlines()),
    "docker": lambda t: prefixed(t, "docker-desktop"),
}


def _delivered(path: Path, matcher: ReMatcher, spans: list[tuple[int, int]] | None = None) -> list[Any]:
    """What the real parser is handed, line by line, and the records it makes: one pass, or the ranges."""
    got: list[tuple[int, str]] = []
    scanner: Any = LineScanner(matcher) if spans is None else RangeReplay(path, matcher)
    builder = LogBuilder(path.name, str(path), scanner)
    builder.learn(_head_text(path.read_bytes()[: prefixes.LEARN_BYTES]))
    if spans is None:
        lines = scanner.scan_file(path)
    else:
        lines = scanner.replay(scan_range(path, a, b, matcher) for a, b in spans)
    for n, text in lines:
        got.append((n, text))
        builder.line(n, text)
    return [got, scanner.lines, [m.to_dict() for m in builder.finish()]]


def _starts(data: bytes) -> list[int]:
    return [i + 1 for i, c in enumerate(data) if c == 10 and i + 1 < len(data)]


def _wrapped_text() -> str:
    """Two real server starts: an OOM message wrapped by a terminal at 61 columns, then a 13-line launch
    command with backslash continuations; a tqdm bar with CR redraws, and no newline at the very end."""
    name = "repo_unknown_glm52-fp8_8xH200_hisparse_a3.log"
    lines = TEXT[name].splitlines()
    k = next(i for i, ln in enumerate(lines) if "Tried to allocate" in ln)
    head, msg = lines[k].split("| ", 1)
    wrapped = [head + "| " + msg[:61]] + [msg[i : i + 61] for i in range(61, len(msg), 61)]
    assert len(wrapped) > 3
    bar = (
        "Capturing batches (bs=24 avail_mem=4.00 GB):   0%|          | 0/7 [00:00<?, ?it/s]\r"
        "Capturing batches (bs=16 avail_mem=3.93 GB):  14%|█▍        | 1/7 [00:02<00:17,  2.96s/it]"
    )
    return "\n".join([*lines[:k], *wrapped, *lines[k + 1 :], bar, TEXT["sglang-24453.log"].rstrip("\n")])


@pytest.mark.parametrize("matcher", MATCHER_OBJS, ids=IDS)
def test_every_cut_between_two_ranges_gives_the_serial_lines(matcher: ReMatcher, tmp_path: Path) -> None:
    f = tmp_path / "two-starts.log"
    f.write_bytes(_wrapped_text().encode())
    data = f.read_bytes()
    want = _delivered(f, matcher)
    assert len(want[2]) == 2 and want[2][0]["failure"]["kind"].startswith("oom")
    for cut in _starts(data):  # the boundary at every line start: inside the OOM, the command, the bar
        assert _delivered(f, matcher, [(0, cut), (cut, len(data))]) == want, cut


@pytest.mark.parametrize("matcher", MATCHER_OBJS, ids=IDS)
@pytest.mark.parametrize("style", list(STYLES))
def test_every_fixture_in_tiny_ranges(matcher: ReMatcher, style: str, tmp_path: Path) -> None:
    for p in LOGS:
        f = tmp_path / p.name
        f.write_bytes(STYLES[style](TEXT[p.name]).encode())
        want = _delivered(f, matcher)
        for size in (61, 997):
            spans = split_ranges(f, max(1, f.stat().st_size // size), min_bytes=1)
            assert _delivered(f, matcher, spans) == want, (style, p.name, size)
        assert records(read_log(f, matcher=matcher, range_bytes=333).runs) == records(read_log(f).runs)


TRAFFIC = [
    *SERVING,
    "[2026-03-01 10:00:00 TP{k}] KV cache pool is full. Retract requests. #retracted_reqs: 1",
    "[2026-03-01 10:00:00 DP{k} TP{k}] Decode batch, #running-req: {r}, token usage: {u:.2f}, #queue-req: 0",
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    items=st.lists(
        st.tuples(st.sampled_from(TRAFFIC), st.integers(0, 3000), st.integers(0, 100), st.integers(0, 3)),
        min_size=1,
        max_size=150,
    ),
    cuts=st.lists(st.integers(0, 10**6), max_size=6),
    discovery=st.sampled_from([150, 400, 4 << 20]),
)
def test_peaks_and_rank_labels_carry_across_ranges(
    items: list[tuple[str, int, int, int]], cuts: list[int], discovery: int
) -> None:
    """The lines handed on (peaks of #running-req and token usage since the last keyword line, the first line
    of each rank label while labels keep coming) are the serial scan's, wherever the ranges are cut; a small
    discovery window makes the stop rule of the label search fire inside and across ranges."""
    import tempfile

    text = "\n".join(fmt.format(r=r, t=r * 7, u=u / 100, k=k) for fmt, r, u, k in items) + "\n"
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "traffic.log"
        f.write_bytes(text.encode())
        data = f.read_bytes()
        starts = _starts(data)
        bounds = sorted({starts[c % len(starts)] for c in cuts} if starts else set())
        spans = list(zip([0, *bounds], [*bounds, len(data)], strict=True))
        old = L.RANK_DISCOVERY_BYTES
        L.RANK_DISCOVERY_BYTES = discovery
        try:
            for m in MATCHER_OBJS:
                serial = list(LineScanner(m).scan([data]))
                replay = RangeReplay(f, m)
                assert list(replay.replay(scan_range(f, a, b, m) for a, b in spans)) == serial, (m.name, spans)
                assert replay.lines == len(items)
        finally:
            L.RANK_DISCOVERY_BYTES = old


def test_a_line_longer_than_a_chunk_is_read_in_one_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "long.log"
    f.write_bytes(
        TEXT["sglang-8538.log"].encode() + b"x" * 9000 + b" avail mem=1.00 GB\n" + TEXT["sglang-1479.log"].encode()
    )
    size = f.stat().st_size
    rs = scan_range(f, 0, size, chunk=4096)
    assert rs.error is not None and "longer than 4,096 bytes" in rs.error
    assert read_ranges(f, [rs]) is None
    # In worker processes (forked: they see the smaller chunk too): the ranges fail, the file is read whole.
    monkeypatch.setattr(L, "CHUNK_BYTES", 4096)
    (lf,) = read_logs([f], jobs=2, range_bytes=2000)
    assert records(lf.runs) == records(read_log(f).runs) and len(lf.runs) == 2


def test_ranges_in_worker_processes_give_the_files_in_order(tmp_path: Path) -> None:
    files = []
    for i, p in enumerate(LOGS[:8]):
        f = tmp_path / f"{i}-{p.name}"
        codec = "gzip" if i == 3 else "plain"  # a compressed file is read whole, in one worker
        f.write_bytes(COMPRESS[codec](TEXT[p.name].encode()))
        files.append(f)
    serial = [(lf.path, records(lf.runs), lf.lines) for lf in read_logs(files, jobs=1)]
    seen: list[int] = []
    got = [
        (lf.path, records(lf.runs), lf.lines) for lf in read_logs(files, jobs=2, range_bytes=700, progress=seen.append)
    ]
    assert got == serial
    assert seen == sorted(seen) and seen[-1] == sum(f.stat().st_size for f in files)


def test_which_files_are_split(tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    big.write_bytes((b"[2026-03-01 10:00:00 TP0] Decode batch, #running-req: 1, token usage: 0.01\n") * 230_000)
    small = tmp_path / "small.log"
    small.write_bytes(TEXT["sglang-8538.log"].encode())
    gz = tmp_path / "small.log.gz"
    gz.write_bytes(COMPRESS["gzip"](small.read_bytes()))
    files = [big, small, gz]
    sizes = [f.stat().st_size for f in files]
    assert sizes[0] >= ranges.RANGE_MIN_BYTES
    plans = _plan(files, sizes, 2, None)
    # The big plain file is more than one process's share: 2 ranges at line starts; the others are read whole.
    assert plans[1] is None and plans[2] is None
    assert plans[0] is not None and len(plans[0]) == 2 and plans[0][0][0] == 0 and plans[0][-1][1] == sizes[0]
    assert big.read_bytes()[plans[0][1][0] - 1] == 10
    # Many files of one size: each is one process's share at most, read whole (the parser runs in the workers).
    assert _plan([big, big, big], [sizes[0]] * 3, 2, None) == [None, None, None]
    # Compressed data cannot be cut into ranges, however big.
    zbig = tmp_path / "big.log.zst"
    zbig.write_bytes(b"\x28\xb5\x2f\xfd" + b"\0" * sizes[0])
    assert _plan([zbig], [zbig.stat().st_size], 2, None) == [None]


def test_matchers_agree_on_keyword_edges() -> None:
    """ "GB/s" is bandwidth, not memory; keywords at line ends, after CRLF, inside ANSI codes, next to each other."""
    data = (
        b"Decode batch, gen throughput 12.3 GB/s\n"
        b"[2026-03-01 10:00:00 TP0] Memory pool end. avail mem=1.46 GB\n"
        b"GB/GB\n"
        b"x GB\r\n"
        b"\x1b[1mKV\x1b[0m cache\r\n"
        b"python -m sglang.launch_server \\\r\n"
        b"  --mem-fraction-static 0.8\n"
        b"ForCausalLM GiBMiBKiB\n"
        b"out of memoryTraceback\n"
    )
    want = list(LineScanner(ReMatcher()).scan([data]))
    assert [n for n, _ in want] == [2, 3, 4, 5, 6, 8, 9]
    for m in MATCHER_OBJS:
        assert list(LineScanner(m).scan([data])) == want, m.name
        assert list(LineScanner(m).scan([data[i : i + 7] for i in range(0, len(data), 7)])) == want, m.name


def _follow_policy(scanner: Any, lines: Any) -> list[tuple[int, str]]:
    """A consumer like the parser: a line ending in "\\" or "of which" asks for the next one, a Traceback
    for the next two."""
    out = []
    for n, text in lines:
        out.append((n, text))
        if text.endswith(("\\", "of which")):
            scanner.follow = 1
        elif text.startswith("Traceback"):
            scanner.follow = 2
    return out


def test_followed_lines_are_handed_on_once(tmp_path: Path) -> None:
    """A followed line that is itself a keyword line (found by its range's scan) is not handed on twice, also
    when it is the last line of the file, without a newline."""
    text = (
        "Traceback (most recent call last):\n"
        "  avail mem=1.00 GB\n"  # followed, and a keyword line
        "  noise\n"
        "[2026-03-01 10:00:00 TP0] Memory pool end. avail mem=2.00 GB\n"
        "CUDA out of memory. GPU 0 has a total capacity of 79.19 GiB of which\n"
        "1.50 GiB is free.\n"  # followed, and a keyword line
        "python -m sglang.launch_server \\\n"
        "  --mem-fraction-static 0.8 \\\n"
        "  --tp 2 avail mem=3.00 GB"  # followed, a keyword line, and no newline at the end
    )
    f = tmp_path / "follow.log"
    f.write_bytes(text.encode())
    data = f.read_bytes()
    for m in MATCHER_OBJS:
        sc = LineScanner(m)
        want = _follow_policy(sc, sc.scan_file(f))
        assert [n for n, _ in want] == [1, 2, 3, 4, 5, 6, 7, 8, 9]
        for cut in [None, *_starts(data)]:
            spans = [(0, len(data))] if cut is None else [(0, cut), (cut, len(data))]
            rp = RangeReplay(f, m)
            assert _follow_policy(rp, rp.replay(scan_range(f, a, b, m) for a, b in spans)) == want, (m.name, cut)
            assert rp.lines == sc.lines == 9


def test_ingest_json_loads_no_heavy_module(tmp_path: Path) -> None:
    """`memfrac ingest FILE --format json` starts in tens of milliseconds: no pandas, matplotlib, numpy, sglang,
    nor rich when stderr is not a terminal (here on a file big enough to be split into ranges)."""
    import subprocess
    import sys

    big = tmp_path / "big.log"
    big.write_bytes(TEXT["repo_sglang-docs_send-request_llama31-8b_1gpu.log"].encode())
    with big.open("ab") as f:
        line = TRAFFIC[0].format(r=3, t=21, u=0.5, k=0).encode() + b"\n"
        f.write(line * (ranges.RANGE_MIN_BYTES // len(line) + 10))
    code = (
        "import sys, json; from profiler.ingest.core import run_ingest; out = []\n"
        f"assert run_ingest([{str(big)!r}], fmt='json', echo=out.append, jobs=2) == 0\n"
        "assert json.loads(out[0])[0]['kv_mib'] > 0\n"
        "print(sorted(m for m in ('pandas', 'matplotlib', 'numpy', 'sglang', 'rich') if m in sys.modules))"
    )
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert got.stdout.strip() == "[]", got.stderr


@pytest.mark.parametrize("pool_kind", ["forked", "executor"])
def test_worker_pools_return_results_errors_and_progress(pool_kind: str, tmp_path: Path) -> None:
    """Both pools (fork-based on Linux, concurrent.futures elsewhere) give each task's result, raise a task's
    MemfracError where its result is asked for, and report bytes done."""
    from profiler.core.errors import MemfracError
    from profiler.ingest.pool import PROGRESS_EVERY, _Executor, _Forked, _read_task, _scan_task

    if pool_kind == "forked" and not hasattr(__import__("os"), "fork"):
        pytest.skip("no fork on this platform")
    good = tmp_path / "a.log"
    line = TRAFFIC[0].format(r=3, t=21, u=0.5, k=0).encode() + b"\n"
    good.write_bytes(TEXT["sglang-8538.log"].encode() + line * (2 * PROGRESS_EVERY // len(line) + 1))
    size = good.stat().st_size
    missing = str(tmp_path / "missing.log")
    tasks = [(_read_task, (str(good),)), (_read_task, (missing,)), (_scan_task, (str(good), 0, size))]
    pool = (_Forked if pool_kind == "forked" else _Executor)(2, tasks)
    try:
        lf = pool.result(0, lambda: None)
        assert records(lf.runs) == records(read_log(good).runs) and len(lf.runs) == 1
        with pytest.raises(MemfracError, match=r"missing\.log: no such log file"):
            pool.result(1, lambda: None)
        rs = pool.result(2, lambda: None)
        assert rs.lines == lf.lines and rs.error is None
        if pool_kind == "forked":  # progress comes on the result's pipe, before it
            assert PROGRESS_EVERY <= pool.done[0] <= size and PROGRESS_EVERY <= pool.done[2] <= size
    finally:
        pool.close()
