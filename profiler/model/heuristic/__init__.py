"""SGLang's memory reservation heuristic, modelled term by term per release (pure Python, no sglang import)."""

from profiler.model.heuristic.inputs import inputs_from_args, inputs_from_scenario
from profiler.model.heuristic.model import decode_bs_list, prefill_bs_list, reserve, resolve
from profiler.model.heuristic.record import TERM_NAMES, HeuristicInputs, Reservation, Resolved, Step, Term
from profiler.model.heuristic.releases import rules_for
from profiler.model.heuristic.rules import DEFAULT_RULES, RULE_SETS, RuleSet

__all__ = [
    "DEFAULT_RULES",
    "RULE_SETS",
    "TERM_NAMES",
    "HeuristicInputs",
    "Reservation",
    "Resolved",
    "RuleSet",
    "Step",
    "Term",
    "decode_bs_list",
    "inputs_from_args",
    "inputs_from_scenario",
    "prefill_bs_list",
    "reserve",
    "resolve",
    "rules_for",
]
