"""Per-request proof that a PD pair's KV cache crossed: a hash of each request's KV rows at send and receive.

Active only when `MEMFRAC_KV_HASH=1` (memfrac sets it for the two workers of a pair it starts) in a scheduler
that loads memfrac's plugin. Two AROUND hooks, both on sglang 0.5.23's Scheduler (the disaggregation mixins'
methods, so the hook sees `self` = the scheduler):

- prefill — `send_kv_chunk` (disaggregation/prefill.py:1501). On the last chunk of a request it hashes the
  rows [req.disagg_decode_prefix_len, end) of the request's KV, exactly the range sglang's own checksum
  digests there (prefill.py:1513-1518: "only the pages this prefill sends"), before the transfer is queued;
  earlier calls (one per chunk of a chunked prefill) are counted.
- decode — `_verify_kv_checksums` (disaggregation/decode.py:3289), which `get_new_prebuilt_batch`
  (decode.py:3273-3280) calls for every batch of requests whose transfer completed, before any KV of theirs is
  cached or decoded. It hashes rows [req.kv.cache_protected_len, len(origin_input_ids)) — the range sglang's
  checksum digests on decode (decode.py:3312-3315).

sglang's own digest (`--disaggregation-enable-kv-checksum`, disaggregation/checksum.py) asserts CUDA tensors
(checksum.py:110 `assert kv_page_indices_gpu.is_cuda`), so it cannot serve on a CPU pair; this one reads the
same rows through torch and works on both devices. The hash: SHA-256 over every layer's K then V rows (or an
MLA pool's single buffer), in token order, as raw bytes; the token slots themselves differ between the
workers and are not hashed. `zero` says every hashed byte was 0: the decode pool is allocated with
torch.zeros (mem_cache/memory_pool.py `_create_buffers`), so a request whose KV never arrived — sglang's
warm-up request to the fake bootstrap host "2.2.2.2" — shows zeros: the negative control.

Cost: per layer a gather of the request's rows (a device temporary of tokens × row bytes, freed at once) and a
copy to the host. Records go to `$MEMFRAC_PROBE_DIR/kv-<pid>.jsonl` (not the probe's own file), one JSON
object per line, flushed per record.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

ENV = "MEMFRAC_KV_HASH"
FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # sglang/srt/disaggregation/utils.py FAKE_BOOTSTRAP_HOST
_SCHED = "sglang.srt.managers.scheduler.Scheduler"
SEND_TARGET = f"{_SCHED}.send_kv_chunk"  # disaggregation/prefill.py:1501 (SchedulerDisaggregationPrefillMixin)
RECV_TARGET = f"{_SCHED}._verify_kv_checksums"  # disaggregation/decode.py:3289 (SchedulerDisaggregationDecodeMixin)


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


class KvLog:
    """Append-only JSONL of kv_send / kv_recv records for one scheduler process."""

    def __init__(self, out_dir: str) -> None:
        os.makedirs(out_dir, exist_ok=True)
        self.path = os.path.join(out_dir, f"kv-{os.getpid()}.jsonl")
        self.chunks: dict[str, int] = {}

    def write(self, rec: dict[str, Any]) -> None:
        rec = {"t": round(time.time(), 3), "pid": os.getpid(), **rec}
        with open(self.path, "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")
            f.flush()


def _buffers(pool: Any) -> list[Any]:
    """Every per-layer KV buffer of a token-to-KV pool: MHA's K then V lists, or MLA's one list."""
    k, v = getattr(pool, "k_buffer", None), getattr(pool, "v_buffer", None)
    if isinstance(k, list | tuple) and isinstance(v, list | tuple):
        return [*k, *v]
    kv = getattr(pool, "kv_buffer", None)
    if isinstance(kv, list | tuple):
        return list(kv)
    raise TypeError(f"{type(pool).__name__} has neither k_buffer/v_buffer nor kv_buffer")


def digest_rows(pool: Any, locs: Any) -> tuple[str, bool, int]:
    """(sha256 hex, every byte zero, bytes hashed) of the pool's rows at token slots `locs`, in order."""
    import torch

    h = hashlib.sha256()
    zero = True
    n = 0
    idx = locs.to(torch.int64)
    for buf in _buffers(pool):
        rows = buf.index_select(0, idx.to(buf.device)).contiguous()
        raw = rows.view(-1).view(torch.uint8).cpu()
        zero = zero and not bool(raw.any())
        b = raw.numpy().tobytes()
        n += len(b)
        h.update(b)
    return h.hexdigest(), zero, n


def _req_fields(req: Any) -> dict[str, Any]:
    host = getattr(req, "bootstrap_host", None)
    return {
        "rid": getattr(req, "rid", None),
        "room": getattr(req, "bootstrap_room", None),
        "bootstrap_host": host,
        "fake": host == FAKE_BOOTSTRAP_HOST,
        "input_len": len(getattr(req, "origin_input_ids", ()) or ()),
    }


def _row_hash(log: KvLog, kind: str, sched: Any, req: Any, start: int, end: int, extra: dict[str, Any]) -> None:
    rec: dict[str, Any] = {"type": kind, **_req_fields(req), "start": start, "end": end, "tokens": end - start}
    rec.update(extra)
    try:
        pool = sched.token_to_kv_pool_allocator.get_kvcache()
        locs = sched.req_to_token_pool.req_to_token[req.kv.req_pool_idx, start:end]
        rec["sha256"], rec["zero"], rec["bytes"] = digest_rows(pool, locs)
        rec["pool"] = type(pool).__name__
    except Exception as e:  # never break the worker: say why there is no hash
        rec["error"] = f"{type(e).__name__}: {e}"[:300]
    log.write(rec)


def send_hook(log: KvLog) -> Callable[..., Any]:
    def hook(original: Callable[..., Any], self: Any, req: Any, last_chunk: bool = False,
             end_idx: int | None = None, *args: Any, **kwargs: Any) -> Any:  # fmt: skip
        try:
            rid = str(getattr(req, "rid", ""))
            log.chunks[rid] = log.chunks.get(rid, 0) + 1
            if last_chunk:
                # the range sglang's own checksum digests (prefill.py:1513-1518)
                end = end_idx if end_idx is not None else min(req.extend_end, len(req.origin_input_ids))
                start = int(getattr(req, "disagg_decode_prefix_len", 0) or 0)
                extra = {"send_calls": log.chunks.pop(rid, 1), "cached_tokens": getattr(req, "cached_tokens", None)}
                _row_hash(log, "kv_send", self, req, start, int(end), extra)
        except Exception as e:
            log.write({"type": "kv_send", "error": f"{type(e).__name__}: {e}"[:300]})
        return original(self, req, last_chunk, end_idx, *args, **kwargs)

    return hook


def recv_hook(log: KvLog) -> Callable[..., Any]:
    def hook(original: Callable[..., Any], self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            for req in list(getattr(batch, "reqs", []) or []):
                start = int(getattr(req.kv, "cache_protected_len", 0) or 0)  # decode.py:3312-3315
                _row_hash(log, "kv_recv", self, req, start, len(req.origin_input_ids), {})
        except Exception as e:
            log.write({"type": "kv_recv", "error": f"{type(e).__name__}: {e}"[:300]})
        return original(self, batch, *args, **kwargs)

    return hook


def install(registry: Any, hook_type: Any, out_dir: str) -> list[str]:
    """Register both hooks when MEMFRAC_KV_HASH=1 (a target missing in the installed sglang is written to the
    log as an error record, never raised). Returns the targets registered."""
    if not enabled():
        return []
    from profiler.measure.probe.targets import Target, resolve

    log = KvLog(out_dir)
    done = []
    for path, make in ((SEND_TARGET, send_hook), (RECV_TARGET, recv_hook)):
        r = resolve(Target("kv_hash", path, required=False))
        if not r.ok:
            log.write({"type": "error", "target": path, "note": r.note})
            continue
        registry.register(path, make(log), hook_type.AROUND)
        done.append(path)
    log.write({"type": "start", "targets": done})
    return done
