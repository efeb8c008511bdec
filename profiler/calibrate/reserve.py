"""The reserve a calibration predicts for a scenario, term by term beside today's (`memfrac explain --calibration`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profiler.calibrate.shapes import DIVISOR, calibrated_sum, floor_applies
from profiler.model.heuristic.constants import FLOOR_MIB, PRE_FLOOR_TERMS

#: What x counts in each term (x = today's MiB ÷ sglang's per-unit constant, `shapes.DIVISOR`).
UNITS = {"activation": "tokens", "parallel": "tp·pp", "decode_graph": "bs", "prefill_graph": "buckets"}


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


def calibrated_reserve(scenario: Any, reservation: Any, cal: dict[str, Any]) -> CalibratedReserve:
    """sglang's sum with the calibrated shapes (`shapes.calibrated_sum`, the one every reader uses) for one
    scenario: max(pre-floor terms, floor) + post-floor terms → fraction, applied to the rules the scenario's
    reservation was computed with (`--rules`), whatever rules the file's evidence was sized with (said so)."""
    from profiler.calibrate.codec import fits, sized_by_note

    fs = fits(cal)
    gpu = float(scenario.gpu.total_mib)
    notes: list[str] = []
    note = sized_by_note(cal, reservation.rules)
    if note:
        notes.append(note)
    today = {t.name: (float(t.mib) if t.on else 0.0) for t in reservation.terms
             if t.name not in ("floor_topup", "vlm_scaling")}  # fmt: skip
    analytic = None
    if "deepep_a2a" in fs and fs["deepep_a2a"].form == "deepep" and today.get("deepep_a2a"):
        from profiler.model.a2a_inputs import deepep_sizes_mib

        analytic, _ = deepep_sizes_mib(scenario)
        if analytic is None:
            notes.append("deepep_a2a: no analytic DeepEP size for this shape; today's 2 GiB kept")
    floor_on = bool(floor_applies(gpu))
    t_total, n_total, each = calibrated_sum(
        today, fs, floor_on=floor_on, is_mla=scenario.shape.is_mla, hidden=scenario.shape.hidden_size,
        tp=getattr(scenario, "tp", None), analytic=analytic,
    )  # fmt: skip
    out: list[CalibratedTerm] = []
    for name, mib in today.items():
        new = float(each.get(name, mib))
        key = "prefill_graph_mla" if name == "prefill_graph" and scenario.shape.is_mla else name
        f = fs.get(key)
        if f is None or new == mib:
            how = "unchanged"
        else:
            x = (analytic or 0.0) if f.form == "deepep" else mib / DIVISOR[key] if key in DIVISOR else 1.0
            how = f"{f.form}: " + f.arithmetic(x, UNITS.get(key, ""), scenario.shape.hidden_size, scenario.tp)
        out.append(CalibratedTerm(name, mib, new, how))
    pre_t = sum(v for k, v in today.items() if k in PRE_FLOOR_TERMS)
    pre_n = sum(float(each.get(k, v)) for k, v in today.items() if k in PRE_FLOOR_TERMS)
    floor_new = fs["floor_topup"].constant if "floor_topup" in fs else FLOOR_MIB
    ft_today = max(0.0, FLOOR_MIB - pre_t) if floor_on else 0.0
    ft_new = max(0.0, floor_new - pre_n) if floor_on else 0.0
    how = "floor_mib − pre-floor terms" if floor_on else "no floor (GPU ≤ 60 GiB)"
    out.insert(min(7, len(out)), CalibratedTerm("floor_topup", ft_today, ft_new, how))
    today_total, new_total = float(t_total), float(n_total)
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
