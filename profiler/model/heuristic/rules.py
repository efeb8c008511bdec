"""Rule sets: the parameters in which sglang releases' memory heuristics differ, one per group of releases.

Read from each release's own source (`pip download --no-deps sglang==X`): every release from 0.4.0 (December
2024) to 0.5.23, `.postN` and release candidates included. Releases whose rules are identical share one rule
set, named after the group's first release (`releases.py` maps every release to its group). Two mechanisms
(`model.py`): before 0.5.3 sglang computed the fraction by a formula that is not a sum of terms; from 0.5.3rc2
it is the term-by-term reserve still used today. The conformance tests check them against the real releases
installed side by side. Families, for orientation:

- 0.4.0 … 0.4.7 (`formula="tp_table"`, `ServerArgs.__post_init__`): a fraction by tp size (0.79 … 0.88); from
  0.4.5.post3 only on GPUs ≤ 80 GiB, above it (capacity − 13 GiB)/capacity; 0.4.6.post2 blends big GPUs towards
  an 18 GiB reserve; 0.4.7 adds 0.79 above 180 GB and speculative variants. Not rounded.
- 0.4.7.post1 … 0.5.3rc0 (`formula="band_reserve"`): a reserve by GPU band growing with tp·pp, 32 GiB flat from
  160 GiB, + 2 GiB speculative (6 GiB STANDALONE from 0.5.2), + 4 GiB DP attention; rounded to 3 decimals.
- 0.5.3rc2 … 0.5.11 (`formula="terms"`, `_handle_gpu_memory_settings`): 512 + activation + graph + parallel,
  the 10 GiB floor, the speculative reserve after it; the piecewise prefill graph term arrives in 0.5.5.post1.
- ≤ 0.5.14: before PR #29615 — decode-graph term always added, DP term and prefill term not role-gated.
- 0.5.15 … 0.5.19: PR #29615 in `server_args.py` (0.5.19 already in `arg_groups/memory_hook.py`) — decode
  activation sizing, role-gated graph/DP terms, +2 GiB DeepEP after the floor (0.5.17: DeepEP bucket
  alignment and +1 GiB breakable-prefill DeepEP delta).
- ≥ 0.5.20: `arg_groups/memory_hook.py` — new < 35 GiB band, XPU term, fallback 0.95 (0.5.22: attn_dp_size,
  max_bs capped by max_running_requests).

Not modelled (no input for them): ROCm's aiter attention backend (0.5.4.post1+ scale the fraction by 0.9/0.85
for context > 8192), NPU bands, `--language-only` (0.5.9+ skip the VLM scaling), `--enable-mis` (0.5.11+).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from profiler.model.heuristic.constants import DEEPEP_A2A_MIB


@dataclass(frozen=True, slots=True)
class Band:
    """A GPU-size band of the capacity defaults: below `limit_mib` (None: the largest band).

    `max_bs` None: this release's server_args leaves cuda_graph_max_bs unset there and the CUDA-graph runner
    picks its capture list at start (0.4.5.post3 … 0.5.3rc0 on GPUs ≥ 25000 MB / 35 GiB).
    """

    limit_mib: int | None
    chunk: int
    max_bs: int | None
    max_bs_large_tp: int | None  # when tp ≥ 4

    @property
    def limit_gib(self) -> float | None:
        return None if self.limit_mib is None else self.limit_mib / 1024


def _gib(limit: int | None, chunk: int, max_bs: int | None, large: int | None) -> Band:
    return Band(None if limit is None else limit * 1024, chunk, max_bs, large)


_BANDS_NEW = (
    _gib(20, 2048, 8, 8),
    _gib(35, 4096, 48, 160),
    _gib(60, 4096, 32, 160),
    _gib(90, 8192, 256, 512),
    _gib(160, 8192, 256, 512),
    _gib(None, 16384, 512, 512),
)
_BANDS_OLD = (_gib(20, 2048, 8, 8), _gib(35, 2048, 24, 80), *_BANDS_NEW[2:])
# 0.5.3rc2 … 0.5.4 (server_args.py _handle_gpu_memory_settings): 16 below 35 GiB (24 from 0.5.4.post1)
_BANDS_0_5_3 = (_gib(20, 2048, 8, 8), _gib(35, 2048, 16, 80), *_BANDS_NEW[2:])
# 0.4.x: `gpu_mem < 25_000` (MB of nvidia-smi, i.e. MiB) for the small-GPU defaults
_BANDS_0_4_0 = (Band(25000, 2048, 8, 8), Band(None, 8192, 160, 160))  # 0.4.0 server_args.py:171-183
_BANDS_0_4_0_POST1 = (Band(25000, 2048, 8, 80), Band(None, 8192, 160, 160))  # 0.4.0.post1: 80 with tp ≥ 4
_BANDS_0_4_5_POST3 = (Band(25000, 2048, 8, 80), Band(None, 8192, None, None))  # the 160 default removed
_BANDS_0_4_7 = (Band(25000, 2048, 8, 80), Band(180001, 8192, None, None), Band(None, 16384, None, None))
_BANDS_0_4_7_POST1 = (_gib(35, 2048, 8, 80), _gib(160, 8192, None, None), _gib(None, 16384, None, None))

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
# 0.5.10rc0–0.5.11 (configs/model_config.py piecewise_cuda_graph_disabled_model_archs): no DeepSeek-V4 yet
TC_DISABLED_ARCHS_0_5_10 = frozenset(
    {
        "DeepseekV32ForCausalLM",
        "Qwen3NextForCausalLM",
        "GlmMoeDsaForCausalLM",
        "BailingMoeV2_5ForCausalLM",
        "LLaDAModelLM",
    }
)
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
    fallback_fraction: float  # when the GPU size is unknown (tp_table without table_max_mib: the table instead)
    # -- prefill graph, resolved before the heuristic --------------------------------------------------
    # "none" (no prefill graph: ≤ 0.5.3.post1), "pcg_optin" (0.5.3.post2–0.5.9 --enable-piecewise-cuda-graph),
    # "pcg" (0.5.10–13 piecewise on unless disabled), "tc" (0.5.14 tc_piecewise), "breakable"
    prefill_default: str
    # -- the fraction's mechanism ----------------------------------------------------------------------
    # "terms" (0.5.3rc2+: a sum of terms), "tp_table" (0.4.0–0.4.7), "band_reserve" (0.4.7.post1–0.5.3rc0)
    formula: str = "terms"
    gpu_none_raises: bool = False  # 0.4.0, 0.4.5.post3–0.4.6.post4 compare an unknown (None) GPU size: TypeError
    table_by_pp: bool = False  # tp_table: the table keys on tp·pp (0.4.6.post2+) instead of tp
    table_max_mib: int | None = None  # tp_table: only on GPUs ≤ this (81920 from 0.4.5.post3)
    above_table: str = "flat_13g"  # tp_table above table_max_mib: "flat_13g" ((cap − 13 GiB)/cap) or "0.88"
    blend_48g: bool = False  # tp_table (0.4.6.post2+): > 96 GiB, min(f + 48 GiB·(1−f)/cap, (cap − 18 GiB)/cap)
    blend_spec_reserve_mib: float | None = None  # 0.4.7: that 18 GiB is 20 GiB with speculative decoding
    b200_fraction: float | None = None  # 0.4.7: 0.79 on CUDA GPUs > 180 GB
    spec_scale: float | None = None  # 0.4.7: × 0.95 with speculative decoding on GPUs ≤ 96 GiB
    spec_standalone_mib: float = 6144.0  # band_reserve: 2048 before 0.5.2
    spec_other_mib: float = 4096.0  # terms: 2048 before 0.5.10rc0 (band_reserve: always 2048)
    dp_attention_mib: float = 4096.0  # band_reserve: + 4 GiB with --enable-dp-attention
    multimodal_scale: str = "vlm"  # "none" (≤ 0.4.8.post1), "x0.9" (0.4.9–0.4.9.post2), "vlm" (ViT-size factor)
    runner_multimodal_factor: float | None = None  # 0.4.0–0.4.8.post1: ModelRunner scales it at worker start
    nsa_fraction: float | None = None  # 0.5.3rc2–0.5.3: DeepSeek-V3.2 (NSA) forced to 0.8
    # -- the prefill (piecewise) graph term before 0.5.10 --------------------------------------------
    pcg_term: str = "buckets"  # "none", "max_tokens_div4"/"max_tokens_div8" (after the floor), "buckets"
    pcg_mla_flat: bool = True  # 0.5.10rc0+: MLA models pay a flat 1.5 GiB instead of the buckets
    pcg_max_tokens_fixed: int | None = None  # ≤ 0.5.6.post2: piecewise_cuda_graph_max_tokens defaults to 4096
    mla_prefill_2048: bool = True  # 0.5.8+: MLA models' prefill graph max tokens default to 2048 (0.5.7: chunk)
    prefill_caps: bool = True  # 0.5.10rc0+: prefill max tokens capped by max_total_tokens and 4096 for llama-2
    prefill_ladder: str = "0.5.9"  # token buckets: "0.5.3.post2" (…640+128…), "0.5.8" (…640+64…), "0.5.9"
    pcg_disabled_by_spec: bool = False  # 0.5.10rc0–0.5.10.post1
    decode_ladder: str = "0.5.10"  # "0.5.3" (spec range(40, 64, 4)), "0.5.4.post2", "0.5.10" (max_bs appended)
    pd_chunk: int | None = None  # 0.4.6.post2–0.4.7: chunk 16384 for PD (disaggregated) nodes
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
    fallback_max_bs: int | None = 160

    def band_for(self, gpu_mib: int) -> Band:
        for b in self.bands:
            if b.limit_mib is None or gpu_mib < b.limit_mib:
                return b
        return self.bands[-1]

    def mla_prefill_max_bs(self, chunk: int) -> int:
        if self.mla_prefill_max_bs_min8192:
            return min(8192, chunk)
        return 2048 if self.mla_prefill_2048 else chunk

    @property
    def summary(self) -> str:
        """The rule in words, for `memfrac explain`."""
        if self.formula == "tp_table":
            key = "tp·pp" if self.table_by_pp else "tp"
            out = f"fraction by {key} size (≥16 0.79, ≥8 0.81, ≥4 0.85, ≥2 0.87, else 0.88)"
            if self.table_max_mib is not None:
                above = "(capacity − 13 GiB) / capacity" if self.above_table == "flat_13g" else "0.88"
                out += f" on GPUs ≤ {self.table_max_mib} MiB, {above} above"
            if self.blend_48g:
                cap = "18 GiB (20 with speculative decoding)" if self.blend_spec_reserve_mib else "18 GiB"
                out += f"; > 96 GiB: min(f + 48 GiB·(1 − f)/capacity, (capacity − {cap})/capacity)"
            if self.b200_fraction is not None:
                out += f"; {self.b200_fraction} on CUDA GPUs > 180 GB"
            if self.spec_scale is not None:
                out += f"; × {self.spec_scale} with speculative decoding otherwise"
            out += "; not rounded"
        elif self.formula == "band_reserve":
            out = (
                "reserve by GPU band: < 35 GiB 2.8 GiB + tp·pp/10 GiB, < 90 GiB 9.5 + tp·pp/2, < 160 GiB 12 + tp·pp/2,"
                f" 32 GiB flat above; + {self.spec_standalone_mib / 1024:g} GiB STANDALONE / 2 GiB other draft"
                " models, + 4 GiB DP attention; round((capacity − reserve)/capacity, 3)"
            )
        else:
            out = "512 MiB + activation (tokens × 1.5) + graph terms + tp·pp/8 GiB, floor 10 GiB above 60 GiB"
            if self.spec_after_floor:
                out += f", + {self.spec_other_mib / 1024:g} GiB (STANDALONE 6 GiB) draft reserve after the floor"
            if self.pcg_term in ("max_tokens_div4", "max_tokens_div8"):
                out += f", piecewise prefill graph: max tokens // {self.pcg_term[-1]} after the floor"
            elif self.pcg_term == "none":
                out += ", no prefill-graph term"
            if self.role_aware:
                out += "; PD-role-aware terms (PR #29615)"
            if self.deepep_a2a_mib:
                out += f"; + {self.deepep_a2a_mib / 1024:g} GiB DeepEP after the floor"
            out += "; round((capacity − reserve)/capacity, 3)"
        if self.multimodal_scale == "x0.9":
            out += "; multimodal × 0.9"
        elif self.multimodal_scale == "vlm" and self.formula != "tp_table":
            out += "; multimodal × the ViT-size factor"
        if self.runner_multimodal_factor is not None:
            out += f"; the worker scales a multimodal model's fraction by {self.runner_multimodal_factor}"
        return out

    @property
    def mla_prefill_why(self) -> str:
        if self.mla_prefill_max_bs_min8192:
            return "MLA: min(8192, chunked_prefill_size)"
        return "MLA: 2048" if self.mla_prefill_2048 else "chunked_prefill_size (MLA too)"


# -- 0.4.0 … 0.4.7: a fraction by tp size (server_args.py ServerArgs.__post_init__) ----------------------
R_0_4_0 = RuleSet(
    name="0.4.0",
    releases="0.4.0",
    bands=_BANDS_0_4_0,
    fallback_fraction=0.88,
    gpu_none_raises=True,  # 0.4.0 compares gpu_mem < 25_000 unguarded (server_args.py:172)
    prefill_default="none",
    formula="tp_table",
    multimodal_scale="none",
    runner_multimodal_factor=0.95,  # model_runner.py:118
    pcg_term="none",
    fallback_max_bs=None,
)
R_0_4_0_POST1 = replace(
    R_0_4_0,
    name="0.4.0.post1",
    releases="0.4.0.post1 … 0.4.4.post3",
    bands=_BANDS_0_4_0_POST1,
    gpu_none_raises=False,
    fallback_chunk=8192,  # `gpu_mem is not None and gpu_mem < 25_000` else 8192
    fallback_max_bs=160,
)
R_0_4_4_POST4 = replace(
    R_0_4_0_POST1, name="0.4.4.post4", releases="0.4.4.post4 … 0.4.5.post2", runner_multimodal_factor=0.90
)
R_0_4_5_POST3 = replace(
    R_0_4_4_POST4,
    name="0.4.5.post3",
    releases="0.4.5.post3 … 0.4.6.post1",
    bands=_BANDS_0_4_5_POST3,
    table_max_mib=81920,
    above_table="flat_13g",
    gpu_none_raises=True,  # server_args.py:225 `if gpu_mem <= 81920` with gpu_mem None
    fallback_max_bs=None,
)
R_0_4_6_POST2 = replace(
    R_0_4_5_POST3,
    name="0.4.6.post2",
    releases="0.4.6.post2 … 0.4.6.post4",
    table_by_pp=True,
    above_table="0.88",
    blend_48g=True,
    pd_chunk=16384,
)
R_0_4_6_POST5 = replace(R_0_4_6_POST2, name="0.4.6.post5", releases="0.4.6.post5", gpu_none_raises=False)
R_0_4_7 = replace(
    R_0_4_6_POST5,
    name="0.4.7",
    releases="0.4.7",
    bands=_BANDS_0_4_7,
    blend_spec_reserve_mib=20480.0,
    b200_fraction=0.79,
    spec_scale=0.95,
)
# -- 0.4.7.post1 … 0.5.3rc0: a reserve by GPU band (server_args.py ServerArgs.__post_init__) -------------
R_0_4_7_POST1 = replace(
    R_0_4_7,
    name="0.4.7.post1",
    releases="0.4.7.post1 … 0.4.8.post1",
    formula="band_reserve",
    bands=_BANDS_0_4_7_POST1,
    table_by_pp=False,
    blend_48g=False,
    blend_spec_reserve_mib=None,
    b200_fraction=None,
    spec_scale=None,
    spec_standalone_mib=2048.0,
    spec_other_mib=2048.0,
    pd_chunk=None,
    fallback_chunk=4096,
)
R_0_4_9 = replace(
    R_0_4_7_POST1, name="0.4.9", releases="0.4.9 … 0.4.9.post2", multimodal_scale="x0.9", runner_multimodal_factor=None
)
R_0_4_9_POST3 = replace(R_0_4_9, name="0.4.9.post3", releases="0.4.9.post3 … 0.5.2rc2", multimodal_scale="vlm")
R_0_5_2 = replace(R_0_4_9_POST3, name="0.5.2", releases="0.5.2, 0.5.3rc0", spec_standalone_mib=6144.0)
# -- 0.5.3rc2 … 0.5.11: the term-by-term reserve (server_args.py _handle_gpu_memory_settings) -------------
R_0_5_3 = replace(
    R_0_5_2,
    name="0.5.3",
    releases="0.5.3rc2, 0.5.3",
    formula="terms",
    bands=_BANDS_0_5_3,
    spec_after_floor=True,
    spec_other_mib=2048.0,
    nsa_fraction=0.8,
    decode_ladder="0.5.3",
    prefill_caps=False,
    prefill_ladder="0.5.3.post2",
    fallback_max_bs=160,
)
R_0_5_3_POST1 = replace(
    R_0_5_3, name="0.5.3.post1", releases="0.5.3.post1 … 0.5.4", nsa_fraction=None, prefill_default="pcg_optin"
)
R_0_5_4_POST1 = replace(R_0_5_3_POST1, name="0.5.4.post1", releases="0.5.4.post1 … 0.5.5", bands=_BANDS_OLD)
R_0_5_5_POST1 = replace(
    R_0_5_4_POST1,
    name="0.5.5.post1",
    releases="0.5.5.post1 … 0.5.6.post2",
    pcg_term="max_tokens_div4",
    pcg_max_tokens_fixed=4096,
    decode_ladder="0.5.4.post2",
)
R_0_5_7 = replace(
    R_0_5_5_POST1, name="0.5.7", releases="0.5.7", pcg_term="max_tokens_div8", pcg_max_tokens_fixed=None,
    mla_prefill_2048=False,
)  # fmt: skip
R_0_5_8 = replace(
    R_0_5_7, name="0.5.8", releases="0.5.8, 0.5.8.post1", pcg_term="buckets", pcg_mla_flat=False,
    mla_prefill_2048=True, prefill_ladder="0.5.8",
)  # fmt: skip
R_0_5_9 = replace(R_0_5_8, name="0.5.9", releases="0.5.9", prefill_ladder="0.5.9")
R_0_5_10 = replace(
    R_0_5_9,
    name="0.5.10",
    releases="0.5.10rc0, 0.5.10, 0.5.10.post1",
    prefill_default="pcg",
    pcg_mla_flat=True,
    spec_other_mib=4096.0,
    prefill_caps=True,
    pcg_disabled_by_spec=True,
    decode_ladder="0.5.10",
    tc_disabled_archs=TC_DISABLED_ARCHS_0_5_10,
)
R_0_5_11 = replace(R_0_5_10, name="0.5.11", releases="0.5.11", pcg_disabled_by_spec=False)
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
    deepep_a2a_mib=DEEPEP_A2A_MIB,
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
        R_0_4_0,
        R_0_4_0_POST1,
        R_0_4_4_POST4,
        R_0_4_5_POST3,
        R_0_4_6_POST2,
        R_0_4_6_POST5,
        R_0_4_7,
        R_0_4_7_POST1,
        R_0_4_9,
        R_0_4_9_POST3,
        R_0_5_2,
        R_0_5_3,
        R_0_5_3_POST1,
        R_0_5_4_POST1,
        R_0_5_5_POST1,
        R_0_5_7,
        R_0_5_8,
        R_0_5_9,
        R_0_5_10,
        R_0_5_11,
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


def version_tuple(v: str) -> tuple[int, ...]:
    """'0.5.15.post1' → (0, 5, 15); 'v0.4.6.post2' → (0, 4, 6). Stops at the first non-number."""
    nums: list[int] = []
    for part in v.strip().lstrip("v").split("+")[0].replace(".post", ".x").replace("rc", ".x").split("."):
        if not part.isdigit():
            break
        nums.append(int(part))
    return tuple(nums)
