"""A real prefill/decode pair on the CPU with the REAL sglang 0.5.23 and sglang-router 0.3.2 — one start.

Both workers (tiny config-only Llama, dummy weights, `--device cpu`) run with the mooncake TCP transfer backend
in one loopback-only network namespace, sglang's Rust router in front; the load goes through the router only:
single-chunk, chunked (3 chunk sends of ≤ 1024 tokens) and prefix-cached prompts. Each request's KV rows are
hashed at send on prefill and at receive on decode (profiler/measure/probe/kv_hash.py): equal, non-zero hashes
per request are the proof that the KV cache crossed; sglang's warm-up and health-check requests to the fake
bootstrap host leave zeros on decode (the negative control). Needs root (network namespace), mooncake and
libibverbs — what `make test` installs.
"""

from __future__ import annotations

import json

import pytest

from profiler.measure.runner.pair import Namespace, run_pair
from profiler.model.scenario import load_scenarios
from tests.conftest import ROOT, needs_sglang
from tests.measure.test_e2e_cpu import _prefill_possible

pytestmark = [pytest.mark.e2e, needs_sglang]

PAIR = {s.mode: s for s in load_scenarios(ROOT / "scenarios" / "cpu-pd-pair.toml")}


def _why_not() -> str | None:
    import importlib.util

    if importlib.util.find_spec("sglang_router") is None:
        return "sglang-router not installed (memfrac[sglang] pins 0.3.2)"
    return _prefill_possible() or Namespace.possible()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    if _why_not():
        pytest.skip(_why_not())
    out = tmp_path_factory.mktemp("pd-pair")
    return run_pair(PAIR["prefill"], PAIR["decode"], out, device="cpu")


def test_the_pair_ran_and_every_request_went_through_the_router(pair):
    assert pair.status == "ok", pair.failure
    assert [r.kind for r in pair.requests] == ["single"] * 2 + ["chunked"] * 2 + ["prefix"] * 2
    assert all(r.status == 200 and r.output_tokens > 0 for r in pair.requests), pair.requests
    assert pair.router["ready"] and pair.router["argv"][:5] == [
        "nsenter", pair.router["argv"][1], "--", pair.router["argv"][3], "-m"]  # fmt: skip
    assert "--pd-disaggregation" in pair.router["argv"] and "--mini-lb" not in pair.router["argv"]
    for side in (pair.prefill, pair.decode):
        cmd = json.loads((side.out_dir / "command.json").read_text())
        assert cmd["argv"][0] == "nsenter" and "mooncake_tcp" in cmd["argv"]
        assert cmd["env"]["SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER"] == "1" and cmd["env"]["MEMFRAC_KV_HASH"] == "1"
        assert side.stop["left_behind"] == []


def test_the_pair_drives_what_each_side_reserves_for(pair):
    """Issue 26.1, the pair likewise: through the router, prefill bursts at the prefill worker's chunk and the decode
    burst of every request the decode worker says it admits (its internal_states: the scenario's 32), each side's
    bursts in its own load.json and Measurement.serving."""
    dinfo = json.loads((pair.decode.out_dir / "server_info.json").read_text())
    admits = sum(s["effective_max_running_requests_per_dp"] for s in dinfo["internal_states"])
    dec = json.loads((pair.decode.out_dir / "load.json").read_text())
    pre = json.loads((pair.prefill.out_dir / "load.json").read_text())
    assert admits == 32 and [b["plan"]["kind"] for b in dec] == ["decode"]
    assert dec[0]["plan"]["requests"] == dec[0]["plan"]["concurrency"] == dec[0]["ok"] == admits
    assert [b["plan"]["kind"] for b in pre] == ["prefill", "prefill"] and pre[0]["plan"]["target_tokens"] == 1024
    assert all(b["ok"] == b["plan"]["requests"] for b in pre)
    assert pair.decode.measurement.serving["load_plans"][0]["admitted"] == admits


def test_kv_hashes_equal_at_send_and_receive_for_every_request(pair):
    t = json.loads((pair.out_dir / "transfer.json").read_text())
    assert t["proven"] == t["of"] == 6 and t["kinds_proven"] == ["chunked", "prefix", "single"]
    for r in t["requests"]:
        assert r["send_sha256"] == r["recv_sha256"] and len(r["send_sha256"]) == 64 and not r["zero"], r
        assert r["tokens"] == r["recv_tokens"] == r["input_len"]  # the whole prompt: decode held no prefix of it
    by = {r["rid"]: r for r in t["requests"]}
    assert all(by[f"memfrac-chunked-{k}"]["send_calls"] == 3 for k in (0, 1))  # 3 chunk sends of ≤ 1024 tokens
    assert all(by[f"memfrac-single-{k}"]["send_calls"] == 1 for k in (0, 1))
    # prefix-k starts with single-k's prompt, which prefill's radix cache holds (sglang's own count)
    assert all(by[f"memfrac-prefix-{k}"]["prefill_cached_tokens"] >= by[f"memfrac-single-{k}"]["tokens"] - 1
               for k in (0, 1))  # fmt: skip
    assert len({r["send_sha256"] for r in t["requests"]}) == 6  # six different prompts, six different hashes


def test_the_warm_up_to_the_fake_host_leaves_zeros_on_decode(pair):
    t = json.loads((pair.out_dir / "transfer.json").read_text())
    dec = [c for c in t["negative_control"] if c["side"] == "decode"]
    assert dec and all(c["zero"] for c in dec) and t["negative_control_zero"]
    pre = [c for c in t["negative_control"] if c["side"] == "prefill"]
    assert pre and not any(c["zero"] for c in pre)  # prefill computed them; nothing was sent for them


def test_both_workers_recorded_their_own_role_with_the_transfer_engine(pair):
    from profiler.core.measurement import Measurement

    for side, mode in ((pair.prefill, "prefill"), (pair.decode, "decode")):
        m = Measurement.load(side.out_dir / "measurement.json")
        assert m.identity.mode == mode and m.memory_kind == "host" and m.failure is None
        init = m.primary.phase("disaggregation_init")
        assert init is not None and init.used_mib is not None  # the transfer engine's own window
        info = json.loads((side.out_dir / "server_info.json").read_text())
        # sglang resolves "mooncake_tcp" to mooncake with MC_FORCE_TCP=1 (arg_groups/pd_disaggregation_hook.py:27-31)
        assert info["disaggregation_mode"] == mode and info["disaggregation_transfer_backend"] == "mooncake"


# ---------------------------------------------------------------------------------------------------------------
# On a CUDA machine (the nightly hardware CI): the same pair on two GPUs, every number GPU memory
# ---------------------------------------------------------------------------------------------------------------


def _two_gpus() -> str | None:
    from tests.measure.test_run_gpu import _cuda

    why = _cuda()
    if why:
        return why
    import torch

    if torch.cuda.device_count() < 2:
        return f"a pair needs 2 GPUs; torch sees {torch.cuda.device_count()}"
    from profiler.core.errors import MemfracError
    from profiler.measure.runner.worker import check_transfer_backend

    try:
        check_transfer_backend("mooncake_tcp")
        check_router_installed()
    except MemfracError as e:
        return str(e)
    return None


def check_router_installed() -> None:
    from profiler.measure.runner.pair import check_router

    check_router()


@pytest.mark.gpu
def test_the_pair_on_two_gpus_transfers_gpu_kv_and_measures_both_roles(tmp_path):
    why = _two_gpus()
    if why:
        pytest.skip(why)
    from profiler.core.measurement import Measurement

    res = run_pair(PAIR["prefill"], PAIR["decode"], tmp_path / "gpu-pair", device="cuda", gpus=([0], [1]))
    assert res.status == "ok", res.failure
    t = res.transfer
    assert t["proven"] == t["of"] == 6 and t["kinds_proven"] == ["chunked", "prefix", "single"]
    assert t["negative_control_zero"]
    for side, mode in ((res.prefill, "prefill"), (res.decode, "decode")):
        m = Measurement.load(side.out_dir / "measurement.json")
        assert m.memory_kind == "gpu" and m.identity.mode == mode and m.failure is None
        init = m.primary.phase("disaggregation_init")
        assert init is not None and init.before.free_mib is not None  # a GPU reading around the transfer engine
        assert side.gpu_check.get("checked") is not False or side.gpu_check.get("why")


def test_the_sweep_records_both_roles_and_the_report_shows_them_side_by_side(pair, tmp_path):
    from profiler.face.report import write_report
    from profiler.results.store import Store
    from profiler.sweep.executors import Job, JobResult
    from profiler.sweep.plan import make_plan
    from profiler.sweep.sweep import SweepSummary, record

    plan = make_plan([PAIR["prefill"], PAIR["decode"]], [0])
    (g,) = plan.runs
    store = Store(tmp_path / "r")
    store.init({"scenarios": "cpu-pd-pair.toml", "executor": "local", "device": "cpu"})
    summary = SweepSummary()
    record(store, plan, JobResult(Job(g, pair.out_dir, "cpu"), pair.prefill, pair=pair), summary)
    run = store.manifest()["runs"][g.key]
    assert run["status"] == "ok" and run["pair"] and run["transfer"]["proven"] == 6 and len(run["ids"]) == 2
    write_report(tmp_path / "r")
    md = (tmp_path / "r" / "report.md").read_text()
    section = md[md.index("## PD pairs: prefill and decode side by side"):]
    section = section[: section.index("\n## ", 10)]
    assert "| prefill" in section and "| decode" in section and "6/6 requests" in section
    line = next(x for x in section.splitlines() if x.startswith("| transfer engine (disaggregation_init)"))
    cells = [c.strip() for c in line.split("|")[2:4]]
    assert all(c != "—" and float(c.replace(",", "")) >= 0 for c in cells), line  # measured on both nodes
