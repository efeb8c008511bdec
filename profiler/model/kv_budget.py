"""What a fraction leaves for the KV pool on one GPU, by sglang's runtime rule.

The pool gets `free_at_start × mfs − weights`, where free_at_start is the free memory after NCCL init (capacity
minus CUDA context and communicator buffers). Without a measurement memfrac assumes free_at_start = capacity and
says so (`free_at_start_assumed`). Used by `explain` and the sweep's plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profiler.model.scenario import Scenario


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
