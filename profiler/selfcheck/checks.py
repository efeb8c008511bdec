"""`memfrac selfcheck`: the acceptance run of a CUDA machine that has torch but not sglang.

Two groups of checks, each a CUDA part that takes readings and a pure judge over those readings (the judges
are plain Python, so CPU tests run them on recorded and hand-made readings):

**attribution** — the probe's snapshot layers say what an allocation of known size and owner cost. Each step
takes `Probe.snapshot()` before and after (after `torch.cuda.synchronize()`, and after `empty_cache()` where
the caching allocator's free cache would blur the reading):

0. idle: two snapshots with nothing between them: every layer moves by 0 (a snapshot costs no GPU memory,
   and nothing else is allocating on this GPU; if it fails, every driver delta below is suspect).
1. a 512 MiB torch tensor: driver, torch reserved and torch allocated all take 512 MiB, non-torch
   (driver − reserved) 0; freed + `empty_cache`: all give 512 MiB back.
2. a 256 MiB `cudaMalloc` through ctypes on libcudart (behind torch's back): driver takes 256 MiB, torch
   reserved 0, so non-torch 256 MiB; `cudaFree`: the driver gives 256 MiB back.
3. a CUDA-graph ladder (4-layer MLP, batch sizes 64 → 1, one shared graph pool, like sglang): each capture's
   driver delta equals its torch reserved delta (graph private pools are inside torch reserved, non-torch 0),
   memory never goes down, and replaying every graph afterwards costs nothing: the per-capture deltas sum to
   the ladder's total.
4. peak reset: `reset_peaks()` drops an earlier 512 MiB peak, and a transient 256 MiB tensor allocated and
   freed after it shows in `torch_peak_allocated_mib`.

Their tolerance: |measured − expected| ≤ max(5 % of the check's size, 2 MiB) on every compared layer, where
the size is the allocation the check is about. The 2 MiB floor is the CUDA allocation granule: `cudaMalloc`
and the caching allocator's large segments come in 2 MiB pages, and the driver's free count moves in such
pages. The sizes are multiples of 2 MiB and powers of two, so they are exact under the default allocator and
under `roundup_power2_divisions`; with `expandable_segments:True` torch maps 20 MiB pages (512 → 520 MiB, 1.6 %).

**worker life** — the whole probe pipeline on a real device: a worker's life shaped like sglang 0.5.23's, in
this process, driven through the plugin's own hook functions into the real `Recorder`, written as probe JSONL,
read back by `read_probe_dir`, and judged by `compare` and the `ledger`: the books close and every line equals
the bytes the life allocated for it. The life, its sizes and its tolerances are in `profiler/selfcheck/life.py`.

NVML's per-process delta is reported beside the others but never decides a check (containers hide PIDs, MIG
hides per-process usage); a disagreement with the driver is named in the check's note.

`--json` prints one object (schema `memfrac-selfcheck/2`, stable; new keys may be added, none renamed):

    schema      "memfrac-selfcheck/2"
    passed      true when every check passed
    device      {index, name, total_mib, free_mib}            free_mib: driver free when the run began
    torch, cuda, allocator, libcudart, elapsed_s
    checks      [{name, group, unit, expected, expected_how, expected_by_layer, measured, tolerance,
                  tolerance_why, passed, note}]
                group: attribution | worker life; unit: MiB unless it says otherwise; measured: every layer's
                reading (None: no reading); expected_by_layer: the layers compared and what each must read
    ledger      the worker life's books, `Ledger.as_dict()` (None when the life did not run)
    readings    what the judges ran on: {"attribution": {check: snapshots}, "life": {truth, probe_records}} —
                `run.judge_readings(doc["readings"])` re-judges a recorded run on any machine

    refused     only when the run refused to start (exit 2): the one-line reason, also on stderr; then
                passed is false, checks is [], ledger null, readings {}, and device/torch/cuda say what was seen

Exit status: 0 every check passed, 1 a check failed, 2 no CUDA device (or too little free memory for the
worker life) — one line on stderr; with `--json` stdout still carries the document, with `refused` set.

Only the CUDA-touching functions import torch; the records, the tolerance, the judges and the rendering are
plain Python.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from profiler.core.errors import MemfracError
from profiler.core.measurement import Snapshot
from profiler.core.units import BYTES_PER_MIB

MIB = BYTES_PER_MIB
REL_TOL = 0.05
ABS_TOL_MIB = 2.0
TOLERANCE_RULE = "|measured − expected| ≤ max(5% of the check's size, 2 MiB)"
SCHEMA = "memfrac-selfcheck/2"
ATTRIBUTION, LIFE = "attribution", "worker life"

TORCH_ALLOC_MIB = 512
NON_TORCH_ALLOC_MIB = 256
PEAK_PRIOR_MIB = 512
PEAK_TRANSIENT_MIB = 256

LADDER = (64, 32, 16, 8, 4, 2, 1)  # largest first, as sglang captures
HIDDEN, FFN, LAYERS = 1024, 4096, 4
# Rows per batch entry: a 4-layer MLP at bs 64 × 1 row would need < 2 MiB of graph memory, all of it inside one
# allocation granule; 256 rows make the bs=64 capture hold ~300-400 MiB (two 128 MiB FFN activations alive at once,
# the 32 MiB hidden state, the output), so the tolerance is a small share of what is measured.
ROWS_PER_BS = 256

# Layer keys of an attribution check's `measured`, in table order, with their column titles.
LAYERS_SHOWN: tuple[tuple[str, str], ...] = (
    ("driver", "driver Δ"),
    ("torch_reserved", "reserved Δ"),
    ("torch_allocated", "allocated Δ"),
    ("torch_peak_allocated", "peak alloc Δ"),
    ("non_torch", "non-torch Δ"),
    ("nvml", "NVML Δ"),
)
# ... and of a worker-life check (the window's layers beside what the ledger booked).
LIFE_LAYERS_SHOWN: tuple[tuple[str, str], ...] = (
    ("driver", "window driver Δ"),
    ("torch_reserved", "reserved Δ"),
    ("non_torch", "non-torch Δ"),
)


class NoCudaDevice(MemfracError):
    """No CUDA device is visible to this process: nothing to check."""


class NotEnoughFreeMemory(MemfracError):
    """The GPU has less free memory than the worker life needs (another process holds it)."""


class LibcudartNotFound(MemfracError):
    """No CUDA runtime library to call `cudaMalloc` through; the message names every place looked in."""


class CudaRuntimeError(RuntimeError):
    """A CUDA runtime call through ctypes returned an error."""


# ---------------------------------------------------------------------------------------------------------------
# Records and the judging arithmetic: plain Python


def tolerance_mib(size_mib: float) -> float:
    """The tolerance of an attribution check about `size_mib` of memory: 5 % of it or 2 MiB, the larger."""
    return max(REL_TOL * abs(size_mib), ABS_TOL_MIB)


def within(measured: float | None, expected: float | None, tol: float) -> bool:
    """True when a reading and its expectation exist and lie within `tol` (a missing one never passes)."""
    return measured is not None and expected is not None and abs(measured - expected) <= tol + 1e-9


@dataclass(frozen=True, slots=True)
class Check:
    """One judged measurement. `measured` holds every layer's reading (memory taken by the step; negative:
    given back; None: the layer gave no reading); `expected_by_layer` the layers compared and what each must
    read; `expected` the headline figure; `expected_how` where the expectation comes from (a priori, read,
    measured before the books opened); `tolerance_why` why the tolerance is what it is."""

    name: str
    expected: float | None
    measured: dict[str, float | None]
    expected_by_layer: dict[str, float | None]
    tolerance: float
    passed: bool
    note: str = ""
    group: str = ATTRIBUTION
    unit: str = "MiB"
    expected_how: str = ""
    tolerance_why: str = ""

    @property
    def headline(self) -> tuple[str, float | None]:
        """The first compared layer and its reading (what a table's 'measured' column shows)."""
        k = next(iter(self.expected_by_layer), "")
        return k, self.measured.get(k)

    def as_dict(self) -> dict[str, Any]:
        def r(v: float | None) -> float | None:
            return None if v is None else round(float(v), 3)

        return {
            "name": self.name,
            "group": self.group,
            "unit": self.unit,
            "expected": r(self.expected),
            "expected_how": self.expected_how,
            "expected_by_layer": {k: r(v) for k, v in self.expected_by_layer.items()},
            "measured": {k: r(v) for k, v in self.measured.items()},
            "tolerance": r(self.tolerance),
            "tolerance_why": self.tolerance_why,
            "passed": self.passed,
            "note": self.note,
        }


def verdict(
    name: str,
    measured: dict[str, float | None],
    expected_by_layer: dict[str, float | None],
    tolerance: float,
    *,
    expected: float | None = None,
    also: tuple[bool, str] = (True, ""),
    note: str = "",
    group: str = ATTRIBUTION,
    unit: str = "MiB",
    how: str = "",
    tolerance_why: str = "",
) -> Check:
    """A `Check` from readings: passes when every expected layer lies within `tolerance` of its expectation
    and the extra condition `also` = (holds, what it says when it does not) holds. The headline `expected`
    defaults to the first compared layer's expectation."""
    notes = [note] if note else []
    off = [k for k, e in expected_by_layer.items() if not within(measured.get(k), e, tolerance)]
    for k in off:
        m, e = measured.get(k), expected_by_layer[k]
        got = "no reading" if m is None else f"{m:+.1f}"
        want = "no expectation (its reading is missing)" if e is None else f"expected {_e_fmt(e)}"
        notes.append(f"{k} {got} vs {want}")
    ok, why = also
    if not ok:
        notes.append(why)
    drv, nv = measured.get("driver"), measured.get("nvml")
    if drv is not None and nv is not None and abs(nv - drv) > tolerance:
        notes.append(f"NVML Δ {nv:+.1f} differs from driver Δ {drv:+.1f} (informational)")
    head = expected if expected is not None else next(iter(expected_by_layer.values()), None)
    return Check(
        name=name,
        expected=head,
        measured=dict(measured),
        expected_by_layer=dict(expected_by_layer),
        tolerance=tolerance,
        passed=not off and ok,
        note="; ".join(notes),
        group=group,
        unit=unit,
        expected_how=how,
        tolerance_why=tolerance_why,
    )


def judge(
    name: str,
    size_mib: float,
    measured: dict[str, float | None],
    expected_by_layer: dict[str, float],
    *,
    expected_mib: float | None = None,
    also: tuple[bool, str] = (True, ""),
    note: str = "",
) -> Check:
    """An attribution check: `verdict` with the tolerance of `size_mib` (5 % or 2 MiB)."""
    return verdict(
        name,
        measured,
        dict(expected_by_layer),
        tolerance_mib(size_mib),
        expected=size_mib if expected_mib is None else expected_mib,
        also=also,
        note=note,
        how="a priori: the size of what the step allocates" if size_mib else "",
        tolerance_why="max(5% of the size, one 2 MiB allocation granule)",
    )


def _e_fmt(v: float) -> str:
    return f"{v:+.1f}" if v else "0"


def failed(name: str, note: str, group: str = ATTRIBUTION) -> Check:
    """A check that could not measure (an exception, a missing library): fails, says why."""
    return Check(
        name=name,
        expected=None,
        measured={},
        expected_by_layer={},
        tolerance=ABS_TOL_MIB,
        passed=False,
        note=note,
        group=group,
    )


def deltas(before: Snapshot, after: Snapshot) -> dict[str, float | None]:
    """Per-layer memory taken between two snapshots, MiB (negative: given back). driver = free before − free
    after; non-torch = driver − torch reserved; NVML = this process's NVML usage after − before."""

    def diff(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else b - a

    d = after - before
    return {
        "driver": d.driver_mib,
        "torch_reserved": d.reserved_mib,
        "torch_allocated": d.allocated_mib,
        "torch_peak_allocated": diff(before.torch_peak_allocated_mib, after.torch_peak_allocated_mib),
        "non_torch": d.nontorch_mib,
        "nvml": diff(before.nvml_used_mib, after.nvml_used_mib),
    }


def _snap_dict(s: Snapshot) -> dict[str, Any]:
    return {"kind": s.kind, **s.as_dict()}


def _snap_of(d: dict[str, Any]) -> Snapshot:
    return Snapshot(**d)


# ---------------------------------------------------------------------------------------------------------------
# The attribution checks' readings (what the CUDA part hands the judges; JSON both ways)


@dataclass(frozen=True, slots=True)
class IdleReadings:
    first: Snapshot
    second: Snapshot


@dataclass(frozen=True, slots=True)
class AllocReadings:
    """A known allocation: before it, while it is held, after it was given back."""

    size_mib: float
    before: Snapshot
    held: Snapshot
    freed: Snapshot
    via: str = ""  # the libcudart of a cudaMalloc


@dataclass(frozen=True, slots=True)
class LadderReadings:
    """The graph ladder: the baseline, the reading after each capture (capture order), after every replay."""

    floor_mib: float
    base: Snapshot
    rungs: tuple[tuple[int, Snapshot], ...]
    final: Snapshot


@dataclass(frozen=True, slots=True)
class PeakReadings:
    """Before and after reset_peaks (an earlier `prior_mib` peak), and after a `transient_mib` tensor came and went."""

    prior_mib: float
    transient_mib: float
    pre: Snapshot
    reset: Snapshot
    after: Snapshot


def readings_as_dict(r: Any) -> dict[str, Any]:
    """One readings record as JSON-ready data (snapshots as their recorded fields)."""
    out: dict[str, Any] = {"type": type(r).__name__}
    for name in r.__slots__:
        v = getattr(r, name)
        if isinstance(v, Snapshot):
            v = _snap_dict(v)
        elif name == "rungs":
            v = [[bs, _snap_dict(s)] for bs, s in v]
        out[name] = v
    return out


_READINGS = {c.__name__: c for c in (IdleReadings, AllocReadings, LadderReadings, PeakReadings)}


def readings_from_dict(d: dict[str, Any]) -> Any:
    cls = _READINGS[d["type"]]
    kw = {}
    for name in cls.__slots__:
        v = d[name]
        if name == "rungs":
            v = tuple((int(bs), _snap_of(s)) for bs, s in v)
        elif isinstance(v, dict):
            v = _snap_of(v)
        kw[name] = v
    return cls(**kw)


# ---------------------------------------------------------------------------------------------------------------
# The attribution judges: pure functions of readings


def judge_idle(r: IdleReadings) -> list[Check]:
    """0. Nothing between two snapshots: no layer moves."""
    d = deltas(r.first, r.second)
    exp = {"driver": 0.0, "torch_reserved": 0.0, "torch_allocated": 0.0, "non_torch": 0.0}
    ok = within(d["driver"], 0.0, tolerance_mib(0))
    why = "" if ok else "the driver's free memory moved while idle: another process is using this GPU?"
    return [judge("idle: snapshot costs nothing", 0.0, d, exp, note=why)]


def judge_torch_tensor(r: AllocReadings) -> list[Check]:
    """1. A torch tensor of known size: reserved = allocated = driver; non-torch 0; given back on free."""
    n = r.size_mib
    layers = ("driver", "torch_reserved", "torch_allocated")
    return [
        judge(
            f"torch tensor {n:g} MiB",
            n,
            deltas(r.before, r.held),
            {**dict.fromkeys(layers, float(n)), "non_torch": 0.0},
        ),
        judge(
            f"torch tensor {n:g} MiB freed",
            n,
            deltas(r.held, r.freed),
            {**dict.fromkeys(layers, float(-n)), "non_torch": 0.0},
            expected_mib=-n,
            note="del + empty_cache",
        ),
    ]


def judge_cuda_malloc(r: AllocReadings) -> list[Check]:
    """2. cudaMalloc behind torch's back: the driver sees it, torch does not, so it is non-torch; cudaFree gives
    it back."""
    n = r.size_mib
    return [
        judge(
            f"cudaMalloc {n:g} MiB (non-torch)",
            n,
            deltas(r.before, r.held),
            {"driver": float(n), "torch_reserved": 0.0, "torch_allocated": 0.0, "non_torch": float(n)},
            note=r.via,
        ),
        judge(
            f"cudaFree {n:g} MiB",
            n,
            deltas(r.held, r.freed),
            {"driver": float(-n), "torch_reserved": 0.0, "torch_allocated": 0.0, "non_torch": float(-n)},
            expected_mib=-n,
        ),
    ]


def judge_graph_ladder(r: LadderReadings) -> list[Check]:
    """3. Per capture, driver Δ = torch reserved Δ (the private pool is inside reserved; non-torch 0) and memory
    never goes down; replaying every graph costs nothing, so the per-capture deltas sum to the total."""
    checks: list[Check] = []
    prev = r.base
    rungs: list[dict[str, float | None]] = []
    for i, (bs, s) in enumerate(r.rungs):
        d = deltas(prev, s)
        rungs.append(d)
        prev = s
        res, drv = d["torch_reserved"] or 0.0, d["driver"]
        tol = tolerance_mib(res)
        up = res >= 0 and drv is not None and drv >= -tol
        checks.append(
            judge(
                f"graph capture bs={bs}",
                res,
                d,
                {"driver": res, "non_torch": 0.0},
                also=(up, "memory went down during a capture"),
                note="expected = torch reserved Δ (graph pool growth); the driver must match" if i == 0 else "",
            )
        )
    total = deltas(r.base, r.final)
    sum_r = sum(d["torch_reserved"] or 0.0 for d in rungs)
    sum_d = sum(d["driver"] or 0.0 for d in rungs)
    top = r.rungs[0][0] if r.rungs else "?"
    checks.append(
        judge(
            f"graph ladder total ({len(r.rungs)} graphs, replayed)",
            sum_r,
            total,
            {"driver": sum_d, "torch_reserved": sum_r, "non_torch": 0.0},
            also=(
                (total["torch_reserved"] or 0.0) >= r.floor_mib,
                f"the ladder reserved less than its bs={top} FFN activation ({r.floor_mib:.0f} MiB)",
            ),
            note="expected = Σ per-capture deltas; replays must allocate nothing",
        )
    )
    return checks


def judge_peak_reset(r: PeakReadings) -> list[Check]:
    """4. reset_peaks() drops an earlier peak to the current allocation; a transient tensor allocated and freed
    after the reset shows in torch_peak_allocated_mib (allocated itself is back where it was)."""
    big, n = r.prior_mib, r.transient_mib
    return [
        judge(
            f"reset_peaks drops a {big:g} MiB peak",
            big,
            deltas(r.pre, r.reset),
            {"torch_peak_allocated": float(-big), "torch_allocated": 0.0},
            expected_mib=-big,
        ),
        judge(
            f"transient {n:g} MiB after reset",
            n,
            deltas(r.reset, r.after),
            {"torch_peak_allocated": float(n), "torch_allocated": 0.0},
            note="allocated and freed between the snapshots",
        ),
    ]


_JUDGES: dict[str, Callable[[Any], list[Check]]] = {
    "idle": judge_idle,
    "torch tensor": judge_torch_tensor,
    "cudaMalloc": judge_cuda_malloc,
    "graph ladder": judge_graph_ladder,
    "peak reset": judge_peak_reset,
}


@dataclass(slots=True)
class SelfcheckReport:
    """Every check of one run, with what the run found about the machine."""

    device: int
    device_name: str
    total_mib: float
    torch_version: str
    allocator: str
    checks: list[Check] = field(default_factory=list)
    libcudart: str | None = None
    free_mib: float | None = None
    cuda_version: str | None = None
    ledger: Any = None  # the worker life's Ledger
    readings: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float | None = None

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        """The `--json` document (schema in the module docstring)."""
        return {
            "schema": SCHEMA,
            "passed": self.passed,
            "device": {
                "index": self.device,
                "name": self.device_name,
                "total_mib": self.total_mib,
                "free_mib": self.free_mib,
            },
            "torch": self.torch_version,
            "cuda": self.cuda_version,
            "allocator": self.allocator,
            "libcudart": self.libcudart,
            "elapsed_s": None if self.elapsed_s is None else round(self.elapsed_s, 2),
            "checks": [c.as_dict() for c in self.checks],
            "ledger": None if self.ledger is None else self.ledger.as_dict(),
            "readings": self.readings,
        }


def refusal_document(device: int, why: str) -> dict[str, Any]:
    """The `--json` document of a run that refused to start (exit 2): the report's keys, nothing measured, and
    `refused`. torch's version and CUDA build are read when torch imports (no CUDA context is created)."""
    try:
        import torch

        torch_version, cuda_version = str(torch.__version__), torch.version.cuda
    except ImportError:
        torch_version = cuda_version = None
    return {
        "schema": SCHEMA,
        "passed": False,
        "refused": why,
        "device": {"index": device, "name": None, "total_mib": None, "free_mib": None},
        "torch": torch_version,
        "cuda": cuda_version,
        "allocator": None,
        "libcudart": None,
        "elapsed_s": None,
        "checks": [],
        "ledger": None,
        "readings": {},
    }


# ---------------------------------------------------------------------------------------------------------------
# Rendering (profiler.core.ui: a box table on a terminal, Markdown otherwise)


def _cell(c: Check, key: str) -> str:
    v = c.measured.get(key)
    if v is None:
        return "-"
    if key not in c.expected_by_layer:
        return f"({v:.1f})"
    return f"{v:.1f}" + ("" if within(v, c.expected_by_layer[key], c.tolerance) else "!")


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def render_text(report: SelfcheckReport, rich_look: bool | None = None) -> str:
    """The report as tables: attribution checks (compared layers plain, informational ones in (), a compared
    layer out of tolerance marked !), worker-life checks, the life's ledger; notes and the verdict below."""
    from profiler.core.ui import table

    free = f", {report.free_mib:,.0f} free" if report.free_mib is not None else ""
    cuda = f" (CUDA {report.cuda_version})" if report.cuda_version else ""
    out = [
        f"memfrac selfcheck: GPU {report.device} ({report.device_name}, {report.total_mib:,.0f} MiB{free}), "
        f"torch {report.torch_version}{cuda}, allocator {report.allocator}",
        "",
    ]
    attr = [c for c in report.checks if c.group == ATTRIBUTION]
    life = [c for c in report.checks if c.group != ATTRIBUTION]
    if attr:
        rows = [
            [
                c.name,
                _num(c.expected),
                *(_cell(c, k) for k, _ in LAYERS_SHOWN),
                f"{c.tolerance:.1f}",
                "pass" if c.passed else "FAIL",
            ]
            for c in attr
        ]
        out.append(
            table(
                ["check", "expected", *(t for _, t in LAYERS_SHOWN), "tol", "result"],
                rows,
                title="attribution: what each snapshot layer saw (MiB)",
                caption=f"tolerance {TOLERANCE_RULE}. Δ = MiB taken by the step (negative: given back); "
                "non-torch = driver − torch reserved; (x) informational; ! out of tolerance",
                right=[False, *[True] * (len(LAYERS_SHOWN) + 2), False],
                rich_look=rich_look,
            )
        )
        out.append("")
    if life:
        rows = []
        for c in life:
            key, v = c.headline
            shown = _num(v) if key in ("ledger", "") else f"{key} {_num(v)}"
            rows.append(
                [
                    c.name,
                    _num(c.expected),
                    shown + ("" if c.passed else "!"),
                    *(_cell(c, k) for k, _ in LIFE_LAYERS_SHOWN),
                    f"{c.tolerance:g}",
                    c.unit,
                    "pass" if c.passed else "FAIL",
                ]
            )
        out.append(
            table(
                ["check", "expected", "measured", *(t for _, t in LIFE_LAYERS_SHOWN), "tol", "unit", "result"],
                rows,
                title="worker life: probe → JSONL → reader → ledger / compare, against what was allocated",
                caption="measured: the ledger line (or the figure named); window Δ: the phase window's own layers",
                right=[False, True, True, True, True, True, True, False, False],
                rich_look=rich_look,
            )
        )
        out.append("")
    L = report.ledger
    if L is not None:
        rows = [[x.name, f"{x.mib:,.1f}", x.how, x.source] for x in L.lines]
        rows += [[f"{x.name} (after the worst point)", f"{x.mib:,.1f}", x.how, x.source] for x in L.after_worst]
        res = L.residual_mib
        closes = "closes" if L.closes else "does NOT close"
        out.append(
            table(
                ["line", "MiB", "how", "source"],
                rows,
                title=f"the life's ledger ({L.rank or 'rank'}): free at start "
                f"{_num(L.free_at_start_mib)} MiB, books at the {L.worst_point}",
                caption=f"residual {_num(res)} MiB (resolution {L.resolution_mib:g}): {closes}",
                right=[False, True, False, False],
                rich_look=rich_look,
            )
        )
        out.append("")
    notes = [f"  {c.name}: {c.note}" for c in report.checks if c.note]
    if notes:
        out += ["notes:", *notes]
    if report.libcudart:
        out.append(f"libcudart: {report.libcudart}")
    n_ok = sum(c.passed for c in report.checks)
    out.append(f"{n_ok}/{len(report.checks)} checks passed: {'all pass' if report.passed else 'FAILED'}")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------------
# Finding libcudart
