"""profiler/core/validate.py: each check accepts what it documents and names the field and value otherwise."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiler.core.errors import FieldError, MemfracError, ScenarioError, show_value
from profiler.core.validate import (
    GPU_MAX_MIB,
    GPU_MIN_MIB,
    finite,
    gpu_mib,
    in_range,
    json_object,
    read_json,
    read_text,
    readable_file,
    size_mib,
    writable_file,
)

ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def test_field_error_is_one_line_naming_file_field_value_and_allowed() -> None:
    e = FieldError("c.json", "terms.decode_graph.params.mib_per_bs", -1280, "a number ≥ 0")
    assert str(e) == "c.json: terms.decode_graph.params.mib_per_bs: bad value -1280; allowed: a number ≥ 0"
    assert isinstance(e, MemfracError)
    assert str(ScenarioError("s.toml", "tp", 0, "an integer 1..512")) == (
        "s.toml: key 'tp': bad value 0; allowed: an integer 1..512"
    )
    long = show_value("x\n" * 100)
    assert len(long) == 80 and "\n" not in long and long.endswith("…")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, True, "1", None, [1], 10**400])
def test_finite_refuses_what_is_not_a_finite_number(bad: object) -> None:
    with pytest.raises(FieldError, match=r"^f: x: bad value .*; allowed: a finite number$"):
        finite("f", "x", bad)


@settings(max_examples=60, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers())
def test_in_range_accepts_exactly_the_finite_numbers_between_its_bounds(v: float) -> None:
    ok = math.isfinite(float(v)) if abs(v) < 1e308 or isinstance(v, float) else False
    ok = ok and 0 <= v <= 100
    if ok:
        assert in_range("f", "x", v, 0, 100) == float(v)
    else:
        with pytest.raises(FieldError, match=r"allowed: a number 0\.\.100$"):
            in_range("f", "x", v, 0, 100)


def test_sizes_and_gpus() -> None:
    assert size_mib("f", "x", 0) == 0.0
    with pytest.raises(FieldError, match=r"x: bad value -1; allowed: a number ≥ 0 MiB"):
        size_mib("f", "x", -1)
    assert (GPU_MIN_MIB, GPU_MAX_MIB) == (1024, 1_048_576)  # 1 GiB … 1 TiB in MiB
    assert gpu_mib("f", "x", 143771) == 143771.0
    for bad in (1023, 1_048_577, 10**30):
        with pytest.raises(FieldError, match="a GPU holds 1 GiB … 1 TiB"):
            gpu_mib("f", "x", bad)


def test_files_that_are_not_regular_are_named_for_what_they_are(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for p, kind in ((tmp_path, "a directory"), (fifo, "a FIFO"), (Path("/dev/null"), "a character device")):
        with pytest.raises(FieldError, match=f"not {kind}"):
            readable_file(p)
    with pytest.raises(FieldError, match="no such file or directory"):
        readable_file(tmp_path / "missing")


def test_text_is_strict_utf8_and_json_strict(tmp_path: Path) -> None:
    p = tmp_path / "s.toml"
    p.write_bytes(b"name = 'a'\n\xff")
    with pytest.raises(FieldError, match=r"s\.toml: encoding: bad value 'byte 0xff at offset 11'; allowed: UTF-8"):
        read_text(p)
    p.write_text('{"a": NaN}')
    with pytest.raises(FieldError, match="NaN and Infinity are not JSON"):
        read_json(p)
    p.write_text("[1]")
    with pytest.raises(FieldError, match=r"\(top level\): bad value \[1\]"):
        json_object(p)


def test_writable_file(tmp_path: Path) -> None:
    assert writable_file(tmp_path / "new" / "deeper" / "g.xml", "--junit") == tmp_path / "new" / "deeper" / "g.xml"
    with pytest.raises(FieldError, match=r"^--junit: bad value .*; allowed: a file path, not a directory$"):
        writable_file(tmp_path, "--junit")
    (tmp_path / "f").write_text("")
    with pytest.raises(FieldError, match="is not one"):
        writable_file(tmp_path / "f" / "g.xml", "--junit")


@settings(max_examples=40, deadline=None)
@given(ANY_JSON)
def test_json_object_takes_only_objects(tmp_path_factory: pytest.TempPathFactory, doc: object) -> None:
    import json

    p = tmp_path_factory.mktemp("j") / "x.json"
    p.write_text(json.dumps(doc))
    if isinstance(doc, dict) and not _has_nonfinite(doc):
        assert json_object(p) == doc
    else:
        with pytest.raises(MemfracError):
            json_object(p)


def _has_nonfinite(x: object) -> bool:
    if isinstance(x, float):
        return not math.isfinite(x)
    if isinstance(x, dict):
        return any(_has_nonfinite(v) for v in x.values())
    if isinstance(x, list):
        return any(_has_nonfinite(v) for v in x)
    return False


def test_a_field_or_file_name_with_a_newline_stays_one_line() -> None:
    e = FieldError("a\nb.json", "scenarios.\n", None, "an object")
    assert str(e) == "a\\nb.json: scenarios.\\n: bad value None; allowed: an object"
