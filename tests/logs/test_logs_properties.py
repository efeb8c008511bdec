"""Property tests: whatever the input (random bytes, cut or shuffled real lines), parsing never raises (except
a one-line MemfracError for data that only looks compressed) and always returns well-formed records; and the
chunk size never changes the result."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiler.core.errors import MemfracError
from profiler.core.measurement import FAILURE_KINDS, PHASES, Measurement
from profiler.logs import parse_log
from tests.conftest import LOG_FIXTURES

REAL_LINES = [ln for p in sorted(LOG_FIXTURES.glob("*.log")) for ln in p.read_text(errors="replace").splitlines()]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _well_formed(ms: list[Measurement]) -> None:
    for i, m in enumerate(ms):
        assert m.id.endswith(f"#{i}")
        assert m.unparsed_memory_lines >= len(m.unparsed_examples) and len(m.unparsed_examples) <= 5
        assert m.first_line is None or m.last_line is None or m.first_line <= m.last_line
        labels = [r.label for r in m.ranks]
        assert len(labels) == len(set(labels)) and labels
        for r in m.ranks:
            assert all(p.name in PHASES for p in r.phases)
            if r.failure is not None:
                assert r.failure.kind in FAILURE_KINDS
                assert r.failure.phase is None or r.failure.phase in PHASES
        if m.failure is not None:
            assert m.failure.kind in FAILURE_KINDS
        assert Measurement.from_json(m.to_json()).id == m.id


def _parse_bytes(data: bytes, chunk: int = 1 << 20) -> list[Measurement]:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "x.log"
        p.write_bytes(data)
        return parse_log(p, chunk_bytes=chunk)


@SETTINGS
@given(st.binary(max_size=4000))
def test_arbitrary_bytes(data: bytes) -> None:
    try:
        _well_formed(_parse_bytes(data))
    except MemfracError as e:  # e.g. the xz magic followed by junk: a clear one-line error, never a traceback
        assert "compressed" in str(e) and "\n" not in str(e)


@SETTINGS
@given(st.lists(st.text(max_size=300), max_size=40))
def test_arbitrary_text_lines(lines: list[str]) -> None:
    _well_formed(parse_log(lines))


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(REAL_LINES), st.integers(0, 400)), max_size=60))
def test_truncated_real_lines(picks: list[tuple[str, int]]) -> None:
    _well_formed(parse_log([line[:cut] for line, cut in picks]))


@SETTINGS
@given(st.randoms(use_true_random=False), st.integers(1, 300))
def test_shuffled_real_lines(rnd: random.Random, n: int) -> None:
    lines = rnd.sample(REAL_LINES, min(n, len(REAL_LINES)))
    _well_formed(parse_log(lines))


_DAMAGE = st.sampled_from(["\r", "\r\n", "\x1b[31m", "\x1b[0m", "> ", "\n", "", " ", "\\\n", "\t", "\xff"])


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(REAL_LINES), _DAMAGE, st.integers(0, 200)), max_size=50))
def test_damaged_real_lines(picks: list[tuple[str, str, int]]) -> None:
    text = "\n".join(line[:cut] + dmg + line[cut:] for line, dmg, cut in picks)
    _well_formed(_parse_bytes(text.encode("utf-8", "surrogateescape")))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5000), st.randoms(use_true_random=False))
def test_chunk_size_does_not_change_the_result(chunk: int, rnd: random.Random) -> None:
    files = sorted(LOG_FIXTURES.glob("*.log"))
    data = b"\n".join(p.read_bytes() for p in rnd.sample(files, 4))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "x.log"
        path.write_bytes(data)
        small = [m.to_dict() for m in parse_log(path, chunk_bytes=chunk)]
        assert small == [m.to_dict() for m in parse_log(path)]
