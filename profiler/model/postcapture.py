"""Post-capture KV sizing (`SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1`, sglang PR #30157, off by default).

With it, sglang's heuristic reserves only 1536 MiB + tp·pp/8 GiB (`memory_hook.handle_gpu_memory_settings`)
and sizes the KV pool after graph capture from the memory really left
(`model_runner_components/kv_pool_runtime.py compute_post_capture_kv_resize`): budget = free after capture −
free_at_start × (1 − mfs), capped at the pool sized before capture (the "VA upper bound"). With F the free
memory at start, W the weights and U what the worker allocates after the KV pool (graphs, all-to-all
buffers, workspaces), the two pools are

    classic:       F·mfs − W                         (and the worker OOMs when U > F·(1 − mfs))
    post-capture:  min(F·mfs_pc − W, F·mfs_pc − W − U) = F·mfs_pc − W − U

so post-capture gives more KV exactly when U < F·(mfs_pc − mfs) — the break-even — and avoids the OOM the
classic pool runs into when U > F·(1 − mfs). Not modelled: the activation headroom sglang keeps when the
decode graph's max_bs is below max_running_requests, the sampling pre-warm headroom without graph-pool
borrowing, multimodal reservations, and the draft pools of speculative decoding.

`answers` gives both answers for a scenario before anything runs; `gain_from_run` what a measured run says
(compare and report call it with the run's figures).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profiler.core.units import BYTES_PER_MIB
from profiler.model.heuristic import RuleSet, inputs_from_scenario, reserve
from profiler.model.heuristic.record import Reservation
from profiler.model.scenario import Scenario

MIB = BYTES_PER_MIB


@dataclass(frozen=True, slots=True)
class Answers:
    """The heuristic with and without post-capture sizing, and what each leaves for the KV pool."""

    enabled: bool  # the scenario sets the variable
    planned: bool  # sglang would post-capture-size this configuration (post_capture_kv_sizing_planned)
    classic: Reservation
    post: Reservation
    free_at_start_mib: float
    weights_mib: float
    kv_bytes_per_token: int

    @property
    def classic_kv_mib(self) -> float:
        return self.free_at_start_mib * self.classic.mem_fraction_static - self.weights_mib

    @property
    def post_upper_kv_mib(self) -> float:
        """The pool post-capture sizing reserves before capture (its upper bound)."""
        return self.free_at_start_mib * self.post.mem_fraction_static - self.weights_mib

    @property
    def break_even_mib(self) -> float:
        """Post-capture gives more KV whenever the worker allocates less than this after the pool."""
        return self.free_at_start_mib * (self.post.mem_fraction_static - self.classic.mem_fraction_static)

    @property
    def classic_headroom_mib(self) -> float:
        """What the classic pool leaves for everything allocated after it (more: OOM)."""
        return self.free_at_start_mib * (1 - self.classic.mem_fraction_static)

    def tokens(self, mib: float) -> int:
        return int(mib * MIB // self.kv_bytes_per_token) if mib > 0 and self.kv_bytes_per_token > 0 else 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "planned": self.planned,
            "classic_mfs": self.classic.mem_fraction_static,
            "post_capture_mfs": self.post.mem_fraction_static,
            "classic_kv_tokens": self.tokens(self.classic_kv_mib),
            "post_capture_upper_kv_tokens": self.tokens(self.post_upper_kv_mib),
            "break_even_mib": round(self.break_even_mib, 1),
            "classic_headroom_mib": round(self.classic_headroom_mib, 1),
        }


def answers(s: Scenario, rules: RuleSet, free_at_start_mib: float | None = None) -> Answers:
    """Both answers for `s`, whichever of them it asks for (free at start = capacity unless given)."""
    inp = inputs_from_scenario(s)
    on = inp._replace(post_capture_env=True)
    off = inp._replace(post_capture_env=False)
    classic, post = reserve(off, rules), reserve(on, rules)
    shape = s.shape
    return Answers(
        enabled=s.post_capture_kv_sizing or inp.post_capture_env,
        planned=post.resolved.post_capture_sizing,
        classic=classic,
        post=post,
        free_at_start_mib=float(s.gpu.total_mib if free_at_start_mib is None else free_at_start_mib),
        weights_mib=shape.weight_bytes_per_gpu(s.tp, s.pp, s.attn_dp) / MIB,
        kv_bytes_per_token=shape.kv_bytes_per_token(s.tp, s.pp, s.attn_dp, s.kv_cache_dtype),
    )


def render(a: Answers) -> list[str]:
    """Lines for `memfrac explain`: both answers side by side."""
    state = "on" if a.enabled else "off"
    head = f"post-capture KV sizing (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING, {state} in this scenario):"
    if not a.planned:
        return [
            head,
            "  sglang would not post-capture-size this configuration (post_capture_kv_sizing_planned: MLA, a "
            "disabled decode graph, or a prefill graph that does not cover the chunk): both answers are "
            f"{a.classic.mem_fraction_static:.3f}",
        ]
    c, p = a.classic.mem_fraction_static, a.post.mem_fraction_static
    return [
        head,
        f"  without: mem_fraction_static {c:.3f}, KV {a.classic_kv_mib / 1024:.2f} GiB ≈ "
        f"{a.tokens(a.classic_kv_mib):,} tokens; whatever is allocated after the pool must fit in "
        f"{a.classic_headroom_mib:,.0f} MiB",
        f"  with:    mem_fraction_static {p:.3f} (reserve {a.post.reserved_mib:,.0f} MiB), pool sized after capture: "
        f"at most {a.post_upper_kv_mib / 1024:.2f} GiB ≈ {a.tokens(a.post_upper_kv_mib):,} tokens, minus what is "
        "allocated after the pool",
        f"  post-capture gives more KV when that is below {a.break_even_mib:,.0f} MiB (free × ({p:.3f} − {c:.3f})); "
        "`memfrac run` measures it",
    ]


@dataclass(frozen=True, slots=True)
class Gain:
    """What enabling post-capture sizing would have changed for one measured run."""

    kv_tokens_gained: int | None  # None: not computable from this run
    oom_avoided: bool  # the classic pool left less than the run allocated after it
    how: str  # the arithmetic, in words


def gain_from_run(
    *,
    classic_mfs: float,
    post_mfs: float,
    free_at_start_mib: float,
    weights_mib: float,
    used_after_kv_mib: float | None,
    kv_bytes_per_token: float,
    planned: bool = True,
) -> Gain:
    """KV tokens post-capture sizing gains (or the OOM it avoids) for a run that measured U (MiB after the pool).

    Symmetric in which mode the run used: U does not depend on the pool's size. Inputs are the run's figures
    (compare: free_at_start_mib, weights_mib, used_after_kv_mib, kv_bytes_per_token) and both fractions
    (`answers(...).classic/post.mem_fraction_static` for the run's scenario).
    """
    if not planned:
        return Gain(0, False, "sglang would not post-capture-size this configuration: nothing changes")
    if used_after_kv_mib is None or kv_bytes_per_token <= 0:
        return Gain(None, False, "not computable: the run did not measure what it allocated after the KV pool")
    u = max(0.0, used_after_kv_mib)
    classic = free_at_start_mib * classic_mfs - weights_mib
    post = free_at_start_mib * post_mfs - weights_mib - u
    headroom = free_at_start_mib * (1 - classic_mfs)
    oom = u > headroom
    t_classic = max(0.0, classic) * MIB // kv_bytes_per_token
    t_post = max(0.0, post) * MIB // kv_bytes_per_token
    how = (
        f"post-capture pool F·{post_mfs:.3f} − W − U = {free_at_start_mib:,.0f}·{post_mfs:.3f} − {weights_mib:,.0f} − "
        f"{u:,.0f} = {post:,.0f} MiB vs classic F·{classic_mfs:.3f} − W = {classic:,.0f} MiB"
    )
    if oom:
        how += f"; the classic pool leaves {headroom:,.0f} MiB for the {u:,.0f} MiB allocated after it: OOM"
    return Gain(int(t_post - t_classic), oom, how)
