"""What a scenario gives the all-to-all buffer: the one place its a2a inputs (backend, hidden, experts, top-k,
EP size, dispatch tokens) are derived, and the buffer set beside the heuristic's reservation.

Kept apart from `a2a` (the backends and their size formulas) so that `scenario` can name the backends without a
circle: scenario → a2a, and a2a_inputs → scenario + a2a.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from profiler.model import deepep
from profiler.model.a2a import MIB, A2AInputs, A2ASize, Backend, backend, default_tokens, model_topk, size_for

if TYPE_CHECKING:
    from profiler.model.heuristic.record import Reservation
    from profiler.model.scenario import Scenario


def tokens_for(s: Scenario, b: Backend, chunk: int | None = None) -> int | None:
    """The dispatch capacity of scenario `s`: its environment variable, else sglang's default."""
    if b.tokens_env is None:
        return None
    env = s.env_dict
    if b.tokens_env in env:
        try:
            return int(env[b.tokens_env])
        except ValueError:
            return None
    per_dp = (chunk or 0) // max(1, s.attn_dp) if (chunk or 0) > 0 else 0
    return default_tokens(b, per_dp)


@dataclass(frozen=True, slots=True)
class A2AReport:
    """A scenario's all-to-all buffer beside what the heuristic reserved for it."""

    size: A2ASize
    reserve_mib: float  # the deepep terms (deepep_a2a + prefill_bcg_deepep) the heuristic added for it
    reserved_total_mib: float  # every non-KV term of the reservation
    inputs: A2AInputs | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def excess_mib(self) -> float | None:
        """Buffer beyond its own reserve (positive: under-reserved)."""
        d = self.size.device_mib
        return None if d is None else d - self.reserve_mib

    @property
    def verdict(self) -> str:
        d = self.size.device_mib
        if self.size.fails:
            return "fails"
        if d is None:
            return "unknown"
        if d > self.reserved_total_mib:
            return "oom"  # larger than every non-KV term together: nothing else can absorb it
        return "over_reserve" if d > self.reserve_mib else "fits"


def a2a_reserve_mib(r: Reservation) -> float:
    """What the heuristic added for the all-to-all buffer: the deepep terms (0 for every other backend)."""
    t = {x.name: x for x in r.terms}
    return sum(t[n].mib for n in ("deepep_a2a", "prefill_bcg_deepep") if n in t and t[n].on)


def inputs_for(s: Scenario, chunk: int | None = None) -> A2AInputs | None:
    """The buffer inputs of scenario `s` (None for backend none or a model without experts)."""
    b = backend(s.moe_a2a_backend)
    sh = s.shape
    if b.name == "none" or not sh.is_moe:
        return None
    t = tokens_for(s, b, chunk)
    return A2AInputs(
        backend=b.name,
        hidden=sh.hidden_size,
        num_experts=sh.num_experts,
        topk=model_topk(s.model_path),
        num_ranks=s.tp,  # _a2a_ep_size: ep_size = tp_size
        tokens_per_rank=t if t is not None else 0,
        deepep_mode=s.deepep_mode,
        deepep_v2_mode=s.deepep_v2_mode,
        attn_dp=s.attn_dp,
        nnodes=max(1, -(-s.tp // 8)),
    )


def report_for(s: Scenario, r: Reservation) -> A2AReport | None:
    """Size the scenario's buffer and set it beside the reservation (None without a backend)."""
    b = backend(s.moe_a2a_backend)
    if b.name == "none":
        return None
    inp = inputs_for(s, r.resolved.chunked_prefill_size)
    notes: list[str] = []
    if inp is None:
        size = A2ASize(b.name, None, None, None, note=f"model {s.model} has no routed experts: nothing to dispatch")
    elif inp.num_ranks < 2 and b.name not in ("megamoe",):
        size = size_for(inp)
        notes.append("EP group of 1 GPU: sglang builds the buffer all the same (ep_size = tp_size = 1)")
    else:
        size = size_for(inp)
    if inp is not None and inp.nnodes > 1:
        notes.append(f"tp {s.tp} spans {inp.nnodes} nodes of 8 GPUs (assumed)")
    return A2AReport(size, a2a_reserve_mib(r), r.reserved_mib, inp, tuple(notes))


def deepep_sizes_mib(s: Scenario) -> tuple[float | None, float | None]:
    """(analytic buffers, device total with NVSHMEM heap rounding) per GPU for a DeepEP scenario.

    The inputs are `inputs_for`'s, the same the a2a report and the plan use (one derivation of a scenario's
    DeepEP inputs: ep_size = tp_size, dispatch tokens from the environment variable or sglang's default).
    """
    if s.moe_a2a_backend != "deepep":
        return None, None
    inp = inputs_for(s)
    if inp is None:
        return None, None
    try:
        sizes = deepep.analytic_sizes(
            deepep.DeepEPInputs(
                hidden=inp.hidden,
                num_experts=inp.num_experts,
                tokens_per_rank=inp.tokens_per_rank,
                num_ranks=inp.num_ranks,
                mode=inp.deepep_mode,
            )  # type: ignore[arg-type]
        )
    except ValueError:
        return None, None
    return sizes.analytic_bytes / MIB, sizes.total_bytes / MIB
