"""Every file memfrac reads, given generated wrong shapes, types and values: exit 2 and one line naming the file,
never a traceback (issue 23). The CLI runs in-process through `main()`; Hypothesis draws the damage.

Each property starts from a file memfrac accepts and breaks one field of it (or the whole shape): the command then
either still works (the value happened to be allowed: exit 0, or 1 for a gate that fails a run) or stops with
exactly one `memfrac: error:` line — and an exception that escapes `main()` fails the test with its traceback.
"""

from __future__ import annotations

import copy
import gzip
import json
import lzma
import math
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiler.core.errors import FieldError
from profiler.face.cli import _parse_gpus, main
from profiler.model.scenario import ALL_KEYS, BUNDLED_MODELS
from profiler.results.store import RESULT_COLUMNS
from tests.conftest import LOG_FIXTURES

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FEW = settings(FAST, max_examples=12)  # each example gates a whole results directory (~1 s)
SCALAR = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
          | st.floats() | st.text(max_size=12))  # fmt: skip
ANY_JSON = st.recursive(
    SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
LLAMA = BUNDLED_MODELS / "meta-llama--Llama-3.1-8B-Instruct"


def outcome(capsys: pytest.CaptureFixture[str], argv: list[str], ok: tuple[int, ...] = (0,)) -> tuple[int, str]:
    """Run the CLI; exit 2 must come with exactly one `memfrac: error:` line (the message itself one line)."""
    rc = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [ln for ln in err.splitlines() if ln.startswith("memfrac: error:")]
    if rc == 2:
        assert len(errors) == 1 and err.rstrip().endswith(errors[0]), err
    else:
        assert rc in ok and not errors, (rc, err)
    return rc, (errors[0] if errors else "")


# ---- TOML (scenario files) -------------------------------------------------------------------------------------


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int | str):
        return json.dumps(v) if isinstance(v, str) else str(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)  # None: the caller leaves the key out


def toml_doc(doc: dict[str, Any]) -> str:
    return "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in doc.items() if v is not None)


TOML_VALUE = st.recursive(
    st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip
SCENARIO = {"name": "h", "model": "meta-llama--Llama-3.1-8B-Instruct", "gpu": "H200", "mode": "decode"}


@FAST
@given(key=st.sampled_from([*ALL_KEYS, "decode_graph", "run", "unknown_key"]), value=TOML_VALUE)
def test_scenario_file_with_a_wrong_value(tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str,
                                          value: Any) -> None:  # fmt: skip
    p = tmp_path / "s.toml"
    p.write_text(toml_doc({**SCENARIO, key: value}))
    rc, err = outcome(capsys, ["explain", str(p), "--no-validate"])
    if rc == 2:
        assert str(p) in err or "--" in err or "model config" in err, err


@FAST
@given(st.binary(min_size=1, max_size=64))
def test_scenario_file_of_any_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str], data: bytes) -> None:
    p = tmp_path / "s.toml"
    p.write_bytes(toml_doc(SCENARIO).encode() + data)
    outcome(capsys, ["explain", str(p), "--no-validate"])


def test_the_cases_of_issue_23(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each named in the issue, with the one line it now gives."""
    p = tmp_path / "s.toml"
    p.write_bytes(toml_doc(SCENARIO).encode() + b"# caf\xe9 in latin-1\n")
    at = len(toml_doc(SCENARIO).encode()) + len(b"# caf")
    assert outcome(capsys, ["explain", str(p)])[1] == (
        f"memfrac: error: {p}: encoding: bad value 'byte 0xe9 at offset {at}'; allowed: UTF-8 text")
    p.write_text(toml_doc({**SCENARIO, "gpu": 10**18}))  # "10^30 MiB" (TOML stops at 2^63)
    assert "key 'gpu': bad value 1000000000000000000; allowed: a GPU name" in outcome(capsys, ["explain", str(p)])[1]
    p.write_text(toml_doc(SCENARIO))
    for free, why in (("-5", "a number ≥ 0"), ("200000", "a number 0..143771 MiB (free memory at start: at most"),
                      ("nan", "bad value nan; allowed: a number ≥ 0")):
        assert why in outcome(capsys, ["explain", str(p), "--no-validate", f"--free-at-start={free}"])[1]
    bad_model = tmp_path / "m"
    bad_model.mkdir()
    (bad_model / "config.json").write_text("{")
    p.write_text(toml_doc({**SCENARIO, "model": str(bad_model)}))
    assert f"{bad_model}/config.json: not JSON (Expecting property name" in outcome(capsys, ["explain", str(p)])[1]


@FAST
@given(st.text(max_size=12))
def test_gpus_option(text: str) -> None:
    """`--gpus`: distinct indices ≥ 0, ranges rising (`7-0` planned on no GPU before), or one line."""
    try:
        got = _parse_gpus(text)
    except FieldError as e:
        assert str(e).startswith("--gpus: bad value") and "\n" not in str(e)
        return
    assert got and len(set(got)) == len(got) and min(got) >= 0
    with pytest.raises(FieldError, match="a rising range like 0-7"):
        _parse_gpus("7-0")


# ---- config.json -----------------------------------------------------------------------------------------------

CONFIG_KEYS = ["architectures", "hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
               "head_dim", "intermediate_size", "vocab_size", "torch_dtype", "tie_word_embeddings", "text_config",
               "quantization_config", "num_experts", "kv_lora_rank", "first_k_dense_replace", "mlp_only_layers"]


@FAST
@given(key=st.sampled_from(CONFIG_KEYS), value=ANY_JSON)
def test_model_config_with_a_wrong_field(tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str,
                                         value: Any) -> None:  # fmt: skip
    cfg = json.loads((LLAMA / "config.json").read_text())
    cfg[key] = value
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(cfg))
    p = tmp_path / "s.toml"
    p.write_text(toml_doc({**SCENARIO, "model": str(model)}))
    rc, err = outcome(capsys, ["explain", str(p), "--no-validate"])
    if rc == 2:
        assert f"{model}/config.json" in err, err


# ---- results directory: results.parquet and manifest.json ------------------------------------------------------


@pytest.fixture
def results(tmp_path_factory: pytest.TempPathFactory, ingested: Path) -> Path:
    """A copy of the ingested fixture directory; each example below breaks a file from the pristine one."""
    d = tmp_path_factory.mktemp("r") / "r"
    shutil.copytree(ingested, d)
    return d


COLUMN_VALUES = (st.sampled_from(["x", "", "1e3"]) | st.floats() | st.booleans()
                 | st.integers(min_value=-(2**62), max_value=2**62))  # fmt: skip


@FEW
@given(col=st.sampled_from(sorted(RESULT_COLUMNS)), value=COLUMN_VALUES)
def test_results_parquet_with_a_column_of_another_type(
    results: Path, ingested: Path, capsys: pytest.CaptureFixture[str], col: str, value: Any
) -> None:
    p = results / "results.parquet"
    df = pd.read_parquet(ingested / "results.parquet")
    df[col] = [value] * len(df)
    df.to_parquet(p)
    rc, err = outcome(capsys, ["gate", str(results)], ok=(0, 1))
    if rc == 2:
        assert "results.parquet" in err, err


@FEW
@given(path=st.sampled_from(["schema_version", "runs", "sweep", "runs.ingest", "runs.ingest.status",
                             "runs.ingest.ids", "runs.ingest.at"]), value=ANY_JSON)  # fmt: skip
def test_manifest_with_a_field_of_another_type(results: Path, ingested: Path, capsys: pytest.CaptureFixture[str],
                                               path: str, value: Any) -> None:  # fmt: skip
    p = results / "manifest.json"
    man = json.loads((ingested / "manifest.json").read_text())
    *parents, leaf = path.split(".")
    d = man
    for k in parents:
        d = d[k]
    d[leaf] = value
    p.write_text(json.dumps(man))
    rc, err = outcome(capsys, ["gate", str(results)], ok=(0, 1))
    if rc == 2:
        assert "manifest.json" in err, err


def test_manifest_of_other_types_names_the_field(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = results / "manifest.json"
    man = json.loads(p.read_text())
    man["runs"]["ingest"]["status"] = 3
    p.write_text(json.dumps(man))
    assert outcome(capsys, ["gate", str(results)])[1] == (
        f"memfrac: error: {p}: runs.ingest.status: bad value 3; allowed: a string (ok | failed | error | "
        "not_started | skipped …)")  # fmt: skip


# ---- gate baseline.json ----------------------------------------------------------------------------------------


@FEW
@given(doc=st.fixed_dictionaries({"version": ANY_JSON, "scenarios": ANY_JSON}) | ANY_JSON
       | st.fixed_dictionaries({"scenarios": st.dictionaries(st.text(max_size=5), ANY_JSON, max_size=2)}))
def test_gate_baseline_of_any_shape(results: Path, capsys: pytest.CaptureFixture[str], doc: Any) -> None:
    b = results / "baseline.json"
    b.write_text(json.dumps(doc))
    rc, err = outcome(capsys, ["gate", str(results), "--baseline", str(b)], ok=(0, 1))
    if rc == 2:
        assert "baseline" in err, err


def test_gate_output_paths(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`gate --junit DIR` was an IsADirectoryError after the work; now one line before it."""
    rc, err = outcome(capsys, ["gate", str(results), "--junit", str(results)])
    assert rc == 2 and err == f"memfrac: error: --junit: bad value '{results}'; allowed: a file path, not a directory"
    b = results / "b.json"
    b.write_text(json.dumps({"version": 1, "scenarios": {"x": {"total": -1280}}}))
    assert outcome(capsys, ["gate", str(results), "--baseline", str(b)])[1] == (
        f"memfrac: error: {b}: scenarios.x.total: bad value -1280; allowed: a number ≥ -20.48 MiB")
    for bad in ("nan", "-5%", "inf"):
        assert "--max-regression: bad value" in outcome(capsys, ["gate", str(results), f"--max-regression={bad}"])[1]


# ---- calibration.json ------------------------------------------------------------------------------------------

CALIBRATION = {"schema_version": 1, "rules": "0.5.23", "terms": {
    "decode_graph": {"params": {"mib_per_bs": 2.5}}, "constant": {"params": {"constant_mib": 600}}}}


@FAST
@given(where=st.sampled_from(["schema_version", "rules", "terms", "terms.decode_graph", "terms.decode_graph.params",
                              "terms.decode_graph.params.mib_per_bs", "terms.constant.params.constant_mib",
                              "terms.activation"]), value=ANY_JSON)  # fmt: skip
def test_calibration_with_a_wrong_field(tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str,
                                        value: Any) -> None:  # fmt: skip
    doc = copy.deepcopy(CALIBRATION)
    *parents, leaf = where.split(".")
    d = doc
    for k in parents:
        d = d[k]
    d[leaf] = value
    c = tmp_path / "cal.json"
    c.write_text(json.dumps(doc))
    s = tmp_path / "s.toml"
    s.write_text(toml_doc(SCENARIO))
    rc, err = outcome(capsys, ["explain", str(s), "--no-validate", "--calibration", str(c)])
    if rc == 2:
        assert "cal.json" in err, err


def test_calibration_numbers_not_finite_or_negative(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 23: Infinity was an OverflowError, −1280 printed as "decode_graph −1,280 MiB"."""
    s = tmp_path / "s.toml"
    s.write_text(toml_doc(SCENARIO))
    c = tmp_path / "cal.json"
    for value, shown in ((-1280, "-1280"), (1e400, "Infinity")):
        doc = copy.deepcopy(CALIBRATION)
        doc["terms"]["decode_graph"]["params"]["mib_per_bs"] = value
        c.write_text(json.dumps(doc))
        err = outcome(capsys, ["explain", str(s), "--no-validate", "--calibration", str(c)])[1]
        assert f"{c}" in err and shown in err, err


# ---- probe JSONL -----------------------------------------------------------------------------------------------


def probe_records() -> list[dict[str, Any]]:
    """A host worker's probe file as the plugin writes it: start, the weights window, the KV pool window."""
    snap = {"t": 1.0, "rss_mib": 1000.0}
    return [
        {"type": "start", "pid": 7, "ranks": {"tp": 0}, "kind": "host", "sglang_version": "0.5.23"},
        {"type": "begin", "seq": 0, "phase": "weights", "pid": 7, "ranks": {"tp": 0}, "snap": snap, "t": 1.0},
        {"type": "end", "seq": 0, "phase": "weights", "pid": 7, "before": snap, "t": 2.0,
         "after": {"t": 2.0, "rss_mib": 3000.0}, "elapsed_s": 1.0},
        {"type": "begin", "seq": 1, "phase": "kv_pool", "pid": 7, "snap": {"t": 2.0, "rss_mib": 3000.0}, "t": 2.0},
        {"type": "end", "seq": 1, "phase": "kv_pool", "pid": 7, "before": {"t": 2.0, "rss_mib": 3000.0},
         "after": {"t": 3.0, "rss_mib": 5000.0}, "elapsed_s": 1.0, "t": 3.0},
    ]  # fmt: skip


@FAST
@given(line=st.integers(0, 4), key=st.sampled_from(["type", "seq", "phase", "pid", "ranks", "kind", "snap", "before",
                                                    "after", "t", "elapsed_s", "details", "bs"]),
       value=ANY_JSON)  # fmt: skip
def test_probe_jsonl_with_a_wrong_field(tmp_path: Path, capsys: pytest.CaptureFixture[str], line: int, key: str,
                                        value: Any) -> None:  # fmt: skip
    recs = probe_records()
    recs[line][key] = value
    probe = tmp_path / "probe"
    probe.mkdir(exist_ok=True)
    (probe / "probe-7.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    s = tmp_path / "s.toml"
    s.write_text(toml_doc({**SCENARIO, "mode": "null"}))
    rc, err = outcome(capsys, ["judge", str(probe), "--scenario", str(s)], ok=(0, 1))
    if rc == 2:
        assert "probe" in err, err


# ---- logs ------------------------------------------------------------------------------------------------------

LOG = LOG_FIXTURES / "repo_unknown_qwen3-0.6b_wsl_4gb.log"


@FAST
@given(codec=st.sampled_from(["gzip", "xz", "plain"]), cut=st.floats(0.0, 1.0), junk=st.binary(max_size=32))
def test_logs_cut_anywhere_or_with_junk(tmp_path: Path, capsys: pytest.CaptureFixture[str], codec: str, cut: float,
                                        junk: bytes) -> None:  # fmt: skip
    data = LOG.read_bytes()
    packed = {"gzip": gzip.compress, "xz": lzma.compress, "plain": bytes}[codec](data)
    f = tmp_path / "x.log"
    f.write_bytes(packed[: int(len(packed) * cut)] + junk)
    rc = main(["ingest", str(f), "--jobs", "1"])
    err = capsys.readouterr().err
    assert "Traceback" not in err and rc in (0, 2), err
    lines = err.strip().splitlines()
    if rc == 2:  # one error line, or the file's "no server run" line and the summary (exit 2: nothing judged)
        assert (len(lines) == 1 and lines[0].startswith(f"memfrac: error: {f}")) or "no server run" in err, err
    assert all(ln.startswith("memfrac: ") for ln in lines), err


def test_output_paths_must_be_writable_files(tmp_path: Path, ingested: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Checked before the work: a directory (or a path under a file) given where a file is written."""
    (tmp_path / "f").write_text("")
    under_file = str(tmp_path / "f" / "x.json")
    cases = [
        (["calibrate", str(ingested), "--out", str(tmp_path)], "--out", "a file path, not a directory"),
        (["calibrate", str(ingested), "--emit-patch", str(tmp_path)], "--emit-patch", "not a directory"),
        (["ingest", str(LOG), "--out", under_file], "--out", "a file path under a directory"),
        (["baseline", str(ingested), "--out", str(tmp_path)], "--out", "not a directory"),
    ]
    for argv, flag, allowed in cases:
        err = outcome(capsys, argv)[1]
        assert err.startswith(f"memfrac: error: {flag}: bad value") and allowed in err, err


@FAST
@given(key=st.sampled_from(["hidden_size", "n_routed_experts", "text_config", "num_attention_heads"]), value=ANY_JSON)
def test_deepep_size_of_a_model_with_a_wrong_field(tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str,
                                                   value: Any) -> None:  # fmt: skip
    cfg = json.loads((BUNDLED_MODELS / "deepseek-ai--DeepSeek-V3" / "config.json").read_text())
    cfg[key] = value
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(cfg))
    rc, err = outcome(capsys, ["deepep-size", "--model", str(model)])
    if rc == 2:  # the file and field named, or the value the sizing cannot take (1 expert on 8 ranks) named
        assert "config" in err or f"={value}" in err.replace(" ", ""), err


def test_a_manifest_as_sweeps_write_it_reads_back(tmp_path: Path) -> None:
    """Every run record profiler.sweep.sweep writes (ok, not started, skipped, error, a PD pair) passes the check."""
    from profiler.results.store import read_manifest

    runs = {"a": {"status": "ok", "ids": ["a"], "at": 1.5, "out_dir": "raw/a"},
            "b": {"status": "not_started", "ids": [], "at": 2, "reason": "predicted not to load"},
            "c": {"status": "skipped", "ids": [], "reason": "x", "scenarios": ["c1", "c2"]},
            "d": {"status": "error", "ids": [], "error": {"kind": "crash"}},
            "p": {"status": "ok", "ids": ["p-prefill", "p-decode"], "out_dir": "raw/p", "pair": True,
                  "failure": None, "transfer": {"proven": True, "of": 8}}}  # fmt: skip
    p = tmp_path / "manifest.json"
    p.write_text(json.dumps({"schema_version": 1, "runs": runs, "sweep": {"kind": "ingest"}}))
    assert read_manifest(p)["runs"] == runs


@FAST
@given(key=st.sampled_from(["startup_timeout_s", "load_timeout_s", "stop_grace_s", "output_len", "load_requests"]),
       value=st.floats() | st.integers(min_value=-(2**63), max_value=2**63 - 1))  # fmt: skip
def test_run_table_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: float) -> None:
    """[run] settings: finite and > 0 (TOML writes nan and inf; a NaN timeout never times out)."""
    p = tmp_path / "s.toml"
    p.write_text(toml_doc({**SCENARIO, "run": {key: value}}))
    rc, err = outcome(capsys, ["explain", str(p), "--no-validate"])
    good = not isinstance(value, bool) and math.isfinite(value) and value > 0
    good = good and (isinstance(value, int) or key.endswith("_s"))
    assert (rc == 0) == good, (rc, err)
    if not good:
        assert f"key 'run.{key}'" in err, err


@FAST
@given(table=st.sampled_from(["ledger.parquet", "ladder.parquet"]), value=COLUMN_VALUES, pick=st.integers(0, 99))
def test_ledger_and_ladder_parquet_with_a_column_of_another_type(
    results: Path, ingested: Path, table: str, value: Any, pick: int
) -> None:
    """The report's and calibrate's readers (load_ledger, load_ladder): a typed frame or one FieldError line."""
    from profiler.core.errors import MemfracError
    from profiler.results.store import LADDER_COLUMNS, LEDGER_COLUMNS, load_ladder, load_ledger

    columns, load = (LEDGER_COLUMNS, load_ledger) if table == "ledger.parquet" else (LADDER_COLUMNS, load_ladder)
    col = sorted(columns)[pick % len(columns)]
    src = ingested / table
    df = pd.read_parquet(src) if src.exists() else pd.DataFrame()
    real = len(df) > 0
    if not real:  # the logs hold no ladder: one rung as the store writes it (16 MiB at bs 8)
        df = pd.DataFrame([{"schema_version": 1, "run_id": "r", "scenario": "s", "model": "m", "gpu_name": "H200",
                            "mode": "decode", "tp": 1, "bs": 8, "capture_index": 0, "used_mib": 16.0,
                            "reserved_mib": 16.0}])  # fmt: skip
    assert len(load(ingested if real else _write(df, results / table)))  # the unbroken table reads back
    df[col] = [value] * len(df)
    df.to_parquet(results / table)
    try:
        got = load(results)
    except MemfracError as e:
        assert str(e).startswith(f"{results / table}: column {col}: bad value") and "\n" not in str(e), e
        return
    assert list(got.columns)[: len(columns)] == list(columns)


def _write(df: pd.DataFrame, path: Path) -> Path:
    df.to_parquet(path)
    return path.parent


def test_report_with_a_ledger_of_another_type(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from profiler.results.store import LEDGER_COLUMNS

    df = pd.DataFrame({c: [None] for c in LEDGER_COLUMNS}).assign(mib=["lots"], run_id=["r"], schema_version=[1])
    df.to_parquet(results / "ledger.parquet")
    assert outcome(capsys, ["report", str(results)])[1] == (
        f"memfrac: error: {results / 'ledger.parquet'}: column mib: bad value 'lots'; allowed: float64 values")
