"""Which sglang releases print each log format: the release that introduced it and the last one that prints it.

Why: most logs never say which release wrote them, and the memory heuristic differs between releases. The
wording of the lines does date them. Every entry below was read from the released wheels' sources
(`pip download --no-deps sglang==X`, all 101 releases 0.4.0 … 0.5.23, the file named in `source`), by
diffing the format strings release by release. `first` None means the format is already in 0.4.0 (older
releases were not read: such a log may be older); `last` None means 0.5.23 still prints it.

A log's formats bound its release: the intersection of their [first, last] spans (`release_range`). An
absent format proves nothing (excerpts omit lines); only formats seen count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import NamedTuple

#: Every sglang release on PyPI since 0.4.0, oldest first (pre-releases included: they were published).
RELEASES: tuple[str, ...] = (
    "0.4.0", "0.4.0.post1", "0.4.0.post2", "0.4.1", "0.4.1.post1", "0.4.1.post2", "0.4.1.post3", "0.4.1.post4",
    "0.4.1.post5", "0.4.1.post6", "0.4.1.post7", "0.4.2", "0.4.2.post1", "0.4.2.post2", "0.4.2.post3",
    "0.4.2.post4", "0.4.3", "0.4.3.post1", "0.4.3.post2", "0.4.3.post3", "0.4.3.post4", "0.4.4", "0.4.4.post1",
    "0.4.4.post2", "0.4.4.post3", "0.4.4.post4", "0.4.5", "0.4.5.post1", "0.4.5.post2", "0.4.5.post3", "0.4.6",
    "0.4.6.post1", "0.4.6.post2", "0.4.6.post3", "0.4.6.post4", "0.4.6.post5", "0.4.7", "0.4.7.post1", "0.4.8",
    "0.4.8.post1", "0.4.9", "0.4.9.post1", "0.4.9.post2", "0.4.9.post3", "0.4.9.post4", "0.4.9.post5",
    "0.4.9.post6", "0.4.10", "0.4.10.post1", "0.4.10.post2", "0.5.0rc0", "0.5.0rc1", "0.5.0rc2", "0.5.1",
    "0.5.1.post1", "0.5.1.post2", "0.5.1.post3", "0.5.2rc0", "0.5.2rc1", "0.5.2rc2", "0.5.2", "0.5.3rc0",
    "0.5.3rc2", "0.5.3", "0.5.3.post1", "0.5.3.post2", "0.5.3.post3", "0.5.4", "0.5.4.post1", "0.5.4.post2",
    "0.5.4.post3", "0.5.5", "0.5.5.post1", "0.5.5.post2", "0.5.5.post3", "0.5.6", "0.5.6.post1", "0.5.6.post2",
    "0.5.7", "0.5.8", "0.5.8.post1", "0.5.9", "0.5.10rc0", "0.5.10", "0.5.10.post1", "0.5.11", "0.5.12",
    "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18",
    "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23",
)  # fmt: skip
OLDEST, NEWEST = RELEASES[0], RELEASES[-1]

_REL = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(?:(rc)(\d+)|\.(post)(\d+)|\.(dev)(\d+))?")


@lru_cache(maxsize=512)
def release_key(v: str) -> tuple[int, ...]:
    """Sort key of a release string: 0.5.0rc2 < 0.5.0 < 0.5.0.post1; .devN before rc. Unparsable → ()."""
    m = _REL.match(v.strip())
    if m is None:
        return ()
    a, b, c = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if m.group(4):
        return (a, b, c, 1, int(m.group(5)))
    if m.group(6):
        return (a, b, c, 3, int(m.group(7)))
    if m.group(8):
        return (a, b, c, 0, int(m.group(9)))
    return (a, b, c, 2, 0)


def next_release(v: str) -> str | None:
    """The first release after `v` (None when `v` is the newest known or not a release string)."""
    k = release_key(v)
    for r in RELEASES:
        if release_key(r) > k:
            return r
    return None


def releases_between(first: str | None, last: str | None) -> list[str]:
    """Known releases in [first, last] (either end None: open), oldest first."""
    lo = release_key(first) if first else ()
    hi = release_key(last) if last else None
    return [r for r in RELEASES if release_key(r) >= lo and (hi is None or release_key(r) <= hi)]


class Format(NamedTuple):
    """One log format and the releases that print it."""

    key: str
    example: str  # what the line looks like (values elided)
    first: str | None  # the release that introduced it (None: already in 0.4.0 or older)
    last: str | None  # the last release that prints it (None: 0.5.23 still does)
    source: str  # where sglang prints it (path inside the sglang package, newest release that has it)


FORMATS: tuple[Format, ...] = (
    Format("load_end_no_usage", "Load weight end. type=…, dtype=…, avail mem=… GB", None, "0.4.3.post2",
           "srt/model_executor/model_runner.py load_model"),
    Format("load_end_usage", "Load weight end. type=…, dtype=…, avail mem=… GB, mem usage=… GB.", "0.4.3.post3",
           "0.5.8.post1", "srt/model_executor/model_runner.py load_model"),
    Format("load_end_elapsed_dtype", "Load weight end. elapsed=… s, type=…, dtype=…, avail mem=…, mem usage=…",
           "0.5.9", "0.5.9", "srt/model_executor/model_runner.py load_model"),
    Format("load_end_elapsed", "Load weight end. elapsed=… s, type=…, [quant, ]avail mem=…, mem usage=…",
           "0.5.10rc0", None, "srt/model_executor/model_runner.py load_model"),
    Format("init_ends_usage", "Init torch distributed ends. mem usage=… GB", "0.4.3.post3", "0.5.8.post1",
           "srt/model_executor/model_runner.py init_torch_distributed"),
    Format("init_ends_elapsed", "Init torch distributed ends. elapsed=… s, mem usage=… GB", "0.5.9", "0.5.20",
           "srt/model_executor/model_runner.py init_torch_distributed"),
    Format("kv_no_tokens", "KV Cache is allocated. K size: … GB, V size: … GB.", "0.4.1.post6", "0.4.3.post2",
           "srt/mem_cache/memory_pool.py MHATokenToKVPool"),
    Format("kv_tokens", "KV Cache is allocated. #tokens: …, K size: … GB, V size: … GB", "0.4.3.post3",
           "0.5.12.post1", "srt/mem_cache/memory_pool.py MHATokenToKVPool"),
    Format("kv_tokens_mla", "KV Cache is allocated. #tokens: …, KV size: … GB", "0.4.5.post3", "0.5.12.post1",
           "srt/mem_cache/memory_pool.py MLATokenToKVPool"),
    Format("kv_dtype", "KV Cache is allocated. dtype: …, #tokens: …, K size: … (or KV size: …)", "0.5.13", None,
           "srt/mem_cache/memory_pool.py _finalize_allocation_log"),
    Format("kv_va_upper_bound", "KV Cache VA upper bound. dtype: …, #tokens: …", "0.5.18", None,
           "srt/mem_cache/memory_pool.py _finalize_allocation_log"),
    Format("using_kv_dtype", "Using KV cache dtype: torch.…", "0.5.3rc2", "0.5.12.post1",
           "srt/model_executor/model_runner.py configure_kv_cache_dtype"),
    Format("swakvpool", "SWAKVPool mem usage: … GB, swa size: …, full size: …", "0.5.3.post3", "0.5.17",
           "srt/mem_cache/swa_memory_pool.py"),
    Format("ready_no_chunk", "max_total_num_tokens=…, max_prefill_tokens=…, max_running_requests=…, context_len=…",
           None, "0.4.1.post7", "srt/managers/scheduler.py Scheduler.__init__"),
    Format("ready_chunk", "max_total_num_tokens=…, chunked_prefill_size=…, …, context_len=… (no available_gpu_mem)",
           "0.4.2", "0.4.6.post5", "srt/managers/scheduler.py Scheduler.__init__"),
    Format("ready_avail", "max_total_num_tokens=…, chunked_prefill_size=…, …, available_gpu_mem=… GB", "0.4.7",
           None, "srt/managers/scheduler.py init_memory_pool_and_cache"),
    Format("server_args_repr", "server_args=ServerArgs(…)", None, "0.5.18", "srt/entrypoints/engine.py"),
    Format("server_args_dict", "server_args={…}", "0.5.19", None, "srt/entrypoints/engine.py"),
    Format("cap_begin_plain", "Capture cuda graph begin. This can take up to several minutes.", None,
           "0.4.3.post2", "srt/model_executor/model_runner.py init_cuda_graphs"),
    Format("cap_begin_avail", "Capture cuda graph begin. This can take up to several minutes. avail mem=… GB",
           "0.4.3.post3", "0.5.13.post1", "srt/model_executor/model_runner.py init_device_graphs"),
    Format("cap_begin_per_bs", "Capture target decode CUDA graph begin. backend=…, num_tokens_per_bs=…, bs=[…]",
           "0.5.14", "0.5.15.post1", "srt/model_executor/model_runner.py init_device_graphs"),
    Format("cap_begin_per_req_bs", "Capture target decode CUDA graph begin. backend=…, num_tokens_per_req=…, bs=[…]",
           "0.5.16", "0.5.21", "srt/model_executor/model_runner_components/cuda_graph_setup.py"),
    Format("cap_begin_per_req", "Capture target decode CUDA graph begin. backend=…, num_tokens_per_req=…, avail mem",
           "0.5.22", None, "srt/model_executor/model_runner_components/cuda_graph_setup.py"),
    Format("cap_end_time", "Capture cuda graph end. Time elapsed: … s", None, "0.4.3.post2",
           "srt/model_executor/model_runner.py init_cuda_graphs"),
    Format("cap_end_avail_usage", "Capture cuda graph end. Time elapsed: … s. avail mem=… GB. mem usage=… GB.",
           "0.4.3.post3", "0.4.6", "srt/model_executor/model_runner.py init_cuda_graphs"),
    Format("cap_end_usage_avail", "Capture cuda graph end. Time elapsed: … s. mem usage=… GB. avail mem=… GB.",
           "0.4.6.post1", "0.5.13.post1", "srt/model_executor/model_runner.py init_device_graphs"),
    Format("cap_end_elapsed", "Capture target decode CUDA graph end. elapsed=… s, mem usage=…, avail mem=…",
           "0.5.14", "0.5.21", "srt/model_executor/model_runner_components/cuda_graph_setup.py"),
    Format("cap_end_bs", "Capture target decode CUDA graph end. bs=[…], elapsed=… s, mem usage=…, avail mem=…",
           "0.5.22", None, "srt/model_executor/model_runner_components/cuda_graph_setup.py"),
    Format("cap_bs_list", "Capture cuda graph bs [1, 2, 4, …]", "0.4.6.post2", "0.5.13.post1",
           "srt/model_executor/cuda_graph_runner.py CudaGraphRunner.__init__"),
    Format("cap_num_tokens_list", "Capture cuda graph num tokens […]", "0.5.3.post2", "0.5.13.post1",
           "srt/model_executor/piecewise_cuda_graph_runner.py"),
    Format("piecewise_begin", "Capture piecewise CUDA graph begin. avail mem=… GB", "0.5.6", "0.5.13.post1",
           "srt/model_executor/model_runner.py init_piecewise_cuda_graphs"),
    Format("prefill_begin_new", "Capture target prefill CUDA graph begin. backend=…, num_tokens=[…], avail mem=…",
           "0.5.14", None, "srt/model_executor/model_runner_components/cuda_graph_setup.py"),
    Format("bcg", "[BCG] Capture …", "0.5.11", "0.5.13.post1", "srt/model_executor/breakable_cuda_graph_runner.py"),
    Format("tqdm_avail", "Capturing batches (avail_mem=… GB)", "0.4.4.post1", "0.4.8",
           "srt/model_executor/cuda_graph_runner.py capture"),
    Format("tqdm_bs", "Capturing batches (bs=… avail_mem=… GB)", "0.4.8.post1", None,
           "srt/model_executor/cuda_graph_runner.py capture"),
    Format("tqdm_num_tokens", "Capturing num tokens (num_tokens=… avail_mem=… GB)", "0.5.3.post2", "0.5.20",
           "srt/model_executor/piecewise_cuda_graph_runner.py capture"),
    Format("tqdm_prefill_shape", "Capturing prefill shape (num_tokens=… avail_mem=… GB)", "0.5.21", None,
           "srt/model_executor/prefill_cuda_graph_runner.py capture"),
    Format("post_capture", "Post-capture KV sizing: …", "0.5.16", None, "srt/mem_cache/kv_cache_configurator.py"),
    Format("batch_period", "Prefill batch. #new-seq: … / Decode batch. #running-req: …", None, "0.5.3.post3",
           "srt/managers/scheduler.py log_prefill_stats / log_decode_stats"),
    Format("batch_comma", "Prefill batch[ [n]], #new-seq: … / Decode batch[ [n]], #running-req: …", "0.5.4", None,
           "srt/managers/scheduler_metrics_mixin.py"),
    Format("retract_old", "Decode out of memory happened. #retracted_reqs: …", None, "0.4.6.post5",
           "srt/managers/scheduler.py update_running_batch"),
    Format("retract_new", "KV cache pool is full. Retract requests. #retracted_reqs: …", "0.4.7", None,
           "srt/managers/scheduler.py update_running_batch"),
)  # fmt: skip
BY_KEY = {f.key: f for f in FORMATS}
_SPAN_LEN = {f.key: len(releases_between(f.first, f.last)) for f in FORMATS}
_BY_RELEASE_KEY = {release_key(r): r for r in RELEASES}

_CAP = r"^Capture (?:target|draft) (?:decode|verify) \w+ graph "  # "CUDA graph", "NPU graph", "XPU graph", …
# Message → format key. Checked in order; each message is classified once (callers cache per message).
_RULES: tuple[tuple[str, str, re.Pattern[str]], ...] = tuple(
    (head, key, re.compile(rx))
    for head, key, rx in (
        ("Load weight end.", "load_end_elapsed_dtype", r"^Load weight end\. elapsed=.*\bdtype="),
        ("Load weight end.", "load_end_elapsed", r"^Load weight end\. elapsed="),
        ("Load weight end.", "load_end_usage", r"^Load weight end\. type=.*mem usage="),
        ("Load weight end.", "load_end_no_usage", r"^Load weight end\. type=.*avail mem=[\d.]+ GB\s*$"),
        ("Init torch distributed ends", "init_ends_elapsed", r"^Init torch distributed ends\. elapsed="),
        ("Init torch distributed ends", "init_ends_usage", r"^Init torch distributed ends\. mem usage="),
        ("KV Cache", "kv_va_upper_bound", r"^(?:\S+ )?KV Cache VA upper bound\. dtype: "),
        ("KV Cache", "kv_dtype", r"^(?:\S+ )?KV Cache is allocated\. dtype: "),
        ("KV Cache", "kv_tokens_mla", r"^KV Cache is allocated\. #tokens: \d+, KV size"),
        ("KV Cache", "kv_tokens", r"^KV Cache is allocated\. #tokens: \d+, K size"),
        ("KV Cache", "kv_no_tokens", r"^KV Cache is allocated\. K size: "),
        ("Using KV cache dtype", "using_kv_dtype", r"^Using KV cache dtype: "),
        ("SWAKVPool mem usage", "swakvpool", r"^SWAKVPool mem usage: "),
        ("max_total_num_tokens=", "ready_avail",
         r"^max_total_num_tokens=\d+, chunked_prefill_size=.*available_\w+_mem"),
        ("max_total_num_tokens=", "ready_chunk",
         r"^max_total_num_tokens=\d+, chunked_prefill_size=.*context_len=\d+\s*$"),
        ("max_total_num_tokens=", "ready_no_chunk", r"^max_total_num_tokens=\d+, max_prefill_tokens="),
        ("Capture cuda graph begin", "cap_begin_avail", r"^Capture cuda graph begin\. .*avail mem="),
        ("Capture cuda graph begin", "cap_begin_plain",
         r"^Capture cuda graph begin\. This can take up to several minutes\.\s*$"),
        # f"Capture {role} {decode|verify} {CUDA|NPU|XPU|…} graph begin." (role: target | draft; verify when
        # speculative): one print for all of them (cuda_graph_setup.py capture_decode_graph, 0.5.16–0.5.23)
        ("Capture ", "cap_begin_per_bs", _CAP + r"begin\. .*num_tokens_per_bs=.*\bbs="),
        ("Capture ", "cap_begin_per_req_bs", _CAP + r"begin\. .*num_tokens_per_req=.*\bbs="),
        ("Capture ", "cap_begin_per_req", _CAP + r"begin\. .*num_tokens_per_req="),
        ("Capture ", "cap_end_bs", _CAP + r"end\. bs="),
        ("Capture ", "cap_end_elapsed", _CAP + r"end\. elapsed="),
        ("Capture cuda graph end", "cap_end_usage_avail",
         r"^Capture cuda graph end\. Time elapsed: [\d.]+ s\. mem usage="),
        ("Capture cuda graph end", "cap_end_avail_usage",
         r"^Capture cuda graph end\. Time elapsed: [\d.]+ s\. avail mem="),
        ("Capture cuda graph end", "cap_end_time", r"^Capture cuda graph end\. Time elapsed: [\d.]+ s\s*$"),
        ("Capture cuda graph bs", "cap_bs_list", r"^Capture cuda graph bs \["),
        ("Capture cuda graph num tokens", "cap_num_tokens_list", r"^Capture cuda graph num tokens \["),
        ("Capture piecewise CUDA graph begin", "piecewise_begin", r"^Capture piecewise CUDA graph begin\."),
        ("Capture target prefill", "prefill_begin_new", r"^Capture target prefill CUDA graph begin\. backend="),
        ("[BCG]", "bcg", r"^\[BCG\] Captur"),
        ("Capturing batches", "tqdm_bs", r"^Capturing batches \(bs=\d+ avail_mem="),
        ("Capturing batches", "tqdm_avail", r"^Capturing batches \(avail_mem="),
        ("Capturing num tokens", "tqdm_num_tokens", r"^Capturing num tokens \(num_tokens="),
        ("Capturing prefill shape", "tqdm_prefill_shape", r"^Capturing prefill shape \("),
        ("Post-capture KV sizing", "post_capture", r"^Post-capture KV sizing"),
        ("Prefill batch", "batch_comma", r"^Prefill batch(?: \[\d+\])?, "),
        ("Prefill batch", "batch_period", r"^Prefill batch\. "),
        ("Decode batch", "batch_comma", r"^Decode batch(?: \[\d+\])?, "),
        ("Decode batch", "batch_period", r"^Decode batch\. "),
        ("Decode out of memory happened", "retract_old", r"^Decode out of memory happened"),
        ("KV cache pool is full", "retract_new", r"^KV cache pool is full\. Retract requests"),
    )
)  # fmt: skip
_BY_PREFIX: dict[str, list[tuple[str, str, re.Pattern[str]]]] = {}
for _rule in _RULES:
    _BY_PREFIX.setdefault(_rule[0][:4], []).append(_rule)


def format_key(msg: str) -> str | None:
    """The dated format of one message (the text after the "[time ranks] " prefix), or None."""
    for head, key, rx in _BY_PREFIX.get(msg[:4], ()):
        if msg.startswith(head) and rx.search(msg):
            return key
    return None


class ReleaseRange(NamedTuple):
    """The releases a log's formats allow: [first, last] (None = open end), and what decided it."""

    first: str | None  # None: 0.4.0 or older (releases before 0.4.0 were not read)
    last: str | None  # None: up to the newest known release (0.5.23) or later
    decided_by: tuple[str, ...]  # the format keys that set the two ends
    conflicts: tuple[str, ...]  # formats left out because they contradict the others

    @property
    def bounded(self) -> bool:
        return self.first is not None or self.last is not None

    def label(self) -> str:
        lo = self.first or f"≤{OLDEST}"
        hi = self.last or f"{NEWEST}+"
        return lo if self.first is not None and self.first == self.last else f"{lo} … {hi}"


def release_range(keys: Iterable[str]) -> ReleaseRange:
    """Intersect the spans of the formats seen. The narrowest spans are applied first; a format whose span
    misses what the others allow (a fork, a dev build, or several logs pasted together) is left out and
    named in `conflicts`."""
    spans = [BY_KEY[k] for k in dict.fromkeys(keys) if k in BY_KEY]
    spans.sort(key=lambda f: _SPAN_LEN[f.key])
    lo: tuple[int, ...] = ()
    hi: tuple[int, ...] | None = None
    lo_by = hi_by = None
    conflicts: list[str] = []
    for f in spans:
        f_lo = release_key(f.first) if f.first else ()
        f_hi = release_key(f.last) if f.last else None
        new_lo = max(lo, f_lo)
        new_hi = f_hi if hi is None else (hi if f_hi is None else min(hi, f_hi))
        if new_hi is not None and new_lo > new_hi:
            conflicts.append(f.key)
            continue
        if new_lo != lo:
            lo_by = f.key
        if new_hi != hi:
            hi_by = f.key
        lo, hi = new_lo, new_hi
    first = _release_of(lo) if lo else None
    last = _release_of(hi) if hi is not None else None
    decided = tuple(k for k in (lo_by, hi_by) if k)
    return ReleaseRange(first, last, tuple(dict.fromkeys(decided)), tuple(conflicts))


def _release_of(key: tuple[int, ...]) -> str:
    return _BY_RELEASE_KEY[key]  # keys only come from FORMATS, whose releases are all in RELEASES
