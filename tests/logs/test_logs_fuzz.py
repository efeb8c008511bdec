"""Fuzzing what happens to real logs on their way to us: random (but per-file consistent) line prefixes,
indentation, CRLF, ANSI colours, a glued markdown fence, launch commands split with backslash continuations,
OOM messages wrapped at random widths, and compression. The records must not change."""

from __future__ import annotations

import tempfile
from dataclasses import asdict
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiler.logs import parse_log
from profiler.logs.matchers import MATCHERS, ReMatcher
from profiler.logs.prefixes import PrefixLearner
from tests.logs.test_logs_prefixes import TEXT, records
from tests.logstyles import COMPRESS, SERVING

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NAMES = sorted(TEXT)
# A named lead ("host unit[pid]: ") is learned from the records behind it: files with fewer than three records
# (a pasted command, a traceback) only get timestamp-like leads, which are learned by repetition alone.
SPARSE = {n for n, t in TEXT.items() if sum(1 for ln in t.splitlines() if PrefixLearner().split(ln).hms) < 3}
HOST = st.text("abcdefghijklmnopqrstuvwxyz-", min_size=2, max_size=10).filter(lambda h: h[0] != "-" and "--" not in h)


@st.composite
def leads(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A prefix template: fixed words (host, unit, service) and per-line numbers (time, pid, sequence)."""
    parts = draw(
        st.lists(
            st.sampled_from(["date", "time", "iso", "host", "unit", "svc", "seq", "level"]), min_size=1, max_size=4
        )
    )
    host, unit = draw(HOST), draw(HOST)
    quote = draw(st.sampled_from(["", "> ", "> > "]))
    sep = draw(st.sampled_from([" ", "  ", " | ", ": "]))
    words = {
        "host": host,
        "unit": f"{unit}[{draw(st.integers(100, 99999))}]:",
        "svc": f"{host}-1  |",
        "level": draw(st.sampled_from(["stdout F", "I", "out"])),
    }
    return quote, [words.get(p, p) for p in parts] + [sep]


def _fill(template: list[str], i: int) -> str:
    words = {
        "date": f"2026-03-{1 + i % 28:02d}",
        "time": f"{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}",
        "iso": f"2026-03-01T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z",
        "seq": str(i),
    }
    return " ".join(words.get(w, w) for w in template[:-1]) + template[-1]


@SETTINGS
@given(
    name=st.sampled_from(NAMES),
    lead=leads(),
    indent=st.sampled_from(["", "  ", "    ", "\t"]),
    crlf=st.booleans(),
    ansi=st.booleans(),
    fence=st.booleans(),
    codec=st.sampled_from(list(COMPRESS)),
)
def test_records_survive_any_packaging(
    name: str, lead: tuple[str, list[str]], indent: str, crlf: bool, ansi: bool, fence: bool, codec: str
) -> None:
    quote, template = lead
    text = TEXT[name]
    if name in SPARSE and any(w not in ("date", "time", "iso", "seq") for w in template[:-1]):
        template = ["iso", " "]
    lines = text.splitlines()
    out = []
    for i, ln in enumerate(lines):
        if ansi and ln.startswith("["):
            ln = "\x1b[32m" + ln + "\x1b[0m"
        out.append(quote + _fill(template, i) + indent + ln)
    if fence:
        out[0] = "```text " + out[0]
    data = ("\r\n" if crlf else "\n").join(out) + "\n"
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "x.log"
        f.write_bytes(COMPRESS[codec](data.encode("utf-8", "surrogateescape")))
        got = records(parse_log(f))
    assert got == records(parse_log(lines)), (name, template, quote, indent, crlf, ansi, fence, codec)


@SETTINGS
@given(width=st.integers(47, 300), name=st.sampled_from(["repo_unknown_glm52-fp8_8xH200_hisparse_a3.log"]))
def test_oom_message_wrapped_at_any_width_keeps_its_numbers(width: int, name: str) -> None:
    lines = TEXT[name].splitlines()
    k = next(i for i, ln in enumerate(lines) if "Tried to allocate" in ln)
    head, msg = lines[k].split("| ", 1)
    wrapped = [head + "| " + msg[:width]] + [msg[i : i + width] for i in range(width, len(msg), width)]
    got = parse_log([*lines[:k], *wrapped, *lines[k + 1 :]])
    want = parse_log(lines)
    assert [asdict(m.failure) if m.failure else None for m in got] == [
        asdict(m.failure) if m.failure else None for m in want
    ]


@SETTINGS
@given(cuts=st.lists(st.integers(1, 60), min_size=1, max_size=8))
def test_launch_command_split_with_continuations_anywhere(cuts: list[int]) -> None:
    name = "sglang-8538.log"
    lines = TEXT[name].splitlines()
    k = next(i for i, ln in enumerate(lines) if "sglang.launch_server" in ln or "sglang serve" in ln)
    tokens = lines[k].split(" ")
    pieces, pos = [], 0
    for c in sorted(set(cuts)):
        if pos < c < len(tokens):
            pieces.append(" ".join(tokens[pos:c]) + " \\")
            pos = c
    pieces.append(" ".join(tokens[pos:]))
    got = parse_log([*lines[:k], *pieces, *lines[k + 1 :]])
    assert [m.args for m in got] == [m.args for m in parse_log(lines)]


def _mixed(rnd_lines: list[str]) -> bytes:
    return ("\n".join(rnd_lines) + "\n").encode()




@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.sampled_from(SERVING), st.integers(0, 3000), st.integers(0, 100)),
            st.sampled_from(TEXT["repo_unknown_llama31-8b_24gb_docker.log"].splitlines()),
        ),
        max_size=120,
    ),
    st.integers(1, 4096),
)
def test_traffic_peaks_are_exact_and_the_same_with_either_matcher(items: list[object], chunk: int) -> None:
    """The scanner hands over only traffic lines that raise a maximum; the maximum of what it hands over is the
    maximum of the stretch. Same lines with re and hyperscan, whatever the chunk size."""
    lines = []
    for it in items:
        if isinstance(it, tuple):
            fmt, r, u = it
            lines.append(fmt.format(r=r, t=r * 7, u=u / 100))
        else:
            lines.append(it)
    data = _mixed(lines)
    from profiler.logs.lines import LineScanner
    from profiler.logs.matchers import field_values

    chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    got_re = list(LineScanner(ReMatcher()).scan(chunks))
    for kind in ("hyperscan", "aho"):
        try:
            fast = MATCHERS[kind]()
        except ImportError:
            continue
        assert list(LineScanner(fast).scan([data])) == got_re, kind
    # Exactness: the largest value handed over equals the largest in the whole text.
    every = [field_values(ln.encode()) for ln in lines]
    seen = [field_values(t.encode()) for _, t in got_re]
    for k in range(2):
        assert max((v[k] for v in seen), default=-1) == max((v[k] for v in every), default=-1)
