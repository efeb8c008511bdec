"""profiler.logs.lines: chunked scanning, line numbers, CR/CRLF/ANSI, prefixes, paste damage."""

from __future__ import annotations

import pytest

from profiler.logs.lines import MAX_LINE_BYTES, LineScanner, chunks_of_lines
from profiler.logs.prefixes import rank_numbers, split_glued, split_prefix, unquote

POOL = "[2025-03-08 12:29:21 TP0] Memory pool end. avail mem=2.09 GB"
NOISE = '[2025-03-08 12:29:30] INFO:     127.0.0.1:49534 - "GET /get_model_info HTTP/1.1" 200 OK'


def _scan(data: bytes, chunk: int = 1 << 20) -> list[tuple[int, str]]:
    chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    return list(LineScanner().scan(chunks))


def test_only_candidate_lines_come_out_with_grep_line_numbers() -> None:
    data = f"{NOISE}\n{POOL}\n{NOISE}\n{POOL}\n".encode()
    assert _scan(data) == [(2, POOL), (4, POOL)]


@pytest.mark.parametrize("chunk", [1, 3, 17, 64, 1 << 20])
def test_chunk_size_does_not_change_lines_or_numbers(chunk: int) -> None:
    data = (f"{NOISE}\n{POOL}\r\n\n\x1b[32m{POOL}\x1b[0m\n" * 3).encode()
    assert _scan(data, chunk) == _scan(data)


def test_crlf_and_ansi_are_removed() -> None:
    data = f"\x1b[2m{POOL}\x1b[0m\r\n".encode()
    assert _scan(data) == [(1, POOL)]


def test_bare_cr_segments_share_the_physical_line_number() -> None:
    # tqdm redraws: every segment is kept (each one is a ladder point).
    a = "Capturing batches (bs=24 avail_mem=4.00 GB):   0%|          | 0/7 [00:00<?, ?it/s]"
    b = "Capturing batches (bs=16 avail_mem=3.93 GB):  14%|█▍        | 1/7 [00:02<00:17,  2.96s/it]"
    data = f"{NOISE}\n\r{a}\r{b}\r\n".encode()
    assert _scan(data) == [(2, a), (2, b)]


def test_last_line_without_newline_and_invalid_utf8() -> None:
    data = b"\xff\xfe garbage\n" + POOL.encode()
    assert _scan(data) == [(2, POOL)]


def test_over_long_line_is_cut_not_buffered() -> None:
    data = b"x" * (MAX_LINE_BYTES * 2 + 5) + b" avail mem=1.00 GB\n" + POOL.encode() + b"\n"
    got = _scan(data, chunk=1 << 16)
    assert got[-1] == (2, POOL)
    assert all(len(text) <= MAX_LINE_BYTES + (1 << 16) for _, text in got)  # one cut piece + one chunk


def test_follow_passes_the_next_lines_unfiltered() -> None:
    scanner = LineScanner()
    out = []
    for n, _text in scanner.scan(
        [
            b"CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capa\ncity of\n"
            b"79.19 GiB of which\nnoise\n"
        ]
    ):
        out.append(n)
        if n == 1:
            scanner.follow = 2
    assert out == [1, 2, 3]


def test_rank_labels_of_non_memory_lines_are_discovered() -> None:
    data = (
        b"[2025-07-22 06:18:33 TP1] Using default chat sampling params from model generation config\n"
        b"[2025-07-22 06:18:33 TP1] Using default chat sampling params from model generation config\n"
        b"[2025-07-22 06:18:33 DP0 TP0 EP0] Using default chat sampling params from model generation config\n"
    )
    assert [n for n, _ in _scan(data)] == [1, 3]


@pytest.mark.parametrize(
    ("line", "date", "hms", "label", "msg"),
    [
        (
            "[2026-05-07 13:39:14 DP0 TP0 EP0] Memory pool end.",
            "2026-05-07",
            "13:39:14",
            "DP0 TP0 EP0",
            "Memory pool end.",
        ),
        ("[23:17:01 TP7] Load weight end.", None, "23:17:01", "TP7", "Load weight end."),
        ("[2025-03-08 12:29:04] server_args=ServerArgs()", "2025-03-08", "12:29:04", "", "server_args=ServerArgs()"),
        ("[2025-03-08 12:29:04 PP1 TP3] x", "2025-03-08", "12:29:04", "PP1 TP3", "x"),
        ("[2025-03-08 12:29:04.123 TP0] x", "2025-03-08", "12:29:04", "TP0", "x"),
        ("[2025-03-08 12:29:04  DP1   TP1] x", "2025-03-08", "12:29:04", "DP1 TP1", "x"),
        ("[2026-05-05 04:41:51 DP2 TP2 E", None, None, None, "[2026-05-05 04:41:51 DP2 TP2 E"),
        ("Capturing batches (bs=1 avail_mem=0.86 GB)", None, None, None, "Capturing batches (bs=1 avail_mem=0.86 GB)"),
        ("[aiter] import ok", None, None, None, "[aiter] import ok"),
    ],
)
def test_split_prefix(line: str, date: str | None, hms: str | None, label: str | None, msg: str) -> None:
    p = split_prefix(line)
    assert (p.date, p.hms, p.label, p.msg) == (date, hms, label, msg)


def test_rank_numbers() -> None:
    assert rank_numbers("DP0 TP3 EP3") == {"dp": 0, "tp": 3, "ep": 3}
    assert rank_numbers("PP1 ATTN_CP0 TP3") == {"pp": 1, "tp": 3}
    assert rank_numbers("") == {}


def test_unquote_github_quotes_and_compose_prefix() -> None:
    assert unquote("> [2025-12-09 05:12:15 DP5 TP5] x") == "[2025-12-09 05:12:15 DP5 TP5] x"
    assert unquote("> > nested") == "nested"
    assert unquote('worker-longctx-1  |   File "/x.py", line 1, in f') == '  File "/x.py", line 1, in f'
    assert unquote("Loading safetensors checkpoint shards:  25% Completed | 1/4") == (
        "Loading safetensors checkpoint shards:  25% Completed | 1/4"
    )


def test_split_glued_tqdm_and_record() -> None:
    # Real line (sglang-pr17392.log): the record follows the bar without a newline.
    line = (
        "Multi-thread loading shards:  94% Completed | 15/16 [00:04<00:00,  3.89it/s][2026-05-07 13:39:14 DP1 TP1 "
        "EP1] Load weight end. elapsed=5.05 s, type=Qwen3MoeForCausalLM, avail mem=121.90 GB, mem usage=16.39 GB."
    )
    bar, record = split_glued(line)
    assert bar.endswith("3.89it/s]") and record.startswith("[2026-05-07 13:39:14 DP1 TP1 EP1] Load weight end.")
    assert split_glued("Capturing batches (bs=1 avail_mem=3.80 GB): 100%| 7/7 [00:04<00:00,  1.72it/s]") == [
        "Capturing batches (bs=1 avail_mem=3.80 GB): 100%| 7/7 [00:04<00:00,  1.72it/s]"
    ]


def test_chunks_of_lines_accepts_str_and_bytes() -> None:
    assert b"".join(chunks_of_lines(["a", b"b\n", "c\n"])) == b"a\nb\nc\n"
