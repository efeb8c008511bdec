"""`memfrac explain`: the heuristic's terms for a scenario, and what they leave for the KV cache.

The KV arithmetic follows sglang's runtime rule: the pool gets `free_at_start × mfs − weights`, where
free_at_start is the free memory after NCCL init (capacity minus CUDA context and communicator buffers).
Without a measurement memfrac assumes free_at_start = capacity and says so; `--free-at-start` overrides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profiler import ui
from profiler.heuristic import RuleSet, inputs_from_scenario, reserve
from profiler.heuristic.record import Reservation
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
        "resolution before the heuristic:",
    ]  # fmt: skip
    lines += [f"  - {st.detail}" for st in r.steps] or ["  - (nothing to resolve: every input was given)"]
    rows = [["yes" if t.on else "no", t.name, _mib(t.mib), t.reason] for t in r.terms]
    rows.append(["", "reserved", _mib(r.reserved_mib), f"= {r.reserved_mib / 1024:.2f} GiB of {s.gpu.total_mib} MiB"])
    lines.append(ui.table(["on", "term", "MiB", "why"], rows, right=[False, False, True, False]))
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
    a, b = ra.rule_set.name, rb.rule_set.name
    out = [f"{s.name}: {s.model} on {s.gpu.name} ({s.gpu.total_mib} MiB), mode {s.mode}, tp {s.tp}"]
    rows: list[list[str]] = []
    for ta, tb in zip(ra.terms, rb.terms, strict=True):
        d = tb.mib - ta.mib
        note = "" if abs(d) < 1e-9 and ta.on == tb.on else f"{a}: {ta.reason} | {b}: {tb.reason}"
        rows.append([ta.name, _mib(ta.mib), _mib(tb.mib), _mib(d), note])
    rows.append(["reserved", _mib(ra.reserved_mib), _mib(rb.reserved_mib), _mib(rb.reserved_mib - ra.reserved_mib), ""])
    fa, fb = ra.mem_fraction_static, rb.mem_fraction_static
    rows.append(["fraction", f"{fa:.3f}", f"{fb:.3f}", f"{fb - fa:+.3f}", ""])
    out.append(ui.table(["term", a, b, "Δ MiB", "why it differs"], rows, right=[False, True, True, True, False]))
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


def render_calibrated(e: Explanation, cr: Any, source: str = "calibration.json") -> str:
    """Today's and the calibrated reserve per term, the fraction each gives, and what the KV pool gains or the
    OOM it avoids (`memfrac explain --calibration`; `cr` is a profiler.upstream.CalibratedReserve)."""
    s = e.scenario
    rows = [[t.name, _mib(t.today_mib), _mib(t.calibrated_mib), _mib(t.calibrated_mib - t.today_mib), t.how]
            for t in cr.terms if t.today_mib or t.calibrated_mib]  # fmt: skip
    rows.append(["reserved", _mib(cr.today_mib), _mib(cr.calibrated_mib), _mib(cr.calibrated_mib - cr.today_mib), ""])
    rows.append(["fraction", f"{cr.today_fraction:.3f}", f"{cr.calibrated_fraction:.3f}",
                 f"{cr.calibrated_fraction - cr.today_fraction:+.3f}", "round((gpu − reserved) ÷ gpu, 3)"])  # fmt: skip
    head = ["term", "today MiB", "calibrated MiB", "Δ MiB", "calibrated from"]
    out = [
        f"{s.name}: today's and the calibrated reserve ({source}) on {s.gpu.name} ({s.gpu.total_mib} MiB), "
        f"mode {s.mode}",
        ui.table(head, rows, right=[False, True, True, True, False]),
    ]
    free = None if e.kv.free_at_start_assumed else e.kv.free_at_start_mib
    a, b = kv_budget(s, cr.today_fraction, free), kv_budget(s, cr.calibrated_fraction, free)
    where = "assumed = capacity" if e.kv.free_at_start_assumed else "given"
    out.append(f"KV tokens per GPU (free at start {where}): today {a.tokens:,} → calibrated {b.tokens:,} "
               f"({b.tokens - a.tokens:+,})")  # fmt: skip
    short = cr.calibrated_mib - cr.today_mib
    if short > 0:
        out.append(
            f"today's reserve is {_mib(short)} MiB short of what the measured runs need: the calibrated reserve avoids "
            f"an out-of-memory after the KV pool, at the cost of {a.tokens - b.tokens:,} KV tokens"
        )
    elif short < 0:
        gain = b.tokens - a.tokens
        out.append(f"the calibrated reserve gives {_mib(-short)} MiB back to the KV cache ({gain:+,} tokens)")
    if e.reservation.given:
        out.append(f"mem_fraction_static is given ({e.reservation.mem_fraction_static}): sglang uses it whatever the "
                   "constants; the fractions above are what the heuristic would pick")  # fmt: skip
    out += [f"note: {n}" for n in cr.notes]
    return "\n".join(out)
