"""`memfrac explain`: the heuristic's terms for a scenario, and what they leave for the KV cache.

The fraction shown (`mem_fraction_static`, and the KV budget under it) is the one the worker will run with
(profiler.engine.fraction): sglang's own resolved value where its resolver ran, the model's beside it.

The KV arithmetic follows sglang's runtime rule: the pool gets `free_at_start × mfs − weights`, where
free_at_start is the free memory after NCCL init (capacity minus CUDA context and communicator buffers).
Without a measurement memfrac assumes free_at_start = capacity and says so; `--free-at-start` overrides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from profiler.core import ui
from profiler.engine.fraction import ScenarioFraction, scenario_fraction
from profiler.model.a2a_inputs import A2AReport, report_for
from profiler.model.heuristic import RuleSet, inputs_from_scenario, reserve
from profiler.model.heuristic.model import NOT_IN_RULE
from profiler.model.heuristic.record import Reservation
from profiler.model.kv_budget import KvBudget, kv_budget
from profiler.model.modelcfg import dtype_bytes
from profiler.model.postcapture import Answers, answers
from profiler.model.postcapture import render as render_post_capture
from profiler.model.scenario import Scenario

if TYPE_CHECKING:
    from profiler.engine.validation import Validation


@dataclass(frozen=True, slots=True)
class Explanation:
    scenario: Scenario
    reservation: Reservation
    kv: KvBudget
    a2a: A2AReport | None = None  # the all-to-all buffer beside its reserve (None: no backend)
    post_capture: Answers | None = None  # both answers: with and without post-capture KV sizing
    fraction: ScenarioFraction | None = None  # the fraction the worker runs with (None: the model's, unwrapped)

    @property
    def sglang_release(self) -> str | None:
        """The release whose resolver validated the scenario."""
        return self.fraction.release if self.fraction is not None else None

    @property
    def sglang_fraction(self) -> float | None:
        """What that resolver resolved."""
        return self.fraction.sglang if self.fraction is not None else None

    def as_dict(self) -> dict[str, Any]:
        d = self.reservation.as_dict()
        out = {
            "scenario": self.scenario.name,
            "gpu": self.scenario.gpu.name,
            "mode": self.scenario.mode,
            **d,
            **(self.fraction.as_dict() if self.fraction is not None else {}),
            "kv": self.kv.as_dict(),
        }
        if self.sglang_release is not None:
            out["sglang"] = {"release": self.sglang_release, "mem_fraction_static": self.sglang_fraction}
        if self.a2a is not None:
            out["a2a"] = {**self.a2a.size.as_dict(), "reserve_mib": self.a2a.reserve_mib, "verdict": self.a2a.verdict}
        if self.post_capture is not None:
            out["post_capture"] = self.post_capture.as_dict()
        return out


def explain(
    s: Scenario, rules: RuleSet, free_at_start_mib: float | None = None, validation: Validation | None = None
) -> Explanation:
    r = reserve(inputs_from_scenario(s), rules)
    f = scenario_fraction(s, r, validation)
    return Explanation(
        s, r, kv_budget(s, f.value, free_at_start_mib), report_for(s, r), answers(s, rules, free_at_start_mib), f,
    )  # fmt: skip


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
    rows = [
        ["yes" if t.on else "no", t.name, _mib(t.mib), t.reason]
        for t in r.terms
        if t.on or not t.reason.startswith(NOT_IN_RULE)  # a term of another release family's rule: not shown
    ]
    rows.append(["", "reserved", _mib(r.reserved_mib), f"= {r.reserved_mib / 1024:.2f} GiB of {s.gpu.total_mib} MiB"])
    lines.append(ui.table(["on", "term", "MiB", "why"], rows, right=[False, False, True, False]))
    flags = ", ".join(r.flags) if r.flags else "none"
    f = e.fraction
    frac_line = f"mem_fraction_static = {r.heuristic_fraction:.3f}"
    if r.given:
        would = f"the heuristic would pick {r.heuristic_fraction:.3f}"
        frac_line = f"mem_fraction_static = {r.mem_fraction_static} (given; {would})"
    elif f is not None and f.from_sglang:
        agree = "the model agrees" if not f.differs else f"the model says {f.model:.3f}"
        frac_line = f"mem_fraction_static = {f.value:.3f} (sglang {f.release}'s own resolver; {agree})"
    elif f is not None:
        frac_line += f" ({f.source}; sglang's resolver did not run)"
    lines.append(f"{frac_line}    flags: {flags}")
    if f is not None and f.note:
        lines.append(f"  ! {f.note}")
    if "floor_applied" in r.flags:
        lines.append("  the 10 GiB floor dominates: every term above it is swallowed")
    if "fraction_nonpositive" in r.flags:
        lines.append("  the fraction is ≤ 0: sglang would leave nothing for weights and KV cache (it fails at start)")
    if s.extra_args and not (f is not None and f.note):
        extra = " ".join(s.extra_args)
        lines.append(f"  not modelled: extra flags {extra} (sglang's resolver gives the fraction above)")
    if e.a2a is not None:
        lines += _a2a_lines(e.a2a)
    lines.append("KV cache on one GPU:")
    where = "assumed equal to capacity; no measurement" if kv.free_at_start_assumed else "given"
    mfs = f.value if f is not None else r.mem_fraction_static
    lines.append(f"  free at start {_mib(kv.free_at_start_mib)} MiB ({where}) × {mfs:.3f}")
    lines.append(
        f"  − weights ≈ {kv.weights_mib / 1024:.2f} GiB ({sh.param_count() / 1e9:.2f} B params, "
        f"{sh.quantization or sh.dtype}, sharded tp {s.tp}; estimate from config shapes)"
    )
    lines.append(f"  = KV budget {kv.budget_mib / 1024:.2f} GiB; {kv.kv_bytes_per_token:,} B/token ({_kv_line(s)})")
    lines.append(
        f"  ≈ {kv.tokens:,} tokens" if kv.budget_mib > 0 else "  ≈ 0 tokens: the weights do not fit under this fraction"
    )
    if e.post_capture is not None and not r.given:
        lines += render_post_capture(e.post_capture)
        if f is not None and f.differs:
            lines.append(f"  (both answers are the model's; sglang resolves {f.value:.3f} for this scenario)")
    return "\n".join(lines)


def _a2a_lines(a: A2AReport) -> list[str]:
    z = a.size
    out = [f"all-to-all buffer ({z.backend}), per GPU:"]
    if z.fails:
        out.append(f"  ! creating it fails: {z.fails}")
    if z.device_bytes is None:
        if z.note:
            out.append(f"  size unknown: {z.note}")
        out.append(f"  reserved for it: {_mib(a.reserve_mib)} MiB")
        return out
    i = a.inputs
    if i is not None:
        out.append(
            f"  {z.tokens_per_rank} dispatch tokens/rank, {i.num_ranks} rank(s), hidden {i.hidden}, "
            f"{i.num_experts} experts, top-{i.topk}, mode {i.deepep_mode}"
        )
    for name, b in z.parts:
        out.append(f"  {name.replace('_bytes', ''):<16} {b / 2**20:>10,.1f} MiB")
    out.append(f"  analytic          {z.analytic_bytes / 2**20:>10,.1f} MiB   ({z.source})")  # type: ignore[operator]
    if z.device_bytes != z.analytic_bytes:
        out.append(f"  on the device     {z.device_bytes / 2**20:>10,.1f} MiB   ({z.note.split(';')[0]})")
    reserve_why = "deepep_a2a + prefill_bcg_deepep" if a.reserve_mib else "sglang reserves nothing for this backend"
    out.append(f"  reserved for it   {a.reserve_mib:>10,.1f} MiB   ({reserve_why})")
    verdict = {
        "oom": "larger than every non-KV term together: expect an OOM at capture or at the first dispatch",
        "over_reserve": f"exceeds its reserve by {a.excess_mib or 0:,.0f} MiB (the floor or other terms must cover it)",
        "fits": "fits in its reserve",
        "fails": "the buffer cannot be created",
    }[a.verdict]
    out.append(f"  → {verdict}")
    out += [f"  note: {n}" for n in a.notes]
    return out


def compare_rules(s: Scenario, a: RuleSet, b: RuleSet) -> tuple[Reservation, Reservation]:
    inp = inputs_from_scenario(s)
    return reserve(inp, a), reserve(inp, b)


def render_compare(s: Scenario, ra: Reservation, rb: Reservation) -> str:
    a, b = ra.rule_set.name, rb.rule_set.name
    out = [f"{s.name}: {s.model} on {s.gpu.name} ({s.gpu.total_mib} MiB), mode {s.mode}, tp {s.tp}"]
    rows: list[list[str]] = []
    for ta, tb in zip(ra.terms, rb.terms, strict=True):
        if not (ta.on or tb.on) and ta.reason.startswith(NOT_IN_RULE) and tb.reason.startswith(NOT_IN_RULE):
            continue
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
    OOM it avoids (`memfrac explain --calibration`; `cr` is a profiler.calibrate.reserve.CalibratedReserve)."""
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
