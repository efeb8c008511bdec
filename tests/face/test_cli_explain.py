"""`memfrac explain` and `memfrac deepep-size` as a user runs them."""

from __future__ import annotations

import json

from profiler.face.cli import main
from tests.conftest import ROOT


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_explain_h200_decode_prints_0929_with_floor(capsys):
    rc, out, _ = run(capsys, "explain", str(ROOT / "scenarios/llama8b-h200-decode.toml"))
    assert rc == 0
    assert "mem_fraction_static = 0.929" in out and "floor_applied" in out
    assert "floor_topup" in out and "6,016" in out
    assert "KV budget" in out and "tokens" in out


def test_explain_json_single_and_matrix(capsys):
    rc, out, _ = run(capsys, "explain", str(ROOT / "scenarios/llama8b-h200-decode.toml"), "--json")
    d = json.loads(out)
    assert rc == 0 and d["mem_fraction_static"] == 0.929 and d["reserved_mib"] == 10240 and d["rules"] == "0.5.23"
    assert {t["name"] for t in d["terms"]} >= {"constant", "activation", "decode_graph", "floor_topup", "deepep_a2a"}
    assert all({"name", "mib", "reason"} <= t.keys() for t in d["terms"])
    rc, out, _ = run(capsys, "explain", str(ROOT / "scenarios/default.toml"), "--json")
    lst = json.loads(out)
    assert isinstance(lst, list) and len(lst) == 18
    dsv3 = next(x for x in lst if x["scenario"] == "dsv3-deepep-H200-decode")
    assert dsv3["mem_fraction_static"] == 0.915 and dsv3["kv"]["kv_bytes_per_token"] == 61 * (512 + 64) * 2


def test_explain_older_rules(capsys):
    rc, out, _ = run(capsys, "explain", str(ROOT / "scenarios/llama8b-h200-decode.toml"), "--rules", "0.5.14", "--json")
    assert rc == 0 and json.loads(out)["mem_fraction_static"] == 0.907


def test_compare_rules_shows_what_29615_changed(capsys):
    rc, out, _ = run(
        capsys, "explain", str(ROOT / "scenarios/pd-compare.toml"), "--compare-rules", "0.5.14", "0.5.15.post1"
    )
    assert rc == 0
    block = out.split("\n\n")[2]  # llama8b-h100-decode
    assert "llama8b-h100-decode" in block
    assert "0.835" in block and "0.874" in block and "+0.039" in block
    assert "decode node: max(decode max_bs 256" in block
    rc, out, _ = run(
        capsys,
        "explain",
        str(ROOT / "scenarios/llama8b-h200-decode.toml"),
        "--compare-rules",
        "0.5.14",
        "0.5.23",
        "--json",
    )
    d = json.loads(out)
    assert d["a"]["mem_fraction_static"] == 0.907 and d["b"]["mem_fraction_static"] == 0.929


def test_explain_errors_exit_2(capsys, tmp_path):
    rc, _, err = run(capsys, "explain", str(tmp_path / "missing.toml"))
    assert rc == 2 and err.startswith("memfrac: error: scenario file not found")
    rc, _, err = run(capsys, "explain", str(ROOT / "scenarios/llama8b-h200-decode.toml"), "--rules", "0.3.6")
    assert rc == 2 and "predates" in err


def test_deepep_size(capsys):
    rc, out, _ = run(capsys, "deepep-size", "--hidden", "7168", "--experts", "256", "--tokens", "128", "--json")
    d = json.loads(out)
    assert rc == 0 and d["low_latency_rdma_bytes"] == 1_908_410_496 and d["heuristic_reserve_bytes"] == 2**31
    rc, out, _ = run(capsys, "deepep-size", "--model", str(ROOT / "scenarios/models/moonshotai--Kimi-K2-Instruct"))
    assert rc == 0 and "2.666 GiB" in out and "exceeds the 2 GiB reserve" in out
    rc, _, err = run(capsys, "deepep-size", "--model", str(ROOT / "scenarios/models/Qwen--Qwen3-8B"))
    assert rc == 2 and "not an MoE model" in err
    rc, _, err = run(capsys, "deepep-size", "--hidden", "7168")
    assert rc == 2 and "--experts" in err
