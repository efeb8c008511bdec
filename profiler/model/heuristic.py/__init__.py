"""SGLang's memory reservation heuristic, modelled term by term per release (pure Python, no sglang import)."""

from profiler.heuristic.inputs import inputs_from_args, inputs_from_scenario
from profiler.heuristic.model import decode_bs_list, prefill_bs_list, reserve, resolve
from profiler.heuristic.record import TERM_NAMES, HeuristicInputs, Reservation, Resolved, Step, Term
from profiler.heuristic.rules import DEFAULT_RULES, RULE_SETS, RuleSet, rules_for

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
