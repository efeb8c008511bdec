"""Rule sets: the parameters in which sglang releases' memory heuristics differ, one per release.

Read from each release's own source (`pip download --no-deps sglang==X`): 0.5.12 … 0.5.23. One mechanism
(`model.py`), one parameter record per release; the conformance tests check them against the real
releases installed side by side. Families, for orientation:

- ≤ 0.5.14: before PR #29615 — decode-graph term always added, DP term and prefill term not role-gated.
- 0.5.15 … 0.5.19: PR #29615 in `server_args.py` (0.5.19 already in `arg_groups/memory_hook.py`) — decode
  activation sizing, role-gated graph/DP terms, +2 GiB DeepEP after the floor (0.5.17: DeepEP bucket
  alignment and +1 GiB breakable-prefill DeepEP delta).
- ≥ 0.5.20: `arg_groups/memory_hook.py` — new < 35 GiB band, XPU term, fallback 0.95 (0.5.22: attn_dp_size,
  max_bs capped by max_running_requests).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from profiler.errors import MemfracError


@dataclass(frozen=True, slots=True)
class Band:
    """A GPU-size band of the capacity defaults: below `limit_gib` (None: the largest band)."""

    limit_gib: int | None
    chunk: int
    max_bs: int
    max_bs_large_tp: int  # when tp ≥ 4


_BANDS_NEW = (
    Band(20, 2048, 8, 8),
    Band(35, 4096, 48, 160),
    Band(60, 4096, 32, 160),
    Band(90, 8192, 256, 512),
    Band(160, 8192, 256, 512),
    Band(None, 16384, 512, 512),
)
_BANDS_OLD = (Band(20, 2048, 8, 8), Band(35, 2048, 24, 80), *_BANDS_NEW[2:])

# Architectures whose piecewise/tc prefill graph sglang turns off (0.5.13+ list; 0.5.12 adds two).
TC_DISABLED_ARCHS = frozenset(
    {
        "DeepseekV4ForCausalLM",
        "DeepseekV4ForCausalLMNextN",
        "DeepseekV4ForCausalLMDSpark",
        "Qwen3NextForCausalLM",
        "BailingMoeV2_5ForCausalLM",
        "LLaDAModelLM",
        "Glm5NextForConditionalGeneration",
    }
)
TC_DISABLED_ARCHS_0_5_12 = TC_DISABLED_ARCHS | {"DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"}
# Multimodal architectures the breakable prefill graph supports (union over releases; 0.5.16+).
BCG_MULTIMODAL_OK = frozenset(
    {
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "InternS2MobiusForConditionalGeneration",
        "MuseGlimmerForConditionalGeneration",
        "KimiK3ForConditionalGeneration",
        "KimiK25ForConditionalGeneration",
        "Cohere2VisionForConditionalGeneration",
        "PaddleOCRVLForConditionalGeneration",
        "Glm5NextForConditionalGeneration",
        "Qwen4ExpForConditionalGeneration",
        "MiniMaxM3SparseForConditionalGeneration",
        "MuseSparkForConditionalGeneration",
    }
)


@dataclass(frozen=True, slots=True, eq=False)
class RuleSet:
    """Everything that differs between releases, as data (identity-hashed: one object per release)."""

    name: str
    releases: str
    bands: tuple[Band, ...]
    fallback_fraction: float  # when the GPU size is unknown
    # -- prefill graph, resolved before the heuristic --------------------------------------------------
    prefill_default: str  # "pcg" (0.5.12–13 piecewise booleans), "tc" (0.5.14 tc_piecewise), "breakable"
    bcg_disables_mla: bool = False  # 0.5.15–0.5.17 (0.5.17: unless DSA)
    bcg_disables_dp_attention: bool = False  # 0.5.15–0.5.16
    bcg_disables_any_a2a: bool = False  # 0.5.15–0.5.16 (0.5.17+: only unvalidated backends)
    bcg_multimodal_allowlist: bool = False  # 0.5.16+: allowlisted multimodal archs keep it
    pp_disables_breakable: bool = False  # 0.5.19+
    pd_prefill_disables_graphs: bool = False  # 0.5.13–0.5.15: the PD hook sets disable_cuda_graph on prefill nodes
    offcuda_prefill_default: str = "same"  # "same" (≤0.5.14), "tc" (0.5.15–0.5.21), "disabled" (0.5.22+)
    tc_disabled_archs: frozenset[str] = TC_DISABLED_ARCHS
    # -- terms ---------------------------------------------------------------------------------------
    role_aware: bool = False  # PR #29615: decode activation sizing; role-gated decode/DP/prefill terms
    role_gating: bool = False  # 0.5.16+: the other role's graph backend is disabled (mfs-neutral)
    spec_after_floor: bool = False  # 0.5.12–0.5.13: +6 GiB STANDALONE / +4 GiB any other draft but NGRAM
    deepep_a2a_mib: float = 0.0  # 0.5.15+: 2 GiB after the floor
    deepep_align_prefill_bs: bool = False  # 0.5.17+
    prefill_bcg_deepep_mib: float = 0.0  # 0.5.17+: 1 GiB before the floor
    context_length_clamp: bool = False  # 0.5.13–0.5.16: prefill max_bs ≤ context_length
    pp_prefill_cap: bool = False  # 0.5.19+: breakable prefill max_bs ≤ 8192 with pp > 1
    cap_max_bs_by_mrr: bool = False  # 0.5.22+
    mla_prefill_max_bs_min8192: bool = False  # 0.5.23: min(8192, chunk) instead of 2048 (mfs-neutral)
    post_capture_base_mib: float | None = None  # 0.5.16–17: 512; 0.5.18+: 1536
    post_capture_excludes_dp_attention: bool = False  # 0.5.16
    post_capture_checks_prefill_coverage: bool = False  # 0.5.17+
    xpu_term: bool = False  # 0.5.20+
    vlm_skip_decode: bool = False  # 0.5.17+
    vlm_post_capture: bool = False  # 0.5.20+: −8 GiB of fraction instead of the factor
    fallback_chunk: int = 4096  # GPU size unknown
    fallback_max_bs: int = 160

    def band_for(self, gpu_mib: int) -> Band:
        for b in self.bands:
            if b.limit_gib is None or gpu_mib < b.limit_gib * 1024:
                return b
        return self.bands[-1]

    def mla_prefill_max_bs(self, chunk: int) -> int:
        return min(8192, chunk) if self.mla_prefill_max_bs_min8192 else 2048

    @property
    def mla_prefill_why(self) -> str:
        return "MLA: min(8192, chunked_prefill_size)" if self.mla_prefill_max_bs_min8192 else "MLA: 2048"


R_0_5_12 = RuleSet(
    name="0.5.12",
    releases="0.5.12, 0.5.12.post1",
    bands=_BANDS_OLD,
    fallback_fraction=0.88,
    prefill_default="pcg",
    spec_after_floor=True,
    tc_disabled_archs=TC_DISABLED_ARCHS_0_5_12,
)
R_0_5_13 = replace(
    R_0_5_12,
    name="0.5.13",
    releases="0.5.13, 0.5.13.post1",
    tc_disabled_archs=TC_DISABLED_ARCHS,
    context_length_clamp=True,
    pd_prefill_disables_graphs=True,
)
R_0_5_14 = replace(R_0_5_13, name="0.5.14", releases="0.5.14", prefill_default="tc", spec_after_floor=False)
R_0_5_15 = replace(
    R_0_5_14,
    name="0.5.15",
    releases="0.5.15, 0.5.15.post1",
    prefill_default="breakable",
    role_aware=True,
    deepep_a2a_mib=2048.0,
    bcg_disables_mla=True,
    bcg_disables_dp_attention=True,
    bcg_disables_any_a2a=True,
    offcuda_prefill_default="tc",
)
R_0_5_16 = replace(
    R_0_5_15,
    name="0.5.16",
    releases="0.5.16",
    pd_prefill_disables_graphs=False,
    role_gating=True,
    bcg_multimodal_allowlist=True,
    post_capture_base_mib=512.0,
    post_capture_excludes_dp_attention=True,
)
R_0_5_17 = replace(
    R_0_5_16,
    name="0.5.17",
    releases="0.5.17",
    bcg_disables_dp_attention=False,
    bcg_disables_any_a2a=False,
    deepep_align_prefill_bs=True,
    prefill_bcg_deepep_mib=1024.0,
    context_length_clamp=False,
    vlm_skip_decode=True,
    post_capture_excludes_dp_attention=False,
    post_capture_checks_prefill_coverage=True,
)
R_0_5_18 = replace(R_0_5_17, name="0.5.18", releases="0.5.18", bcg_disables_mla=False, post_capture_base_mib=1536.0)
R_0_5_19 = replace(R_0_5_18, name="0.5.19", releases="0.5.19", pp_disables_breakable=True, pp_prefill_cap=True)
R_0_5_20 = replace(
    R_0_5_19,
    name="0.5.20",
    releases="0.5.20, 0.5.21",
    bands=_BANDS_NEW,
    fallback_fraction=0.95,
    xpu_term=True,
    vlm_post_capture=True,
)
R_0_5_22 = replace(
    R_0_5_20, name="0.5.22", releases="0.5.22", cap_max_bs_by_mrr=True, offcuda_prefill_default="disabled"
)
R_0_5_23 = replace(R_0_5_22, name="0.5.23", releases="0.5.23", mla_prefill_max_bs_min8192=True)

RULE_SETS: dict[str, RuleSet] = {
    r.name: r
    for r in (
        R_0_5_12,
        R_0_5_13,
        R_0_5_14,
        R_0_5_15,
        R_0_5_16,
        R_0_5_17,
        R_0_5_18,
        R_0_5_19,
        R_0_5_20,
        R_0_5_22,
        R_0_5_23,
    )
}
DEFAULT_RULES = R_0_5_23
#: The oldest and newest releases modelled exactly.
MODELLED = ((0, 5, 12), (0, 5, 23))


def version_tuple(v: str) -> tuple[int, ...]:
    """'0.5.15.post1' → (0, 5, 15); 'v0.4.6.post2' → (0, 4, 6). Stops at the first non-number."""
    nums: list[int] = []
    for part in v.strip().lstrip("v").split("+")[0].replace(".post", ".x").replace("rc", ".x").split("."):
        if not part.isdigit():
            break
        nums.append(int(part))
    return tuple(nums)


def rules_for(spec: str) -> RuleSet:
    """A rule set by release (`0.5.17`, `0.5.15.post1`, `0.5.21`) or by its name in `RULE_SETS`.

    Releases newer than the newest modelled one get its rules (the heuristic has not moved since, as far as
    memfrac knows; `memfrac explain` says so); releases older than 0.5.12 are refused.
    """
    if spec in RULE_SETS:
        return RULE_SETS[spec]
    v = version_tuple(spec)[:3]
    if len(v) < 3:
        raise MemfracError(f"unknown release {spec!r}; give a release like 0.5.17 (modelled: {', '.join(RULE_SETS)})")
    if v < MODELLED[0]:
        raise MemfracError(
            f"sglang {spec} predates the modelled releases (0.5.12 … 0.5.23); its heuristic is not modelled"
        )
    best = R_0_5_12
    for r in RULE_SETS.values():
        if version_tuple(r.name) <= v:
            best = r
    return best
