"""profiler.logs.reserve and ingest.judge: a logged run is judged with its release's rules or every candidate's,
never silently with the newest; the fraction reported is the run's own."""

from __future__ import annotations

import pytest

from profiler.ingest.judge import judge
from profiler.logs import parse_log
from profiler.logs.formats import releases_between
from profiler.logs.reserve import heuristic_args, log_reservation
from profiler.model.heuristic import inputs_from_args, reserve, rules_for
from tests.conftest import LOG_FIXTURES

# A 24 GB consumer GPU start (repo_unknown_qwen35-9b_tp2_24gb.log-like), ready line printing the chunk.
READY = ("[2026-04-14 16:09:30] max_total_num_tokens=94000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
         "max_running_requests=48, context_len=32768, available_gpu_mem=3.79 GB")  # fmt: skip
BS = "[2026-04-14 16:09:10] Capture cuda graph bs [1, 2, 4, 8]"
BEGIN_4090 = "[2026-04-14 16:08:40] Load weight begin. avail mem=23.40 GB"  # RTX 4090 (24564 MiB = 23.99 GiB)


def _run(*lines: str):  # type: ignore[no-untyped-def]
    (m,) = parse_log(list(lines))
    return m


def test_stated_release_gets_its_own_rules() -> None:
    m = _run("sglang version: 0.5.15", BEGIN_4090, BS, READY)
    lr = log_reservation(m)
    assert lr.rules == "0.5.15" and lr.release == "0.5.15"
    assert lr.rules_why.startswith("the 0.5.15 rules (0.5.15, 0.5.15.post1) of sglang 0.5.15: version line (line 1)")
    # Hand: 512 + 8192 × 1.5 + 1/8 × 1024 + 8 × 2 (decode bs ≤ 8) + 58 × 8 (prefill bs ≤ 8192) = 13408 MiB; the
    # captured bs list (max 8) and the ready line's chunk are the inputs, not the 24 GB band's defaults.
    assert lr.headline is not None and lr.headline.reserved_mib == 13408.0
    assert lr.headline.inputs.decode_max_bs == 8 and lr.headline.inputs.chunked_prefill_size == 8192
    # (24564 − 13408) / 24564 = 0.45416 → 0.454 (rounded to 3 decimals by the rule)
    assert lr.headline.heuristic_fraction == 0.454


def test_unmodelled_release_is_said_not_replaced() -> None:
    lr = log_reservation(_run("sglang: 0.3.6", BEGIN_4090, READY))
    assert lr.rules == "none" and lr.headline is None
    assert lr.rules_why == "no modelled rule set: 0.3.6 is not modelled by this memfrac"


def test_range_gives_every_candidate_rule_set() -> None:
    # Capture-end format of 0.4.6.post1 … 0.5.13.post1 and "Using KV cache dtype" (0.5.3rc2 … 0.5.12.post1)
    m = _run(BEGIN_4090, "[2026-04-14 16:08:50] Using KV cache dtype: torch.bfloat16", BS, READY)
    assert m.identity.sglang_range == ["0.5.3rc2", "0.5.12.post1"]
    lr = log_reservation(m)
    names = list(dict.fromkeys(c.rule_set.name for c in lr.candidates))
    # every distinct modelled rule set of the releases in the range, oldest first, at each capacity that fits
    # 23.40 GiB free at load (no init line): the RTX 4090 (24564 MiB) and the RTX 3090 (24576 MiB)
    expected = list(dict.fromkeys(rules_for(v).name for v in releases_between("0.5.3rc2", "0.5.12.post1")
                                  if _modelled(v)))  # fmt: skip
    assert names == expected and {c.gpu_mib for c in lr.candidates} == {24564, 24576}
    label = expected[0] if len(expected) == 1 else f"{expected[0]} … {expected[-1]} ({len(expected)} rule sets)"
    assert lr.rules.split(" (+")[0] == label
    lo, hi = lr.reserved_mib_range  # type: ignore[misc]
    assert lo == min(c.res.reserved_mib for c in lr.candidates) and hi == max(c.res.reserved_mib for c in lr.candidates)


def _modelled(v: str) -> bool:
    try:
        rules_for(v)
    except Exception:
        return False
    return True


def test_gpu_candidates_multiply_the_reservations() -> None:
    # 22.39 GiB free, no init line: A10 / L4 / RTX 4090 / RTX 3090 all fit (within 3 GiB): four capacities
    m = _run("sglang version: 0.5.20",
             "[2025-07-14 05:48:43] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=7.37 GB, "
             "mem usage=15.02 GB.", READY)  # fmt: skip
    assert m.identity.gpu_candidates_mib == [23028, 23034, 24564, 24576]
    lr = log_reservation(m)
    assert sorted(c.gpu_mib for c in lr.candidates) == [23028, 23034, 24564, 24576]
    f_lo, f_hi = lr.fraction_range  # type: ignore[misc]
    assert f_lo < f_hi


def test_resolved_max_running_requests_is_not_a_heuristic_input() -> None:
    # The ready line's max_running_requests is what sglang sized after the heuristic (decode nodes would read a
    # user-given one as their activation); it is evidence, not input.
    m = _run("sglang version: 0.5.20", BEGIN_4090, READY)
    assert m.args["max_running_requests"] == 48
    args, _ = heuristic_args(m)
    assert "max_running_requests" not in args and args["chunked_prefill_size"] == 8192


def test_fraction_narrows_the_candidates_and_proves_auto() -> None:
    # the fraction the 0.5.20 rule gives for these inputs on a 4090 …
    args = {"chunked_prefill_size": 8192, "cuda_graph_max_bs": 8, "cuda_graph_bs": [1, 2, 4, 8]}
    want = reserve(inputs_from_args(args, gpu_mem_mib=24564, mode="null"), rules_for("0.5.20")).heuristic_fraction
    sa = f"[2026-04-14 16:08:30] server_args=ServerArgs(model_path='m', mem_fraction_static={want}, tp_size=1)"
    m = _run(sa, BEGIN_4090, BS, READY)
    lr = log_reservation(m)  # no command: who chose it is unknown until a rule reproduces it
    assert lr.mfs == want and lr.mfs_origin == "auto" and "gives the same value, so sglang chose it" in lr.mfs_how


def test_computed_auto_fraction_only_with_exact_rules_and_gpu() -> None:
    cmd = "python3 -m sglang.launch_server --model-path m --chunked-prefill-size 8192 --cuda-graph-max-bs 8"
    m = _run("sglang version: 0.5.20", cmd, "[2026-04-14 16:08:40] Load weight begin. avail mem=15.15 GB")
    assert m.identity.gpu_name == "RTX-5080" and m.mfs is None  # 16303 MiB
    c, judged = judge(m)
    assert judged.reservation.mfs_origin == "auto" and m.mfs == c.mfs == judged.reservation.headline.heuristic_fraction
    assert m.mfs_how.startswith("computed with the 0.5.20 rules for GPU 16303 MiB")


def test_unknown_gpu_fallback_is_never_the_runs_fraction() -> None:
    # sglang-pr8258.log: no fraction printed, GPU not identifiable: the rules' fallback (0.88/0.95) must not show
    (m,) = parse_log(LOG_FIXTURES / "sglang-pr8258.log")
    c, judged = judge(m)
    assert m.mfs is None and c.mfs is None and c.slack_mib is None and c.heuristic_fraction is None
    assert all(x.fallback for x in judged.reservation.candidates) and judged.reservation.fraction_range is None


@pytest.mark.parametrize("name", ["sglang-pr8258.log", "repo_unknown_grok1_8xH100.log"])
def test_notes_name_the_rules(name: str) -> None:
    (m,) = parse_log(LOG_FIXTURES / name)
    _, judged = judge(m)
    assert judged.notes[0].startswith(f"rules: {judged.reservation.rules} — ")


def test_captured_bs_512_is_the_heuristic_input_not_a_default() -> None:
    # sglang-pr11830.log captured bs 1 … 512 (52 sizes, line 7): every candidate rule set reads max_bs 512, and
    # the decode-graph term is 512 × 2 MiB — not the 160 of the fallback defaults
    (m,) = parse_log(LOG_FIXTURES / "sglang-pr11830.log")
    assert m.args["cuda_graph_max_bs"] == 512 and m.args_from["cuda_graph_max_bs"].startswith("log line 7")
    lr = log_reservation(m)
    assert lr.candidates and all(c.res.inputs.decode_max_bs == 512 for c in lr.candidates)
    assert all(c.res.mib("decode_graph") == 1024.0 for c in lr.candidates)
