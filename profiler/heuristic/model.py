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

from functools import lru_cache

from profiler.heuristic.record import TERM_NAMES, HeuristicInputs, Reservation, Resolved, Step
from profiler.heuristic.rules import BCG_MULTIMODAL_OK, DEFAULT_RULES, RuleSet

DISABLED = "disabled"
BREAKABLE = "breakable"
FULL = "full"
TC_PIECEWISE = "tc_piecewise"
PIECEWISE = "piecewise"  # 0.5.12–0.5.13: the piecewise prefill graph, on unless disabled
_DEFAULT_BACKEND = {"pcg": PIECEWISE, "tc": TC_PIECEWISE, "breakable": BREAKABLE, "disabled": DISABLED}
_N = len(TERM_NAMES)
(CONSTANT, ACTIVATION, PARALLEL, DECODE_GRAPH, DP_PADDING, PREFILL_GRAPH, PREFILL_BCG_DEEPEP, FLOOR_TOPUP, DEEPEP_A2A,
 SPECULATIVE, XPU, VLM_SCALING) = range(_N)  # fmt: skip


@lru_cache(maxsize=4096)
def decode_bs_list(max_bs: int, speculative: bool, no_padding: bool) -> tuple[int, ...]:
    """sglang's decode capture ladder (`generate_decode_cuda_graph_batch_sizes`)."""
    if no_padding:
        bs = list(range(1, max_bs + 1))
    elif not speculative:
        bs = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    else:
        bs = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8), *range(272, max_bs + 1, 16)]
    bs = [b for b in bs if b <= max_bs]
    if max_bs not in bs:
        bs.append(max_bs)
    return tuple(bs)


_PREFILL_LADDER = (
    *range(4, 33, 4),
    *range(48, 257, 16),
    *range(288, 513, 32),
    *range(576, 1025, 64),
    *range(1280, 4097, 256),
)


@lru_cache(maxsize=4096)
def prefill_bs_list(max_bs: int) -> tuple[int, ...]:
    """sglang's prefill (token-bucket) capture ladder (`generate_prefill_cuda_graph_batch_sizes`)."""
    return tuple(b for b in (*_PREFILL_LADDER, *range(4608, max_bs + 1, 512)) if b <= max_bs)


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
    # 0.5.12–0.5.13 have only an off-switch for the piecewise prefill graph
    pcg = rules.prefill_default == "pcg"
    explicit_prefill = inp.prefill_backend if not pcg or inp.prefill_backend == DISABLED else None
    prefill_off = disable_all and not pcg  # the piecewise graph ignores --disable-cuda-graph
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
            band = rules.band_for(gpu)
            d_chunk, d_bs = band.chunk, (band.max_bs_large_tp if inp.tp >= 4 else band.max_bs)
        else:
            band, d_chunk, d_bs = None, rules.fallback_chunk, rules.fallback_max_bs
        if say:
            parts = []
            if chunk is None:
                parts.append(f"chunked_prefill_size {d_chunk}")
            if decode_max_bs is None:
                tp_note = (
                    f" (tp {'≥' if inp.tp >= 4 else '<'} 4)" if band and band.max_bs != band.max_bs_large_tp else ""
                )
                parts.append(f"decode max_bs {d_bs}{tp_note}")
            where = (
                (f"band < {band.limit_gib} GiB" if band.limit_gib else "largest band") if band else "GPU size unknown"
            )
            say(Step("gpu_size_defaults", f"{gpu} MiB, {where}: " + ", ".join(parts)))
        if chunk is None:
            chunk = d_chunk
        if decode_max_bs is None:
            decode_max_bs = d_bs
            mrr = inp.max_running_requests
            if rules.cap_max_bs_by_mrr and mrr is not None and decode_max_bs > mrr:
                if say:
                    say(
                        Step(
                            "max_bs_cap",
                            f"defaulted decode max_bs {decode_max_bs} lowered to max_running_requests {mrr}",
                        )
                    )
                decode_max_bs = mrr

    # capture lists
    if inp.decode_bs is None:
        decode_bs = decode_bs_list(decode_max_bs, inp.speculative_algorithm is not None, inp.disable_cuda_graph_padding)
    else:
        decode_bs = inp.decode_bs
        decode_max_bs = max(decode_bs)
        if say:
            say(Step("decode_bs", f"explicit decode bs list ({len(decode_bs)} sizes): max_bs = {decode_max_bs}"))

    if prefill_max_bs is None:
        if inp.is_mla:
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
        if inp.max_total_tokens is not None and inp.max_total_tokens < prefill_max_bs:
            prefill_max_bs = inp.max_total_tokens
            why += ", capped by max_total_tokens"
        if prefill_max_bs > 4096 and "llama-2" in inp.model_path.lower():
            prefill_max_bs = 4096
            why += ", capped at 4096 for llama-2"
        if say and prefill_backend != DISABLED:
            say(Step("prefill_max_bs", f"prefill graph max_bs {prefill_max_bs} ({why})"))
    if rules.context_length_clamp and inp.context_length is not None and inp.context_length < prefill_max_bs:
        prefill_max_bs = inp.context_length
        if say:
            say(Step("prefill_max_bs", f"prefill graph max_bs clamped to context_length {prefill_max_bs}"))
    if prefill_bs is None:
        prefill_bs = prefill_bs_list(prefill_max_bs)

    post_capture = rules.post_capture_base_mib is not None and _post_capture_planned(
        inp, rules, chunk, decode_backend, prefill_backend, prefill_bs
    )
    return Resolved(
        gpu, chunk, inp.max_prefill_tokens, inp.max_running_requests, decode_backend, decode_max_bs, decode_bs,
        prefill_backend, prefill_max_bs, prefill_bs, post_capture,
    )  # fmt: skip


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
    gpu = inp.gpu_mem_mib
    mode = inp.mode
    mib = [0.0] * _N
    on = [False] * _N
    why: list[str] | None = [""] * _N if explain else None
    flags: list[str] = []
    role_aware = rules.role_aware
    deepep = inp.moe_a2a_backend == "deepep"
    par = inp.tp * inp.pp / 8 * 1024
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
        mib[CONSTANT], on[CONSTANT] = 512.0, True
        # activation slack
        if role_aware and mode == "decode":
            running = inp.max_running_requests or res.decode_max_bs or 1
            draft = inp.speculative_num_draft_tokens or 1
            tokens = max(running * draft, 2048)
            if why is not None:
                src = "max_running_requests" if inp.max_running_requests else "decode max_bs"
                why[ACTIVATION] = (
                    f"decode node: max({src} {running} × draft tokens {draft}, 2048) = {tokens} tokens × 1.5"
                )
        elif res.chunked_prefill_size > 0:
            tokens = max(res.chunked_prefill_size, 2048)
            if why is not None:
                why[ACTIVATION] = f"max(chunked_prefill_size {res.chunked_prefill_size}, 2048) = {tokens} tokens × 1.5"
        else:
            tokens = max(res.max_prefill_tokens, 2048)
            if why is not None:
                why[ACTIVATION] = (
                    f"chunking off: max(max_prefill_tokens {res.max_prefill_tokens}, 2048) = {tokens} tokens × 1.5"
                )
        act = tokens * 1.5
        mib[ACTIVATION], on[ACTIVATION] = act, True
        total = 512.0 + act + par
        if why is not None:
            why[CONSTANT] = "constant metadata (attention backends etc.)"
            why[PARALLEL] = f"tp {inp.tp} × pp {inp.pp} / 8 × 1024"

        # decode graph
        max_bs = res.decode_max_bs
        if not role_aware or (res.decode_backend != DISABLED and mode != "prefill"):
            mib[DECODE_GRAPH], on[DECODE_GRAPH] = max_bs * 2, True
            total += max_bs * 2
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
        if res.prefill_backend != DISABLED and not (role_aware and mode == "decode"):
            pg = 1536.0 if inp.is_mla else len(res.prefill_bs) * 8.0
            mib[PREFILL_GRAPH], on[PREFILL_GRAPH] = pg, True
            total += pg
            if why is not None:
                why[PREFILL_GRAPH] = (
                    "MLA model: fixed 1.5 GiB"
                    if inp.is_mla
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
        if gpu is not None and gpu > 60 * 1024 and total < 10 * 1024:
            mib[FLOOR_TOPUP], on[FLOOR_TOPUP] = 10 * 1024 - total, True
            flags.append("floor_applied")
            if why is not None:
                why[FLOOR_TOPUP] = f"10 GiB floor on a {gpu} MiB GPU lifts {total:g} MiB of terms to 10240"
            total = 10 * 1024.0
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
            spec = 6144.0 if alg == "STANDALONE" else (0.0 if alg == "NGRAM" else 4096.0)
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

        if rules.xpu_term and inp.platform == "xpu":
            mib[XPU], on[XPU] = 2048.0, True
            total += 2048.0
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
    if frac <= 0:
        flags.append("fraction_nonpositive")
    if inp.mem_fraction_static is not None:
        flags.append("given_by_user")
    if inp.unmodeled:
        flags.append("unmodeled_flags")
    return res, mib, on, why, steps, total, frac, tuple(flags)


def reserve(inp: HeuristicInputs, rules: RuleSet = DEFAULT_RULES) -> Reservation:
    """Model sglang's reservation for `inp` under `rules`: every term, the total and the fraction."""
    res, mib, on, _, _, total, frac, flags = evaluate(inp, rules)
    mfs = inp.mem_fraction_static if inp.mem_fraction_static is not None else frac
    return Reservation(rules, inp, res, tuple(mib), tuple(on), total, frac, mfs, flags)


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
