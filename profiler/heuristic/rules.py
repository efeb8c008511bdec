"""Rule sets: the parameters in which sglang releases' memory heuristics differ.

Each was read from the release's own source (`pip download --no-deps sglang==X`); the conformance tests
check each against the real release. One mechanism (`model.py`), one parameter record per family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from profiler.errors import MemfracError


@dataclass(frozen=True, slots=True)
class Band:
    """A GPU-size band of the capacity defaults: below `limit_gib` (None: the largest band)."""

    limit_gib: int | None
    chunk: int
    max_bs: int
    max_bs_large_tp: int  # when tp ≥ 4


@dataclass(frozen=True, slots=True)
class RuleSet:
    name: str
    releases: str
    bands: tuple[Band, ...]
    role_aware: bool  # PR #29615: decode activation sizing, role-gated graph and DP terms
    role_gating: bool  # resolution sets the other role's graph backend to disabled
    cap_max_bs_by_mrr: bool
    mla_prefill_max_bs: Callable[[int], int]
    mla_prefill_why: str
    clamp_prefill_to_context_length: bool
    deepep_a2a_mib: float
    prefill_bcg_deepep_mib: float
    deepep_align_prefill_bs: bool
    post_capture_base_mib: float | None
    fallback_fraction: float
    spec_after_floor: dict[str, float] = field(default_factory=dict)
    default_prefill_backend: bool | None = True  # None: this release has no prefill graph by default
    pp_disables_breakable: bool = True
    multimodal_disables_breakable: bool = True
    fallback_chunk: int = 4096
    fallback_max_bs: int = 160

    def band_for(self, gpu_mib: int) -> Band:
        for b in self.bands:
            if b.limit_gib is None or gpu_mib < b.limit_gib * 1024:
                return b
        return self.bands[-1]


_BANDS_NEW = (
    Band(20, 2048, 8, 8),
    Band(35, 4096, 48, 160),
    Band(60, 4096, 32, 160),
    Band(90, 8192, 256, 512),
    Band(160, 8192, 256, 512),
    Band(None, 16384, 512, 512),
)
_BANDS_OLD = (
    Band(20, 2048, 8, 8),
    Band(35, 2048, 24, 80),
    Band(60, 4096, 32, 160),
    Band(90, 8192, 256, 512),
    Band(160, 8192, 256, 512),
    Band(None, 16384, 512, 512),
)

R_0_5_20 = RuleSet(
    name="0.5.20+",
    releases="0.5.20 … 0.5.23 (srt/arg_groups/memory_hook.py)",
    bands=_BANDS_NEW,
    role_aware=True,
    role_gating=True,
    cap_max_bs_by_mrr=True,
    mla_prefill_max_bs=lambda chunk: min(8192, chunk),
    mla_prefill_why="MLA: min(8192, chunked_prefill_size)",
    clamp_prefill_to_context_length=False,
    deepep_a2a_mib=2048.0,
    prefill_bcg_deepep_mib=1024.0,
    deepep_align_prefill_bs=True,
    post_capture_base_mib=1536.0,
    fallback_fraction=0.95,
)

R_0_5_15 = RuleSet(
    name="0.5.15-0.5.19",
    releases="0.5.15 … 0.5.19 (ServerArgs._handle_gpu_memory_settings, PR #29615)",
    bands=_BANDS_NEW,
    role_aware=True,
    role_gating=True,
    cap_max_bs_by_mrr=True,
    mla_prefill_max_bs=lambda chunk: 2048,
    mla_prefill_why="MLA: 2048",
    clamp_prefill_to_context_length=True,
    deepep_a2a_mib=2048.0,
    prefill_bcg_deepep_mib=0.0,
    deepep_align_prefill_bs=False,
    post_capture_base_mib=None,
    fallback_fraction=0.88,
)

R_0_5_14 = RuleSet(
    name="<=0.5.14",
    releases="… 0.5.14 (ServerArgs._handle_gpu_memory_settings, before PR #29615)",
    bands=_BANDS_OLD,
    role_aware=False,
    role_gating=True,
    cap_max_bs_by_mrr=False,
    mla_prefill_max_bs=lambda chunk: 2048,
    mla_prefill_why="MLA: 2048",
    clamp_prefill_to_context_length=True,
    deepep_a2a_mib=0.0,
    prefill_bcg_deepep_mib=0.0,
    deepep_align_prefill_bs=False,
    post_capture_base_mib=None,
    fallback_fraction=0.88,
)

RULE_SETS: dict[str, RuleSet] = {r.name: r for r in (R_0_5_14, R_0_5_15, R_0_5_20)}
DEFAULT_RULES = R_0_5_20


def _version_tuple(v: str) -> tuple[int, ...]:
    core = v.split("+")[0]
    nums: list[int] = []
    for part in core.replace(".post", ".").replace("rc", ".").split("."):
        if not part.isdigit():
            break
        nums.append(int(part))
    return tuple(nums)


def rules_for(spec: str) -> RuleSet:
    """A rule set by its name (`0.5.20+`) or by any sglang release (`0.5.17`, `0.5.15.post1`)."""
    if spec in RULE_SETS:
        return RULE_SETS[spec]
    v = _version_tuple(spec)
    if len(v) < 3:
        raise MemfracError(f"unknown rule set or release {spec!r}; give a release like 0.5.17 or one of {', '.join(RULE_SETS)}")
    if v >= (0, 5, 20):
        return R_0_5_20
    if v >= (0, 5, 15):
        return R_0_5_15
    return R_0_5_14
