"""The calibrated reserve, written once: a fitted shape per term, and sglang's sum with the fitted shapes put in.

Every consumer of a calibration computes it here — `memfrac calibrate` (KV recovered, the whole-reserve
leave-one-model-out), `memfrac calibrate --evaluate` (results directories), `memfrac explain --calibration`
(one scenario) and `memfrac audit --calibration` (numpy over the configuration space): `calibrated_sum` takes
floats or numpy arrays alike.

A term's x is recovered from today's MiB with the heuristic's own constant (`profiler.model.heuristic.
constants`): tokens = MiB ÷ ACTIVATION_MIB_PER_TOKEN, decode max_bs = MiB ÷ DECODE_GRAPH_MIB_PER_BS, prefill
buckets = MiB ÷ PREFILL_GRAPH_MIB_PER_BUCKET, tp·pp = MiB ÷ PARALLEL_MIB_PER_TP_PP.
Shapes (`Fit.form`):

| form | reserve |
|---|---|
| per_unit | slope · x (today's shape: one number per unit) |
| affine | constant + slope · x (a fixed part plus a per-unit part) |
| per_hidden | slope · x · hidden size |
| affine_scaled | constant + slope · x · hidden size ÷ tp (what each rank's graph holds) |
| flat | constant |
| deepep | slope · DeepEP analytic MiB + constant |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from profiler.model.heuristic.constants import (
    ACTIVATION_MIB_PER_TOKEN,
    CONSTANT_MIB,
    DECODE_GRAPH_MIB_PER_BS,
    FLOOR_GPU_MIB,
    FLOOR_MIB,
    PARALLEL_MIB_PER_TP_PP,
    POST_FLOOR_TERMS,
    PRE_FLOOR_TERMS,
    PREFILL_GRAPH_MIB_PER_BUCKET,
)

FORMS = ("per_unit", "affine", "per_hidden", "affine_scaled", "flat", "deepep")
#: today's MiB ÷ this = the term's x (fit key → the heuristic's constant).
DIVISOR: dict[str, float] = {
    "activation": ACTIVATION_MIB_PER_TOKEN,
    "parallel": PARALLEL_MIB_PER_TP_PP,
    "decode_graph": DECODE_GRAPH_MIB_PER_BS,
    "prefill_graph": PREFILL_GRAPH_MIB_PER_BUCKET,
}
#: Fit keys whose term scales with what the heuristic multiplies (the rest are absolute MiB).
SCALED = tuple(DIVISOR)


@dataclass(frozen=True, slots=True)
class Fit:
    """A fitted reserve of one term (see the module table)."""

    form: str
    slope: float = 0.0
    constant: float = 0.0

    def reserve(self, x: Any, hidden: Any = None, tp: Any = None) -> Any:
        """The reserve for x units (floats or numpy arrays; hidden/tp only for the hidden shapes)."""
        if self.form == "per_unit":
            return self.slope * x
        if self.form == "affine":
            return self.constant + self.slope * x
        if self.form == "per_hidden":
            return self.slope * x * (0 if hidden is None else hidden)
        if self.form == "affine_scaled":
            return self.constant + self.slope * x * scale_of(hidden, tp)
        if self.form == "deepep":
            return self.slope * x + self.constant
        return self.constant + 0 * x

    def arithmetic(self, x: float, unit: str, hidden: float | None = None, tp: float | None = None) -> str:
        """The reserve as the arithmetic a reader can redo, e.g. "17.92 MiB × bs 256" (implied, shown)."""
        n = f"{unit} {x:g}" if unit else f"{x:g}"
        if self.form == "per_unit":
            return f"{self.slope:g} MiB × {n}"
        if self.form == "affine":
            return f"{self.constant:g} MiB + {self.slope:g} MiB × {n}"
        if self.form == "per_hidden":
            return f"{self.slope:g} MiB × {n} × hidden {hidden:g}" if hidden else "hidden size unknown"
        if self.form == "affine_scaled":
            return (f"{self.constant:g} MiB + {self.slope:g} MiB × {n} × hidden {hidden:g} ÷ tp {tp or 1:g}"
                    if hidden else "hidden size unknown")  # fmt: skip
        if self.form == "deepep":
            return f"{self.slope:g} × analytic {x:g} MiB + {self.constant:g} MiB"
        return f"{self.constant:g} MiB"

    def predict(self, o: Any) -> float:
        """The reserve of one observation (an object with x, hidden and tp)."""
        return float(self.reserve(o.x, o.hidden, getattr(o, "tp", None)))

    @property
    def needs_hidden(self) -> bool:
        return self.form in ("per_hidden", "affine_scaled")


def scale_of(hidden: Any, tp: Any) -> Any:
    """hidden size ÷ tp: the share of one layer's width each rank's graph buffers hold (0 when unknown)."""
    if hidden is None:
        return 0
    return hidden / (1 if tp is None else np.maximum(tp, 1))


def _w(cond: Any, a: Any, b: Any) -> Any:
    out = np.where(cond, a, b)
    return float(out) if np.ndim(out) == 0 else out


def calibrated_term(
    key: str, today: Any, fits: Mapping[str, Fit], *, hidden: Any = None, tp: Any = None, analytic: Any = None
) -> Any:
    """One term with its fitted shape put in (fit key: prefill_graph_mla for an MLA model's prefill graph).

    A term that is off today (0 MiB) stays off; a key without a fit keeps today's MiB; the constant is
    replaced only where it is the heuristic's 512 (post-capture sizing has another base); a hidden shape
    keeps today's MiB where the hidden size is unknown; the DeepEP affine shape where no analytic size is.
    """
    f = fits.get(key)
    if f is None:
        return today
    on = np.asarray(today) > 0
    if key == "constant":
        on = on & (np.asarray(today) == CONSTANT_MIB)
    if key == "deepep_a2a" and f.form == "deepep":
        ana = np.nan_to_num(np.asarray(0.0 if analytic is None else analytic, dtype=float))
        return _w(on & (ana > 0), f.reserve(ana), today)
    x = np.asarray(today, dtype=float) / DIVISOR[key] if key in DIVISOR else np.ones_like(np.asarray(today, float))
    new = f.reserve(x, hidden, tp)
    if f.needs_hidden:
        known = np.asarray(np.nan_to_num(np.asarray(0 if hidden is None else hidden, dtype=float)) > 0)
        return _w(on & known, new, today)
    return _w(on, new, today)


def calibrated_sum(
    terms: Mapping[str, Any],
    fits: Mapping[str, Fit],
    *,
    floor_on: Any,
    is_mla: Any = False,
    hidden: Any = None,
    tp: Any = None,
    analytic: Any = None,
) -> tuple[Any, Any, dict[str, Any]]:
    """(today's reserve, the calibrated one, each term calibrated): sglang's sum, max(pre-floor terms, floor)
    where the floor is on, plus the post-floor terms.

    `terms` maps sglang term names (joined names such as "decode_graph+dp_padding" included: kept as they
    are) to today's MiB; floor_topup and vlm_scaling are ignored (the floor is recomputed, the VLM factor
    multiplies the fraction). A run whose activation term is off (post-capture KV sizing) keeps today's reserve.
    """
    floor_new = fits["floor_topup"].constant if "floor_topup" in fits else FLOOR_MIB
    pre_t = pre_n = post_t = post_n = 0.0
    # post-capture sizing turns the activation term off (0 MiB); a run that records no activation row is not one
    act_on = np.asarray(terms["activation"]) > 0 if "activation" in terms else np.asarray(True)
    out: dict[str, Any] = {}
    for name, today in terms.items():
        if name in ("floor_topup", "vlm_scaling", "total"):
            continue
        if "+" in name:
            new = today
        elif name == "prefill_graph":
            new = _w(is_mla, calibrated_term("prefill_graph_mla", today, fits),
                     calibrated_term("prefill_graph", today, fits))  # fmt: skip
        else:
            new = calibrated_term(name, today, fits, hidden=hidden, tp=tp, analytic=analytic)
        new = _w(act_on, new, today)
        out[name] = new
        if any(part in POST_FLOOR_TERMS for part in name.split("+")):
            post_t, post_n = post_t + today, post_n + new
        elif any(part in PRE_FLOOR_TERMS for part in name.split("+")):
            pre_t, pre_n = pre_t + today, pre_n + new
    today_total = _w(floor_on, np.maximum(pre_t, FLOOR_MIB), pre_t) + post_t
    new_total = _w(floor_on & act_on, np.maximum(pre_n, floor_new), _w(floor_on, np.maximum(pre_n, FLOOR_MIB), pre_n))
    return today_total, new_total + post_n, out


def floor_applies(gpu_mib: Any) -> Any:
    """sglang's floor condition: `gpu_mem > FLOOR_GPU_MIB`."""
    return np.asarray(gpu_mib) > FLOOR_GPU_MIB
