"""The term-by-term model of SGLang's auto-derived `mem_fraction_static`.

One mechanism, parametrised by a `RuleSet` per release family (see `rules.py`): the resolution steps that
feed the heuristic (GPU-size defaults, bs lists, role gating of graph backends, DeepEP bucket alignment,
max_bs capped by max_running_requests), then the terms in the order sglang adds them. Pure Python, no
sglang import: it runs anywhere and is checked against the real resolver by the conformance tests.

`evaluate` runs once for the numbers; the words (why each term is on or off, what each resolution step
did) come from the same function run again with `explain=True` only when someone reads them, so sweeping
thousands of configurations stays cheap without a second copy of the rules.
"""

from __future__ import annotations

import math
from functools import lru_cache, partial

from profiler.model.heuristic.constants import (
    ACTIVATION_MIB_PER_TOKEN,
    CONSTANT_MIB,
    DECODE_GRAPH_MIB_PER_BS,
    FLOOR_GPU_MIB,
    FLOOR_MIB,
    MIN_ACTIVATION_TOKENS,
    PARALLEL_MIB_PER_TP_PP,
    PREFILL_GRAPH_MIB_PER_BUCKET,
    PREFILL_GRAPH_MLA_MIB,
    XPU_MIB,
)
from profiler.model.heuristic.record import TERM_NAMES, HeuristicInputs, Reservation, Resolved, Step
from profiler.model.heuristic.rules import BCG_MULTIMODAL_OK, DEFAULT_RULES, Band, RuleSet

DISABLED = "disabled"
BREAKABLE = "breakable"
FULL = "full"
TC_PIECEWISE = "tc_piecewise"
PIECEWISE = "piecewise"  # 0.5.12–0.5.13: the piecewise prefill graph, on unless disabled
_DEFAULT_BACKEND = {
    "pcg": PIECEWISE, "tc": TC_PIECEWISE, "breakable": BREAKABLE, "disabled": DISABLED, "none": DISABLED,
    "pcg_optin": DISABLED,
}  # fmt: skip
_N = len(TERM_NAMES)
(CONSTANT, ACTIVATION, PARALLEL, DECODE_GRAPH, DP_PADDING, PREFILL_GRAPH, PREFILL_BCG_DEEPEP, FLOOR_TOPUP, DEEPEP_A2A,
 SPECULATIVE, XPU, VLM_SCALING, FRACTION_TABLE, BAND_BASE, BIG_GPU, DP_ATTENTION) = range(_N)  # fmt: skip


@lru_cache(maxsize=4096)
def decode_bs_list(max_bs: int, speculative: bool, no_padding: bool, ladder: str = "0.5.10") -> tuple[int, ...]:
    """sglang's decode capture ladder (`generate_decode_cuda_graph_batch_sizes`; before 0.5.14
    `ServerArgs._generate_cuda_graph_batch_sizes`: ≤ 0.5.4.post1 the speculative ladder stops at 60 in its
    40…64 stretch, and max_bs itself is appended only from 0.5.10)."""
    if no_padding:
        bs = list(range(1, max_bs + 1))
    elif not speculative:
        bs = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    else:
        end = 64 if ladder == "0.5.3" else 65
        bs = [*range(1, 9), *range(10, 33, 2), *range(40, end, 4), *range(72, 257, 8), *range(272, max_bs + 1, 16)]
    bs = [b for b in bs if b <= max_bs]
    if max_bs not in bs and ladder == "0.5.10":
        bs.append(max_bs)
    return tuple(bs)


_PREFILL_LADDER = (
    *range(4, 33, 4),
    *range(48, 257, 16),
    *range(288, 513, 32),
    *range(576, 1025, 64),
    *range(1280, 4097, 256),
)


_PREFILL_LADDERS = {
    # ServerArgs._generate_piecewise_cuda_graph_tokens, 0.5.3.post2–0.5.7 and 0.5.8
    "0.5.3.post2": (*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(640, 4097, 128)),
    "0.5.8": (*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(640, 1025, 64),
              *range(1280, 4097, 256)),
    "0.5.9": _PREFILL_LADDER,
}  # fmt: skip


@lru_cache(maxsize=4096)
def prefill_bs_list(max_bs: int, ladder: str = "0.5.9") -> tuple[int, ...]:
    """sglang's prefill (token-bucket) capture ladder (`generate_prefill_cuda_graph_batch_sizes`; the
    piecewise-token list of 0.5.3.post2–0.5.13 — 0.5.3.post2–0.5.7 step 256 from 4352, later 512 from 4608)."""
    tail = range(4352, max_bs + 1, 256) if ladder == "0.5.3.post2" else range(4608, max_bs + 1, 512)
    return tuple(b for b in (*_PREFILL_LADDERS[ladder], *tail) if b <= max_bs)


@lru_cache(maxsize=4096)
def _deepep_aligned(bs: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted({(b + 7) // 8 * 8 for b in bs}))


def resolve(inp: HeuristicInputs, rules: RuleSet = DEFAULT_RULES, steps: list[Step] | None = None) -> Resolved:
    """Run the resolution steps that precede the heuristic; say what each did into `steps` when given."""
    say = steps.append if steps is not None else None
    gpu = inp.gpu_mem_mib
    pd_off = rules.pd_prefill_disables_graphs and inp.mode == "prefill"
    disable_all = inp.disable_cuda_graph or pd_off
    locked_decode = disable_all or inp.decode_backend is not None
    # 0.5.10–0.5.13 have only an off-switch for the piecewise prefill graph, 0.5.3.post2–0.5.9 only an on-switch
    # (--enable-piecewise-cuda-graph), older releases no prefill graph at all
    pcg = rules.prefill_default == "pcg"
    optin = rules.prefill_default == "pcg_optin"
    no_prefill_graph = rules.prefill_default == "none"
    if optin:
        explicit_prefill: str | None = DISABLED if inp.prefill_backend in (None, DISABLED) else PIECEWISE
    elif no_prefill_graph:
        explicit_prefill = DISABLED
    else:
        explicit_prefill = inp.prefill_backend if not pcg or inp.prefill_backend == DISABLED else None
    prefill_off = disable_all and not (pcg or optin or no_prefill_graph)  # piecewise ignores --disable-cuda-graph
    locked_prefill = prefill_off or explicit_prefill is not None

    # graph backends: the legacy switch, explicit choices, the platform default
    kind = rules.prefill_default
    if inp.platform == "non-cuda" and rules.offcuda_prefill_default != "same":
        kind = rules.offcuda_prefill_default
    default_prefill = _DEFAULT_BACKEND[kind]
    decode_backend = inp.decode_backend or (DISABLED if disable_all else FULL)
    prefill_backend = explicit_prefill or (DISABLED if prefill_off else default_prefill)
    if say:
        if pd_off:
            say(Step("pd_hook", "prefill node: the PD hook sets --disable-cuda-graph (0.5.13–0.5.15)"))
        if inp.disable_cuda_graph:
            say(Step("graph_backends", "--disable-cuda-graph: decode and prefill graph backends disabled"))
        elif explicit_prefill is None and not prefill_off:
            say(Step("graph_backends", f"prefill graph backend defaults to {default_prefill}"))
        if no_prefill_graph:
            say(Step("graph_backends", f"sglang {rules.name}: no prefill CUDA graph in this release"))
        elif optin:
            say(Step("graph_backends", "piecewise prefill graph " + (
                "off (opt-in with --enable-piecewise-cuda-graph)" if explicit_prefill == DISABLED
                else "on: --enable-piecewise-cuda-graph")))  # fmt: skip

    # compatibility rules that switch the default prefill graph off (skipped when the user chose a backend)
    if not locked_prefill and prefill_backend != DISABLED:
        why = _prefill_incompatible(inp, rules, prefill_backend)
        if why:
            prefill_backend = DISABLED
            if say:
                say(Step("graph_compat", f"{default_prefill} prefill graph disabled: {why}"))

    prefill_bs = inp.prefill_bs
    prefill_max_bs = inp.prefill_max_bs
    # DeepEP: breakable prefill buckets aligned to multiples of 8, before prefill max_bs is known
    if rules.deepep_align_prefill_bs and prefill_backend == BREAKABLE and inp.moe_a2a_backend == "deepep":
        src = prefill_bs if prefill_bs is not None else prefill_bs_list(prefill_max_bs or 2048)
        aligned = _deepep_aligned(src)
        if aligned != tuple(sorted(src)):
            prefill_bs, prefill_max_bs = aligned, aligned[-1]
            if say:
                from_default = inp.prefill_bs is None and inp.prefill_max_bs is None
                say(Step(
                    "deepep_bucket_alignment",
                    f"DeepEP + breakable prefill graph: buckets aligned to multiples of 8 → {len(aligned)} buckets, "
                    f"max_bs {prefill_max_bs}" + (" (from the 2048-token default list)" if from_default else ""),
                ))  # fmt: skip

    # role gating: a prefill node's decode graph and a decode node's prefill graph
    if rules.role_gating:
        if inp.mode == "prefill" and not locked_decode and decode_backend != DISABLED:
            decode_backend = DISABLED
            if say:
                say(Step("role_gating", "prefill node: decode graph backend disabled (the user did not set it)"))
        elif inp.mode == "decode" and not locked_prefill and prefill_backend != DISABLED:
            prefill_backend = DISABLED
            if say:
                say(Step("role_gating", "decode node: prefill graph backend disabled (the user did not set it)"))

    # GPU-size defaults for values left unset
    chunk = inp.chunked_prefill_size
    decode_max_bs = inp.decode_max_bs
    if chunk is None or decode_max_bs is None:
        if gpu is not None:
            band: Band | None = rules.band_for(gpu)
            d_chunk, d_bs = band.chunk, (band.max_bs_large_tp if inp.tp >= 4 else band.max_bs)  # type: ignore[union-attr]
        else:
            band, d_chunk, d_bs = None, rules.fallback_chunk, rules.fallback_max_bs
        # 0.4.6.post2–0.4.7: PD nodes chunk 16384 unless the GPU is under 25000 MB
        small = rules.bands[0].limit_mib
        pd_chunk = rules.pd_chunk is not None and inp.mode != "null" and (gpu is None or small is None or gpu >= small)
        if pd_chunk:
            d_chunk = rules.pd_chunk  # type: ignore[assignment]
        if say:
            parts = []
            if chunk is None:
                parts.append(f"chunked_prefill_size {d_chunk}")
            if chunk is None and pd_chunk:
                parts[-1] += " (PD node)"
            if decode_max_bs is None:
                tp_note = (
                    f" (tp {'≥' if inp.tp >= 4 else '<'} 4)" if band and band.max_bs != band.max_bs_large_tp else ""
                )
                parts.append(
                    f"decode max_bs {d_bs}{tp_note}" if d_bs is not None
                    else "decode max_bs left unset (the CUDA-graph runner picks its capture list at start)"
                )  # fmt: skip
            say(Step("gpu_size_defaults", f"{gpu} MiB, {_band_words(band)}: " + ", ".join(parts)))
        if chunk is None:
            chunk = d_chunk
        if decode_max_bs is None:
            decode_max_bs = d_bs
            mrr = inp.max_running_requests
            if rules.cap_max_bs_by_mrr and mrr is not None and decode_max_bs is not None and decode_max_bs > mrr:
                if say:
                    say(
                        Step(
                            "max_bs_cap",
                            f"defaulted decode max_bs {decode_max_bs} lowered to max_running_requests {mrr}",
                        )
                    )
                decode_max_bs = mrr

    # capture lists
    if inp.decode_bs is None and decode_max_bs is None:
        decode_bs: tuple[int, ...] = ()  # left to the runner (before 0.5.3rc2)
    elif inp.decode_bs is None:
        decode_bs = decode_bs_list(
            decode_max_bs,  # type: ignore[arg-type]
            inp.speculative_algorithm is not None,
            inp.disable_cuda_graph_padding,
            rules.decode_ladder,
        )
    else:
        decode_bs = inp.decode_bs
        decode_max_bs = max(decode_bs)
        if say:
            say(Step("decode_bs", f"explicit decode bs list ({len(decode_bs)} sizes): max_bs = {decode_max_bs}"))

    if prefill_max_bs is None:
        if rules.pcg_max_tokens_fixed is not None:
            prefill_max_bs = rules.pcg_max_tokens_fixed
            why = "the piecewise_cuda_graph_max_tokens default"
        elif inp.is_mla:
            prefill_max_bs = rules.mla_prefill_max_bs(chunk)
            why = rules.mla_prefill_why
        else:
            prefill_max_bs = chunk
            why = "chunked_prefill_size"
        if (
            rules.pp_prefill_cap
            and inp.pp > 1
            and prefill_backend == BREAKABLE
            and inp.prefill_bs is None
            and prefill_max_bs > 8192
        ):
            prefill_max_bs = 8192
            why += ", capped at 8192 with pp > 1"
        if rules.prefill_caps and inp.max_total_tokens is not None and inp.max_total_tokens < prefill_max_bs:
            prefill_max_bs = inp.max_total_tokens
            why += ", capped by max_total_tokens"
        if rules.prefill_caps and prefill_max_bs > 4096 and "llama-2" in inp.model_path.lower():
            prefill_max_bs = 4096
            why += ", capped at 4096 for llama-2"
        if say and prefill_backend != DISABLED:
            say(Step("prefill_max_bs", f"prefill graph max_bs {prefill_max_bs} ({why})"))
    if rules.context_length_clamp and inp.context_length is not None and inp.context_length < prefill_max_bs:
        prefill_max_bs = inp.context_length
        if say:
            say(Step("prefill_max_bs", f"prefill graph max_bs clamped to context_length {prefill_max_bs}"))
    if no_prefill_graph:
        prefill_bs, prefill_max_bs = (), 0  # nothing to capture in this release
    elif prefill_bs is None:
        prefill_bs = prefill_bs_list(prefill_max_bs, rules.prefill_ladder)

    post_capture = rules.post_capture_base_mib is not None and _post_capture_planned(
        inp, rules, chunk, decode_backend, prefill_backend, prefill_bs
    )
    return Resolved(
        gpu, chunk, inp.max_prefill_tokens, inp.max_running_requests, decode_backend, decode_max_bs, decode_bs,
        prefill_backend, prefill_max_bs, prefill_bs, post_capture,
    )  # fmt: skip


def _band_words(band: Band | None) -> str:
    if band is None:
        return "GPU size unknown"
    if band.limit_mib is None:
        return "largest band"
    gib = band.limit_mib / 1024
    return f"band < {gib:g} GiB" if gib == int(gib) else f"band < {band.limit_mib} MiB"


def _post_capture_planned(
    inp: HeuristicInputs,
    rules: RuleSet,
    chunk: int,
    decode_backend: str,
    prefill_backend: str,
    prefill_bs: tuple[int, ...],
) -> bool:
    """`post_capture_kv_sizing_planned` for what the model knows (CUDA, no DCP, sharding or memory saver)."""
    if not inp.post_capture_env or inp.platform != "cuda" or inp.is_mla:
        return False
    if rules.post_capture_excludes_dp_attention and inp.attn_dp > 1:
        return False
    if inp.mode != "prefill" and decode_backend == DISABLED:
        return False
    if inp.mode != "decode":
        if prefill_backend == DISABLED:
            return False
        if rules.post_capture_checks_prefill_coverage and (chunk <= 0 or chunk > max(prefill_bs or (0,))):
            return False
    return True


_DSA_ARCHS = frozenset({"DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"})
_A2A_VALIDATED = frozenset({"none", "deepep", "megamoe", "flashinfer"})


def _prefill_incompatible(inp: HeuristicInputs, rules: RuleSet, backend: str) -> str:
    """Why sglang's compatibility pass turns this default prefill graph off ("" = it stays on)."""
    if backend in (PIECEWISE, TC_PIECEWISE):
        if inp.architecture in rules.tc_disabled_archs:
            return f"architecture {inp.architecture}"
        if rules.pcg_disabled_by_spec and inp.speculative_algorithm is not None:
            return "speculative decoding"
        if inp.mode != "null":
            return "PD disaggregation"
        if inp.attn_dp > 1:
            return "DP attention"
        if inp.pp > 1:
            return "pp > 1"
        if inp.moe_a2a_backend != "none":
            return f"moe_a2a_backend {inp.moe_a2a_backend}"
        if inp.is_multimodal:
            return "multimodal model"
        return ""
    if backend == BREAKABLE:
        if rules.pp_disables_breakable and inp.pp > 1:
            return "pp > 1 (opt in with an explicit prefill backend)"
        if (
            rules.bcg_disables_mla
            and inp.is_mla
            and not (rules.deepep_align_prefill_bs and inp.architecture in _DSA_ARCHS)
        ):
            return "MLA model"
        if inp.architecture.startswith("DeepseekV4"):
            return "DeepSeek-V4"
        if rules.bcg_disables_any_a2a and inp.moe_a2a_backend != "none":
            return f"moe_a2a_backend {inp.moe_a2a_backend}"
        if not rules.bcg_disables_any_a2a and inp.moe_a2a_backend not in _A2A_VALIDATED:
            return f"unvalidated a2a backend {inp.moe_a2a_backend}"
        if rules.bcg_disables_dp_attention and inp.attn_dp > 1:
            return "DP attention"
        if inp.is_multimodal and not (rules.bcg_multimodal_allowlist and inp.architecture in BCG_MULTIMODAL_OK):
            return "multimodal model"
    return ""


def evaluate(
    inp: HeuristicInputs, rules: RuleSet, explain: bool = False
) -> tuple[Resolved, list[float], list[bool], list[str] | None, list[Step] | None, float, float, tuple[str, ...]]:
    """The heuristic itself: (resolved, MiB per term, on per term, reasons, steps, total, fraction, flags).

    Reasons and steps are produced only with `explain=True`; the numbers are identical either way.
    """
    steps: list[Step] | None = [] if explain else None
    res = resolve(inp, rules, steps)
    if rules.formula != "terms":
        return _evaluate_formula(inp, rules, res, steps, explain)
    gpu = inp.gpu_mem_mib
    mode = inp.mode
    mib = [0.0] * _N
    on = [False] * _N
    why: list[str] | None = [""] * _N if explain else None
    flags: list[str] = []
    role_aware = rules.role_aware
    deepep = inp.moe_a2a_backend == "deepep"
    par = inp.tp * inp.pp * PARALLEL_MIB_PER_TP_PP
    mib[PARALLEL], on[PARALLEL] = par, True

    if res.post_capture_sizing:
        flags.append("post_capture_sizing")
        base = rules.post_capture_base_mib or 0.0
        mib[CONSTANT], on[CONSTANT] = base, True
        total = base + par
        if why is not None:
            why[CONSTANT] = f"post-capture KV sizing planned: fixed base {base:g} MiB"
            why[PARALLEL] = f"tp {inp.tp} × pp {inp.pp} / 8 × 1024"
            for i in (ACTIVATION, DECODE_GRAPH, DP_PADDING, PREFILL_GRAPH, PREFILL_BCG_DEEPEP, FLOOR_TOPUP, DEEPEP_A2A,
                      SPECULATIVE, XPU):  # fmt: skip
                why[i] = "post-capture sizing: measured after graph capture instead"
    else:
        mib[CONSTANT], on[CONSTANT] = CONSTANT_MIB, True
        # activation slack
        if role_aware and mode == "decode":
            running = inp.max_running_requests or res.decode_max_bs or 1
            draft = inp.speculative_num_draft_tokens or 1
            tokens = max(running * draft, MIN_ACTIVATION_TOKENS)
            if why is not None:
                src = "max_running_requests" if inp.max_running_requests else "decode max_bs"
                why[ACTIVATION] = (
                    f"decode node: max({src} {running} × draft tokens {draft}, 2048) = {tokens} tokens × 1.5"
                )
        elif res.chunked_prefill_size > 0:
            tokens = max(res.chunked_prefill_size, MIN_ACTIVATION_TOKENS)
            if why is not None:
                why[ACTIVATION] = f"max(chunked_prefill_size {res.chunked_prefill_size}, 2048) = {tokens} tokens × 1.5"
        else:
            tokens = max(res.max_prefill_tokens, MIN_ACTIVATION_TOKENS)
            if why is not None:
                why[ACTIVATION] = (
                    f"chunking off: max(max_prefill_tokens {res.max_prefill_tokens}, 2048) = {tokens} tokens × 1.5"
                )
        act = tokens * ACTIVATION_MIB_PER_TOKEN
        mib[ACTIVATION], on[ACTIVATION] = act, True
        total = CONSTANT_MIB + act + par
        if why is not None:
            why[CONSTANT] = "constant metadata (attention backends etc.)"
            why[PARALLEL] = f"tp {inp.tp} × pp {inp.pp} / 8 × 1024"

        # decode graph
        max_bs = res.decode_max_bs
        if not role_aware or (res.decode_backend != DISABLED and mode != "prefill"):
            mib[DECODE_GRAPH], on[DECODE_GRAPH] = max_bs * DECODE_GRAPH_MIB_PER_BS, True
            total += max_bs * DECODE_GRAPH_MIB_PER_BS
            if why is not None:
                why[DECODE_GRAPH] = f"decode max_bs {max_bs} × 2 MiB" + (
                    "" if role_aware else " (added unconditionally before PR #29615)"
                )
        elif why is not None:
            why[DECODE_GRAPH] = (
                "prefill node" if role_aware and mode == "prefill" else f"decode graph backend {res.decode_backend}"
            )

        # DP-attention padding (older releases spell the width --dp-size with --enable-dp-attention)
        width = inp.attn_dp
        dp_on = width > 1
        if dp_on and not (role_aware and mode == "prefill"):
            pad = max_bs * width * 3
            if max_bs > 300:
                pad += max_bs * width * 1.5
            mib[DP_PADDING], on[DP_PADDING] = pad, True
            total += pad
            if why is not None:
                why[DP_PADDING] = f"attention DP {width}: max_bs {max_bs} × {width} × 3" + (
                    f" + (max_bs > 300) {max_bs} × {width} × 1.5" if max_bs > 300 else ""
                )
        elif why is not None:
            why[DP_PADDING] = "no attention DP" if not dp_on else "prefill node"

        # prefill graph (+ the breakable-graph DeepEP delta)
        late_pcg = rules.pcg_term in ("max_tokens_div4", "max_tokens_div8")
        if rules.pcg_term == "none":
            if why is not None:
                why[PREFILL_GRAPH] = f"rule set {rules.name} reserves nothing for a prefill graph"
                why[PREFILL_BCG_DEEPEP] = "no prefill graph term"
        elif late_pcg:
            if why is not None:
                why[PREFILL_BCG_DEEPEP] = f"rule set {rules.name} has no prefill-BCG DeepEP delta"
        elif res.prefill_backend != DISABLED and not (role_aware and mode == "decode"):
            flat = inp.is_mla and rules.pcg_mla_flat
            pg = PREFILL_GRAPH_MLA_MIB if flat else len(res.prefill_bs) * PREFILL_GRAPH_MIB_PER_BUCKET
            mib[PREFILL_GRAPH], on[PREFILL_GRAPH] = pg, True
            total += pg
            if why is not None:
                why[PREFILL_GRAPH] = (
                    "MLA model: fixed 1.5 GiB"
                    if flat
                    else f"{len(res.prefill_bs)} prefill buckets (up to {res.prefill_max_bs} tokens) × 8 MiB"
                )
            if rules.prefill_bcg_deepep_mib and res.prefill_backend == BREAKABLE and deepep:
                d = rules.prefill_bcg_deepep_mib
                mib[PREFILL_BCG_DEEPEP], on[PREFILL_BCG_DEEPEP] = d, True
                total += d
                if why is not None:
                    why[PREFILL_BCG_DEEPEP] = "breakable prefill graph with DeepEP: bridge pool + NVL first touch"
            elif why is not None:
                why[PREFILL_BCG_DEEPEP] = (
                    f"rule set {rules.name} has no prefill-BCG DeepEP delta"
                    if not rules.prefill_bcg_deepep_mib
                    else (
                        "moe_a2a_backend is not deepep"
                        if not deepep
                        else f"prefill graph backend {res.prefill_backend}"
                    )
                )
        elif why is not None:
            why[PREFILL_GRAPH] = (
                "decode node" if role_aware and mode == "decode" else f"prefill graph backend {res.prefill_backend}"
            )
            why[PREFILL_BCG_DEEPEP] = "no prefill graph"

        # the 10 GiB floor on GPUs above 60 GiB
        if gpu is not None and gpu > FLOOR_GPU_MIB and total < FLOOR_MIB:
            mib[FLOOR_TOPUP], on[FLOOR_TOPUP] = FLOOR_MIB - total, True
            flags.append("floor_applied")
            if why is not None:
                why[FLOOR_TOPUP] = f"10 GiB floor on a {gpu} MiB GPU lifts {total:g} MiB of terms to 10240"
            total = FLOOR_MIB
        elif why is not None:
            why[FLOOR_TOPUP] = (
                "GPU size unknown"
                if gpu is None
                else ("GPU ≤ 60 GiB: no floor" if gpu <= 60 * 1024 else "terms already ≥ 10 GiB")
            )

        # DeepEP all-to-all, after the floor
        if rules.deepep_a2a_mib and deepep and mode != "prefill" and res.decode_backend != DISABLED:
            mib[DEEPEP_A2A], on[DEEPEP_A2A] = rules.deepep_a2a_mib, True
            total += rules.deepep_a2a_mib
            if why is not None:
                why[DEEPEP_A2A] = "DeepEP buffers in the decode graph: hard-coded 2 GiB, added after the floor"
        elif why is not None:
            why[DEEPEP_A2A] = (
                "moe_a2a_backend is not deepep" if not deepep
                else f"rule set {rules.name} has no DeepEP term" if not rules.deepep_a2a_mib
                else "prefill node" if mode == "prefill"
                else "decode graph disabled"
            )  # fmt: skip

        # speculative draft reserve (0.5.12–0.5.13), after the floor
        alg = inp.speculative_algorithm
        spec = 0.0
        if rules.spec_after_floor and alg is not None:  # compared before sglang upper-cases it
            spec = 6144.0 if alg == "STANDALONE" else (0.0 if alg == "NGRAM" else rules.spec_other_mib)
        if spec:
            mib[SPECULATIVE], on[SPECULATIVE] = spec, True
            total += spec
            if why is not None:
                why[SPECULATIVE] = f"{inp.speculative_algorithm} draft model: +{spec:g} MiB after the floor"
        elif why is not None:
            why[SPECULATIVE] = (
                f"rule set {rules.name} has no speculative reserve" if not rules.spec_after_floor
                else "no draft model" if alg is None else "NGRAM drafts need no reserve"
            )  # fmt: skip

        # 0.5.5.post1–0.5.7: the piecewise prefill graph's max tokens // 4 (// 8), after the floor
        if late_pcg:
            if res.prefill_backend != DISABLED:
                div = 4 if rules.pcg_term == "max_tokens_div4" else 8
                pg = float(res.prefill_max_bs // div)
                mib[PREFILL_GRAPH], on[PREFILL_GRAPH] = pg, True
                total += pg
                if why is not None:
                    why[PREFILL_GRAPH] = (
                        f"piecewise prefill graph: max tokens {res.prefill_max_bs} // {div}, added after the floor"
                    )
            elif why is not None:
                why[PREFILL_GRAPH] = "piecewise prefill graph off"

        if rules.xpu_term and inp.platform == "xpu":
            mib[XPU], on[XPU] = XPU_MIB, True
            total += XPU_MIB
            if why is not None:
                why[XPU] = "XPU: oneDNN scratch for unaligned matmuls"
        elif why is not None:
            why[XPU] = "not XPU"

    if gpu is None:
        frac = rules.fallback_fraction
        flags.append("gpu_mem_unknown")
    else:
        frac = round((gpu - total) / gpu, 3)
    # VLM scaling multiplies the fraction (not on a decode node after #29615)
    if inp.is_multimodal and gpu is not None and not (rules.vlm_skip_decode and mode == "decode"):
        new = _vlm_adjust(frac, inp, res.post_capture_sizing and rules.vlm_post_capture, gpu)
        mib[VLM_SCALING], on[VLM_SCALING] = (frac - new) * gpu, True
        if why is not None:
            why[VLM_SCALING] = f"multimodal model: fraction {frac:.3f} → {new:.4f}"
        frac = new
    elif why is not None:
        why[VLM_SCALING] = "not a multimodal model" if not inp.is_multimodal else "decode node"
    if rules.nsa_fraction is not None and inp.architecture in _NSA_ARCHS:
        frac = rules.nsa_fraction
        flags.append("model_override")
        if steps is not None:
            steps.append(Step("model_override", f"DeepSeek NSA model: mem_fraction_static forced to {frac} "
                              "(server_args.py _handle_model_specific_adjustments), even when given"))  # fmt: skip
    return _finish(inp, rules, res, mib, on, why, steps, total, frac, flags)


_NSA_ARCHS = frozenset({"DeepseekV32ForCausalLM"})
#: How a term's reason starts when the rule set's mechanism has no such term (explain hides those rows).
NOT_IN_RULE = "not part of the"


def _finish(
    inp: HeuristicInputs,
    rules: RuleSet,
    res: Resolved,
    mib: list[float],
    on: list[bool],
    why: list[str] | None,
    steps: list[Step] | None,
    total: float,
    frac: float,
    flags: list[str],
) -> tuple[Resolved, list[float], list[bool], list[str] | None, list[Step] | None, float, float, tuple[str, ...]]:
    """The flags every rule set sets the same way, and the words for terms a rule set never uses."""
    if frac <= 0:
        flags.append("fraction_nonpositive")
    if inp.mem_fraction_static is not None:
        flags.append("given_by_user")
    if inp.unmodeled:
        flags.append("unmodeled_flags")
    if rules.runner_multimodal_factor is not None and inp.is_multimodal:
        flags.append("runner_scales_fraction")
        if steps is not None:
            k = rules.runner_multimodal_factor
            steps.append(Step("runner_scaling", f"multimodal model: the worker's ModelRunner multiplies the fraction "
                              f"by {k} at start (not in the printed server_args)"))  # fmt: skip
    if why is not None:
        old_formula = rules.formula != "terms"
        for i in range(_N):
            if not why[i]:
                why[i] = (
                    f"{NOT_IN_RULE} {rules.name} rule (a formula, not a sum of terms)" if old_formula
                    else f"{NOT_IN_RULE} {rules.name} rule (used before 0.5.3rc2)"
                )  # fmt: skip
    return res, mib, on, why, steps, total, frac, tuple(flags)


def reserve(inp: HeuristicInputs, rules: RuleSet = DEFAULT_RULES) -> Reservation:
    """Model sglang's reservation for `inp` under `rules`: every term, the total and the fraction."""
    res, mib, on, _, _, total, frac, flags = evaluate(inp, rules)
    given = inp.mem_fraction_static is not None and "model_override" not in flags
    mfs = inp.mem_fraction_static if given else frac
    explainer = partial(evaluate, inp, rules, explain=True)
    return Reservation(rules, inp, res, tuple(mib), tuple(on), total, frac, mfs, flags, explainer)


def _vlm_adjust(frac: float, inp: HeuristicInputs, post_capture: bool, gpu: int) -> float:
    """`adjust_mem_fraction_for_vlm`: a factor from the vision tower size (ViT-L/14 baseline)."""
    if post_capture:
        return frac - 8 * 1024 / gpu
    if inp.vit_layers is None and inp.vit_hidden is None:
        return frac
    layers = inp.vit_layers if inp.vit_layers is not None else 24
    hidden = inp.vit_hidden if inp.vit_hidden is not None else 1024
    ratio = layers * hidden**2 / (24 * 1024**2)
    factor = max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))
    return frac * 0.95 * factor


def _tp_table(ps: int) -> float:
    """0.4.0–0.4.7 `ServerArgs.__post_init__`: the fraction by tp (tp·pp from 0.4.6.post2) size."""
    if ps >= 16:
        return 0.79
    if ps >= 8:
        return 0.81
    if ps >= 4:
        return 0.85
    if ps >= 2:
        return 0.87
    return 0.88


def _band_reserve(gpu: int, ps: int) -> tuple[float, float, str]:
    """0.4.7.post1–0.5.3rc0: (reserve MiB as sglang computes it, its base part, the band in words)."""
    if gpu < 20 * 1024:
        return (2.8 + ps / 10) * 1024, 2.8 * 1024, "< 20 GiB: 2.8 GiB + tp·pp/10 GiB"
    if gpu < 35 * 1024:
        return (2.8 + ps / 10) * 1024, 2.8 * 1024, "< 35 GiB: 2.8 GiB + tp·pp/10 GiB"
    if gpu < 90 * 1024:
        return (9.5 + ps / 2) * 1024, 9.5 * 1024, "< 90 GiB: 9.5 GiB + tp·pp/2 GiB"
    if gpu < 100 * 1024:
        return (12 + ps / 2) * 1024, 12.0 * 1024, "< 100 GiB: 12 GiB + tp·pp/2 GiB"
    if gpu < 160 * 1024:
        return (12 + ps / 2) * 1024, 12.0 * 1024, "< 160 GiB: 12 GiB + tp·pp/2 GiB"
    return 32 * 1024.0, 32 * 1024.0, "≥ 160 GiB: 32 GiB flat"


def _evaluate_formula(
    inp: HeuristicInputs, rules: RuleSet, res: Resolved, steps: list[Step] | None, explain: bool
) -> tuple[Resolved, list[float], list[bool], list[str] | None, list[Step] | None, float, float, tuple[str, ...]]:
    """Releases before 0.5.3rc2: the fraction by sglang's own formula, float for float, then split into terms.

    The fraction is computed exactly as the release does (same expressions, same order, rounding only where
    it rounds); the terms are `gpu_mem × (1 − fraction)` attributed to what produced it, for reading.
    """
    gpu = inp.gpu_mem_mib
    mib = [0.0] * _N
    on = [False] * _N
    why: list[str] | None = [""] * _N if explain else None
    flags: list[str] = []
    spec = inp.speculative_algorithm
    ps = inp.tp * inp.pp

    def put(i: int, m: float, reason: str) -> None:
        mib[i], on[i] = m, True
        if why is not None:
            why[i] = reason

    if gpu is None:
        flags.append("gpu_mem_unknown")
    if gpu is None and rules.gpu_none_raises:
        flags.append("no_fraction_without_gpu_size")
        if why is not None:
            for i in (FRACTION_TABLE, BAND_BASE, BIG_GPU):
                why[i] = f"sglang {rules.name} compares the GPU size unguarded: it raises TypeError when unknown"
        return _finish(inp, rules, res, mib, on, why, steps, math.nan, math.nan, flags)

    if rules.formula == "tp_table":
        key = ps if rules.table_by_pp else inp.tp
        what = f"tp·pp {key}" if rules.table_by_pp else f"tp {key}"
        if rules.table_max_mib is None or (gpu is not None and gpu <= rules.table_max_mib):
            frac = _tp_table(key)
            where = "" if rules.table_max_mib is None else f" (GPU ≤ {rules.table_max_mib} MiB)"
            base_reason = f"{what} → {frac} (≥16 0.79, ≥8 0.81, ≥4 0.85, ≥2 0.87, else 0.88){where}"
            if gpu is not None:
                put(FRACTION_TABLE, gpu * (1 - frac), f"{base_reason}: {gpu} MiB × (1 − {frac})")
            elif why is not None:
                why[FRACTION_TABLE] = f"{base_reason}; GPU size unknown, so no MiB"
        elif gpu is None:  # 0.4.6.post5+: `gpu_mem is not None and …` falls to 0.88
            frac = 0.88
            if why is not None:
                why[FRACTION_TABLE] = "GPU size unknown: 0.88; no MiB"
        elif rules.above_table == "flat_13g":
            frac = (gpu - 1024 * 13) / gpu
            put(BAND_BASE, 13 * 1024.0, f"GPU > {rules.table_max_mib} MiB: (capacity − 13 GiB) / capacity, not rounded")
        else:
            frac = 0.88
            put(FRACTION_TABLE, gpu * (1 - frac), f"GPU > {rules.table_max_mib} MiB: 0.88 → {gpu} MiB × 0.12")
        before = frac
        if rules.b200_fraction is not None and gpu is not None and gpu > 180 * 1000 and inp.platform == "cuda":
            frac = rules.b200_fraction
            put(BIG_GPU, gpu * (1 - frac) - gpu * (1 - before), f"CUDA GPU > 180000 MiB: {frac} instead of {before}")
        elif rules.blend_48g and gpu is not None and gpu > 96 * 1024:
            reserve_mem = 1024 * 18
            if rules.blend_spec_reserve_mib is not None and spec is not None:
                reserve_mem = 1024 * 20
            frac = min(before + 48 * 1024 * (1 - before) / gpu, (gpu - reserve_mem) / gpu)
            put(
                BIG_GPU,
                gpu * (1 - frac) - gpu * (1 - before),
                f"GPU > 96 GiB: min({before} + 48 GiB × (1 − {before}) / {gpu}, ({gpu} − {reserve_mem // 1024} GiB)"
                f" / {gpu}) = {frac:.4f}" + (" (20 GiB with speculative decoding)" if reserve_mem == 20480 else ""),
            )
        elif rules.spec_scale is not None and spec is not None:
            new = before * rules.spec_scale
            if gpu is not None:
                put(SPECULATIVE, gpu * (before - new), f"{spec}: fraction × {rules.spec_scale} on GPUs ≤ 96 GiB")
            elif why is not None:
                why[SPECULATIVE] = f"{spec}: fraction × {rules.spec_scale}; GPU size unknown, so no MiB"
            frac = new
    else:  # band_reserve
        if gpu is not None:
            reserved, base, band = _band_reserve(gpu, ps)
            put(BAND_BASE, base, f"GPU band {band}")
            if reserved != base:
                put(PARALLEL, reserved - base, f"tp {inp.tp} × pp {inp.pp} = {ps} / {10 if gpu < 35 * 1024 else 2} GiB")
            if spec is not None:
                extra = rules.spec_standalone_mib if spec == "STANDALONE" else 2 * 1024
                reserved += extra
                put(SPECULATIVE, extra, f"{spec} draft model: + {extra / 1024:g} GiB")
            if inp.attn_dp > 1:
                reserved += rules.dp_attention_mib
                put(DP_ATTENTION, rules.dp_attention_mib, "--enable-dp-attention: + 4 GiB")
            frac = round((gpu - reserved) / gpu, 3)
        else:
            frac = rules.fallback_fraction
            flags.append("fallback_fraction")
            if why is not None:
                why[BAND_BASE] = f"GPU size unknown: sglang falls back to {frac}; no MiB"
    if why is not None:
        if not why[PARALLEL]:
            why[PARALLEL] = "no tp·pp term in this band" if rules.formula == "band_reserve" else "in the table"
        if not why[SPECULATIVE]:
            why[SPECULATIVE] = "no draft model" if spec is None else "no speculative reserve in this case"
        if not why[DP_ATTENTION]:
            why[DP_ATTENTION] = "no attention DP" if inp.attn_dp == 1 else f"rule set {rules.name} has no DP term"
        for i, reason in ((FRACTION_TABLE, "no fraction table here"), (BAND_BASE, "no GPU-band reserve here"),
                          (BIG_GPU, "no big-GPU adjustment here")):  # fmt: skip
            if not why[i]:
                why[i] = reason
    frac = _old_multimodal(inp, rules, frac, gpu, mib, on, why)
    total = math.nan if gpu is None else sum(m for i, m in enumerate(mib) if i != VLM_SCALING)
    return _finish(inp, rules, res, mib, on, why, steps, total, frac, flags)


def _old_multimodal(
    inp: HeuristicInputs,
    rules: RuleSet,
    frac: float,
    gpu: int | None,
    mib: list[float],
    on: list[bool],
    why: list[str] | None,
) -> float:
    """0.4.9–0.4.9.post2: × 0.9 for a multimodal model; 0.4.9.post3+: the ViT-size factor (GPU size or not)."""
    if not inp.is_multimodal or rules.multimodal_scale == "none":
        if why is not None:
            why[VLM_SCALING] = (
                "not a multimodal model" if not inp.is_multimodal
                else "no server_args scaling in this release" + (
                    f" (the worker scales by {rules.runner_multimodal_factor})" if rules.runner_multimodal_factor
                    else "")
            )  # fmt: skip
        return frac
    new = frac * 0.9 if rules.multimodal_scale == "x0.9" else _vlm_adjust(frac, inp, False, gpu or 0)
    if gpu is not None:
        mib[VLM_SCALING], on[VLM_SCALING] = (frac - new) * gpu, True
    if why is not None:
        how = "× 0.9" if rules.multimodal_scale == "x0.9" else "ViT-size factor"
        why[VLM_SCALING] = f"multimodal model ({how}): fraction {frac:.3f} → {new:.4f}"
    return new
