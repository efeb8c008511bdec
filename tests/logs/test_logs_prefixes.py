"""Every fixture ingests to the same records however it reached us: behind each real line prefix (docker,
kubernetes, CRI, journald, compose, GitHub quotes, indentation, a markdown fence), compressed, and with either
matcher; plus the prefixed-log failures reported in issue 11, each as a test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiler.core.measurement import Measurement
from profiler.logs import parse_log
from profiler.logs.matchers import MATCHERS, ReMatcher
from profiler.logs.prefixes import PrefixLearner, shape
from tests.conftest import LOG_FIXTURES
from tests.logstyles import COMPRESS, PREFIXES, fenced, prefixed

LOGS = sorted(LOG_FIXTURES.glob("*.log"))
TEXT = {p.name: p.read_text(errors="replace") for p in LOGS}
# Files without one complete sglang record: their prefix can only be learned from repetition, which covers
# timestamp-like leads; a journald or CRI lead ("… python3[41234]: ", "… stdout F ") is learned from records.
RECORDLESS = {n for n, t in TEXT.items() if not any(PrefixLearner().split(ln).hms for ln in t.splitlines())}


def records(ms: list[Measurement]) -> list[dict[str, Any]]:
    """What a run says, without the file's name and the raw text of unparsed lines (which keep their prefix)."""
    out = []
    for m in ms:
        d = m.to_dict()
        for k in ("id", "origin", "unparsed_examples"):
            d.pop(k, None)
        out.append(d)
    return out


def _plain(name: str) -> list[dict[str, Any]]:
    return records(parse_log(TEXT[name].splitlines()))


@pytest.mark.parametrize("style", [*PREFIXES, "fence"])
def test_every_fixture_is_the_same_behind_every_prefix(style: str) -> None:
    bad = []
    for name, text in TEXT.items():
        if style in ("cri", "journald") and name in RECORDLESS:
            continue
        styled = fenced(text) if style == "fence" else prefixed(text, style)
        if records(parse_log(styled.splitlines())) != _plain(name):
            bad.append(name)
    assert not bad, f"{style}: records differ for {bad}"


@pytest.mark.parametrize("codec", [c for c in COMPRESS if c != "plain"])
def test_every_fixture_is_the_same_compressed(codec: str, tmp_path: Path) -> None:
    for p in LOGS:
        # Named .log on purpose: the magic bytes decide, not the suffix.
        f = tmp_path / p.name
        f.write_bytes(COMPRESS[codec](p.read_bytes()))
        assert records(parse_log(f)) == records(parse_log(p)), (codec, p.name)


def test_prefix_and_compression_together(tmp_path: Path) -> None:
    for i, p in enumerate(LOGS):
        style = list(PREFIXES)[i % len(PREFIXES)]
        if style in ("cri", "journald") and p.name in RECORDLESS:
            continue
        codec = list(COMPRESS)[i % len(COMPRESS)]
        f = tmp_path / f"x{i}.log"
        f.write_bytes(COMPRESS[codec](prefixed(TEXT[p.name], style).encode()))
        assert records(parse_log(f)) == records(parse_log(p)), (style, codec, p.name)


@pytest.mark.parametrize("kind", [k for k in MATCHERS if k != "re"])
def test_every_matcher_gives_the_same_records(kind: str) -> None:
    try:
        fast = MATCHERS[kind]()
    except ImportError:
        pytest.skip(f"{kind}: its package is not installed")
    for p in LOGS:
        assert records(parse_log(p, matcher=fast)) == records(parse_log(p, matcher=ReMatcher())), p.name
        styled = prefixed(TEXT[p.name], "rfc3339").splitlines()
        assert records(parse_log(styled, matcher=fast)) == records(parse_log(styled, matcher=ReMatcher()))


# ---- issue 11's failures, one by one ---------------------------------------------------------------------


def test_docker_desktop_prefix_keeps_every_memory_line() -> None:
    # Before: every memory line lost, verdict unknown.
    name = "repo_unknown_llama31-8b_24gb_docker.log"
    (m,) = parse_log(prefixed(TEXT[name], "docker-desktop").splitlines())
    (plain,) = parse_log(TEXT[name].splitlines())
    assert [p.name for p in m.ranks[0].phases] == [p.name for p in plain.ranks[0].phases] == [
        "weights", "kv_pool", "decode_graph", "ready"]  # fmt: skip
    assert m.ranks[0].phase("kv_pool").details["kv_tokens"] == 38141


def test_rfc3339_prefix_keeps_the_command_fraction() -> None:
    # Before: the launch command was lost and the fraction came out "0.950 (given)" where the command said
    # otherwise (here 0.8).
    name = "sglang-8538.log"
    (plain,) = parse_log(TEXT[name].splitlines())
    (m,) = parse_log(prefixed(TEXT[name], "rfc3339").splitlines())
    assert m.args_source == plain.args_source == "launch_command"
    assert m.args["mem_fraction_static"] == plain.args["mem_fraction_static"] == 0.8
    assert m.mfs_origin == "given"


def test_indented_log_loses_no_line() -> None:
    name = "repo_llms-in-clouds_qwq32b_4xL4.log"
    plain = parse_log(TEXT[name].splitlines())
    indented = parse_log(prefixed(TEXT[name], "indent-4").splitlines())
    assert records(indented) == records(plain)
    assert sum(len(r.phases) for r in indented[0].ranks) == sum(len(r.phases) for r in plain[0].ranks) > 12


@pytest.mark.parametrize("style", ["github-quote", "compose"])
def test_quoted_or_compose_launch_command_with_continuations_is_read(style: str) -> None:
    name = "sglang-24453.log"  # a 13-line command with backslash continuations
    (plain,) = parse_log(TEXT[name].splitlines())
    (m,) = parse_log(prefixed(TEXT[name], style).splitlines())
    assert m.args_source == "launch_command" and m.args == plain.args
    assert m.args["mem_fraction_static"] == 0.7 and m.args["chunked_prefill_size"] == 262144


def test_record_found_after_any_lead_and_the_lead_is_learned() -> None:
    learner = PrefixLearner()
    lines = [
        "Feb  1 05:48:43 gpu-node-7 python3[41234]: [2025-07-14 05:48:43 TP0] Memory pool end. avail mem=1.46 GB",
        "Feb  1 05:48:44 gpu-node-7 python3[41234]: [2025-07-14 05:48:44 TP0] Capture cuda graph begin.",
        "Feb  1 05:48:45 gpu-node-7 python3[41234]: Capturing batches (bs=8 avail_mem=0.93 GB):   0%|",
    ]
    p = learner.split(lines[0])
    assert (p.date, p.hms, p.label, p.msg, p.pid) == (
        "2025-07-14", "05:48:43", "TP0", "Memory pool end. avail mem=1.46 GB", 41234)  # fmt: skip
    learner.split(lines[1])  # second sighting: the shape is now a known prefix
    q = learner.split(lines[2])
    assert q.msg == "Capturing batches (bs=8 avail_mem=0.93 GB):   0%|" and q.label is None and q.pid == 41234
    # The shape keeps names (host, unit) and abstracts digits, so it does not eat the first word of a message.
    assert shape("Feb  1 05:48:43 gpu-node-7 python3[41234]: ") == (
        r"Feb\s+\d+\s+\d+:\d+:\d+\s+gpu\-node\-\d+\s+python\d+\[\d+\]:\s+"
    )
    assert learner.split("Exception: Capture cuda graph failed").msg == "Exception: Capture cuda graph failed"


def test_a_wrapper_timestamp_in_brackets_before_the_record() -> None:
    p = PrefixLearner().split("[2025-07-14 07:48:43] [2025-07-14 05:48:43 DP1 TP1] Load weight begin. avail mem=2 GB")
    assert (p.hms, p.label, p.msg) == ("05:48:43", "DP1 TP1", "Load weight begin. avail mem=2 GB")


# tests/fixtures/logs-heldout/sglang-8337.log, lines 4 and 7: a deployment's own logging format (asctime, level, pid,
# then "[ RANKS file.py:line]"); the two excerpts are two server starts (pid 4198 → 289, 17:23:00 → 17:21:06).
CUSTOM_8337 = [
    "2025-07-24 17:23:00 INFO 4198 [ TP0 PP0 model_runner.py:701] Load weight end. type=Qwen3MoeForCausalLM, "
    "dtype=torch.bfloat16, avail mem=124.19 GB, mem usage=13.73 GB.",
    "",
    "--quantization fp8: ",
    "2025-07-24 17:21:06 INFO 289 [ TP0 PP0 model_runner.py:701] Load weight end. type=Qwen3MoeForCausalLM, "
    "dtype=torch.bfloat16, avail mem=117.93 GB, mem usage=19.99 GB.",
]


def test_logging_format_around_the_ranks_is_a_record() -> None:
    p = PrefixLearner().split(CUSTOM_8337[0])
    assert (p.date, p.hms, p.label, p.pid) == ("2025-07-24", "17:23:00", "TP0 PP0", 4198)
    assert p.msg.startswith("Load weight end. type=Qwen3MoeForCausalLM")
    # Without ranks (a launcher line) it is still a record, untagged; without the source location it is not one.
    q = PrefixLearner().split("2025-07-24 17:22:58,123 WARNING [server_args.py:1200] Some warning")
    assert (q.hms, q.label, q.msg, q.pid) == ("17:22:58", "", "Some warning", None)
    r = PrefixLearner().split("2025-07-24 17:22:58 INFO 4198 [ TP0 PP0] Load weight end.")
    assert r.label is None
    runs = parse_log(CUSTOM_8337)
    assert len(runs) == 2 and [m.ranks[0].label for m in runs] == ["TP0 PP0", "TP0 PP0"]
    w0, w1 = (m.ranks[0].phase("weights") for m in runs)
    assert w0 is not None and w1 is not None
    assert (w0.after.free_mib, w0.usage_mib) == (124.19 * 1024, 13.73 * 1024)  # 127170.56, 14059.52
    assert (w1.after.free_mib, w1.usage_mib) == (117.93 * 1024, 19.99 * 1024)  # 120760.32, 20469.76
    assert any("pid 4198 → 289" in n for n in runs[1].notes)


_TAG = st.builds(lambda k, n: f"{k}{n}", st.sampled_from(["TP", "PP", "DP", "EP"]), st.integers(0, 127))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_TAG, max_size=4, unique=True),
    st.sampled_from(["INFO", "WARNING", "ERROR", "DEBUG"]),
    st.integers(1, 4_000_000),
    st.from_regex(r"[a-z_]{1,20}\.py", fullmatch=True),
    st.integers(1, 99999),
    st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=80),
)
def test_logging_record_round_trips(tags: list[str], level: str, pid: int, src: str, n: int, msg: str) -> None:
    line = f"2025-07-24 17:23:00 {level} {pid} [ {' '.join(tags)} {src}:{n}] {msg}"
    p = PrefixLearner().split(line)
    assert (p.date, p.hms, p.label, p.pid, p.msg) == ("2025-07-24", "17:23:00", " ".join(tags), pid, msg)
