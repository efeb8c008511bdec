"""`memfrac audit`: the heuristic over its whole configuration space, and where it under- or over-reserves.

The space is the bundled models × the GPU table × PD roles × parallelism (tp, attention DP, ep) × every
all-to-all backend × its dispatch capacities (and DeepEP modes) × graph settings × post-capture KV sizing
off/on. For each configuration: sglang's fraction and every term, whether sglang 0.5.23 accepts it, the KV
pool it leaves (free at start assumed equal to capacity: an estimate, and labelled so), the all-to-all
buffer beside its reserve, and — with `--calibration` — the reserve the calibrated constants predict.

How it stays fast and exact: the fraction depends on a few inputs only (GPU size, role, tp and attention
DP, the architecture, the backend, the graph settings, post-capture), so the scalar model that the
conformance tests check against the real resolver (`profiler.model.heuristic.model.evaluate`) runs once per
distinct heuristic input — about a tenth of the configurations — and numpy broadcasts its terms to every
row. Weights, KV bytes and buffer sizes are tabulated per distinct model/parallelism/backend input the
same way; the per-row arithmetic (KV budget, tokens given up to the floor, buffer vs reserve, calibrated
reserve) is numpy. `tests/calibrate/test_audit.py` checks rows against `profiler.model.heuristic.reserve` directly.

Findings (the summary table, `findings.parquet`):
- fraction_nonpositive: sglang derives mem_fraction_static ≤ 0 (it fails at start);
- weights_do_not_fit: a positive fraction that does not even cover the weights (KV budget ≤ 0);
- floor_decides: the 10 GiB floor lifted the reserve; KV given up per node type is the top-up;
- a2a_oom: the buffer is larger than every non-KV term together (allocated after the KV pool: OOM at
  capture or at the first dispatch), per backend; a2a_over_reserve: larger than its own reserve (the
  floor or other terms must cover it); a2a_fails: its creation raises; a2a_size_unknown: no formula;
- under_reserved_calibrated (with --calibration): the calibrated constants predict more than today's reserve.
Configurations sglang refuses (`sglang_refusal`, its checks for these inputs, each citing the source) are
kept in the parquet with the reason and left out of every finding.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiler.calibrate.codec import fits, load_calibration, sized_by_note
from profiler.calibrate.shapes import Fit, calibrated_sum, floor_applies
from profiler.core.errors import MemfracError
from profiler.engine.oracle import GPU_CAPABILITY
from profiler.model import a2a
from profiler.model.gpus import known_gpus
from profiler.model.heuristic.constants import ACTIVATION_MIB_PER_TOKEN
from profiler.model.heuristic.inputs import vision_shape
from profiler.model.heuristic.model import evaluate
from profiler.model.heuristic.record import TERM_NAMES, HeuristicInputs
from profiler.model.heuristic.releases import DEFAULT_RELEASE, rules_for
from profiler.model.heuristic.rules import RuleSet
from profiler.model.modelcfg import ModelShape, load_model_shape
from profiler.model.scenario import BUNDLED_MODELS, MODES

MIB = 1 << 20
TI = {n: i for i, n in enumerate(TERM_NAMES)}
#: Graph settings the audit sweeps: (label, decode backend, prefill backend, disable_cuda_graph).
GRAPHS: tuple[tuple[str, str | None, str | None, bool], ...] = (
    ("default", None, None, False),
    ("decode_off", "disabled", None, False),
    ("prefill_off", None, "disabled", False),
    ("no_cuda_graph", None, None, True),
)
TPS = (1, 2, 4, 8, 16)
#: Dispatch capacities per backend (None: sglang's default); DeepEP-family modes per backend.
TOKENS: dict[str, tuple[int | None, ...]] = {
    "deepep": (64, 128, 256, 512, 1024),
    "mooncake": (64, 128, 256, 512, 1024),
    "nixl": (64, 128, 256, 512, 1024),
    "pplx": (128, 1024, 4096, 8192, 16384),
    "deepep_v2": (128, 1024, 4096, 8192, 16384),
    "mori": (1024, 4096, 8192, 16384),
    "flashinfer": (None, 4096, 8192, 16384),
    "megamoe": (None, 16384),
}
DEEPEP_MODES_FOR: dict[str, tuple[str, ...]] = {
    "deepep": ("auto", "low_latency", "normal"),
    "mooncake": ("low_latency", "auto"),
    "nixl": ("low_latency", "auto"),
}
#: The --moe-runner-backend the audit gives flashinfer's all-to-all (sglang asserts a flashinfer or DeepGEMM
#: runner; deep_gemm is accepted for FP8 and BF16 experts on every bundled GPU).
FLASHINFER_RUNNER = "deep_gemm"


# ------------------------------------------------------------------------------------------------------
# What sglang 0.5.23 refuses among these inputs (checked against the real resolver by tests/calibrate/test_audit.py)
# ------------------------------------------------------------------------------------------------------

_MEGA_MOE_NO_FALLBACK = frozenset({"Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "Qwen3NextForCausalLM"})


def sglang_refusal(
    backend: str,
    arch: str,
    capability: tuple[int, int] | None,
    mode: str,
    tp: int,
    attn_dp: int,
    tokens: int | None,
    deepep_mode: str,
    chunk: int,
    decode_on: bool,
    decode_max_bs: int,
) -> str:
    """sglang 0.5.23's refusal of an audit configuration ("" = accepted), for the inputs the audit varies.

    `chunk` is the resolved chunked_prefill_size before DP attention divides it (handle_data_parallelism runs
    before handle_a2a_moe, so the a2a checks see chunk // attn_dp). Sources: srt/arg_groups/moe_hook.py
    (handle_a2a_moe, validate_deepep_v2_dispatch_token_budget, validate_flashinfer_a2a_token_budget),
    mega_moe_hook.py (check_mega_moe_compat, validate_mega_moe_token_budget), overrides.py.
    """
    per_dp = chunk // attn_dp if chunk > 0 else chunk
    if backend == "pplx":
        if deepep_mode == "normal":
            return "moe_a2a_backend='pplx' only supports low-latency mode"
        if attn_dp < 2:
            return "moe_a2a_backend='pplx' requires attention DP with at least 2 groups (--attn-dp-size >= 2)"
        cap = tokens if tokens is not None else 128
        if per_dp > 0 and mode != "decode" and per_dp > cap:
            return "SGLANG_PPLX_NUM_MAX_DISPATCH_TOKENS_PER_RANK must be >= the per-rank pplx dispatch tokens"
    elif backend == "mori":
        cap = tokens if tokens is not None else 4096
        if per_dp > 0 and mode != "decode" and per_dp > cap:
            return "SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK must be >= the per-rank MoRI dispatch tokens"
    elif backend == "flashinfer":
        if not (attn_dp > 1 and attn_dp == tp):
            return "Flashinfer MoE A2A requires --attn-dp-size equal to --tp-size"
        if mode != "decode" and per_dp <= 0:
            return "FlashInfer MoE A2A requires chunked prefill"
        cap = tokens if tokens is not None else max(per_dp, 4096)
        need = max(per_dp if mode != "decode" else 0, decode_max_bs if (decode_on and mode != "prefill") else 0)
        if need > cap:
            return "FlashInfer MoE A2A per-rank token budget exceeds its workspace"
    elif backend == "deepep_v2":
        cap = tokens if tokens is not None else 128
        scatter = max(1, tp // attn_dp)
        if mode != "decode" and -(-max(per_dp, 0) // scatter) > cap:
            return "DeepEP v2 per-rank prefill budget exceeds SGLANG_DEEPEP_V2_NUM_MAX_DISPATCH_TOKENS_PER_RANK"
        if decode_on and mode != "prefill" and decode_max_bs > cap:
            return "DeepEP v2 per-rank decode CUDA graph exceeds SGLANG_DEEPEP_V2_NUM_MAX_DISPATCH_TOKENS_PER_RANK"
    elif backend == "megamoe":
        if capability is None or capability[0] not in (9, 10):
            return "--moe-a2a-backend megamoe needs a CUDA SM90 GPU or an SM100-class GPU"
        if arch in _MEGA_MOE_NO_FALLBACK:
            cap = tokens if tokens is not None else 8192
            if mode != "prefill" and decode_on and decode_max_bs > cap:
                return "MegaMoE requires SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK to cover the decode"
            if mode != "decode":
                if per_dp <= 0:
                    return "MegaMoE requires chunked prefill to be enabled"
                align = max(tp // attn_dp, 1)
                if -(-per_dp // align) * align > cap:
                    return "MegaMoE requires SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK to cover the prefill"
    elif backend == "flashinfer_megamoe":
        return "FlashInfer MegaMOE currently supports only MXFP8, ModelOpt NVFP4, FP4-expert, hybrid NVFP4 checkpoints"
    return ""


# ------------------------------------------------------------------------------------------------------
# The space
# ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Space:
    """What the audit sweeps. Backends pair with MoE models only; dense models run backend none."""

    models: tuple[str, ...]
    gpus: tuple[str, ...]
    modes: tuple[str, ...] = MODES
    backends: tuple[str, ...] = a2a.A2A_BACKENDS
    tps: tuple[int, ...] = TPS
    graphs: tuple[tuple[str, str | None, str | None, bool], ...] = GRAPHS
    post_capture: tuple[bool, ...] = (False, True)

    def par(self) -> list[tuple[int, int]]:
        return [(tp, dp) for tp in self.tps for dp in sorted({1, tp})]


def bundled_models() -> list[str]:
    """The bundled model directories (the tiny config-only CPU models excluded: they are not real shapes; draft
    heads too: they are served beside a target, never alone)."""
    from profiler.model.modelcfg import is_draft_model

    return sorted(
        p.name for p in BUNDLED_MODELS.iterdir()
        if (p / "config.json").is_file() and not p.name.startswith("tiny-") and not is_draft_model(p)
    )  # fmt: skip


def make_space(
    models: Sequence[str] | None = None,
    gpus: Sequence[str] | None = None,
    modes: Sequence[str] | None = None,
    backends: Sequence[str] | None = None,
) -> Space:
    """The space, with every name checked (one-line errors naming what exists)."""
    have_models = bundled_models()
    have_gpus = [g.name for g in known_gpus()]
    for kind, got, have in (
        ("model", models, have_models),
        ("GPU", gpus, have_gpus),
        ("mode", modes, list(MODES)),
        ("backend", backends, list(a2a.A2A_BACKENDS)),
    ):
        bad = [x for x in (got or ()) if x not in have]
        if bad:
            raise MemfracError(f"audit: unknown {kind} {bad[0]!r}; known: {', '.join(have)}")
    return Space(
        tuple(models or have_models),
        tuple(gpus or have_gpus),
        tuple(modes or MODES),
        tuple(backends or a2a.A2A_BACKENDS),
    )


@dataclass(frozen=True)
class _Variant:
    backend: str
    tokens: int | None
    deepep_mode: str
    ep_is_tp: bool


def variants(space: Space, moe: bool) -> list[_Variant]:
    """(backend, capacity, mode, ep) combinations: ep 1 or tp for backend none, ep = tp for every backend."""
    out: list[_Variant] = []
    for b in space.backends:
        if b == "none":
            out.append(_Variant("none", None, "auto", False))
            if moe:
                out.append(_Variant("none", None, "auto", True))
            continue
        if not moe:
            continue
        for t in TOKENS.get(b, (None,)):
            for m in DEEPEP_MODES_FOR.get(b, ("auto",)):
                out.append(_Variant(b, t, m, True))
    return out


# ------------------------------------------------------------------------------------------------------
# Calibrated constants
# ------------------------------------------------------------------------------------------------------


def read_calibration(path: str | Path) -> tuple[str | None, dict[str, Fit]]:
    """calibration.json as `memfrac calibrate --out` writes it, through the one codec: (the rules its evidence
    was sized with, its shapes by fit key). An absent term keeps today's constant."""
    doc = load_calibration(path)
    return (doc.get("rules") if isinstance(doc.get("rules"), str) else None), fits(doc, path)


# ------------------------------------------------------------------------------------------------------
# Evaluation
# ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Model:
    name: str
    shape: ModelShape
    klass: tuple[Any, ...]  # what the heuristic reads of the model
    topk: int


@cache
def _model(name: str) -> _Model:
    path = str(BUNDLED_MODELS / name)
    sh = load_model_shape(path)
    vit = vision_shape(path) if sh.is_multimodal else (None, None)
    klass = (sh.architecture, sh.is_mla, sh.is_multimodal, vit, "llama-2" in path.lower())
    return _Model(name, sh, klass, a2a.model_topk(path))


_KEY_FIELDS = ("fraction", "reserved_mib", "chunk", "decode_max_bs", "decode_on", "prefill_on", "post_capture",
               "floor_mib", "a2a_reserve_mib", "act_tokens", "prefill_buckets", *TERM_NAMES)  # fmt: skip


@cache
def _heuristic(rules: RuleSet, klass: tuple, backend: str, gpu_mib: int, mode: str, tp: int, attn_dp: int,
               graph: int, post: bool) -> tuple[float, ...]:  # fmt: skip
    arch, is_mla, is_mm, vit, llama2 = klass
    _, dec, pre, off = GRAPHS[graph]
    inp = HeuristicInputs(
        gpu_mem_mib=gpu_mib, mode=mode, tp=tp, attn_dp=attn_dp, is_mla=is_mla, is_multimodal=is_mm,
        vit_layers=vit[0], vit_hidden=vit[1], model_path="llama-2" if llama2 else "", architecture=arch,
        disable_cuda_graph=off, decode_backend=dec, prefill_backend=pre, moe_a2a_backend=backend,
        post_capture_env=post,
    )  # fmt: skip
    res, mib, on, _, _, total, frac, _ = evaluate(inp, rules)
    a2a_res = (mib[TI["deepep_a2a"]] if on[TI["deepep_a2a"]] else 0.0) + (
        mib[TI["prefill_bcg_deepep"]] if on[TI["prefill_bcg_deepep"]] else 0.0
    )
    act = mib[TI["activation"]] / ACTIVATION_MIB_PER_TOKEN if on[TI["activation"]] else 0.0
    buckets = len(res.prefill_bs) if on[TI["prefill_graph"]] and not is_mla else 0
    return (
        frac, total, res.chunked_prefill_size, res.decode_max_bs, float(res.decode_backend != "disabled"),
        float(res.prefill_backend != "disabled"), float(res.post_capture_sizing),
        mib[TI["floor_topup"]] if on[TI["floor_topup"]] else 0.0, a2a_res, act, buckets,
        *(m if o else 0.0 for m, o in zip(mib, on, strict=True)),
    )  # fmt: skip


@cache
def _weights_kv(name: str, tp: int, attn_dp: int) -> tuple[float, int]:
    sh = _model(name).shape
    return sh.weight_bytes_per_gpu(tp, 1, attn_dp) / MIB, sh.kv_bytes_per_token(tp, 1, attn_dp)


@cache
def _a2a_size(name: str, backend: str, tokens: int | None, deepep_mode: str, tp: int, attn_dp: int,
              chunk: int) -> tuple[float, float, str]:  # fmt: skip
    """(device MiB or NaN, analytic MiB or NaN, fails) of one backend's buffer for this model/parallelism."""
    if backend == "none":
        return 0.0, 0.0, ""
    m = _model(name)
    b = a2a.BACKENDS[backend]
    t = tokens if tokens is not None else a2a.default_tokens(b, chunk // attn_dp if chunk > 0 else 0)
    inp = a2a.A2AInputs(
        backend, m.shape.hidden_size, m.shape.num_experts, m.topk, tp, t or 0, deepep_mode=deepep_mode,
        attn_dp=attn_dp, nnodes=max(1, -(-tp // 8)),
    )  # fmt: skip
    s = a2a.size_for(inp)
    dev = math.nan if s.device_bytes is None else s.device_bytes / MIB
    ana = math.nan if s.analytic_bytes is None else s.analytic_bytes / MIB
    return dev, ana, s.fails


def evaluate_space(
    space: Space,
    rules: RuleSet,
    calibration: Mapping[str, Fit] | None = None,
    tick: Callable[[int, str], None] | None = None,
) -> pd.DataFrame:
    """One row per configuration (see the module docstring for the columns' meaning)."""
    gpus = [g for g in known_gpus() if g.name in space.gpus]
    par = space.par()
    cats = _Cats(space, gpus)
    parts: list[dict[str, np.ndarray]] = []
    for name in space.models:
        m = _model(name)
        vs = variants(space, m.shape.is_moe)
        if not vs:
            continue
        parts.append(_model_rows(m, vs, gpus, space, par, rules, cats))
        if tick is not None:
            tick(len(parts[-1]["fraction"]), name)
    if not parts:
        raise MemfracError("audit: the space is empty (dense models take backend none only)")
    cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    df = pd.DataFrame({k: cats.wrap(k, v) for k, v in cols.items()}, copy=False)
    _derive(df, calibration)
    return df


class _Cats:
    """Global categories, so each model's rows carry codes and the frame is built once."""

    def __init__(self, space: Space, gpus: list) -> None:
        self.lists: dict[str, list[Any]] = {
            "model": list(space.models), "gpu": [g.name for g in gpus], "mode": list(space.modes),
            "graphs": [g[0] for g in space.graphs], "backend": list(a2a.A2A_BACKENDS),
            "deepep_mode": ["auto", "low_latency", "normal"], "a2a_fails": [""], "sglang_refusal": [""],
        }  # fmt: skip
        self.index = {k: {v: i for i, v in enumerate(vals)} for k, vals in self.lists.items()}

    def codes(self, col: str, values: Sequence[Any]) -> np.ndarray:
        idx = self.index[col]
        for v in values:
            if v not in idx:
                idx[v] = len(self.lists[col])
                self.lists[col].append(v)
        return np.asarray([idx[v] for v in values], dtype=np.int32)

    def wrap(self, col: str, v: np.ndarray) -> Any:
        if col in self.lists:
            return pd.Categorical.from_codes(v, categories=self.lists[col])
        return v


def _model_rows(
    m: _Model, vs: list[_Variant], gpus: list, space: Space, par: list, rules: RuleSet, cats: _Cats
) -> dict[str, np.ndarray]:
    ng, nr, np_, nv, ns, nc = len(gpus), len(space.modes), len(par), len(vs), len(space.graphs), len(space.post_capture)
    # one scalar-model evaluation per distinct heuristic input; the variant enters only through its backend
    backends = sorted({v.backend for v in vs})
    graph_ids = [GRAPHS.index(g) for g in space.graphs]
    keys: dict[tuple, int] = {}
    table: list[tuple[float, ...]] = []
    flat: list[int] = []
    for g in gpus:
        for mode in space.modes:
            for tp, dp in par:
                for b in backends:
                    for graph in graph_ids:
                        for post in space.post_capture:
                            k = (g.total_mib, mode, tp, dp, b, graph, post)
                            i = keys.get(k)
                            if i is None:
                                i = keys[k] = len(table)
                                table.append(_heuristic(rules, m.klass, b, g.total_mib, mode, tp, dp, graph, post))
                            flat.append(i)
    kid = np.asarray(flat, dtype=np.int32).reshape(ng, nr, np_, len(backends), ns, nc)
    tab = np.asarray(table, dtype=np.float64)
    vb = np.array([backends.index(v.backend) for v in vs])
    gi, ri, pi, vi, si, ci = np.indices((ng, nr, np_, nv, ns, nc), dtype=np.int32).reshape(6, -1)
    row_key = kid[gi, ri, pi, vb[vi], si, ci]
    n = row_key.size
    cols: dict[str, np.ndarray] = {f: tab[row_key, j] for j, f in enumerate(_KEY_FIELDS)}
    tp_arr = np.array([p[0] for p in par])[pi]
    cols.update(
        model=np.full(n, cats.codes("model", [m.name])[0], dtype=np.int32),
        gpu=cats.codes("gpu", [g.name for g in gpus])[gi],
        gpu_mib=np.array([g.total_mib for g in gpus], dtype=np.float64)[gi],
        mode=cats.codes("mode", space.modes)[ri], tp=tp_arr, attn_dp=np.array([p[1] for p in par])[pi],
        graphs=cats.codes("graphs", [g[0] for g in space.graphs])[si],
        post_capture_env=np.array(space.post_capture)[ci],
        backend=cats.codes("backend", [v.backend for v in vs])[vi],
        tokens=np.array([np.nan if v.tokens is None else v.tokens for v in vs])[vi],
        deepep_mode=cats.codes("deepep_mode", [v.deepep_mode for v in vs])[vi],
        ep=np.where(np.array([v.ep_is_tp for v in vs])[vi], tp_arr, 1),
        hidden=np.full(n, m.shape.hidden_size), experts=np.full(n, m.shape.num_experts),
        is_mla=np.full(n, m.shape.is_mla),
    )  # fmt: skip
    wk = np.array([_weights_kv(m.name, tp, dp) for tp, dp in par])
    cols["weights_mib"], cols["kv_bytes_per_token"] = wk[pi, 0], wk[pi, 1]
    # buffers per distinct (variant, parallelism, chunk); sglang's refusals per distinct input they read
    chunk = cols["chunk"].astype(np.int64)
    cu, chunk_i = np.unique(chunk, return_inverse=True)
    code = vi.astype(np.int64) + nv * (pi + np_ * chunk_i.astype(np.int64))
    uq, inv = np.unique(code, return_inverse=True)
    sizes = [
        _a2a_size(m.name, vs[c % nv].backend, vs[c % nv].tokens, vs[c % nv].deepep_mode, *par[(c // nv) % np_],
                  int(cu[c // nv // np_]))
        for c in uq.tolist()
    ]  # fmt: skip
    cols["a2a_device_mib"] = np.asarray([z[0] for z in sizes])[inv]
    cols["a2a_analytic_mib"] = np.asarray([z[1] for z in sizes])[inv]
    cols["a2a_fails"] = cats.codes("a2a_fails", [z[2] for z in sizes])[inv]
    caps = [GPU_CAPABILITY.get(g.name, (0, 0)) for g in gpus]
    cap_u = sorted(set(caps))
    cap_i = np.array([cap_u.index(c) for c in caps])[gi]
    dmbs = cols["decode_max_bs"].astype(np.int64)
    du, dmbs_i = np.unique(dmbs, return_inverse=True)
    don = cols["decode_on"].astype(np.int64)
    rcode = inv.astype(np.int64) + uq.size * (
        ri.astype(np.int64) + nr * (cap_i + len(cap_u) * (don + 2 * dmbs_i.astype(np.int64)))
    )
    ru, rinv = np.unique(rcode, return_inverse=True)
    refs = []
    for c in ru.tolist():
        u = uq[c % uq.size]
        v, p_i, ch = vs[u % nv], (u // nv) % np_, int(cu[u // nv // np_])
        rest = c // uq.size
        r_i, rest = rest % nr, rest // nr
        cp, rest = rest % len(cap_u), rest // len(cap_u)
        d_on, d_i = rest % 2, rest // 2
        tp, dp = par[p_i]
        cap = cap_u[cp] if cap_u[cp] != (0, 0) else None
        mode = space.modes[r_i]
        refs.append(
            sglang_refusal(v.backend, m.shape.architecture, cap, mode, tp, dp, v.tokens, v.deepep_mode, ch,
                           bool(d_on), int(du[d_i]))
        )  # fmt: skip
    cols["sglang_refusal"] = cats.codes("sglang_refusal", refs)[rinv]
    return cols


def _derive(df: pd.DataFrame, calibration: Mapping[str, Fit] | None) -> None:
    """Per-row arithmetic: KV budget, findings, and the calibrated reserve (numpy over every row)."""
    df["accepted"] = (df["sglang_refusal"] == "").to_numpy()
    df["kv_budget_mib"] = df["gpu_mib"] * df["fraction"] - df["weights_mib"]  # free at start = capacity (estimate)
    bpt = df["kv_bytes_per_token"].where(df["kv_bytes_per_token"] > 0)
    df["kv_tokens"] = np.floor(df["kv_budget_mib"].clip(lower=0) * MIB / bpt).fillna(0).astype(np.int64)
    df["floor_kv_tokens_given_up"] = np.floor(df["floor_mib"] * MIB / bpt).fillna(0).astype(np.int64)
    dev = df["a2a_device_mib"]
    df["a2a_excess_mib"] = dev - df["a2a_reserve_mib"]
    fails = df["a2a_fails"] != ""
    has = df["backend"] != "none"
    df["a2a_verdict"] = np.select(
        [~has, fails, dev.isna(), dev > df["reserved_mib"], dev > df["a2a_reserve_mib"]],
        ["none", "fails", "unknown", "oom", "over_reserve"],
        default="fits",
    )
    df["a2a_verdict"] = df["a2a_verdict"].astype("category")
    if calibration:
        df["calibrated_reserved_mib"] = calibrated_reserve(df, calibration)
        df["calibrated_excess_mib"] = df["calibrated_reserved_mib"] - df["reserved_mib"]


def calibrated_reserve(df: pd.DataFrame, c: Mapping[str, Fit]) -> pd.Series:
    """Today's reserve with each calibrated shape put in its term, vectorised through the one calibrated sum
    (`profiler.calibrate.shapes.calibrated_sum`): max(pre-floor terms, floor) above 60 GiB, then the post-floor
    terms. Post-capture rows (activation off) keep today's reserve."""
    terms = {n: df[n].to_numpy(dtype=float) for n in TERM_NAMES if n in df.columns}
    _, new, _ = calibrated_sum(
        terms, c, floor_on=floor_applies(df["gpu_mib"].to_numpy()), is_mla=df["is_mla"].to_numpy(dtype=bool),
        hidden=df["hidden"].to_numpy(dtype=float), tp=df["tp"].to_numpy(dtype=float),
        analytic=df["a2a_analytic_mib"].to_numpy(dtype=float),
    )  # fmt: skip
    out = pd.Series(np.asarray(new, dtype=float), index=df.index)
    return out.where(~(df["post_capture"] > 0), df["reserved_mib"])


# ------------------------------------------------------------------------------------------------------
# Findings
# ------------------------------------------------------------------------------------------------------


def findings(df: pd.DataFrame) -> pd.DataFrame:
    """Findings by kind: kind, scope, configurations, share (of the feasible configurations in that scope: the
    role or the backend; of all accepted for weights_exceed_gpu, of all for sglang_refuses), detail.

    Feasible: sglang accepts it and the weights alone fit on the GPU (weights_exceed_gpu counts the rest
    once: no fraction could run them, so they say nothing about the heuristic)."""
    acc = df[df["accepted"]]
    too_big = acc["weights_mib"] >= acc["gpu_mib"]
    ok = acc[~too_big]
    total = len(ok)
    rows: list[dict[str, Any]] = []

    def add(kind: str, scope: str, sel: pd.DataFrame, detail: str, of: int | None = None) -> None:
        if len(sel):
            rows.append({"kind": kind, "scope": scope, "configurations": len(sel),
                         "share": len(sel) / max(1, total if of is None else of), "detail": detail})  # fmt: skip

    nonpos = ok[ok["fraction"] <= 0]
    add("fraction_nonpositive", "all", nonpos, f"lowest {nonpos['fraction'].min():.3f}" if len(nonpos) else "")
    nofit = ok[(ok["fraction"] > 0) & (ok["kv_budget_mib"] <= 0)]
    worst = -nofit["kv_budget_mib"].min() / 1024 if len(nofit) else 0.0
    add("weights_do_not_fit", "all", nofit, f"worst: weights exceed fraction × capacity by {worst:.1f} GiB")
    fl = ok[ok["floor_mib"] > 0]
    per_mode = ok["mode"].value_counts()
    per_backend = ok["backend"].value_counts()
    for mode, g in fl.groupby("mode", observed=True):
        add("floor_decides", f"{mode} nodes", g,
            f"KV given up: median {g['floor_mib'].median() / 1024:.2f} GiB, max {g['floor_mib'].max() / 1024:.2f} GiB "
            f"(median {int(g['floor_kv_tokens_given_up'].median()):,} tokens)", int(per_mode[mode]))  # fmt: skip
    for verdict, kind in (("oom", "a2a_oom"), ("over_reserve", "a2a_over_reserve"), ("fails", "a2a_fails"),
                          ("unknown", "a2a_size_unknown")):  # fmt: skip
        sel = ok[ok["a2a_verdict"] == verdict]
        for b, g in sel.groupby("backend", observed=True):
            if verdict in ("oom", "over_reserve"):
                d = (f"buffer − reserve: median {g['a2a_excess_mib'].median() / 1024:.2f} GiB, max "
                     f"{g['a2a_excess_mib'].max() / 1024:.2f} GiB")  # fmt: skip
            elif verdict == "fails":
                d = str(g["a2a_fails"].iloc[0])[:90]
            else:
                d = a2a.BACKENDS[str(b)].unsized_reason.split(":")[0][:90]
            add(kind, str(b), g, d, int(per_backend[b]))
    if "calibrated_excess_mib" in ok:
        sel = ok[ok["calibrated_excess_mib"] > 0]
        for mode, g in sel.groupby("mode", observed=True):
            add("under_reserved_calibrated", f"{mode} nodes", g,
                f"calibrated − today: median {g['calibrated_excess_mib'].median():,.0f} MiB, "
                f"max {g['calibrated_excess_mib'].max():,.0f} MiB", int(per_mode[mode]))  # fmt: skip
    big = acc[too_big]
    add("weights_exceed_gpu", "all", big, "the weights alone exceed the GPU (share of all accepted)", len(acc))
    ref = df[~df["accepted"]]
    for b, g in ref.groupby("backend", observed=True):
        add("sglang_refuses", str(b), g, str(g["sglang_refusal"].value_counts().index[0])[:90], len(df))
    out = pd.DataFrame(rows, columns=["kind", "scope", "configurations", "share", "detail"])
    return out


# ------------------------------------------------------------------------------------------------------
# Heat maps
# ------------------------------------------------------------------------------------------------------


def heatmaps(df: pd.DataFrame, out: Path) -> list[Path]:
    """model × GPU per role (share of accepted configurations with a finding) and dispatch tokens × experts
    per sized backend (largest buffer − reserve, GiB)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: list[Path] = []
    ok = df[df["accepted"] & (df["weights_mib"] < df["gpu_mib"])]
    finding = (
        (ok["fraction"] <= 0)
        | (ok["kv_budget_mib"] <= 0)
        | (ok["floor_mib"] > 0)
        | ok["a2a_verdict"].isin(["oom", "over_reserve", "fails"])
    )
    if "calibrated_excess_mib" in ok:
        finding |= ok["calibrated_excess_mib"] > 0
    ok = ok.assign(finding=finding)
    gpu_order = [g.name for g in known_gpus() if g.name in set(ok["gpu"].astype(str))]
    for mode, g in ok.groupby("mode", observed=True):
        piv = g.pivot_table(index="model", columns="gpu", values="finding", aggfunc="mean", observed=False) * 100
        piv = piv.reindex(columns=[c for c in gpu_order if c in piv.columns])
        paths.append(_heat(plt, piv, f"{mode} nodes: % of configurations with a finding", "%",
                           out / f"heatmap-model-gpu-{mode}.png", "{:.0f}"))  # fmt: skip
    sized = ok[ok["a2a_verdict"].isin(["oom", "over_reserve", "fits"])]
    for b, g in sized.groupby("backend", observed=True):
        if str(b) == "none" or g["tokens"].isna().all():
            continue
        piv = g.pivot_table(index="tokens", columns="experts", values="a2a_excess_mib", aggfunc="max", observed=True)
        piv = piv / 1024
        piv.index = [int(i) for i in piv.index]
        name = out / f"heatmap-tokens-experts-{b}.png"
        title = f"{b}: largest buffer − reserve (GiB)"
        paths.append(_heat(plt, piv, title, "GiB", name, "{:.2f}", "dispatch tokens / rank", "experts"))
    return paths


def _heat(plt: Any, piv: pd.DataFrame, title: str, unit: str, path: Path, fmt: str, ylabel: str = "",
          xlabel: str = "") -> Path:  # fmt: skip
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * piv.shape[1] + 3), max(3, 0.45 * piv.shape[0] + 3 / 2)))
    im = ax.imshow(piv.to_numpy(dtype=float), aspect="auto", cmap="magma_r")
    ax.set_xticks(range(piv.shape[1]), [str(c) for c in piv.columns], rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(piv.shape[0]), [str(i) for i in piv.index], fontsize=8)
    for (y, x), v in np.ndenumerate(piv.to_numpy(dtype=float)):
        if not np.isnan(v):
            ax.text(x, y, fmt.format(v), ha="center", va="center", fontsize=6, color="tab:cyan")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.colorbar(im, ax=ax, label=unit)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------------
# The command
# ------------------------------------------------------------------------------------------------------


@dataclass
class AuditResult:
    rows: pd.DataFrame
    findings: pd.DataFrame
    seconds: float
    plots: list[Path] = field(default_factory=list)


def run(
    space: Space, rules: RuleSet, calibration: Mapping[str, Fit] | None = None, show_progress: bool = True
) -> AuditResult:
    from profiler.core.ui import progress

    t0 = time.perf_counter()
    total = sum(
        len(space.gpus) * len(space.modes) * len(space.par()) * len(variants(space, _model(m).shape.is_moe))
        * len(space.graphs) * len(space.post_capture)
        for m in space.models
    )  # fmt: skip
    if show_progress:
        with progress(total, "configurations") as bar:
            df = evaluate_space(space, rules, calibration, lambda n, name: bar.advance(n, note=name))
    else:
        df = evaluate_space(space, rules, calibration)
    return AuditResult(df, findings(df), time.perf_counter() - t0)


def timing(evaluated_s: float, wall_s: float) -> str:
    """Both clocks: the evaluation alone read as the command's time (8.0 s printed for a 16–28 s command)."""
    return f"evaluated in {evaluated_s:.1f} s, {wall_s:.1f} s wall (with the rows written and the heat maps drawn)"


def calibrated_summary(rows: pd.DataFrame, rules: str) -> str:
    """Per node type over the feasible configurations: how the calibrated shapes move the fraction and the KV
    pool against today's (free at start = capacity: an estimate)."""
    from profiler.core.ui import table

    ok = rows[rows["accepted"] & (rows["weights_mib"] < rows["gpu_mib"]) & (rows["fraction"] > 0)]
    ok = ok.assign(cal_fraction=np.round((ok["gpu_mib"] - ok["calibrated_reserved_mib"]) / ok["gpu_mib"], 3))
    ok = ok.assign(dkv=(ok["cal_fraction"] - ok["fraction"]) * ok["gpu_mib"])
    bpt = ok["kv_bytes_per_token"].where(ok["kv_bytes_per_token"] > 0)
    ok = ok.assign(dtok=(ok["dkv"] * MIB / bpt).fillna(0))
    out = []
    for mode, g in ok.groupby("mode", observed=True):
        out.append([str(mode), f"{len(g):,}", f"{g['fraction'].median():.3f}", f"{g['cal_fraction'].median():.3f}",
                    f"{int((g['cal_fraction'] < g['fraction']).sum()):,}", f"{g['dkv'].median():+,.0f}",
                    f"{int(g['dtok'].median()):+,}"])  # fmt: skip
    head = ["node type", "configurations", "fraction today (median)", "calibrated (median)", "fraction lowered",
            "KV MiB Δ (median)", "KV tokens Δ (median)"]  # fmt: skip
    title = f"calibrated constants vs today's (sglang {rules} rules)"
    return table(head, out, right=[False, *([True] * 6)], title=title,
                 caption="feasible configurations; KV Δ = (calibrated − today's fraction) × capacity")  # fmt: skip


def run_audit(
    models: Iterable[str] | None,
    gpus: Iterable[str] | None,
    modes: Iterable[str] | None,
    backends: Iterable[str] | None,
    calibration: str | None,
    out: str,
    rules: str = DEFAULT_RELEASE,
) -> int:
    """`memfrac audit`: evaluate, print the findings, write audit.parquet, findings.parquet and the heat maps."""
    started = time.perf_counter()  # the wall time printed covers reading, evaluating, writing and plotting
    from profiler.core.ui import table

    space = make_space(
        list(models) if models else None, list(gpus) if gpus else None, list(modes) if modes else None,
        list(backends) if backends else None,
    )  # fmt: skip
    cal = None
    rs = rules_for(rules)
    said = None
    if calibration:
        doc = load_calibration(calibration)
        cal = fits(doc, calibration)
        said = sized_by_note(doc, rs.name)
    res = run(space, rs, cal)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    res.rows.to_parquet(out_dir / "audit.parquet", index=False)
    res.findings.to_parquet(out_dir / "findings.parquet", index=False)
    res.plots = heatmaps(res.rows, out_dir)
    n, acc = len(res.rows), int(res.rows["accepted"].sum())
    rows = [[f.kind, f.scope, f"{f.configurations:,}", f"{100 * f.share:.1f}%", f.detail]
            for f in res.findings.itertuples(index=False)]  # fmt: skip
    print(
        table(
            ["finding", "scope", "configurations", "share", "detail"], rows,
            title=f"memfrac audit: {n:,} configurations (sglang {rs.name} rules), {acc:,} accepted by sglang",
            caption=f"{timing(res.seconds, time.perf_counter() - started)}; free at start assumed = capacity; "
                    f"rows and plots in {out_dir}",
            right=[False, False, True, True, False],
        )
    )  # fmt: skip
    if cal is not None:
        print(calibrated_summary(res.rows, rs.name))
        if said:
            print(said)
    print(f"wrote {out_dir / 'audit.parquet'}, {out_dir / 'findings.parquet'} and {len(res.plots)} heat maps")
    return 0
