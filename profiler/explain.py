"""`memfrac explain`: the heuristic's terms for a scenario, and what they leave for the KV cache.

The KV arithmetic follows sglang's runtime rule: the pool gets `free_at_start × mfs − weights`, where
free_at_start is the free memory after NCCL init (capacity minus CUDA context and communicator buffers).
Without a measurement memfrac assumes free_at_start = capacity and says so; `--free-at-start` overrides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profiler.heuristic import RuleSet, inputs_from_scenario, reserve
from profiler.heuristic.model import NOT_IN_RULE
from profiler.heuristic.record import TERM_NAMES, Reservation
from profiler.modelcfg import dtype_bytes
from profiler.scenario import Scenario


@dataclass(frozen=True, slots=True)
class KvBudget:
    """What the fraction leaves for the KV pool on one GPU (estimates are labelled as such)."""

    free_at_start_mib: float
    free_at_start_assumed: bool
    weights_mib: float  # estimate from the config's shapes
    kv_bytes_per_token: int
    budget_mib: float
    tokens: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "free_at_start_mib": self.free_at_start_mib,
            "free_at_start_assumed": self.free_at_start_assumed,
            "weights_mib_estimate": round(self.weights_mib, 1),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_budget_mib": round(self.budget_mib, 1),
            "kv_tokens": self.tokens,
        }


def kv_budget(s: Scenario, mfs: float, free_at_start_mib: float | None = None) -> KvBudget:
    shape = s.shape
    assumed = free_at_start_mib is None
    free = float(s.gpu.total_mib if free_at_start_mib is None else free_at_start_mib)
    weights = shape.weight_bytes_per_gpu(s.tp, s.pp, s.attn_dp) / 2**20
    per_tok = shape.kv_bytes_per_token(s.tp, s.pp, s.attn_dp, s.kv_cache_dtype)
    budget = free * mfs - weights
    tokens = int(budget * 2**20 // per_tok) if budget > 0 and per_tok > 0 else 0
    return KvBudget(free, assumed, weights, per_tok, budget, tokens)


@dataclass(frozen=True, slots=True)
class Explanation:
    scenario: Scenario
    reservation: Reservation
    kv: KvBudget

    def as_dict(self) -> dict[str, Any]:
        d = self.reservation.as_dict()
        return {
            "scenario": self.scenario.name,
            "gpu": self.scenario.gpu.name,
            "mode": self.scenario.mode,
            **d,
            "kv": self.kv.as_dict(),
        }


def explain(s: Scenario, rules: RuleSet, free_at_start_mib: float | None = None) -> Explanation:
    r = reserve(inputs_from_scenario(s), rules)
    return Explanation(s, r, kv_budget(s, r.mem_fraction_static, free_at_start_mib))


def _mib(x: float) -> str:
    return f"{x:,.0f}" if abs(x - round(x)) < 1e-9 else f"{x:,.1f}"


def _kv_line(s: Scenario) -> str:
    sh = s.shape
    kvd = sh.dtype if s.kv_cache_dtype == "auto" else s.kv_cache_dtype
    eb = dtype_bytes(kvd)
    if sh.is_mla:
        return f"MLA latent ({sh.kv_lora_rank} + {sh.qk_rope_head_dim} rope) × {sh.num_layers} layers × {eb:g} B"
    heads = max(1, sh.num_kv_heads // max(1, s.tp // s.attn_dp))
    return f"K+V: {heads} kv heads/GPU × {sh.head_dim} × {sh.num_layers} layers × {eb:g} B × 2"


def render_text(e: Explanation) -> str:
    s, r, kv = e.scenario, e.reservation, e.kv
    sh = s.shape
    lines = [
        f"{s.name}: {s.model} on {s.gpu.name} ({s.gpu.total_mib} MiB), mode {s.mode}, tp {s.tp}"
        + (f" pp {s.pp}" if s.pp > 1 else "") + (f" attn-dp {s.attn_dp}" if s.attn_dp > 1 else "")
        + (f" dp {s.dp}" if s.dp > 1 else "")
        + (f", moe_a2a {s.moe_a2a_backend}" if s.moe_a2a_backend != "none" else ""),
        f"rules: sglang {r.rule_set.name} (applies to {r.rule_set.releases})",
        f"  the rule: {r.rule_set.summary}",
        "resolution before the heuristic:",
    ]  # fmt: skip
    lines += [f"  - {st.detail}" for st in r.steps] or ["  - (nothing to resolve: every input was given)"]
    w = max(len(n) for n in TERM_NAMES)
    lines.append(f"  {'term':<{w}}  {'MiB':>9}  why")
    for t in r.terms:
        if not t.on and t.reason.startswith(NOT_IN_RULE):
            continue  # a term of another release family's rule
        mark = " " if t.on else "-"
        lines.append(f"{mark} {t.name:<{w}}  {_mib(t.mib):>9}  {t.reason}")
    lines.append(
        f"  {'reserved':<{w}}  {_mib(r.reserved_mib):>9}  = {r.reserved_mib / 1024:.2f} GiB of {s.gpu.total_mib} MiB"
    )
    flags = ", ".join(r.flags) if r.flags else "none"
    frac_line = f"mem_fraction_static = {r.heuristic_fraction:.3f}"
    if r.given:
        would = f"the heuristic would pick {r.heuristic_fraction:.3f}"
        frac_line = f"mem_fraction_static = {r.mem_fraction_static} (given; {would})"
    lines.append(f"{frac_line}    flags: {flags}")
    if "floor_applied" in r.flags:
        lines.append("  the 10 GiB floor dominates: every term above it is swallowed")
    if "fraction_nonpositive" in r.flags:
        lines.append("  the fraction is ≤ 0: sglang would leave nothing for weights and KV cache (it fails at start)")
    if s.extra_args:
        lines.append(
            f"  not modelled: extra flags {' '.join(s.extra_args)} "
            "(use `memfrac explain --oracle` to resolve with sglang)"
        )
    lines.append("KV cache on one GPU:")
    where = "assumed equal to capacity; no measurement" if kv.free_at_start_assumed else "given"
    lines.append(f"  free at start {_mib(kv.free_at_start_mib)} MiB ({where}) × {r.mem_fraction_static:.3f}")
    lines.append(
        f"  − weights ≈ {kv.weights_mib / 1024:.2f} GiB ({sh.param_count() / 1e9:.2f} B params, "
        f"{sh.quantization or sh.dtype}, sharded tp {s.tp}; estimate from config shapes)"
    )
    lines.append(f"  = KV budget {kv.budget_mib / 1024:.2f} GiB; {kv.kv_bytes_per_token:,} B/token ({_kv_line(s)})")
    lines.append(
        f"  ≈ {kv.tokens:,} tokens" if kv.budget_mib > 0 else "  ≈ 0 tokens: the weights do not fit under this fraction"
    )
    return "\n".join(lines)


def compare_rules(s: Scenario, a: RuleSet, b: RuleSet) -> tuple[Reservation, Reservation]:
    inp = inputs_from_scenario(s)
    return reserve(inp, a), reserve(inp, b)


def render_compare(s: Scenario, ra: Reservation, rb: Reservation) -> str:
    w = max(len(n) for n in TERM_NAMES)
    a, b = ra.rule_set.name, rb.rule_set.name
    out = [f"{s.name}: {s.model} on {s.gpu.name} ({s.gpu.total_mib} MiB), mode {s.mode}, tp {s.tp}"]
    out.append(f"  {'term':<{w}}  {a:>9}  {b:>9}  {'Δ MiB':>8}  why it differs")
    for ta, tb in zip(ra.terms, rb.terms, strict=True):
        if not (ta.on or tb.on) and ta.reason.startswith(NOT_IN_RULE) and tb.reason.startswith(NOT_IN_RULE):
            continue
        d = tb.mib - ta.mib
        note = "" if abs(d) < 1e-9 and ta.on == tb.on else f"{a}: {ta.reason} | {b}: {tb.reason}"
        out.append(f"  {ta.name:<{w}}  {_mib(ta.mib):>9}  {_mib(tb.mib):>9}  {_mib(d):>8}  {note}")
    out.append(
        f"  {'reserved':<{w}}  {_mib(ra.reserved_mib):>9}  {_mib(rb.reserved_mib):>9}  "
        f"{_mib(rb.reserved_mib - ra.reserved_mib):>8}"
    )
    out.append(
        f"  {'fraction':<{w}}  {ra.mem_fraction_static:>9.3f}  {rb.mem_fraction_static:>9.3f}  "
        f"{rb.mem_fraction_static - ra.mem_fraction_static:>+8.3f}"
    )
    kva, kvb = kv_budget(s, ra.mem_fraction_static), kv_budget(s, rb.mem_fraction_static)
    out.append(
        f"  KV tokens per GPU (free at start assumed = capacity): {kva.tokens:,} → {kvb.tokens:,} "
        f"({kvb.tokens - kva.tokens:+,})"
    )
    steps_a = {st.detail for st in ra.steps}
    steps_b = {st.detail for st in rb.steps}
    for d in sorted(steps_a - steps_b):
        out.append(f"  only {a}: {d}")
    for d in sorted(steps_b - steps_a):
        out.append(f"  only {b}: {d}")
    return "\n".join(out)
