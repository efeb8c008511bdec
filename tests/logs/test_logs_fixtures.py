"""Every real log in tests/fixtures/logs against its hand-written expectation (expected/<log>.json).

Expectation format, per run: architecture, model_contains, mode, tp/dp/ep/pp, mem_fraction_static,
chunked_prefill_size, args{}, gpu_total_gib, rank_labels[], ranks{label: {phase: {…}, failure: {…}}},
failure_kind, tricky_lines[]; and what the log proves: release (exact, or null), release_range [first, last]
(the range the parser finds must lie inside it; "" = open end), release_includes (a release the range must
contain), state (finished | incomplete | aborted | no_kv), verdict (what `memfrac ingest` concludes),
mfs {value, origin} (the fraction the log supports; value within its ± or 0.0005), gpu_candidates_mib[],
args_from{key: substring of its origin}, serving{key: value}, profiled_kv_tokens (the KV budget sglang profiled,
in tokens), failure_reason_contains (a substring of the failure message or the verdict's reason). Phases of a
speculative run: draft_weights, draft_kv_pool, draft_decode_graph, target_verify_graph (PHASE_ALIASES); capture
keys begin_avail_gib (the begin line's avail mem) and min_ladder_avail_gib (the lowest tqdm avail_mem); failure
keys reserved_by_torch_* and outside_torch_* beside torch's other OOM numbers (tests/fixtures/logs/FIELDS-NEW.md).
At the file's top level, "classes" lists the issue-24 classes of log text the log covers (CLASSES; counted per
class by `class_coverage`). A key that is absent is not checked (an unknown run-level key fails); JSON null means
"must be None". *_gib keys compare with MiB/1024 and *_mib keys with MiB, both within 0.005.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from profiler.core.measurement import Measurement, Phase, Rank
from profiler.ingest.judge import judge
from profiler.logs import parse_log
from profiler.logs.formats import release_key
from profiler.logs.state import profiled_kv_tokens
from tests.conftest import LOG_FIXTURES

EXPECTED = sorted((LOG_FIXTURES / "expected").glob("*.json"))
TOL = 0.005


def _close(got: Any, want: Any) -> bool:
    if want is None:
        return got is None
    if isinstance(want, bool) or not isinstance(want, int | float):
        return got == want
    return got is not None and not isinstance(got, bool | str) and abs(float(got) - float(want)) <= TOL


def _gib(mib: float | None) -> float | None:
    return None if mib is None else mib / 1024


# Expectation phase names for a speculative run's phases: (phase name, role) as the parser records them.
PHASE_ALIASES = {
    "draft_weights": ("weights", "draft"),  # the draft model's own "Load weight begin/end" pair
    "draft_kv_pool": ("kv_pool", "draft"),  # the draft model runner's KV pool (second pool per rank)
    "draft_decode_graph": ("draft_graph", "draft"),  # "Capture draft verify CUDA graph" (timings: draft_decode)
    "target_verify_graph": ("verify_graph", "target"),  # "Capture target verify CUDA graph" (timings: target_verify)
}


def _phase_of(rank: Rank, name: str) -> Phase | None:
    phase, role = PHASE_ALIASES.get(name, (name, "target"))
    return rank.phase(phase, role)


def _phase_value(ph: Phase | None, key: str) -> Any:
    if ph is None:
        return None
    if key == "before_free_gib":
        return _gib(ph.before.free_mib) if ph.before else None
    if key == "after_free_gib":
        return _gib(ph.after.free_mib) if ph.after else None
    if key == "usage_gib":
        return _gib(ph.usage_mib)
    if key == "elapsed_s":
        return ph.elapsed_s
    if key == "last_ladder_bs":
        return ph.ladder[-1].bs if ph.ladder else None
    if key == "last_ladder_avail_gib":
        return _gib(ph.ladder[-1].free_mib) if ph.ladder else None
    if key.endswith("_gib"):
        return _gib(ph.details.get(key[:-4] + "_mib"))
    return ph.details.get(key)


_FAILURE_MIB = {
    "tried_alloc",
    "total_capacity",
    "free",
    "in_use",
    "allocated_by_torch",
    "reserved_unallocated",
    "private_pools",
    "reserved_by_torch",  # old-format "X reserved in total by PyTorch"
    "outside_torch",  # in use − allocated by PyTorch − reserved but unallocated
}


def _failure_value(rank: Rank, key: str) -> Any:
    f = rank.failure
    if f is None:
        return None
    for suffix, scale in (("_gib", 1024.0), ("_mib", 1.0)):
        if key.endswith(suffix) and key[: -len(suffix)] in _FAILURE_MIB:
            v = getattr(f, key[: -len(suffix)] + "_mib")
            return None if v is None else v / scale
    return getattr(f, key)


def _run_value(m: Measurement, key: str) -> Any:
    ident = m.identity
    if key in ("architecture", "mode", "tp", "dp", "ep", "pp"):
        return getattr(ident, key)
    if key == "gpu_total_gib":
        return _gib(ident.gpu_total_mib)
    if key in ("mem_fraction_static", "chunked_prefill_size"):
        return m.args.get(key)
    if key == "failure_kind":
        return m.failure.kind if m.failure else None
    if key == "profiled_kv_tokens":
        return profiled_kv_tokens(m)
    raise KeyError(key)


def _check_run(m: Measurement, want: dict[str, Any]) -> list[str]:
    errors: list[str] = []

    def check(where: str, got: Any, expected: Any) -> None:
        if not _close(got, expected):
            errors.append(f"{where}: got {got!r}, expected {expected!r}")

    for key in (
        "architecture",
        "mode",
        "tp",
        "dp",
        "ep",
        "pp",
        "gpu_total_gib",
        "mem_fraction_static",
        "chunked_prefill_size",
        "failure_kind",
        "profiled_kv_tokens",
    ):
        if key in want:
            check(key, _run_value(m, key), want[key])
    if "failure_reason_contains" in want:
        sub = want["failure_reason_contains"]
        message = m.failure.message if m.failure else ""
        reason = judge(m)[0].reason
        if sub not in message and sub not in reason:
            errors.append(f"failure reason: {sub!r} in neither the failure message {message[:200]!r} nor the "
                          f"verdict reason {reason[:200]!r}")  # fmt: skip
    unknown = set(want) - _RUN_KEYS
    if unknown:
        errors.append(f"expectation keys the harness does not check: {sorted(unknown)}")
    if "model_contains" in want:
        model = m.identity.model or ""
        if want["model_contains"] not in model:
            errors.append(f"model: {model!r} does not contain {want['model_contains']!r}")
    for k, v in (want.get("args") or {}).items():
        check(f"args.{k}", m.args.get(k), v)
    if "rank_labels" in want:
        check("rank_labels", sorted(r.label for r in m.ranks), sorted(want["rank_labels"]))
    errors += _check_truth(m, want)
    for label, phases in (want.get("ranks") or {}).items():
        rank = m.rank(label)
        if rank is None:
            errors.append(f"rank {label!r} missing (have {[r.label for r in m.ranks]})")
            continue
        for name, keys in phases.items():
            for key, expected in keys.items():
                if name == "failure":
                    check(f"{label!r}.failure.{key}", _failure_value(rank, key), expected)
                else:
                    check(f"{label!r}.{name}.{key}", _phase_value(_phase_of(rank, name), key), expected)
    return errors


#: Every run-level expectation key the harness reads (an unknown one fails the test instead of passing silently).
_RUN_KEYS = {
    "architecture", "model_contains", "mode", "tp", "dp", "ep", "pp", "gpu_total_gib", "mem_fraction_static",
    "chunked_prefill_size", "args", "rank_labels", "ranks", "failure_kind", "profiled_kv_tokens",
    "failure_reason_contains", "tricky_lines", "release", "release_range", "release_includes", "state", "verdict",
    "mfs", "gpu_candidates_mib", "args_from", "serving", "notes",
}  # fmt: skip


def _within(v: str, lo: str, hi: str) -> bool:
    k = release_key(v)
    return (not lo or k >= release_key(lo)) and (not hi or k <= release_key(hi))


def _check_truth(m: Measurement, want: dict[str, Any]) -> list[str]:
    """Release, startup state, verdict, fraction: what the log proves."""
    errors: list[str] = []
    ident = m.identity
    got_lo, got_hi = [*ident.sglang_range, "", ""][:2]
    if ident.sglang_version:
        got_lo = got_hi = ident.sglang_version
    if "release" in want and ident.sglang_version != want["release"]:
        errors.append(f"release: got {ident.sglang_version!r} ({ident.sglang_how}), expected {want['release']!r}")
    if "release_range" in want:
        lo, hi = want["release_range"]
        unbounded = not ident.sglang_version and not ident.sglang_range
        inside = (not got_lo or _within(got_lo, lo, hi)) and (not got_hi or _within(got_hi, lo, hi))
        if (unbounded and (lo or hi)) or (got_lo == "" and lo) or (got_hi == "" and hi) or not inside:
            errors.append(f"release range: got {got_lo or '…'} – {got_hi or '…'} ({ident.sglang_how}), "
                          f"expected within {lo or '…'} – {hi or '…'}")  # fmt: skip
    if "release_includes" in want and not _within(want["release_includes"], got_lo, got_hi):
        errors.append(f"release range {got_lo or '…'} – {got_hi or '…'} excludes {want['release_includes']}")
    if "state" in want and m.startup != want["state"]:
        errors.append(f"state: got {m.startup!r} ({m.startup_seen}), expected {want['state']!r}")
    if "gpu_candidates_mib" in want and ident.gpu_candidates_mib != want["gpu_candidates_mib"]:
        errors.append(f"gpu_candidates_mib: got {ident.gpu_candidates_mib}, expected {want['gpu_candidates_mib']}")
    for key, sub in (want.get("args_from") or {}).items():
        if sub not in m.args_from.get(key, ""):
            errors.append(f"args_from.{key}: got {m.args_from.get(key)!r}, expected it to contain {sub!r}")
    for key, val in (want.get("serving") or {}).items():
        if not _close(m.serving.get(key), val):
            errors.append(f"serving.{key}: got {m.serving.get(key)!r}, expected {val!r}")
    if "verdict" in want or "mfs" in want:
        c, _ = judge(m)
        if "verdict" in want and c.verdict != want["verdict"]:
            errors.append(f"verdict: got {c.verdict!r} ({c.reason}), expected {want['verdict']!r}")
        if "mfs" in want:
            w = want["mfs"]
            tol = max(0.0005, m.mfs_plus_minus or 0.0)
            ok = (m.mfs is None) if w["value"] is None else (m.mfs is not None and abs(m.mfs - w["value"]) <= tol)
            if not ok or m.mfs_origin != w["origin"]:
                errors.append(f"mfs: got {m.mfs} ({m.mfs_origin}: {m.mfs_how}), expected {w['value']} ({w['origin']})")
    return errors


@pytest.mark.parametrize("expected_file", EXPECTED, ids=[p.stem for p in EXPECTED])
def test_fixture(expected_file: Path) -> None:
    want = json.loads(expected_file.read_text())
    log = LOG_FIXTURES / want["file"]
    got = parse_log(log)
    assert len(got) == len(want["runs"]), f"{len(got)} runs parsed, {len(want['runs'])} expected"
    errors: list[str] = []
    for i, (m, w) in enumerate(zip(got, want["runs"], strict=True)):
        errors += [f"run {i}: {e}" for e in _check_run(m, w)]
        errors += [f"run {i}: {e}" for line in w.get("tricky_lines") or [] if (e := tricky_line_error(line))]
    assert not errors, "\n".join(errors)


def tricky_line_error(line: str) -> str | None:
    """A line the expectation names as hard, read alone: is it left as an unparsed memory line?"""
    (single,) = parse_log([line]) or [None]  # type: ignore[misc]
    if single is not None and single.unparsed_memory_lines:
        return f"tricky line left unparsed: {line[:120]!r}"
    return None


#: Classes of log text (issue 24) an expectation file may list under "classes": what its log covers.
CLASSES = {
    "gpu_id_tags": "2024 rank prefixes '[gpu_id=N]' (sglang 0.1.x) / '[gpu=N]' (0.2.x) read as ranks",
    "text_around_log": "launch command, check_env output, prose or a quoted script around the log: no run of its own",
    "speculative_decoding": "draft ModelRunner's init/load/pool/capture inside the target's run, target pool kept",
    "pool_end_before_capture": "'Memory pool end' kept when a capture-begin reading follows it",
    "failure_signal": "a segfault/signal (NCCL during capture) is a failure",
    "failure_while_serving": "a failure after the ready line or inside request traffic is a runtime failure",
    "max_total_tokens_cap": "no fraction implied from a pool --max-total-tokens capped",
    "mla_request_pools": "an MLA prefill node's implied fraction net of the request pools",
}


def class_coverage() -> dict[str, list[str]]:
    """Class → the fixture logs whose expectations list it (every class, covered or not)."""
    out: dict[str, list[str]] = {c: [] for c in CLASSES}
    for p in EXPECTED:
        for c in json.loads(p.read_text()).get("classes") or []:
            out.setdefault(c, []).append(p.stem)
    return out


def test_class_coverage_is_reported() -> None:
    """Every class an expectation names is one the harness knows; the counts per class are printed (pytest -s, or
    `python -m tests.logs.test_logs_fixtures`)."""
    cov = class_coverage()
    unknown = sorted(set(cov) - set(CLASSES))
    assert not unknown, f"classes no one defined in CLASSES: {unknown}"
    print(_coverage_table(cov))


def _coverage_table(cov: dict[str, list[str]]) -> str:
    return "\n".join(f"{c:26s} {len(v):2d}  {', '.join(v)}" for c, v in cov.items())


def test_fixture_expectations_present() -> None:
    """The fixture logs and their expectations travel together."""
    if not EXPECTED:
        pytest.skip("no hand expectations in tests/fixtures/logs/expected yet")
    for p in EXPECTED:
        assert (LOG_FIXTURES / json.loads(p.read_text())["file"]).is_file(), p.name


def test_fixture_logs_parse_cleanly() -> None:
    """No fixture leaves a memory-looking line unparsed: every format in them is known."""
    for log in sorted(LOG_FIXTURES.glob("*.log")):
        for m in parse_log(log):
            assert m.unparsed_memory_lines == 0, (log.name, m.unparsed_examples)


if __name__ == "__main__":
    print(_coverage_table(class_coverage()))
