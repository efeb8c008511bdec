"""The `Measurement` record: what one worker run really used, phase by phase, rank by rank.

Both sources produce it: `profiler.logs` from a server log (free memory as SGLang printed it) and
`profiler.measure.runner` from the in-process probe (driver, allocator, NVML and host-RSS snapshots). Every
quantity is MiB (a float; SGLang's "GB" is GiB and is converted ×1024). A field the source does not give
is None — explicitly unknown, never guessed; where a value is inferred, the record says how.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, NamedTuple

SCHEMA_VERSION = 1

#: Canonical startup phases, in the order a worker runs them (facts §4), then runtime and the end state.
PHASES = (
    "init_parallel",  # NCCL / custom all-reduce init ("Init torch distributed ends. mem usage")
    "baseline",  # measure_pre_model_load_memory: free memory the fraction is applied to
    "weights",  # Load weight begin → end
    "kv_pool",  # KV cache (and Mamba/SWA pools) allocation → "Memory pool end"
    "attention_backends",
    "eager_runner",
    "prefill_graph",  # prefill (piecewise/breakable/full) CUDA-graph capture
    "decode_graph",  # decode CUDA-graph capture (largest bs first), ladder per bs
    "verify_graph",  # speculative target-verify capture
    "draft_graph",  # speculative draft capture
    "draft_extend_graph",
    "a2a_buffer",  # an all-to-all backend's buffer creation (first MoE dispatch; inside warmup or capture)
    "deepep_buffer",  # the same, as probe records before format 2 named DeepEP's
    "finalize",  # finalize_cuda_graph_capture (symmetric memory)
    "post_capture_resize",  # post-capture KV sizing
    "disaggregation_init",
    "ready",  # the final scheduler line: max_total_num_tokens=… available_gpu_mem=…
    "runtime",  # serving load (probe-sampled peak)
)

Source = Literal["log", "probe", "server_info"]
MemoryKind = Literal["gpu", "host"]

FAILURE_KINDS = (
    "oom_during_capture",  # CUDA OOM while capturing a CUDA graph
    "oom_startup",  # CUDA OOM while loading weights / allocating pools / warmup (before capture)
    "oom_runtime",  # CUDA OOM while serving
    "capture_failed",  # capture failed for a reason other than OOM (kernel image, TypeError, ...)
    "crash",  # scheduler / worker died (exception, signal)
    "timeout",  # never became ready / hung
    "bad_args",  # sglang rejected its arguments
    "load_failed",  # the worker stayed up but rejected the load (the runtime peak is not measured)
    "probe_error",  # memfrac's probe could not hook the worker (a hook target missing in this sglang)
)


@dataclass(slots=True)
class Snapshot:
    """Memory at one instant in one process. `free_mib`/`total_mib` are the driver's view
    (`torch.cuda.mem_get_info`, a log's "avail mem"); torch_* come from `torch.cuda.memory_stats`."""

    kind: MemoryKind = "gpu"
    t: float | None = None  # seconds (unix time for the probe; None for logs without timestamps)
    free_mib: float | None = None
    total_mib: float | None = None
    torch_allocated_mib: float | None = None
    torch_reserved_mib: float | None = None
    torch_peak_allocated_mib: float | None = None
    torch_peak_reserved_mib: float | None = None
    nvml_used_mib: float | None = None  # this process, per NVML
    rss_mib: float | None = None  # host resident set (CPU runs, or alongside GPU numbers)
    rss_peak_mib: float | None = None  # host high-water mark (VmHWM) of the current peak window
    device: int | None = None  # CUDA device index the reading is of

    @property
    def used_mib(self) -> float | None:
        if self.free_mib is None or self.total_mib is None:
            return None
        return self.total_mib - self.free_mib

    def as_dict(self) -> dict[str, Any]:
        """The fields that were read (None left out): what the probe writes per record."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def __sub__(self, before: Snapshot) -> Delta:
        """`after - before`: what the window between two readings took, layer by layer (a value)."""
        return Delta.between(before, self)


def _taken(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


@dataclass(frozen=True, slots=True)
class Delta:
    """What a window took between two snapshots, per layer (MiB; positive = taken, negative = given back).

    A layer is None unless both readings have it: a window that starts before CUDA is up (no driver reading)
    and ends after it has no driver usage — never an RSS figure standing in for a GPU one.

        driver   = free before − free after          every allocation: torch's, NCCL, NVSHMEM, context
        reserved = torch reserved after − before      the caching allocator (CUDA-graph private pools included)
        nontorch = driver − reserved                  what torch cannot see (DeepEP, NCCL, cuBLAS workspaces)
    """

    kind: MemoryKind
    driver_mib: float | None = None
    reserved_mib: float | None = None
    allocated_mib: float | None = None
    rss_mib: float | None = None

    @classmethod
    def between(cls, before: Snapshot, after: Snapshot) -> Delta:
        driver = None
        if before.free_mib is not None and after.free_mib is not None:
            driver = before.free_mib - after.free_mib
        return cls(
            kind="host" if "host" in (before.kind, after.kind) else "gpu",
            driver_mib=driver,
            reserved_mib=_taken(before.torch_reserved_mib, after.torch_reserved_mib),
            allocated_mib=_taken(before.torch_allocated_mib, after.torch_allocated_mib),
            rss_mib=_taken(before.rss_mib, after.rss_mib),
        )

    @property
    def nontorch_mib(self) -> float | None:
        """Device memory outside torch's allocator: driver − reserved."""
        if self.driver_mib is None or self.reserved_mib is None:
            return None
        return self.driver_mib - self.reserved_mib

    @property
    def used_mib(self) -> float | None:
        """The window's usage in its own kind: the driver's on a GPU, RSS on the host."""
        return self.rss_mib if self.kind == "host" else self.driver_mib


@dataclass(slots=True)
class LadderPoint:
    """Memory at one rung of the decode capture ladder (one start gives the whole curve).

    Probe: right after capturing `bs`. Log: sglang's tqdm text, printed before capturing `bs` (after all
    larger sizes), on TP rank 0, without empty_cache; 2025 logs print no bs (then None).
    """

    bs: int | None
    free_mib: float | None = None
    used_mib: float | None = None  # cumulative since the phase began
    torch_reserved_mib: float | None = None


@dataclass(slots=True)
class Phase:
    """One startup (or runtime) phase on one rank: memory before and after, and what it used."""

    name: str
    source: Source = "log"
    before: Snapshot | None = None
    after: Snapshot | None = None
    peak: Snapshot | None = None  # highest point inside the phase (probe: torch peaks, sampled driver)
    usage_mib: float | None = None  # as printed ("mem usage") or before.free − after.free
    elapsed_s: float | None = None
    resolution_mib: float | None = None  # precision of the printed numbers (0.01 GB → 10.24 MiB)
    ladder: list[LadderPoint] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)  # kv tokens, K/V MiB, dtype, backend, bs list, ...
    line: int | None = None  # where in the source it was read (first line of the phase)

    @property
    def delta(self) -> Delta | None:
        """after − before (None unless both readings exist)."""
        if self.before is None or self.after is None:
            return None
        return self.after - self.before

    @property
    def freed_mib(self) -> float | None:
        """Driver-visible usage: free before − free after (None unless both are known)."""
        d = self.delta
        return None if d is None else d.driver_mib

    @property
    def used_mib(self) -> float | None:
        """The phase's usage: as reported, else the driver delta."""
        return self.usage_mib if self.usage_mib is not None else self.freed_mib

    @property
    def role(self) -> str:
        """ "target", or "draft" for a speculative draft model's repeat of a phase (probe tag / log order)."""
        return str(self.details.get("role") or "target")


@dataclass(slots=True)
class Failure:
    """Why a run ended badly, with the numbers of the OOM message when there is one."""

    kind: str  # one of FAILURE_KINDS
    phase: str | None = None  # phase in flight when it failed (e.g. decode_graph)
    message: str = ""
    line: int | None = None
    exit_code: int | None = None
    gpu_index: int | None = None
    tried_alloc_mib: float | None = None
    total_capacity_mib: float | None = None
    free_mib: float | None = None
    in_use_mib: float | None = None  # "this process has X memory in use"
    allocated_by_torch_mib: float | None = None
    reserved_unallocated_mib: float | None = None
    private_pools_mib: float | None = None  # "X is allocated by PyTorch ... in private pools" (CUDA graphs)
    reserved_by_torch_mib: float | None = None  # old-format (torch ≤ 2.0, torch_npu) "X reserved in total by PyTorch"
    outside_torch_mib: float | None = None  # in use − allocated by PyTorch − reserved but unallocated (as printed)
    capture_bs: int | None = None  # batch size being captured, when known

    @property
    def non_torch_mib(self) -> float | None:
        """In-use memory outside torch's allocator (NCCL, DeepEP/NVSHMEM, CUDA context)."""
        if self.in_use_mib is None or self.allocated_by_torch_mib is None:
            return None
        return self.in_use_mib - self.allocated_by_torch_mib - (self.reserved_unallocated_mib or 0.0)


@dataclass(slots=True)
class Rank:
    """One scheduler process: its rank labels, its phases in order, its end state."""

    label: str = ""  # as printed: "TP0", "DP0 TP0 EP0", "PP1 TP3"; "" for single-rank logs
    tp: int | None = None
    dp: int | None = None
    pp: int | None = None
    ep: int | None = None
    pid: int | None = None
    phases: list[Phase] = field(default_factory=list)
    failure: Failure | None = None

    def phase(self, name: str, role: str = "target") -> Phase | None:
        """The last phase of that name run for `role` (a draft model repeats baseline, weights, kv_pool, …:
        eagle_worker_v2.py builds a second ModelRunner with is_draft_worker=True)."""
        for p in reversed(self.phases):
            if p.name == name and p.role == role:
                return p
        return None

    def phases_named(self, name: str) -> list[Phase]:
        return [p for p in self.phases if p.name == name]

    def free_at_start(self) -> FreeAtStart:
        """The free memory this rank's books, its slack and every fraction rest on (see `free_at_start`)."""
        return free_at_start(self)


class FreeAtStart(NamedTuple):
    """Free device memory at the start of a rank (MiB), where it was read, and on how many readings it rests."""

    mib: float | None
    how: str  # read | implied | unknown
    what: str  # which reading
    phase: str | None = None  # the window it was read at (baseline | weights)
    readings: int = 0  # how many printed numbers it is made of (a log's each carry ±0.005 GiB)


def free_at_start(r: Rank | None) -> FreeAtStart:
    """THE rule for "free memory at start" (the ledger's opening, compare's slack and recommended fraction, a
    log's implied fraction all call it), first that the record has:

    1. sglang's own `pre_model_load_memory` — the probe's `measure_pre_model_load_memory` hook keeps what it
       returned (bootstrap.py:193-223: free memory after NCCL init and `empty_cache`, the minimum over ranks,
       bootstrap.py:207-212), older logs print it ("Memory profiling: … total_gpu_memory="). It is the number
       sglang applies the fraction to (the KV budget is free after weights − pre_model_load × (1 − mfs)), so the
       slack, an implied fraction and a recommended fraction are only right on it. On a rank that had more
       free than the minimum the surplus is memory that rank's books cannot attribute: it shows as a gap.
    2. the rank's own reading at the end of the baseline window (probe: the driver right after sglang's
       `get_available_gpu_memory(empty_cache=True)`), for a probe record without the hook's return value;
    3. avail mem at 'Load weight begin' (a log; the probe's weights window begin) — the first reading there is;
    4. 'Load weight end' avail mem + its printed mem usage (implied, two printed numbers).

    Why one rule: three copies read three fields (compare took 1, the ledger 2, the log parser 1 with other
    fallbacks), so a log that prints both pre_model_load and 'Load weight begin' opened its books on one number
    and computed its slack on another."""
    if r is None:
        return FreeAtStart(None, "unknown", "no rank")
    base = r.phase("baseline")
    if base is not None:
        v = base.details.get("pre_model_load_mib")
        if isinstance(v, int | float) and not isinstance(v, bool):
            return FreeAtStart(float(v), "read", "pre_model_load_memory as sglang measured it", "baseline", 1)
        if base.source == "probe" and base.after is not None and base.after.free_mib is not None:
            return FreeAtStart(base.after.free_mib, "read", "free when sglang measured pre_model_load_memory "
                               "(this rank, driver)", "baseline", 1)  # fmt: skip
    w = r.phase("weights")
    if w is None:
        return FreeAtStart(None, "unknown", "no reading before the weights")
    if w.before is not None and w.before.free_mib is not None:
        what = "avail mem at 'Load weight begin'" if w.source == "log" else "free when the weights began"
        return FreeAtStart(w.before.free_mib, "read", what, "weights", 1)
    if w.source == "log" and w.after is not None and w.after.free_mib is not None and w.usage_mib is not None:
        return FreeAtStart(w.after.free_mib + w.usage_mib, "implied",
                           "'Load weight end' avail mem + its printed mem usage", "weights", 2)  # fmt: skip
    return FreeAtStart(None, "unknown", "no reading before the weights")


#: How a GPU capacity bounded by a log's free memory (not printed, not named) is described: the bound first.
ESTIMATED_HOW = ("first avail mem", "avail mem after weights", "largest free")


@dataclass(slots=True)
class Identity:
    """Which run this was: model, GPU, parallelism, release. None = the source does not say."""

    model: str | None = None
    architecture: str | None = None
    gpu_name: str | None = None
    gpu_total_mib: float | None = None
    gpu_total_how: str = "unknown"  # "nvidia-smi" | "torch" | "oom total capacity" | "first avail mem ≈ <GPU>" | ...
    gpu_count: int | None = None
    mode: str | None = None  # null | prefill | decode
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    attn_dp: int | None = None
    ep: int | None = None
    sglang_version: str | None = None  # the release, when known exactly
    sglang_how: str = "unknown"  # how the release is known ("docker image tag … (line 3)", "log formats: …")
    sglang_range: list[str] = field(default_factory=list)  # [first, last] the log's formats allow ("" = open end)
    gpu_candidates_mib: list[int] = field(default_factory=list)  # capacities consistent with the log, when several
    hostname: str | None = None

    @property
    def gpu_total_origin(self) -> str:
        """read (printed, or a named GPU's capacity) | estimated (bounded by the free memory a log shows:
        `gpu_total_how` then begins with the bound, ESTIMATED_HOW) | unknown."""
        if self.gpu_total_mib is None:
            return "unknown"
        return "estimated" if self.gpu_total_how.startswith(ESTIMATED_HOW) else "read"


@dataclass(slots=True)
class Measurement:
    """Everything observed of one worker run (one server start), from a log or from the probe."""

    id: str
    source: Source
    memory_kind: MemoryKind = "gpu"  # "host" on CPU runs: every number is host RSS, never a GPU number
    origin: str = ""  # the log file, or the artifacts directory
    scenario: str | None = None
    identity: Identity = field(default_factory=Identity)
    args: dict[str, Any] = field(default_factory=dict)  # server args recovered / resolved (sglang names)
    args_source: str = "none"  # server_args | launch_command | scheduler_line | scenario | server_info | none
    args_from: dict[str, str] = field(default_factory=dict)  # per arg: server_args | launch_command | log line N (…)
    mfs: float | None = None  # the fraction the run used, when the source prints or implies it (see mfs_how)
    mfs_origin: str = "unknown"  # given | auto | implied | unknown
    mfs_how: str = ""  # where the fraction comes from, with the arithmetic when implied
    mfs_plus_minus: float | None = None  # implied: its uncertainty from the 0.01 GB printing (None: exact or bound)
    startup: str | None = None  # log runs: finished | incomplete | aborted | no_kv (None: not judged, e.g. probe)
    startup_seen: str = ""  # what the text shows of the startup (the last phase reached, where it stops)
    serving: dict[str, Any] = field(default_factory=dict)  # serving traffic a log shows: peaks, retractions
    ranks: list[Rank] = field(default_factory=list)
    failure: Failure | None = None  # the run's first failure, if any
    unparsed_memory_lines: int = 0  # lines that looked like memory lines but matched no known format
    unparsed_examples: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    first_line: int | None = None
    last_line: int | None = None
    schema_version: int = SCHEMA_VERSION

    # ---- convenience ---------------------------------------------------------------------------------
    def rank(self, label: str = "") -> Rank | None:
        for r in self.ranks:
            if r.label == label:
                return r
        return None

    @property
    def primary(self) -> Rank | None:
        """The rank to summarise: the first one with phases (TP0 / DP0 TP0 normally)."""
        for r in self.ranks:
            if r.phases or r.failure:
                return r
        return self.ranks[0] if self.ranks else None

    @property
    def ok(self) -> bool:
        return self.failure is None

    # ---- (de)serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Measurement:
        v = d.get("schema_version", SCHEMA_VERSION)
        if v > SCHEMA_VERSION:
            raise ValueError(f"measurement schema {v} is newer than this memfrac ({SCHEMA_VERSION}); upgrade memfrac")
        kw = _known(cls, d)
        kw["identity"] = Identity(**_known(Identity, d.get("identity") or {}))
        kw["failure"] = _failure(d.get("failure"))
        kw["ranks"] = [_rank(r) for r in d.get("ranks") or []]
        return cls(**kw)

    @classmethod
    def from_json(cls, text: str) -> Measurement:
        return cls.from_dict(json.loads(text))

    def save(self, path: str | Path) -> Path:
        """Write atomically (temp file + rename): a reader never sees half a record."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(p)
        return p

    @classmethod
    def load(cls, path: str | Path) -> Measurement:
        return cls.from_json(Path(path).read_text())


def _known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def _snap(d: dict[str, Any] | None) -> Snapshot | None:
    return None if d is None else Snapshot(**_known(Snapshot, d))


def _failure(d: dict[str, Any] | None) -> Failure | None:
    return None if d is None else Failure(**_known(Failure, d))


def _phase(d: dict[str, Any]) -> Phase:
    kw = _known(Phase, d)
    kw["before"], kw["after"], kw["peak"] = _snap(d.get("before")), _snap(d.get("after")), _snap(d.get("peak"))
    kw["ladder"] = [LadderPoint(**_known(LadderPoint, x)) for x in d.get("ladder") or []]
    return Phase(**kw)


def _rank(d: dict[str, Any]) -> Rank:
    kw = _known(Rank, d)
    kw["phases"] = [_phase(p) for p in d.get("phases") or []]
    kw["failure"] = _failure(d.get("failure"))
    return Rank(**kw)


GIB = 1024.0  # MiB per GiB: SGLang's "GB" is GiB


def gib(x: float | None) -> float | None:
    """GiB (SGLang's "GB") → MiB."""
    return None if x is None else x * GIB


#: The `Phase.details` keys both sources use (MiB for sizes, as everywhere).
DETAIL_KEYS = {
    "weights": ("dtype", "quant", "load_format"),
    "kv_pool": (
        "kv_tokens", "k_mib", "v_mib", "kv_mib", "kv_dtype", "mamba_mib", "swa_tokens", "swa_kv_mib",
        "va_upper_bound", "budget_mib",
    ),
    "prefill_graph": ("backend", "num_tokens", "bs_list"),
    "decode_graph": ("backend", "num_tokens_per_req", "bs_list", "max_bs"),
    "ready": (
        "max_total_num_tokens", "chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "context_len",
        "available_gpu_mem_mib",
    ),
    "baseline": ("pre_model_load_mib",),
    "a2a_buffer": ("backend", "args", "analytic_bytes", "device_bytes", "reported_bytes", "analytic_source", "fails"),
    "deepep_buffer": ("mode", "tokens_per_rank", "analytic_bytes", "num_experts", "hidden"),
}  # fmt: skip
