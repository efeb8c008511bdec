"""What a log's own lines say about the run's arguments and its memory fraction, each with where it came from.

Arguments: server_args and the launch command come first (`identity.args_of`); the lines then fill what
those leave out — the captured batch sizes ("Capture cuda graph bs [1, 2, 4, …]" and its successors), the
scheduler's ready line (chunked_prefill_size, max_prefill_tokens, context_len, and max_running_requests as
sglang resolved it), the piecewise/prefill token list, draft/verify graphs (speculative decoding), a
`max_total_tokens` sglang quotes back. Every value's origin goes to `Measurement.args_from`.

The fraction: printed (server_args, command, "Memory profiling: mem_fraction_static="), else implied from the
KV budget sglang sized, else unknown. sglang sizes the pool (model_runner.profile_max_num_token, every
release since 0.4) as `rest = avail_after_weights − free_at_start × (1 − mfs)`, so
`mfs = 1 − (avail_after_weights − kv_budget) / free_at_start`. The pool printed is at most the budget (it is
capped by --max-total-tokens, rounded to pages), so a fraction implied from the printed pool is a lower
bound unless nothing can have capped it; the log's 0.01 GB printing gives it an uncertainty, shown. With no pool
size printed, the free memory after the pool bounds the fraction from above, once the request pools sglang builds
out of the slack after sizing (req_to_token: `profiler.model.kv_sizing`) are added back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from profiler.core.measurement import Measurement, Phase, Rank
from profiler.core.units import MIB_PER_GIB
from profiler.model.kv_sizing import REQ_TO_TOKEN_EXTRA_COLS, admitted_requests, req_to_token_mib

GIB = MIB_PER_GIB  # sglang's "GB" is GiB (profiler.core.units)
PRINT_GIB = 0.005  # sglang prints GiB with two decimals: each number is ±0.005 GiB
#: An implied fraction below this means the pool was capped, not sized by the fraction (no release's auto
#: value is this low on a GPU a model fits on; a user-given one this low is printed, not implied).
MIN_IMPLIED = 0.3
# Scheduler-line values sglang resolved after the memory heuristic ran: evidence, not heuristic inputs.
RESOLVED_AFTER_HEURISTIC = ("max_running_requests",)


def log_args(
    m: Measurement, resolved: Mapping[str, tuple[int, int]] | None = None
) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(args the lines print that server_args/command left out, their origins, notes). `resolved`: what sglang's
    own warnings said it resolved (key → (value, line)), as the log builder collected them."""
    a = m.args
    out: dict[str, Any] = {}
    frm: dict[str, str] = {}
    notes: list[str] = []

    def put(key: str, value: Any, where: str) -> None:
        if key in a or key in out or value is None:
            return
        out[key] = value
        frm[key] = where

    if resolved and "chunked_prefill_size_per_attn_dp" in resolved:
        notes.append(_dp_chunk(a, resolved, put))

    graph_cfg = "cuda_graph_config" in a
    for r in _ranks_primary_first(m):
        ready = r.phase("ready")
        if ready is not None:
            d = ready.details
            chunk = d.get("chunked_prefill_size")
            attn_dp = _attn_dp(a)
            if isinstance(chunk, int) and chunk > 0 and attn_dp > 1:
                notes.append(f"chunked_prefill_size {chunk} on the ready line (line {ready.line}) is per DP rank: "
                             f"sglang divides it by attn_dp {attn_dp} after the memory heuristic, which saw "
                             f"{chunk * attn_dp}")  # fmt: skip
                put("chunked_prefill_size", chunk * attn_dp, f"log line {ready.line} (× attn_dp {attn_dp})")
            else:
                put("chunked_prefill_size", chunk, f"log line {ready.line}")
            put("max_prefill_tokens", d.get("max_prefill_tokens"), f"log line {ready.line}")
            put("context_length", d.get("context_len"), f"log line {ready.line} (context_len)")
            put("max_running_requests", d.get("max_running_requests"), f"log line {ready.line} (resolved by sglang)")
        for p in r.phases:
            d = p.details
            line = d.get("bs_list_line", p.line)
            if p.name == "decode_graph" and not graph_cfg and "cuda_graph_bs" not in a:
                bs = d.get("bs_list")
                if isinstance(bs, list) and bs and "cuda_graph_max_bs" not in a:
                    put("cuda_graph_bs", list(bs), f"log line {line} (captured bs list)")
                    put("cuda_graph_max_bs", max(bs), f"log line {line} (largest captured bs)")
                if isinstance(d.get("backend"), str) and "cuda_graph_backend_decode" not in a:
                    put("cuda_graph_backend_decode", d["backend"], f"log line {p.line} (decode capture backend)")
            elif p.name == "prefill_graph" and not graph_cfg:
                bs = d.get("bs_list")
                if isinstance(bs, list) and bs:
                    key = "cuda_graph_bs_prefill" if d.get("backend") not in (None, "piecewise") else (
                        "piecewise_cuda_graph_tokens")  # fmt: skip
                    if "cuda_graph_bs_prefill" not in a and "piecewise_cuda_graph_tokens" not in a:
                        put(key, list(bs), f"log line {line} (captured token list)")
                if isinstance(d.get("backend"), str) and d["backend"] != "piecewise":
                    put("cuda_graph_backend_prefill", d["backend"], f"log line {p.line} (prefill capture backend)")
            elif p.name in ("draft_graph", "verify_graph", "draft_extend_graph"):
                if "speculative_algorithm" not in a:
                    put("speculative_algorithm", "EAGLE", f"log line {p.line} (a {p.name.replace('_', ' ')} was "
                        "captured; the algorithm is not printed: EAGLE-family assumed)")  # fmt: skip
                n = d.get("num_tokens_per_req")
                if p.name == "verify_graph" and isinstance(n, int):
                    put("speculative_num_draft_tokens", n, f"log line {p.line} (verify graph num_tokens_per_req)")
            elif p.name == "kv_pool":
                put("max_total_tokens", d.get("max_total_tokens_arg"), f"log line {p.line} (quoted by sglang)")
    if "speculative_algorithm" in frm:
        notes.append("speculative decoding from a captured draft/verify graph: its algorithm is not printed "
                     "(EAGLE, EAGLE3 and NEXTN size alike in every rule set; STANDALONE would differ in "
                     "0.5.12–0.5.13)")  # fmt: skip
    return out, frm, notes


def _dp_chunk(a: dict[str, Any], resolved: Mapping[str, tuple[int, int]], put: Callable[[str, Any, str], None]) -> str:
    """sglang's "chunked prefill size is adjusted [from X] to Y" (DP attention): Y is per DP rank, divided after
    the memory heuristic ran (server_args: _handle_gpu_memory_settings, then _handle_data_parallelism; 0.5.23's
    parallel_hook says so), so the heuristic's chunked_prefill_size is X — printed (0.5.16+) or Y × attn_dp."""
    y, line = resolved["chunked_prefill_size_per_attn_dp"]
    attn_dp = _attn_dp(a)
    before = resolved.get("chunked_prefill_size_before_attn_dp")
    if before is not None:
        x: int | None = before[0]
        how = f"log line {line} (sglang: adjusted from {x} to {y} for DP attention)"
    elif attn_dp > 1:
        x = y * attn_dp
        how = f"log line {line} ({y} per DP rank × attn_dp {attn_dp}; at most {attn_dp - 1} more before the division)"
    else:
        x, how = None, ""
    put("chunked_prefill_size", x, how)
    have = a.get("chunked_prefill_size", x)
    said = f"sglang divided chunked_prefill_size for DP attention at line {line}: {y} per DP rank"
    if have == y and attn_dp > 1:
        return f"{said}; the value read ({have}) is that per-rank part, the memory heuristic saw {x}"
    if x is not None and have is not None and have // max(attn_dp, 1) != y and have != x:
        return f"{said}, which does not follow from the {have} read (÷ attn_dp {attn_dp})"
    return f"{said}, after the memory heuristic, which saw the undivided {have}"


def _ranks_primary_first(m: Measurement) -> list[Rank]:
    p = m.primary
    return ([p] if p is not None else []) + [r for r in m.ranks if r is not p]


def _attn_dp(a: dict[str, Any]) -> int:
    v = a.get("attn_dp_size")
    if isinstance(v, int) and v > 1:
        return v
    if a.get("enable_dp_attention") is True and isinstance(a.get("dp_size"), int):
        return int(a["dp_size"])
    return 1


class Fraction(NamedTuple):
    """The run's mem_fraction_static as the log supports it."""

    value: float | None
    origin: str  # given | auto | implied | unknown
    how: str
    plus_minus: float | None = None  # implied: uncertainty from the 0.01 GB printing
    bound: str = ""  # "lower": from a pool that may have been capped; "upper": from the free memory after it


def printed_fraction(m: Measurement, has_command: bool, command_sets_it: bool) -> Fraction | None:
    """The fraction the text prints, and who chose it (None when it prints none)."""
    v = m.args.get("mem_fraction_static")
    where = m.args_from.get("mem_fraction_static", m.args_source)
    if not isinstance(v, int | float) or isinstance(v, bool):
        for r in m.ranks:
            for p in r.phases_named("kv_pool"):
                w = p.details.get("memprof_mem_fraction_static")
                if isinstance(w, int | float):
                    v, where = float(w), f"log line {p.line} ('Memory profiling: mem_fraction_static=')"
                    break
    if not isinstance(v, int | float) or isinstance(v, bool):
        return None
    if command_sets_it:
        return Fraction(float(v), "given", "set on the launch command")
    if has_command:
        return Fraction(float(v), "auto", f"printed ({where}); not on the launch command, so sglang chose it")
    return Fraction(float(v), "unknown", f"printed ({where}); whether the user set it is unknown (no command)")


def implied_fraction(m: Measurement) -> Fraction | None:
    """The fraction implied by the KV budget sglang sized on a rank that prints the three numbers."""
    for r in _ranks_primary_first(m):
        f = _implied_on(m, r)
        if f is not None:
            return f
    return None


def _implied_on(m: Measurement, r: Rank) -> Fraction | None:
    w = r.phase("weights")
    kv = r.phase("kv_pool")
    if w is None or kv is None:
        return None
    draft = next((p for p in r.phases if p.role == "draft" and p.name in ("weights", "kv_pool")), None)
    if draft is not None:  # the budget feeds two pools (and the draft's weights come out of it): no fraction
        label = f"rank '{r.label}'" if r.label else "the worker"
        return Fraction(None, "unknown", f"a speculative draft model's {draft.name.replace('_', ' ')} (line "
                        f"{draft.line}) shares the KV budget on {label}: the target's pool alone does not imply "
                        "the fraction")  # fmt: skip
    start, d_start, start_how = _free_at_start(r, w)
    if start is None or start <= 0:
        return None
    label = f"rank '{r.label}'" if r.label else "the worker"
    cap = _capped_by_max_total_tokens(m, r, kv)
    if cap:
        return Fraction(None, "unknown", f"{cap} on {label}: the pool was sized by that cap, not by the fraction, "
                        "so nothing implies the fraction")  # fmt: skip
    budget, d_budget, budget_how, capped = _budget(m, kv)
    if budget is None or w.after is None or w.after.free_mib is None:
        return _upper_bound(m, r, kv, start, start_how, label)
    after = w.after.free_mib / GIB
    frac = 1 - (after - budget) / start
    err = (PRINT_GIB + d_budget) / start + abs(after - budget) * d_start / start**2
    arith = (f"1 − (avail after weights {after:.2f} − {budget_how} {budget:.2f}) / free at start "
             f"{start:.2f} ({start_how}) = {frac:.3f} ± {err:.3f}, on {label}")  # fmt: skip
    if frac > 1 + err or frac <= 0:
        return Fraction(None, "unknown", f"the KV numbers do not fit sglang's sizing ({arith}): fraction unknown")
    if frac < MIN_IMPLIED:
        return Fraction(None, "unknown", f"the KV pool is far smaller than the fraction allows ({arith}): "
                        "it was capped (e.g. --max-total-tokens), so the fraction is unknown")  # fmt: skip
    how = f"implied: {arith}"
    if capped:
        how += f"; a lower bound ({capped})"
    return Fraction(round(frac, 3), "implied", how, round(err, 4), "lower" if capped else "")


def _capped_by_max_total_tokens(m: Measurement, r: Rank, kv: Phase) -> str:
    """Why the pool is --max-total-tokens' size ('' when it is not): sglang sizes the pool from the fraction, then
    takes min(that, max_total_tokens) rounded down to the page (model_runner.init_memory_pool / the KV cache
    configurator), so a pool of the cap's size says only that the fraction allowed at least that much."""
    cap = m.args.get("max_total_tokens")
    if not isinstance(cap, int) or isinstance(cap, bool) or cap <= 0:
        return ""
    tokens = kv.details.get("kv_tokens")
    ready = r.phase("ready")
    if not isinstance(tokens, int) and ready is not None:
        tokens = ready.details.get("max_total_num_tokens")
    if not isinstance(tokens, int):
        return ""
    page = m.args.get("page_size")
    known = isinstance(page, int) and not isinstance(page, bool) and page > 0
    floor = cap // page * page if known else cap - 255  # page unknown: rounded down to a page of up to 256 tokens
    if tokens < floor:
        return ""
    page = page if known else "unknown"
    return f"the pool holds {tokens:,} tokens, the --max-total-tokens {cap:,} cap (page {page})"


def _upper_bound(m: Measurement, r: Rank, kv: Phase, start: float, start_how: str, label: str) -> Fraction | None:
    """No pool size printed: the free memory right after the pool is start × (1 − mfs) less whatever else the
    pool step allocated, so 1 − pool_end / start is at least the fraction (an upper bound). sglang builds the
    request pools out of the slack after sizing the KV pool and before it prints "Memory pool end"
    (kv_cache_configurator.configure, 0.5.23; model_runner.init_memory_pool before): where the log gives the pool's
    tokens and the context, req_to_token is added back (`_request_pools`), which tightens the bound."""
    if kv.after is None or kv.after.free_mib is None:
        return None
    end = kv.after.free_mib / GIB
    req_gib, req_how = _request_pools(m, r, kv)
    frac = 1 - (end + req_gib) / start
    if frac < MIN_IMPLIED or frac > 1:
        return None
    freed = (f"(free after the KV pool {end:.2f} + request pools {req_gib:.2f}: {req_how})" if req_how
             else f"free after the KV pool {end:.2f}")  # fmt: skip
    how = (f"implied upper bound: 1 − {freed} / free at start {start:.2f} ({start_how}) = {frac:.3f}, on {label} "
           "(no pool size printed; anything else the pool step allocated lowers it)")  # fmt: skip
    return Fraction(round(frac, 3), "implied", how, None, "upper")


def _request_pools(m: Measurement, r: Rank, kv: Phase) -> tuple[float, str]:
    """(GiB, how) of the req_to_token pool sglang built after sizing the KV pool: int32 [requests + 1, context + 4]
    (`kv_sizing.req_to_token_mib`), requests as the ready line prints them (sglang's resolved
    max_running_requests), else `kv_sizing.admitted_requests` of the pool's tokens when a server_args repr shows
    the user's value. (0.0, '') when the log does not give the tokens, the context and the requests. A decode
    node's pre-allocated rows and the allocator's index are left out: they only lower the bound further."""
    ready = r.phase("ready")
    rd = ready.details if ready is not None else {}
    tokens = rd.get("max_total_num_tokens", kv.details.get("kv_tokens"))
    ctx = rd.get("context_len", m.args.get("context_length"))
    if not _count(tokens) or not _count(ctx):
        return 0.0, ""
    reqs = rd.get("max_running_requests")
    if _count(reqs):
        said = f"max_running_requests={reqs:,} as the ready line prints it"
    elif "max_running_requests" in m.args and m.args_source == "server_args":  # the full repr: None is sglang's
        mrr = m.args["max_running_requests"]
        reqs = admitted_requests(tokens, ctx, mrr if _count(mrr) else None, _attn_dp(m.args))
        said = f"sglang admits {reqs:,} requests for {tokens:,} tokens at context {ctx:,}"
    else:
        return 0.0, ""  # a user's --max-running-requests the text does not show may be smaller: nothing added
    cols = ctx + REQ_TO_TOKEN_EXTRA_COLS
    mib = req_to_token_mib(reqs + 1, cols)
    return mib / GIB, f"req_to_token int32 [{reqs + 1:,} × {cols:,}] = {mib:.1f} MiB, {said}"


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _free_at_start(r: Rank, w: Phase) -> tuple[float | None, float, str]:
    """(GiB, its uncertainty, what it is) by the one rule (`profiler.core.measurement.free_at_start`)."""
    f = r.free_at_start()
    if f.mib is None:
        return None, 0.0, ""
    what = ("pre_model_load" if f.what.startswith("pre_model_load") else "'Load weight begin' avail mem"
            if f.phase == "weights" and f.how == "read" else "avail after weights + weights mem usage"
            if f.how == "implied" else f.what)  # fmt: skip
    return f.mib / GIB, f.readings * PRINT_GIB, what


def _budget(m: Measurement, kv: Phase) -> tuple[float | None, float, str, str]:
    """(KV budget GiB, its uncertainty, what it is, why it may be only a lower bound)."""
    d = kv.details
    if isinstance(d.get("budget_mib"), int | float):
        return d["budget_mib"] / GIB, PRINT_GIB, "KV budget", ""
    parts = []
    if isinstance(d.get("swa_kv_mib"), int | float):
        parts.append(("SWA+full pools", d["swa_kv_mib"], 1))
    else:
        k, v, kvs = d.get("k_mib"), d.get("v_mib"), d.get("kv_mib")
        if isinstance(k, int | float) and isinstance(v, int | float):
            parts.append(("K+V", k + v, 2))
        elif isinstance(kvs, int | float):
            parts.append(("KV", kvs, 1))
        for extra in d.get("extra_pools") or []:
            parts.append(("K+V", extra.get("mib") or 0.0, 2))
    if isinstance(d.get("mamba_mib"), int | float):
        parts.append(("mamba", d["mamba_mib"], 2))
    if not parts or not any(p[1] for p in parts):
        return None, 0.0, "", ""
    total = sum(p[1] for p in parts) / GIB
    n_printed = sum(p[2] for p in parts)
    what = " + ".join(dict.fromkeys(p[0] for p in parts))
    capped = []
    cap = m.args.get("max_total_tokens")
    if isinstance(cap, int) and not isinstance(cap, bool) and not isinstance(d.get("kv_tokens"), int):
        capped.append(f"max_total_tokens={cap} may cap the pool (its token count is not printed)")
    labelled = [x for r in m.ranks for p in r.phases_named("kv_pool") for x in p.details.get("labelled_pools") or []]
    if labelled:
        capped.append("other per-token pools share the budget")
    return total, n_printed * PRINT_GIB, f"KV pool ({what})", "; ".join(capped)
