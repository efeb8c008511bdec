"""Lines that say a run failed, and what each one tells about how (OOM, capture, crash, exit code, ...).

A failure is usually spread over several lines: "[TP7] Scheduler hit an exception: Traceback", frames,
then the exception line ("Exception: Capture cuda graph failed: CUDA out of memory. Tried …"), then the
launcher's "Received sigquit". Each line gives `Evidence`; `build` folds the evidence of one rank into
one `Failure` (`FailureState`, kind decided at the end by `failure_kind`); `OomWindow` joins an OOM
message that a paste wrapped over several lines; `ExceptionDetail` keeps the lines an exception's message
continues on ("… rope.cuh:130" / "- Root cause: Size mismatch …").
"""

from __future__ import annotations

import re
from typing import NamedTuple

from profiler.core.measurement import Failure
from profiler.logs.launchcmd import is_launch_command
from profiler.logs.oom import is_complete
from profiler.logs.patterns import GRAPH_PHASES, graph_phase

DETAIL_LINES = 4  # an exception message's own further lines kept after its first (and DETAIL_CHARS characters)
DETAIL_CHARS = 600
OOM_WINDOW_LINES = 80  # a wrapped OOM message: at most this many lines (and OOM_WINDOW_CHARS) are joined
OOM_WINDOW_CHARS = 3000
# Evidence that a failure happened; a bare traceback ending in an exception line is only tentative.
DEFINITIVE = frozenset({"exception", "oom", "capture", "cuda_error", "exit", "timeout", "no_kv", "signal"})


class Evidence(NamedTuple):
    """What one line says about a failure."""

    what: str  # oom|capture|exception|traceback|tail|cuda_error|signal|sigquit|exit|timeout|no_kv|frame
    message: str
    oom: bool = False
    capture: bool = False
    phase_hint: str | None = None
    exit_code: int | None = None
    bad_args: bool = False


_TAIL = re.compile(  # triton's "triton.runtime.errors.OutOfResources: out of resource: shared memory" too
    r"^(?:[A-Za-z_][\w]*\.)*(?:[A-Z]\w*(?:Error|Exception|Interrupt)|Exception|KeyboardInterrupt|OutOfResources)"
    r"(?::|$)"
)
_CAPTURE_FAILED = re.compile(r"Capture (.{0,40}?) ?failed\b")
# A process killed by a signal: Python's faulthandler ("Fatal Python error: Segmentation fault"), sglang's own
# handler ("!!!!!!! Segfault encountered !!!!!!!", NCCL inside a capture), the shell ("Segmentation fault (core
# dumped)"), torch.multiprocessing ("… terminated with signal SIGSEGV").
_SIGNAL = re.compile(r"^(?:Fatal Python error: (?:Segmentation fault|Aborted|Bus error)|!+ Segfault encountered !*"
                     r"|Segmentation fault(?: \(core dumped\))?$)|terminated with signal SIG[A-Z]+")  # fmt: skip
_EXIT = re.compile(r"exit code:? (-?\d+)|terminated with (-?\d+)|exited with code (-?\d+)")
_FRAME = re.compile(r'^\s*File "([^"]*)", line \d+, in (\w+)')
_ARGPARSE = re.compile(r"^(?:usage: (?:launch_server|sglang)|\S*(?:launch_server(?:\.py)?|sglang serve): error: )")

# Traceback frames → the phase the code was in (first match wins: outer frames name the phase).
_FRAME_PHASES = tuple(
    (re.compile(rx), phase)
    for rx, phase in (
        (r"eagle_draft_extend|draft_extend_cuda_graph|capture_draft_extend", "draft_extend_graph"),
        (r"eagle_draft_cuda_graph|draft_cuda_graph", "draft_graph"),
        (r"prefill_cuda_graph|piecewise_cuda_graph|capture_prefill_graph|breakable_cuda", "prefill_graph"),
        (
            r"cuda_graph_runner|capture_decode_graph|init_(?:cuda|device)_graphs|capture_one_batch",
            "decode_graph",
        ),
        (r"init_memory_pool|kv_cache_configurator|profile_max_num_token|memory_pool\.py", "kv_pool"),
        (r"model_loader|load_model\b|load_weights_and_postprocess", "weights"),
        (r"init_torch_distributed|init_distributed_environment|init_parallel", "init_parallel"),
    )
)


def evidence(msg: str, record: bool = False) -> Evidence | None:
    """The failure evidence in one message (prefix already stripped), or None. `record`: the line is a record
    of sglang's logger (it had a timestamp prefix)."""
    s = msg.strip()
    if not s:
        return None
    if s.startswith("File "):
        return _frame(s)
    oom = "out of memory" in s or "OutOfMemoryError" in s
    cap = _CAPTURE_FAILED.search(s) if "failed" in s else None
    if cap is not None:
        return Evidence("capture", s, oom=oom, capture=True, phase_hint=graph_phase(cap.group(1) or "cuda graph"))
    if oom:
        return Evidence("oom", s, oom=True)
    if says_no_kv(s):
        return Evidence("no_kv", s, oom=True, phase_hint="kv_pool")
    if " hit an exception" in s or s.startswith("Exception in run_tp_server"):
        return Evidence("exception", s)
    if s.startswith("Traceback (most recent call last)"):
        # As a logger record it is sglang's own report (0.3.x process entries log the bare traceback: see
        # _PROCESS_ENTRIES); printed bare, only its exception line will say whether anything failed.
        return Evidence("exception" if record else "traceback", s)
    if _TAIL.match(s):
        return Evidence("tail", s)
    if s.startswith("CUDA error") or "CUDA error:" in s:
        return Evidence("cuda_error", s)
    if ("egment" in s or "Segfault" in s or "SIG" in s or "Fatal Python" in s) and _SIGNAL.search(s):
        return Evidence("signal", s)
    if "Received sigquit" in s:
        return Evidence("sigquit", s)
    if "watchdog timeout" in s:
        return Evidence("timeout", s)
    if _ARGPARSE.match(s):
        return Evidence("exit", s, bad_args=True)
    m = _EXIT.search(s) if ("code" in s or "terminated" in s) else None
    if m is not None:
        code = next(g for g in m.groups() if g is not None)
        return Evidence("exit", s, exit_code=int(code))
    return None


# sglang's guards for a KV budget of zero or less: "Not enough memory. Please try to increase
# --mem-fraction-static. Current value: …" (model_runner, every release) and "Loaded weights leave no GPU memory for
# the KV cache under --mem-fraction-static=0.88." (the newer guard, 2026)
_NO_KV = ("Not enough memory. Please try to increase --mem-fraction-static", "leave no GPU memory")
# The fraction an error message quotes: "Current value: self.server_args.mem_fraction_static=0.2",
# "under --mem-fraction-static=0.88."
_QUOTED_MFS = re.compile(r"mem[_-]fraction[_-]static\s*=\s*(\d*\.\d+|\d+)")


def says_no_kv(message: str) -> bool:
    """True for sglang's "no memory left for the KV cache" errors (the budget it profiled was zero or less)."""
    return any(t in message for t in _NO_KV)


def quoted_fraction(message: str) -> float | None:
    """mem_fraction_static as an error message quotes it, else None."""
    if "fraction" not in message:
        return None
    m = _QUOTED_MFS.search(message)
    if m is None:
        return None
    v = float(m.group(1))
    return v if 0.0 < v <= 1.0 else None


# sglang's process entry points (0.3 → 0.5.23): each catches every exception, logs its traceback and signals the
# launcher (0.3.4 scheduler.py: "except Exception: msg = get_exception_traceback(); logger.error(msg);
# kill_parent_process()"). A traceback that runs through one is that process dying, even when the text is cut
# before the exception line.
_PROCESS_ENTRIES = frozenset({
    "run_scheduler_process",
    "run_data_parallel_controller_process",
    "run_detokenizer_process",
    "run_multi_detokenizer_router_process",
})  # fmt: skip


def _frame(s: str) -> Evidence | None:
    m = _FRAME.match(s)
    if m is None:
        return None
    if m.group(2) in _PROCESS_ENTRIES and "sglang" in m.group(1):
        return Evidence("exception", s)
    where = f"{m.group(1)} {m.group(2)}"
    if "server_args.py" in m.group(1):
        return Evidence("frame", s, bad_args=True)
    for rx, phase in _FRAME_PHASES:
        if rx.search(where):
            return Evidence("frame", s, phase_hint=phase)
    return None


def failure_kind(*, oom: bool, capture: bool, phase: str | None, ready: bool, timeout: bool, bad_args: bool) -> str:
    """One of measurement.FAILURE_KINDS from what the lines showed."""
    in_graph = capture or phase in GRAPH_PHASES
    if oom:
        if in_graph:
            return "oom_during_capture"
        return "oom_runtime" if ready else "oom_startup"
    if in_graph:
        return "capture_failed"
    if timeout:
        return "timeout"
    if bad_args:
        return "bad_args"
    return "crash"


class FailureState:
    """One rank's failure while its lines are still arriving; the kind is decided at the end."""

    __slots__ = ("bad_args", "capture", "failure", "hint", "oom", "tentative", "timeout")

    def __init__(self, line: int, message: str) -> None:
        self.failure = Failure(kind="crash", message=message[:2000], line=line)
        self.oom = self.capture = self.timeout = self.bad_args = False
        self.hint: str | None = None
        self.tentative = False

    def absorb(self, ev: Evidence) -> None:
        """Add one line's evidence; the most informative line becomes the message."""
        self.oom |= ev.oom
        self.capture |= ev.capture
        self.timeout |= ev.what == "timeout"
        self.bad_args |= ev.bad_args
        if ev.phase_hint and self.hint is None:
            self.hint = ev.phase_hint
        if ev.exit_code is not None and self.failure.exit_code is None:
            self.failure.exit_code = ev.exit_code
        better = ev.oom or ev.capture or not _is_informative(self.failure.message)
        if ev.what in ("oom", "capture", "tail", "cuda_error", "no_kv") and better:
            self.failure.message = ev.message[:2000]

    def merge(self, other: FailureState) -> None:
        """Adopt evidence seen before the rank was known (kept aside as a run's floating failure)."""
        self.oom |= other.oom
        self.capture |= other.capture
        self.timeout |= other.timeout
        self.bad_args |= other.bad_args
        self.hint = self.hint or other.hint
        f, o = self.failure, other.failure
        if o.line is not None and (f.line is None or o.line < f.line):
            f.line = o.line
        if other.oom and not self.oom_numbers_known():
            f.message = o.message
        for name in OOM_FIELDS:
            if getattr(f, name) is None:
                setattr(f, name, getattr(o, name))

    def oom_numbers_known(self) -> bool:
        return self.failure.tried_alloc_mib is not None


OOM_FIELDS = (
    "gpu_index",
    "tried_alloc_mib",
    "total_capacity_mib",
    "free_mib",
    "in_use_mib",
    "allocated_by_torch_mib",
    "private_pools_mib",
    "reserved_unallocated_mib",
    "reserved_by_torch_mib",
    "outside_torch_mib",
    "exit_code",
)


def _is_informative(message: str) -> bool:
    """False for a header or a frame (a process entry's frame can open a failure): the exception line says more."""
    return not (message.endswith(":") or message.startswith("File "))


class OomWindow:
    """Joins the lines of a wrapped OOM message until torch's last number has been read.

    A terminal or a paste wraps it at any width: lines are taken (without their prefix) until the text reaches
    torch's last figure, a line that is clearly not part of it (a new record, a traceback, a command), or
    OOM_WINDOW_CHARS characters. A reporter may also put each of torch's sentences on its own line with a blank
    line between: one blank line is passed over when the line after it opens one of torch's sentences
    (`_TORCH_SENTENCE`); two blank lines, or a blank line followed by other text, end the message."""

    __slots__ = ("chars", "fs", "gap", "parts", "remaining")

    def __init__(self, fs: FailureState, text: str) -> None:
        self.fs = fs
        self.parts = [text]
        self.remaining = OOM_WINDOW_LINES
        self.chars = len(text)
        self.gap = False  # the previous line was blank

    def take(self, msg: str, tagged: bool = False) -> bool:
        """Append a continuation line (`msg` without its prefix; `tagged`: it has its own sglang record);
        False when the line is not part of the message (closes the window)."""
        s = msg.strip()
        if tagged:
            return False
        if not s:
            if self.gap:
                return False
            self.gap = True
            self.remaining -= 1
            return True
        if self.gap and not _TORCH_SENTENCE.match(s):
            return False
        self.gap = False
        if s.startswith(_NOT_OOM_TEXT) or is_launch_command(s) or _TAIL.match(s):
            return False
        self.parts.append(s)
        self.remaining -= 1
        self.chars += len(s)
        return True

    def done(self) -> bool:
        return self.remaining <= 0 or self.chars > OOM_WINDOW_CHARS or is_complete("".join(self.parts))


# How torch's OOM sentences begin (c10 CUDACachingAllocator: "Tried to allocate X. GPU N has a total capacity of
# … is free. Process P has X memory in use. | Including non-PyTorch memory, this process has … Of the allocated
# memory X is allocated by PyTorch, with X allocated in private pools …, and X is reserved by PyTorch but
# unallocated. If reserved but unallocated memory is large …")
_TORCH_SENTENCE = re.compile(
    r"(?:Tried to allocate|GPU \d|Process \d|Including non-PyTorch|this process has|Of the allocated|with \d|and \d"
    r"|If reserved but unallocated)"
)
_NOT_OOM_TEXT = ("[", "Traceback", "File ", "During handling", "The above exception", "$ ", "Capturing ", "Loading ")


class ExceptionDetail:
    """The lines right after an exception line that continue its message (a multi-line `str(exc)`: TVM's
    "- Root cause: …", "Try to allocate 148 tokens." under "Decode out of memory"), joined to the failure's message.

    Opened by the caller on a "tail" line that became the failure's message; it takes the following lines while
    they are untagged, not blank, not failure evidence of their own (a traceback, a frame, another exception, a
    sigquit) and not a command, at most DETAIL_LINES lines and DETAIL_CHARS characters; the first other line
    closes it (and is read as usual)."""

    __slots__ = ("chars", "fs", "head", "last", "lines")

    def __init__(self, fs: FailureState, lineno: int) -> None:
        self.fs = fs
        self.head = fs.failure.message  # only a message that is still this exception line is extended
        self.last = lineno  # the line taken last: only the very next line can continue the message
        self.lines = 0
        self.chars = 0

    def take(self, lineno: int, msg: str, tagged: bool = False) -> bool:
        """Join line `lineno` (`msg` without its prefix); False when it is not part of the message."""
        s = msg.strip()
        if lineno != self.last + 1 or tagged or not s:
            return False
        if self.lines >= DETAIL_LINES or self.chars + len(s) > DETAIL_CHARS:
            return False
        if s.startswith(_NOT_OOM_TEXT) or evidence(s) is not None or is_launch_command(s):
            return False
        f = self.fs.failure
        if not f.message.startswith(self.head):
            return False  # a more informative line (an OOM, a capture failure) took the message meanwhile
        f.message = f"{f.message}\n{s}"[:2000]
        self.last = lineno
        self.lines += 1
        self.chars += len(s)
        return True
