"""The reserve a calibration predicts for a scenario, term by term beside today's (`memfrac explain --calibration`)."""


from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class CalibratedTerm:
    name: str
    today_mib: float
    calibrated_mib: float
    how: str  # which param, or "unchanged"


@dataclass(frozen=True, slots=True)
class CalibratedReserve:
    terms: tuple[CalibratedTerm, ...]
    today_mib: float
    calibrated_mib: float
    today_fraction: float
    calibrated_fraction: float
    notes: tuple[str, ...]


_PRE = ("constant", "activation", "parallel", "decode_graph", "dp_padding", "prefill_graph", "prefill_bcg_deepep")


def calibrated_reserve(scenario: Any, reservation: Any, cal: dict[str, Any]) -> CalibratedReserve:
    """sglang's sum with the calibrated constants: max(pre-floor terms, floor) + post-floor terms → fraction.

    Each term's x comes from today's MiB exactly as calibrate recovers it (tokens = MiB ÷ 1.5, bs = MiB ÷ 2,
    buckets = MiB ÷ 8, tp·pp = MiB ÷ 128); terms without calibrated params keep today's MiB.
    """
    p = {t: e.get("params", {}) for t, e in cal["terms"].items()}
    gpu = float(scenario.gpu.total_mib)
    notes: list[str] = []
    if cal.get("rules") and cal["rules"] != reservation.rules:
        notes.append(f"calibrated for sglang {cal['rules']} rules; explained with {reservation.rules}")
    out: list[CalibratedTerm] = []
    pre_today = pre_new = post_today = post_new = 0.0
    floor_new = float(p.get("floor_topup", {}).get("floor_mib", 10240.0))
    for t in reservation.terms:
        if t.name in ("floor_topup", "vlm_scaling"):
            continue
        today = float(t.mib) if t.on else 0.0
        new, how = today, "unchanged"
        tp = p.get(t.name, {})
        if t.on and today > 0:
            if t.name == "constant" and "constant_mib" in tp and today == 512.0:
                new, how = float(tp["constant_mib"]), "constant_mib"
            elif t.name == "activation" and "mib_per_token" in tp:
                new, how = today / 1.5 * tp["mib_per_token"], f"{today / 1.5:g} tokens × mib_per_token"
            elif t.name == "parallel" and "mib_per_tp_pp" in tp:
                new, how = today / 128.0 * tp["mib_per_tp_pp"], f"tp·pp {today / 128.0:g} × mib_per_tp_pp"
            elif t.name == "decode_graph" and "mib_per_bs" in tp:
                new, how = today / 2.0 * tp["mib_per_bs"], f"bs {today / 2.0:g} × mib_per_bs"
            elif t.name == "decode_graph" and "mib_per_bs_per_hidden" in tp:
                hidden = scenario.shape.hidden_size
                new = today / 2.0 * hidden * tp["mib_per_bs_per_hidden"]
                how = f"bs {today / 2.0:g} × hidden {hidden} × mib_per_bs_per_hidden"
            elif t.name == "prefill_graph" and scenario.shape.is_mla and "mla_mib" in tp:
                new, how = float(tp["mla_mib"]), "mla_mib"
            elif t.name == "prefill_graph" and not scenario.shape.is_mla and "mib_per_bucket" in tp:
                new, how = today / 8.0 * tp["mib_per_bucket"], f"{today / 8.0:g} buckets × mib_per_bucket"
            elif t.name == "deepep_a2a" and "analytic_factor" in tp:
                from profiler.model.a2a_inputs import deepep_sizes_mib

                analytic, _ = deepep_sizes_mib(scenario)
                if analytic is None:
                    notes.append("deepep_a2a: no analytic DeepEP size for this shape; today's 2 GiB kept")
                else:
                    new = analytic * tp["analytic_factor"] + tp.get("constant_mib", 0.0)
                    how = f"analytic {analytic:,.0f} MiB × analytic_factor + constant_mib"
            elif t.name == "deepep_a2a" and "constant_mib" in tp:
                new, how = float(tp["constant_mib"]), "constant_mib"
        out.append(CalibratedTerm(t.name, today, new, how))
        if t.name in _PRE:
            pre_today, pre_new = pre_today + today, pre_new + new
        else:
            post_today, post_new = post_today + today, post_new + new
    floor_on = gpu > 60 * 1024
    ft_today = max(0.0, 10240.0 - pre_today) if floor_on else 0.0
    ft_new = max(0.0, floor_new - pre_new) if floor_on else 0.0
    how = "floor_mib − pre-floor terms" if floor_on else "no floor (GPU ≤ 60 GiB)"
    out.insert(min(7, len(out)), CalibratedTerm("floor_topup", ft_today, ft_new, how))
    today_total = pre_today + ft_today + post_today
    new_total = pre_new + ft_new + post_new
    f_today = round((gpu - today_total) / gpu, 3)
    f_new = round((gpu - new_total) / gpu, 3)
    vlm = next((t for t in reservation.terms if t.name == "vlm_scaling" and t.on), None)
    if vlm is not None and f_today > 0:
        factor = (f_today - vlm.mib / gpu) / f_today
        f_today, f_new = f_today * factor, f_new * factor
        notes.append(f"multimodal: both fractions × {factor:.4f} (sglang's VLM scaling)")
    if abs(today_total - reservation.reserved_mib) > 1e-6 and vlm is None:
        notes.append(f"today's sum {today_total:g} MiB differs from the model's {reservation.reserved_mib:g} MiB")
    return CalibratedReserve(tuple(out), today_total, new_total, f_today, f_new, tuple(notes))
