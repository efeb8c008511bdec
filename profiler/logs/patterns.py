"""The memory-line formats SGLang has printed (0.3 … 0.5.23, 2024–2026), each turned into a small `Event`.

Formats were read from the released wheels and checked against real user logs (see tests/test_logs_*.py
for one real line per variant). Numbers stay as printed here (GB = GiB, two decimals); `build` converts.
`classify` dispatches on the message's first word so a line costs one or two regex calls, and caches the
result per message: ranks print identical messages, so a multi-rank log parses each only once.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from profiler.core.units import BYTES_PER_GIB
from profiler.logs.formats import format_key


class Event(NamedTuple):
    """One recognised line. `kind` says what to do with it; sizes are GiB as printed."""

    kind: str  # begin|end|note|kv|ladder|ready|args|arch|model|resolved|known|host_mem|serve|retract|registered
    phase: str | None = None
    free: float | None = None  # "avail mem" (GiB)
    usage: float | None = None  # "mem usage" (GiB)
    elapsed: float | None = None
    details: dict[str, Any] | None = None
    fmt: str | None = None  # the dated format of the line (profiler.logs.formats), when it dates one


KNOWN = Event("known")  # recognised, nothing to record (e.g. a config warning that mentions "KV Cache")

GRAPH_PHASES = frozenset({"prefill_graph", "decode_graph", "verify_graph", "draft_graph", "draft_extend_graph"})

# Lines that mention memory words but carry no startup memory number we record (otherwise they would be
# counted as unparsed, or, for the DeepGEMM warmup warning that says "out of memory", as a failure).
_KNOWN_OTHER = re.compile(
    r"Set (?:NSA|DSA) backends? for|Setting (?:NSA|DSA) backend|KV cache is forced as chunk cache|"
    r"KV cache dtype is|\[unified-memory-pool\]|Load weight end\. Committed real weights|"
    r"Capture Frozen-KV|LoRA adapter|Update (?:engine )?weights|"
    r"is less than required memory \S+ for warmup|"
    # PR-branch lines that restate the pool sglang sizes elsewhere (sglang-pr14071: "KV cache: MLA(…) … mem=42.5/43.8GB
    # rest=35.9GB max_tokens=…", "req_to_token_pool: slots=… mem=2.68GB")
    r"^KV cache: \w+\(.*\bmax_tokens=\d+|^req_to_token_pool: slots=\d+|"
    # un-prefixed debug prints a developer left in (sglang-pr18263: "initial available_bytes 219721119039 / 204.63 GB",
    # "Case 2: candidate_kv_budget 164149629787 / 152.88 GB", "###### self.workspace_buffer size: 51.75 GB")
    r"^(?:initial available_bytes|Case \d+: candidate_kv_budget) \d+ / \d+(?:\.\d+)? GB$|"
    r"^#{2,} ?self\.\w+ size: \d+(?:\.\d+)? GB$"
)
# A line "looks like a memory line" when it has one of these and matched nothing (brief §5). "KV Cache" alone
# is not enough: prose quoting a log says it too ("the KV Cache memory is almost 2x …"); a pool line prints a
# size in GB or its #tokens.
MEMORYISH = re.compile(r"avail[ _]mem|mem usage| GB\b|\dGB\b|KV Cache.*#tokens|Capture |Capturing |out of memory")

_F = r"(-?\d+(?:\.\d+)?)"
_FIELD = re.compile(
    r"(avail mem|mem usage|Time elapsed|elapsed|dtype|type|#tokens|K size|V size|KV size|backend|"
    r"num_tokens_per_req|num_tokens_per_bs|num_tokens|bs|step)(?:=|: ?)"
    r"(\[[^\]]*\]?|-?\d+(?:\.\d+)?|[A-Za-z_][\w.\-]*)"
)
_QUANT = re.compile(r"\bquant=(.*?), avail mem=")
_KV_HEAD = re.compile(r"^(?:(?P<label>.+?) )?KV Cache (?P<what>is allocated|VA upper bound)\.")
_CAPTURE = re.compile(r"^Capture (?P<what>.+?) (?P<be>begin|end)\b(?: \(step (?P<step>\d+)\))?")
_CAPTURE_LIST = re.compile(
    r"^(?:\[BCG\] )?Capture (?:cuda graph |CUDA graph )?(?P<what>bs|num tokens):? *(?P<list>\[.*)"
)
_TQDM = re.compile(
    r"^(?:\[BCG\] )?Capturing (?P<what>batches|num tokens|prefill shape|)\s*"
    r"\((?:(?:bs|num_tokens)=(?P<bs>\d+) )?avail_mem=(?P<free>-?\d+(?:\.\d+)?) GB\)"
    r"(?:.*?(?P<n>\d+)/(?P<total>\d+) \[)?"
)
_READY_KV = re.compile(r"(\w+)=(-?\d+(?:\.\d+)?)( GB)?")
_MAMBA_SIZE = re.compile(r"(\w+) size: (\d+(?:\.\d+)?) ?GB")
_MAMBA_N = re.compile(r"max_mamba_cache_size: (\d+)")
_SWA = re.compile(r"^SWAKVPool (mem usage|VA upper bound): " + _F + r" GB, swa size: (\d+), full size: (\d+)")
_SWA_TOKENS = re.compile(r"(full|swa)_layer_tokens=(\d+)")
_UNIFIED = re.compile(r"UnifiedKVPool (?:reserved VA upper bound|allocated): total_bytes=[\d.]+ GB \(=(\d+) B\)")
_POST = re.compile(r"(#tokens|max_total_num_tokens|KV size|avail mem|free memory|dtype)(?:=|: )([\w.]+)")
_POST_RUNNING = re.compile(r"max_running_requests (\d+) -> (\d+)")
_POST_CANARY = re.compile(r"workspace (\d+(?:\.\d+)?) GB")
_PROFILING = re.compile(r"(available_gpu_memory|total_gpu_memory|mem_fraction_static|rest_memory)=(\d+(?:\.\d+)?)")
# pool_configurator's "DSV4 memory calculation: [unified=…, unified_fp8=…, dspark_draft_bf16=…,]
# [bytes_per_full_token=X,] available_bytes=X GB, [c128_state_fixed=X GB, c2_state_fixed=…, swa_fixed=…,
# swa_ring_fixed=…, c4_state_fixed=X GB,] full_token=N" (0.5.13 → 0.5.23 add fields between; each read by name)
_DSV4_FIELD = re.compile(r"\b(\w+)=(\d+(?:\.\d+)?)( GB)?(?=,|$)")
# server_args under --enable-dp-attention divides chunked_prefill_size by the attention-DP width, after the memory
# heuristic ran: "DP attention is enabled. The chunked prefill size is adjusted to 2048 to avoid MoE kernel
# issues." (0.4.0 … 0.5.15) / "… chunked prefill size is adjusted from 8192 to 2048." (0.5.16+)
_DP_CHUNK = re.compile(
    r"^DP attention is enabled\. (?:The )?chunked prefill size is adjusted (?:from (-?\d+) )?to (-?\d+)"
)
_RESOLVED_SIZE = re.compile(r"\b(tp|dp|pp|ep|attn_dp)_size=(\d+)\b")
_HF_SNAPSHOT = re.compile(r"^Found local HF snapshot for (\S+) at ")
_HOST = re.compile(r"^Allocating (\d+(?:\.\d+)?) GB host memory for (.+?) ?[.(]")
_SYMM = re.compile(r"^Pre-allocating symmetric memory pool with (\d+(?:\.\d+)?) GiB")
_ARCH = re.compile(r"\b([A-Z]\w*For(?:CausalLM|ConditionalGeneration))\b")
# Serving traffic (scheduler stats lines, every release since 0.4: "Decode batch. #running-req: 3, #token: 512,
# token usage: 0.01, …", 0.5.4+ "Decode batch [12], …"; hybrid pools print "full token usage"/"swa token usage").
TRAFFIC_HEADS = ("Decode batch", "Prefill batch", "Decode out of memory happened", "KV cache pool is full")
_STATS = re.compile(r"(#running-req|#queue-req|#token|full token usage|swa token usage|token usage): (\d+(?:\.\d+)?)")
_STAT_KEYS = {"#running-req": "running_req", "#queue-req": "queue_req", "#token": "tokens",
              "token usage": "token_usage", "full token usage": "full_token_usage",
              "swa token usage": "swa_token_usage"}  # fmt: skip
_RETRACTED = re.compile(r"#retracted_reqs: (\d+)")
# model_runner: "max_total_tokens=131072 is larger than the profiled value -561981. Use the profiled value
# instead." (every release since 0.4): the KV budget sglang profiled, in tokens, can be negative.
_PROFILED = re.compile(r"^max_total_tokens=(\d+) is larger than the profiled value (-?\d+)")
# ktransformers' sglang fork: "The available memory for KV cache is 9.19 GB." (the KV budget it profiled).
_KT_BUDGET = re.compile(r"^The available memory for KV cache is (-?\d+(?:\.\d+)?) GB")
# custom all-reduce, when a capture context closes: "Registering 2967 cuda graph addresses" (0 = none captured)
_REGISTER = re.compile(r"^Registering (\d+) cuda graph addresses")

_CACHE: dict[str, Event | None] = {}
_CACHE_MAX = 8192  # entries of at most _CACHE_CHARS: a few MB whatever the log
_CACHE_CHARS = 400


def classify(msg: str) -> Event | None:
    """The event for one message (the text after the "[time ranks] " prefix), or None if no format fits.
    Events are shared between identical messages: treat them (and their details) as read-only."""
    if msg.startswith(TRAFFIC_HEADS):  # serving lines: all different (counters), so never cached
        return traffic(msg)
    if len(msg) > _CACHE_CHARS:
        return _dated(msg, _classify(msg))
    ev = _CACHE.get(msg, _MISS)
    if ev is _MISS:
        ev = _dated(msg, _classify(msg))
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        _CACHE[msg] = ev
    return ev  # type: ignore[return-value]


def _dated(msg: str, ev: Event | None) -> Event | None:
    if ev is None or ev is KNOWN:
        return ev
    if ev.kind == "args":
        return ev._replace(fmt="server_args_repr" if "ServerArgs(" in msg else "server_args_dict")
    key = format_key(msg)
    return ev if key is None else ev._replace(fmt=key)


_MISS = Event("miss")


def _classify(msg: str) -> Event | None:
    msg = msg.rstrip()
    first = msg[:40].partition(" ")[0]
    handler = _BY_HEAD.get(first)
    if handler is None and first.startswith("max_total_num_tokens="):
        handler = _ready
    elif handler is None and first.startswith("max_total_tokens="):
        handler = _max
    if handler is not None:
        ev = handler(msg)
        if ev is not None:
            return ev
    if "server_args=ServerArgs(" in msg or "server_args={" in msg:
        return Event("args", details={"text": msg})
    if "KV Cache" in msg:
        m = _KV_HEAD.match(msg)
        if m is not None:
            return _kv_alloc(msg, m)
    if "_size=" in msg and "server_args" in msg[:40]:
        sizes = {f"{k}_size": int(v) for k, v in _RESOLVED_SIZE.findall(msg)}
        if sizes:
            return Event("resolved", details=sizes)
    if _KNOWN_OTHER.search(msg):
        return KNOWN
    if "For" in msg:
        m = _ARCH.search(msg)
        if m is not None:
            return Event("arch", details={"architecture": m.group(1)})
    return None


def fields(msg: str) -> dict[str, str]:
    """The key=value / key: value pairs SGLang prints in load, KV and capture lines."""
    return dict(_FIELD.findall(msg))


def _num(d: dict[str, str], key: str) -> float | None:
    v = d.get(key)
    if v is None or not v or not (v[0].isdigit() or v[0] == "-"):
        return None
    try:
        return float(v)
    except ValueError:
        return None


def _int_list(text: str) -> list[int] | None:
    """A printed list of ints; None when the text is cut before its "]" (its largest size is then unknown)."""
    if "]" not in text:
        return None
    body = text.strip().lstrip("[").split("]", 1)[0]
    out = []
    for part in body.split(","):
        part = part.strip()
        if not part.isdigit():
            return None if part else out or None
        out.append(int(part))
    return out or None


# ---- per first word ----------------------------------------------------------------------------------


def traffic(msg: str) -> Event | None:
    """A scheduler stats line (serving) or a KV retraction."""
    if msg.startswith(("Decode out", "KV cache pool")):
        key = format_key(msg)
        if msg.startswith("KV cache pool is full") and "Retract" not in msg:
            return None
        m = _RETRACTED.search(msg)
        return Event("retract", details={"retracted": int(m.group(1)) if m else None}, fmt=key)
    # "Decode batch." / "Prefill batch." (≤ 0.5.3.post3) or "Decode batch, " / "Decode batch [12], " (0.5.4+)
    key = "batch_period" if msg[12:14] == ". " or msg[13:15] == ". " else "batch_comma"
    det: dict[str, Any] = {"stage": "decode" if msg[0] == "D" else "prefill"}
    for name, val in _STATS.findall(msg):
        det[_STAT_KEYS[name]] = float(val) if "usage" in name else int(val)
    return Event("serve", details=det, fmt=key)


def _max(msg: str) -> Event | None:
    m = _PROFILED.match(msg)
    if m is None:
        return None
    det = {"profiled_tokens": int(m.group(2)), "max_total_tokens_arg": int(m.group(1))}
    return Event("note", "kv_pool", details=det)


def _the(msg: str) -> Event | None:
    if msg.startswith("The server is fired up and ready to roll"):
        return Event("fired")  # the HTTP server after its warmup request: startup finished (every release)
    m = _KT_BUDGET.match(msg)
    return None if m is None else Event("note", "kv_pool", details={"budget_gib": float(m.group(1))})


def _registering(msg: str) -> Event | None:
    m = _REGISTER.match(msg)
    return KNOWN if m is None else Event("registered", details={"graph_addresses": int(m.group(1))})


def _load(msg: str) -> Event | None:
    if msg.startswith("Load weight begin"):
        return Event("begin", "weights", free=_num(fields(msg), "avail mem"))
    if msg.startswith("Load weight end."):
        if "Committed real weights" in msg:
            return KNOWN
        f = fields(msg)
        det: dict[str, Any] = {}
        if "dtype" in f:
            det["dtype"] = f["dtype"]
        if "type" in f:
            det["architecture"] = f["type"]
        q = _QUANT.search(msg)
        if q is not None:
            det["quant"] = q.group(1)
        return Event("end", "weights", _num(f, "avail mem"), _num(f, "mem usage"), _num(f, "elapsed"), det)
    return None


def _memory(msg: str) -> Event | None:
    if msg.startswith("Memory pool end"):
        return Event("end", "kv_pool", free=_num(fields(msg), "avail mem"))
    if msg.startswith("Memory baseline taken"):
        return Event("end", "baseline", usage=_num(fields(msg), "mem usage"))
    if msg.startswith("Memory profiling:"):
        d = dict(_PROFILING.findall(msg))
        det: dict[str, Any] = {}
        for key, val in d.items():  # every printed number, under its own name
            det[f"memprof_{key}" if key == "mem_fraction_static" else f"memprof_{key}_gib"] = float(val)
        if "total_gpu_memory" in d:
            det["pre_model_load_gib"] = float(d["total_gpu_memory"])
        if "rest_memory" in d:
            det["budget_gib"] = float(d["rest_memory"])
        if "available_gpu_memory" in d:
            det["free_after_weights_gib"] = float(d["available_gpu_memory"])
        return Event("note", "kv_pool", details=det) if det else None
    return None


def _kv_alloc(msg: str, m: re.Match[str] | None = None) -> Event | None:
    m = m or _KV_HEAD.match(msg)
    if m is None:
        return None
    f = fields(msg)
    det: dict[str, Any] = {}
    if "#tokens" in f:
        det["kv_tokens"] = int(float(f["#tokens"]))
    for key, name in (("K size", "k_gib"), ("V size", "v_gib"), ("KV size", "kv_gib")):
        v = _num(f, key)
        if v is not None:
            det[name] = v
    if "dtype" in f:
        det["kv_dtype"] = f["dtype"]
    if m.group("what") == "VA upper bound":
        det["va_upper_bound"] = True
    if m.group("label"):
        det["label"] = m.group("label")
    return Event("kv", "kv_pool", details=det)


def _kv(msg: str) -> Event | None:
    if msg.startswith("KV cache is forced as chunk cache for decode server"):
        return Event("mode", details={"mode": "decode"})  # printed only by decode servers (PD disaggregation)
    if msg.startswith("KV Cache skipped"):
        return Event("kv", "kv_pool", details={"noop_pool": True})
    return _kv_alloc(msg)


def _using(msg: str) -> Event | None:
    if msg.startswith("Using KV cache dtype:"):
        return Event("note", "kv_pool", details={"kv_dtype": msg.split(":", 1)[1].strip()})
    return None


def _mamba(msg: str) -> Event | None:
    if not msg.startswith("Mamba Cache is allocated"):
        return None
    sizes = _MAMBA_SIZE.findall(msg)
    det: dict[str, Any] = {f"mamba_{name}_gib": float(v) for name, v in sizes}
    if sizes:
        det["mamba_gib"] = round(sum(float(v) for _, v in sizes), 2)
    n = _MAMBA_N.search(msg)
    if n is not None:
        det["mamba_max_cache_size"] = int(n.group(1))
    return Event("kv", "kv_pool", details=det)


def _swa(msg: str) -> Event | None:
    m = _SWA.match(msg)
    if m is None:
        return None
    det = {"swa_kv_gib": float(m.group(2)), "swa_tokens": int(m.group(3)), "full_tokens": int(m.group(4))}
    if m.group(1) == "VA upper bound":
        det["va_upper_bound"] = True
    return Event("kv", "kv_pool", details=det)


def _use(msg: str) -> Event | None:
    if "liding window memory pool" not in msg:
        return None
    d = dict(_SWA_TOKENS.findall(msg))
    det = {k: int(d[s]) for s, k in (("swa", "swa_tokens"), ("full", "full_tokens")) if s in d}
    return Event("kv", "kv_pool", details=det)


def _unified(msg: str) -> Event | None:
    m = _UNIFIED.search(msg)
    if m is None:
        return KNOWN
    return Event("kv", "kv_pool", details={"kv_gib": int(m.group(1)) / BYTES_PER_GIB, "unified": True})


def _dsv4(msg: str) -> Event | None:
    if " memory calculation:" not in msg[:30]:
        return None
    fields = {k: (v, gb) for k, v, gb in _DSV4_FIELD.findall(msg)}
    avail, full = fields.get("available_bytes"), fields.get("full_token")
    if avail is None or not avail[1] or full is None or full[1] or "." in full[0]:
        return None  # 0.5.12 printed only the pool sizes (c4=, c128=, …): no budget in it
    det: dict[str, Any] = {"budget_gib": float(avail[0]), "kv_tokens": int(full[0]),
                           "dsv4_available_bytes_gib": float(avail[0])}  # fmt: skip
    if "bytes_per_full_token" in fields:
        det["dsv4_bytes_per_full_token"] = float(fields["bytes_per_full_token"][0])
    for k, (v, gb) in fields.items():
        if k.endswith("_fixed") and gb:  # what the configurator set aside before sizing the full-token pool
            det[f"dsv4_{k}_gib"] = float(v)
    return Event("note", "kv_pool", details=det)


def _dp_chunk(msg: str) -> Event | None:
    m = _DP_CHUNK.match(msg)
    if m is None:
        return None
    det = {"chunked_prefill_size_per_attn_dp": int(m.group(2))}
    if m.group(1) is not None:
        det["chunked_prefill_size_before_attn_dp"] = int(m.group(1))
    return Event("resolved", details=det)


def _init(msg: str) -> Event | None:
    if not msg.startswith("Init torch distributed"):
        return None
    if msg.startswith("Init torch distributed begin"):
        return KNOWN  # no number; the "ends" line carries the phase (and begin lines are not scanned for)
    f = fields(msg)
    return Event("end", "init_parallel", usage=_num(f, "mem usage"), elapsed=_num(f, "elapsed"))


def _post(msg: str) -> Event | None:
    if not msg.startswith("Post-capture KV sizing"):
        return None
    det: dict[str, Any] = {}
    free = None
    for key, val in _POST.findall(msg):
        if key in ("#tokens", "max_total_num_tokens") and val.isdigit():
            det["kv_tokens"] = int(val)
        elif key == "KV size":
            det["kv_gib"] = float(val)
        elif key in ("avail mem", "free memory"):
            free = float(val.rstrip("."))
        elif key == "dtype":
            det["kv_dtype"] = val
    if (m := _POST_RUNNING.search(msg)) is not None:
        det["max_running_requests"] = int(m.group(2))
    if (m := _POST_CANARY.search(msg)) is not None:
        det["canary_workspace_gib"] = float(m.group(1))
    d = dict(_SWA_TOKENS.findall(msg))
    if d:
        det.update({f"{k}_tokens": int(v) for k, v in d.items()})
    return Event("end" if free is not None else "note", "post_capture_resize", free=free, details=det)


def graph_phase(what: str) -> str:
    """Phase name for the words between "Capture" and "begin/end" (every release's wording)."""
    w = what.lower()
    if "prefill" in w or "piecewise" in w:
        return "prefill_graph"
    if "draft" in w:  # "draft verify" (DSPARK, 2026) is the draft model's own graph: startup timings' draft_decode
        return "draft_extend_graph" if "extend" in w else "draft_graph"
    if "verify" in w:
        return "verify_graph"
    return "decode_graph"


def _capture(msg: str) -> Event | None:
    m = _CAPTURE_LIST.match(msg)
    if m is not None:
        bs = _int_list(m.group("list"))
        phase = "decode_graph" if m.group("what") == "bs" else "prefill_graph"
        det: dict[str, Any] = {"bs_list": bs} if bs else {}
        if bs and phase == "decode_graph":
            det["max_bs"] = max(bs)
        return Event("note", phase, details=det)
    if " failed" in msg[:60]:
        return None  # a failure line: handled by failures.py
    m = _CAPTURE.match(msg)
    if m is None:
        return None
    phase = graph_phase(m.group("what"))
    f = fields(msg)
    det = {}
    if m.group("what").split()[0] in ("target", "draft"):
        det["role"] = m.group("what").split()[0]
    if "backend" in f:
        det["backend"] = f["backend"]
    elif "piecewise" in m.group("what").lower():
        det["backend"] = "piecewise"
    for key in ("num_tokens_per_req", "num_tokens_per_bs"):
        if key in f and f[key].isdigit():
            det["num_tokens_per_req"] = int(f[key])
    if "num_tokens" in f:
        nt = _int_list(f["num_tokens"]) if f["num_tokens"].startswith("[") else None
        if nt:
            det["bs_list"] = nt
        elif f["num_tokens"].isdigit():
            det["num_tokens"] = int(f["num_tokens"])
    if "bs" in f and f["bs"].startswith("["):
        bs = _int_list(f["bs"])
        if bs:
            det["bs_list"] = bs
            if phase != "prefill_graph":
                det["max_bs"] = max(bs)
    step = m.group("step") or f.get("step")
    if step is not None and step.isdigit():
        det["step"] = int(step)
    elapsed = _num(f, "elapsed")
    if elapsed is None:
        elapsed = _num(f, "Time elapsed")
    kind = "begin" if m.group("be") == "begin" else "end"
    return Event(kind, phase, _num(f, "avail mem"), _num(f, "mem usage"), elapsed, det)


_CUT_TQDM = ("Capturing batches", "Capturing num tokens", "Capturing prefill shape")


def _capturing(msg: str) -> Event | None:
    m = _TQDM.match(msg)
    if m is None:
        # a tqdm frame cut before its numbers (ktransformers-1854.log ends on a bare "Capturing batches")
        return KNOWN if msg.rstrip() in _CUT_TQDM else None
    phase = "decode_graph" if m.group("what") == "batches" else "prefill_graph"
    det: dict[str, Any] = {"bs": int(m.group("bs")) if m.group("bs") else None}
    if m.group("n") is not None:
        det["n"], det["total"] = int(m.group("n")), int(m.group("total"))
    return Event("ladder", phase, free=float(m.group("free")), details=det)


def _bcg(msg: str) -> Event | None:
    return _capturing(msg) or _capture(msg)


def _ready(msg: str) -> Event | None:
    det: dict[str, Any] = {}
    free = None
    for key, val, gb in _READY_KV.findall(msg):
        if gb:
            free = float(val)
            if key == "available_cpu_mem":
                det["host"] = True
        else:
            det[key] = int(val) if "." not in val else float(val)
    return Event("ready", "ready", free=free, details=det)


def _allocating(msg: str) -> Event | None:
    m = _HOST.match(msg)
    if m is None:
        return None
    return Event("host_mem", details={"gb_decimal": float(m.group(1)), "what": m.group(2)})


def _symm(msg: str) -> Event | None:
    m = _SYMM.match(msg)
    return None if m is None else Event("note", "finalize", details={"symm_mem_prealloc_gib": float(m.group(1))})


def _found(msg: str) -> Event | None:
    m = _HF_SNAPSHOT.match(msg)
    return None if m is None else Event("model", details={"model": m.group(1)})


_BY_HEAD = {
    "Load": _load,
    "Memory": _memory,
    "KV": _kv,
    "Using": _using,
    "Mamba": _mamba,
    "SWAKVPool": _swa,
    "Use": _use,
    "[unified-memory-pool]": _unified,
    "DSv4": _dsv4,
    "DSV4": _dsv4,  # sglang's spelling (pool_configurator); "DSv4" in an earlier excerpt
    "DP": _dp_chunk,
    "Init": _init,
    "Post-capture": _post,
    "Capture": _capture,
    "Capturing": _capturing,
    "[BCG]": _bcg,
    "Allocating": _allocating,
    "Found": _found,
    "Pre-allocating": _symm,
    "The": _the,
    "Registering": _registering,
}
