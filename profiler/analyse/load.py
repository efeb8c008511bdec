"""What the load reached, set beside the worst case the activation reserve is for.

sglang 0.5.23 reserves activation memory for the largest forward a worker may run (arg_groups/memory_hook.py:296-310):
a decode node for `max(running × draft tokens, 2048)` tokens, where the running requests are what the scheduler
admits (`KVCacheConfigurator.resolve_max_num_reqs`, kv_cache_configurator.py:3119: 2,048 … 4,096 unless given) —
above the decode graph's max_bs those steps run eager and materialise the logits in bf16 and fp32
(layers/logits_processor.py); a prefill or unified node for a chunk (`chunked_prefill_size`, else
`max_prefill_tokens`). A run whose load never reached that forward has not measured the term: its activation is "not
reached", never "fits" or "over", and a fraction recommended from it rests on a partial load (compare.py).

The worst case is read from the worker (the admitted requests sglang built its pools for — the probe's kv_pool record,
or /server_info's `effective_max_running_requests_per_dp`; the chunk from its resolved arguments), never from the CLI
field `max_running_requests`, which /server_info reports unresolved (None unless given). The load reached is what
the probe saw the scheduler run (`Recorder.runtime_batch`: largest batch per kind, eager or graph). A decode node
keeps `num_reserved_decode_tokens` free per running request (disaggregation/decode.py:2052-2058), so its pool may hold
fewer requests at once than it admits: the driver says how many its requests could run at once (`reachable`), and
that is the target when it is lower.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profiler.core.measurement import Measurement, Rank


@dataclass(frozen=True, slots=True)
class Reach:
    """One kind of forward: the largest the worker can run, the largest it ran, and whether that is the worst case."""

    kind: str  # decode | extend
    target: int | None  # requests (decode) or tokens (extend) of the worst case; None: unknown
    seen: int | None  # the largest the runtime window saw; None: no batch record (an old probe, a log)
    basis: str  # where the target comes from
    eager: int | None = None  # the largest decode batch that ran eager (above the graph's max_bs)

    @property
    def reached(self) -> bool | None:
        if self.target is None or self.seen is None:
            return None
        return self.seen >= self.target

    def describe(self) -> str:
        unit = "requests" if self.kind == "decode" else "tokens"
        what = "decode batch" if self.kind == "decode" else "prefill batch"
        seen = "no batch recorded" if self.seen is None else f"largest {what} {self.seen:,} {unit}"
        if self.kind == "decode" and self.eager:
            seen += f" ({self.eager:,} eager)"
        tgt = "unknown" if self.target is None else f"{self.target:,} {unit}"
        return f"{seen} of {tgt} ({self.basis})"


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 else None


def admitted(m: Measurement, r: Rank | None) -> tuple[int | None, str]:
    """Requests one scheduler admits at once, as sglang resolved them, and where that was read."""
    kv = r.phase("kv_pool") if r is not None else None
    v = _int(kv.details.get("max_running_requests")) if kv is not None else None
    if v is not None:
        return v, "admitted requests sglang sized its pools for (KVCacheConfigResult, probe)"
    for rk in [r] if r is not None else []:
        ready = rk.phase("ready")
        if ready is not None and (v := _int(ready.details.get("effective_max_running_requests_per_dp"))):
            return v, "/server_info effective_max_running_requests_per_dp"
    return None, "admitted requests not recorded"


def _seen(r: Rank | None, kind: str) -> dict[str, Any] | None:
    rt = r.phase("runtime") if r is not None else None
    s = (rt.details.get("batches_seen") or {}).get(kind) if rt is not None else None
    return s if isinstance(s, dict) else None


def _reachable(m: Measurement) -> int | None:
    """The driver's own bound on how many of its decode requests the pool can hold at once (load plan)."""
    for p in m.serving.get("load_plans") or []:
        if isinstance(p, dict) and p.get("kind") == "decode":
            return _int(p.get("reachable_requests"))
    return None


def reaches(m: Measurement, r: Rank | None, mode: str | None) -> tuple[Reach, ...]:
    """The worst cases of the role (decode: the admitted requests at once; prefill: a chunk; unified: both) and
    what the load reached of each."""
    out = []
    if mode in ("decode", "null", None):
        n, basis = admitted(m, r)
        reach = _reachable(m)
        if n is not None and reach is not None and reach < n:
            n, basis = reach, f"{basis}: {n:,}, of which the KV pool holds {reach:,} at once (load plan)"
        s = _seen(r, "decode")
        out.append(Reach("decode", n, None if s is None else _int(s.get("max_requests")) or 0, basis,
                         None if s is None else _int(s.get("max_eager_requests"))))  # fmt: skip
    if mode in ("prefill", "null", None):
        chunk = _int(m.args.get("chunked_prefill_size"))
        basis = "chunked_prefill_size"
        if chunk is None:
            chunk, basis = _int(m.args.get("max_prefill_tokens")), "max_prefill_tokens (chunking off)"
        s = _seen(r, "extend")
        out.append(Reach("extend", chunk, None if s is None else _int(s.get("max_tokens")) or 0,
                         basis + (" (resolved)" if m.args_source == "server_info" else " (scenario)")))  # fmt: skip
    return tuple(out)


def load_note(rs: tuple[Reach, ...]) -> str:
    """'' when every worst case was reached; else what was not (for the activation row and the recommendation)."""
    missing = [x for x in rs if x.reached is not True]
    return "; ".join(x.describe() for x in missing)
