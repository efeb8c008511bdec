"""The `mem_fraction_static` a scenario's worker will run with — one definition for every output.

The model (profiler.model.heuristic) replays sglang's rule from the scenario's keys; a flag passed through
`extra_args` is not interpreted by it (`unmodeled`), and some change the fraction: `--enable-dynamic-chunking` at
pp > 1 makes sglang plan on `max_prefill_buffer_tokens` and drop post-capture KV sizing
(`arg_groups/overrides.py post_capture_kv_sizing_planned`), 0.833 where the model says 0.978 for Llama-3.1-8B at
pp 2 on an H100. sglang is the oracle: where its own resolver ran on the scenario (profiler.engine.validation),
its resolved value IS the fraction, and the model's stands beside it; without a resolver the model's value is
shown and says it is the model's, and a scenario with extra flags says the value may be wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from profiler.engine.validation import Validation
    from profiler.model.heuristic.record import Reservation
    from profiler.model.scenario import Scenario

#: Fractions sglang rounds to 3 decimals; closer than this they agree.
AGREE = 5e-4


@dataclass(frozen=True, slots=True)
class ScenarioFraction:
    """The fraction shown for a scenario (`value`), where it comes from, and the model's beside it."""

    value: float
    source: str  # "given" | "sglang <release> resolver" | "model (sglang <rules> rules)"
    model: float  # the model's: the user's value when given, else the heuristic's
    sglang: float | None  # what sglang's own resolver resolved (None: not asked, or it could not)
    release: str | None  # the release whose resolver ran
    note: str = ""

    @property
    def differs(self) -> bool:
        return self.sglang is not None and abs(self.sglang - self.model) > AGREE

    @property
    def from_sglang(self) -> bool:
        return self.source.startswith("sglang")

    def as_dict(self) -> dict[str, Any]:
        """The JSON keys every output carries (explain --json, the plan, results)."""
        return {
            "mem_fraction_static": self.value,
            "mem_fraction_static_source": self.source,
            "mem_fraction_static_model": self.model,
            "mem_fraction_static_differs": self.differs,
            "mem_fraction_static_note": self.note,
        }

    def label(self) -> str:
        """`0.833 (sglang 0.5.23 resolver; the model says 0.978)`: the value, its source, the model's when it
        differs."""
        extra = f"; the model says {self.model:.3f}" if self.differs else ""
        return f"{self.value:.3f} ({self.source}{extra})"


def scenario_fraction(s: Scenario, r: Reservation, validation: Validation | None = None) -> ScenarioFraction:
    """The fraction `s`'s worker runs with: the given one; else sglang's own resolved value where `validation`
    resolved `s` (the model's beside it); else the model's (`r`), saying so."""
    model = float(r.mem_fraction_static)
    extra = " ".join(s.extra_args)
    if s.mem_fraction_static is not None:
        return ScenarioFraction(float(s.mem_fraction_static), "given", model, None, None)
    resolved = validation.fraction(s.name) if validation is not None and validation.validated else None
    if resolved is not None:
        release = validation.release  # type: ignore[union-attr]
        src = f"sglang {release} resolver"
        if abs(resolved - model) <= AGREE:
            return ScenarioFraction(float(resolved), src, model, float(resolved), release)
        why = (
            f"extra flags {extra} change it and the model does not interpret them"
            if extra
            else "the model disagrees with sglang on this scenario: a modelling gap (report it)"
        )
        note = f"sglang {release} resolves {resolved:.3f}, the model {model:.3f}: {why}"
        return ScenarioFraction(float(resolved), src, model, float(resolved), release, note)
    src = f"model (sglang {r.rules} rules)"
    why = ""
    if validation is not None:
        why = validation.reason if not validation.validated else validation.inexpressible.get(s.name, "")
    note = ""
    if extra:
        note = (
            f"extra flags {extra} are not modelled and sglang's resolver did not run"
            + (f" ({why})" if why else "")
            + ": the fraction may differ"
        )
    return ScenarioFraction(model, src, model, None, None, note)
