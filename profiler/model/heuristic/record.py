"""Typed records the heuristic model returns: inputs, resolution steps, terms, and the reservation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

#: Term names, in the order sglang adds them. Shared by compare, calibrate, report and the store.
TERM_NAMES = (
    "constant",
    "activation",
    "parallel",
    "decode_graph",
    "dp_padding",
    "prefill_graph",
    "prefill_bcg_deepep",
    "floor_topup",
    "deepep_a2a",
    "speculative",
    "xpu",
    "vlm_scaling",
    # releases before 0.5.3rc2 computed the fraction by a formula, not a sum of these terms:
    "fraction_table",
    "band_base",
    "big_gpu",
    "dp_attention",
)

#: Where each term lives in sglang's own code (0.5.20+ names), so a maintainer can carry numbers back.
SGLANG_TERM_SOURCE = {
    "constant": "memory_hook.handle_gpu_memory_settings: reserved_mem = 512 (1536 with post-capture sizing)",
    "activation": "memory_hook.handle_gpu_memory_settings: activation_tokens * 1.5",
    "parallel": "memory_hook.handle_gpu_memory_settings: tp_size * pp_size / 8 * 1024",
    "decode_graph": "memory_hook.reserve_for_graph_mb: decode max_bs * 2",
    "dp_padding": "memory_hook.reserve_for_graph_mb: max_bs * attn_dp_size * 3 (+1.5 if max_bs > 300)",
    "prefill_graph": "memory_hook.reserve_for_graph_mb: len(prefill bs) * 8 | 1.5 * 1024 (MLA); 0.5.5.post1-0.5.7:"
    " piecewise_cuda_graph_max_tokens // 4 (// 8 in 0.5.7) after the floor",
    "prefill_bcg_deepep": "memory_hook.reserve_for_graph_mb: + 1 * 1024 (breakable prefill graph + DeepEP)",
    "floor_topup": "memory_hook.handle_gpu_memory_settings: max(reserved_mem, 10 * 1024) when gpu_mem > 60 GiB",
    "deepep_a2a": "memory_hook.reserve_for_deepep_a2a_mb: 2 * 1024",
    "speculative": "server_args._handle_gpu_memory_settings (0.5.3rc2-0.5.13): +2 GiB (4 GiB from 0.5.10rc0) EAGLE"
    " / +6 GiB STANDALONE after the floor; 0.4.7.post1-0.5.3rc0: +2 GiB (STANDALONE 6 GiB from 0.5.2)",
    "xpu": "memory_hook.handle_gpu_memory_settings: + 2 * 1024 on XPU",
    "vlm_scaling": "memory_hook.adjust_mem_fraction_for_vlm: fraction * factor",
    "fraction_table": "server_args.__post_init__ (0.4.0-0.4.7): 0.79/0.81/0.85/0.87/0.88 by tp size; cap * (1 - f)",
    "band_base": "server_args.__post_init__: 13 GiB above 80 GiB (0.4.5.post3-0.4.6.post1); reserve by GPU band "
    "(0.4.7.post1-0.5.3rc0): 2.8 / 9.5 / 12 GiB, 32 GiB from 160 GiB",
    "big_gpu": "server_args.__post_init__ (0.4.6.post2-0.4.7): > 96 GiB min(f + 48 GiB (1 - f)/cap,"
    " (cap - 18 GiB)/cap); 0.4.7: 0.79 above 180 GB",
    "dp_attention": "server_args.__post_init__ (0.4.7.post1-0.5.3rc0): + 4 GiB with --enable-dp-attention",
}


class HeuristicInputs(NamedTuple):
    """Everything the heuristic reads, before sglang's resolution fills the defaults in.

    None means "not given by the user" — exactly what sglang sees when a flag is left out. A NamedTuple:
    immutable, hashable, and cheap to build by the thousand in sweeps and benchmarks.
    """

    gpu_mem_mib: int | None
    mode: str = "null"
    tp: int = 1
    pp: int = 1
    dp: int = 1
    attn_dp: int = 1
    is_mla: bool = False
    is_multimodal: bool = False
    vit_layers: int | None = None  # vision tower shape, for the VLM scaling (None: no vision_config)
    vit_hidden: int | None = None
    model_path: str = ""
    architecture: str = ""
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = 16384
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    context_length: int | None = None
    disable_cuda_graph: bool = False
    disable_cuda_graph_padding: bool = False
    decode_backend: str | None = None
    decode_max_bs: int | None = None
    decode_bs: tuple[int, ...] | None = None
    prefill_backend: str | None = None
    prefill_max_bs: int | None = None
    prefill_bs: tuple[int, ...] | None = None
    speculative_algorithm: str | None = None
    speculative_num_draft_tokens: int | None = None
    moe_a2a_backend: str = "none"
    deepep_mode: str = "auto"
    mem_fraction_static: float | None = None
    post_capture_env: bool = False  # SGLANG_ENABLE_POST_CAPTURE_KV_SIZING set truthy
    platform: str = "cuda"  # cuda | xpu | non-cuda (what sglang's default prefill backend keys off)
    unmodeled: tuple[str, ...] = ()  # extra flags the model does not interpret (said in every explanation)


@dataclass(frozen=True, slots=True)
class Step:
    """One resolution step that fed the heuristic (GPU-size defaults, bs lists, role gating, ...)."""

    name: str
    detail: str


class Resolved(NamedTuple):
    """The values the heuristic actually read, after the resolution steps ran."""

    gpu_mem_mib: int | None
    chunked_prefill_size: int
    max_prefill_tokens: int
    max_running_requests: int | None
    decode_backend: str
    decode_max_bs: int | None  # None: left to the CUDA-graph runner at start (0.4.5.post3 … 0.5.3rc0, big GPUs)
    decode_bs: tuple[int, ...]  # () when the runner picks the list at start (before 0.5.3rc2)
    prefill_backend: str
    prefill_max_bs: int
    prefill_bs: tuple[int, ...]
    post_capture_sizing: bool


@dataclass(frozen=True, slots=True)
class Term:
    """One reservation term: its MiB, whether it applied, why, and what it read."""

    name: str
    mib: float
    on: bool
    reason: str
    inputs: tuple[tuple[str, Any], ...] = ()

    @property
    def sglang_source(self) -> str:
        return SGLANG_TERM_SOURCE.get(self.name, "")


class Reservation:
    """What sglang reserves for non-KV memory for one configuration under one rule set.

    `reserved_mib` is the sum of the additive terms (everything but `vlm_scaling`, which multiplies the
    fraction; its MiB is the equivalent `Δfraction × gpu_mem`). Before 0.5.3rc2 sglang computed the fraction
    by a formula (`RuleSet.formula`); its terms (`fraction_table`, `band_base`, `big_gpu`, …) then show the
    formula's reserve `gpu_mem × (1 − fraction)` split by what produced it, and `reserved_mib` is NaN when
    the GPU size is unknown (the formula gives no MiB then). `mem_fraction_static` is what sglang
    uses: the user's value when given, else the heuristic's. `terms` and `steps` (the words) are built on
    first access by re-running the same model with explanations on.
    """

    __slots__ = (
        "_explained",
        "_explainer",
        "flags",
        "heuristic_fraction",
        "inputs",
        "mem_fraction_static",
        "reserved_mib",
        "resolved",
        "rule_set",
        "term_mib",
        "term_on",
    )

    def __init__(
        self,
        rule_set: Any,
        inputs: HeuristicInputs,
        resolved: Resolved,
        term_mib: tuple[float, ...],
        term_on: tuple[bool, ...],
        reserved_mib: float,
        heuristic_fraction: float,
        mem_fraction_static: float,
        flags: tuple[str, ...],
        explainer: Callable[[], tuple] | None = None,
    ) -> None:
        self._explainer = explainer  # model.evaluate(inputs, rules, explain=True), bound by model.reserve
        self.rule_set = rule_set
        self.inputs = inputs
        self.resolved = resolved
        self.term_mib = term_mib
        self.term_on = term_on
        self.reserved_mib = reserved_mib
        self.heuristic_fraction = heuristic_fraction
        self.mem_fraction_static = mem_fraction_static
        self.flags = flags
        self._explained: tuple[tuple[Term, ...], tuple[Step, ...]] | None = None

    def __repr__(self) -> str:
        return f"Reservation(rules={self.rules!r}, reserved_mib={self.reserved_mib:g}, mfs={self.mem_fraction_static})"

    @property
    def rules(self) -> str:
        return self.rule_set.name

    def _explain(self) -> tuple[tuple[Term, ...], tuple[Step, ...]]:
        if self._explained is None:
            if self._explainer is None:
                raise ValueError("this Reservation was built without its explainer (use model.reserve)")
            _, mib, on, why, steps, *_ = self._explainer()
            inputs_of = _term_inputs(self)
            terms = tuple(
                Term(n, mib[i], on[i], (why or [""] * len(mib))[i], inputs_of.get(n, ()))
                for i, n in enumerate(TERM_NAMES)
            )
            self._explained = (terms, tuple(steps or ()))
        return self._explained

    @property
    def terms(self) -> tuple[Term, ...]:
        return self._explain()[0]

    @property
    def steps(self) -> tuple[Step, ...]:
        return self._explain()[1]

    def mib(self, name: str) -> float:
        """MiB of one term by name (fast: no explanation built)."""
        return self.term_mib[TERM_NAMES.index(name)]

    @property
    def given(self) -> bool:
        return self.inputs.mem_fraction_static is not None

    @property
    def effective_reserved_mib(self) -> float | None:
        """Non-static MiB of capacity under the fraction sglang really uses: gpu_mem × (1 − mfs)."""
        g = self.inputs.gpu_mem_mib
        return None if g is None else g * (1 - self.mem_fraction_static)

    def term(self, name: str) -> Term:
        for t in self.terms:
            if t.name == name:
                return t
        raise KeyError(name)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (what `memfrac explain --json` prints)."""
        return {
            "rules": self.rules,
            "rule_releases": self.rule_set.releases,
            "rule": self.rule_set.summary,
            "gpu_mem_mib": self.inputs.gpu_mem_mib,
            "mem_fraction_static": self.mem_fraction_static,
            "heuristic_fraction": self.heuristic_fraction,
            "given": self.given,
            "reserved_mib": self.reserved_mib,
            "flags": list(self.flags),
            "terms": [
                {"name": t.name, "mib": t.mib, "on": t.on, "reason": t.reason, "inputs": dict(t.inputs)}
                for t in self.terms
            ],
            "resolution": [{"step": s.name, "detail": s.detail} for s in self.steps],
            "resolved": {
                "chunked_prefill_size": self.resolved.chunked_prefill_size,
                "max_prefill_tokens": self.resolved.max_prefill_tokens,
                "max_running_requests": self.resolved.max_running_requests,
                "decode_backend": self.resolved.decode_backend,
                "decode_max_bs": self.resolved.decode_max_bs,
                "decode_bs": list(self.resolved.decode_bs),
                "prefill_backend": self.resolved.prefill_backend,
                "prefill_max_bs": self.resolved.prefill_max_bs,
                "prefill_bs": list(self.resolved.prefill_bs),
                "post_capture_sizing": self.resolved.post_capture_sizing,
            },
            "unmodeled": list(self.inputs.unmodeled),
        }


def _term_inputs(r: Reservation) -> dict[str, tuple[tuple[str, Any], ...]]:
    """The inputs each term read, for explanations and the store."""
    i, res = r.inputs, r.resolved
    return {
        "activation": (
            ("mode", i.mode),
            ("chunked_prefill_size", res.chunked_prefill_size),
            ("max_prefill_tokens", res.max_prefill_tokens),
            ("max_running_requests", i.max_running_requests),
            ("decode_max_bs", res.decode_max_bs),
            ("speculative_num_draft_tokens", i.speculative_num_draft_tokens),
        ),
        "parallel": (("tp", i.tp), ("pp", i.pp)),
        "decode_graph": (("decode_backend", res.decode_backend), ("decode_max_bs", res.decode_max_bs)),
        "dp_padding": (("attn_dp", i.attn_dp), ("decode_max_bs", res.decode_max_bs)),
        "prefill_graph": (
            ("prefill_backend", res.prefill_backend),
            ("prefill_buckets", len(res.prefill_bs)),
            ("is_mla", i.is_mla),
        ),
        "prefill_bcg_deepep": (("prefill_backend", res.prefill_backend), ("moe_a2a_backend", i.moe_a2a_backend)),
        "floor_topup": (("gpu_mem_mib", i.gpu_mem_mib),),
        "deepep_a2a": (
            ("moe_a2a_backend", i.moe_a2a_backend),
            ("mode", i.mode),
            ("decode_backend", res.decode_backend),
        ),
        "speculative": (("speculative_algorithm", i.speculative_algorithm),),
        "xpu": (("platform", i.platform),),
        "vlm_scaling": (("is_multimodal", i.is_multimodal), ("vit_layers", i.vit_layers), ("vit_hidden", i.vit_hidden)),
        "fraction_table": (("tp", i.tp), ("pp", i.pp), ("gpu_mem_mib", i.gpu_mem_mib)),
        "band_base": (("gpu_mem_mib", i.gpu_mem_mib),),
        "big_gpu": (("gpu_mem_mib", i.gpu_mem_mib), ("speculative_algorithm", i.speculative_algorithm)),
        "dp_attention": (("attn_dp", i.attn_dp),),
    }
