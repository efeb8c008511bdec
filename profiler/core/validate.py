"""Typed checks at the boundary: every file memfrac reads and every number a user gives passes one of these.

Each check returns the value it accepted (typed) or raises `FieldError(file, field, value, allowed)`: one line
naming the file (or the option), the field, the bad value and what is allowed, which the CLI prints with exit 2.
Why one module: the same rule (a size is a finite number ≥ 0, a GPU holds 1 GiB … 1 TiB) reads the same
everywhere, and a reader cannot forget the NaN case.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from profiler.core.errors import FieldError, MemfracError

#: A GPU's memory.total as nvidia-smi prints it: at least 1 GiB, at most 1 TiB (the largest part today holds
#: 288 GB; a value outside is a typo or a unit mix-up, never a GPU).
GPU_MIN_MIB = 1024
GPU_MAX_MIB = 1024 * 1024


def of_type(file: object, field: str, value: Any, types: type | tuple[type, ...], allowed: str) -> Any:
    """`value` if it is one of `types` (a bool is never taken for a number)."""
    want = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool) and bool not in want:
        raise FieldError(file, field, value, allowed)
    if not isinstance(value, want):
        raise FieldError(file, field, value, allowed)
    return value


def finite(file: object, field: str, value: Any, allowed: str = "a finite number") -> float:
    """A real number that is neither NaN nor infinite (JSON's NaN/Infinity, a float overflow) as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(file, field, value, allowed)
    try:
        f = float(value)
    except OverflowError:  # an int beyond a float's range
        raise FieldError(file, field, value, allowed) from None
    if not math.isfinite(f):
        raise FieldError(file, field, value, allowed)
    return f


def in_range(
    file: object, field: str, value: Any, lo: float | None = None, hi: float | None = None, unit: str = ""
) -> float:
    """A finite number within [lo, hi] (either bound may be open: None)."""
    u = f" {unit}" if unit else ""
    if lo is not None and hi is not None:
        allowed = f"a number {lo:g}..{hi:g}{u}"
    elif lo is not None:
        allowed = f"a number ≥ {lo:g}{u}"
    elif hi is not None:
        allowed = f"a number ≤ {hi:g}{u}"
    else:
        allowed = f"a finite number{u}"
    f = finite(file, field, value, allowed)
    if (lo is not None and f < lo) or (hi is not None and f > hi):
        raise FieldError(file, field, value, allowed)
    return f


def size_mib(file: object, field: str, value: Any) -> float:
    """A memory size: finite and ≥ 0 MiB."""
    return in_range(file, field, value, 0, None, "MiB")


def gpu_mib(file: object, field: str, value: Any) -> float:
    """A GPU's capacity: GPU_MIN_MIB … GPU_MAX_MIB (1 GiB … 1 TiB)."""
    return in_range(file, field, value, GPU_MIN_MIB, GPU_MAX_MIB, "MiB (a GPU holds 1 GiB … 1 TiB)")


def mapping(file: object, field: str, value: Any, what: str = "a JSON object") -> Mapping[str, Any]:
    """A dict with string keys."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise FieldError(file, field, value, what)
    return value


def readable_file(path: str | os.PathLike[str], field: str = "", what: str = "a file") -> Path:
    """A regular file that exists: not a directory, a FIFO, a device (`/dev/null`) or a socket."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise FieldError(p, field, str(p), f"{what} that exists (no such file or directory)") from None
    except OSError as e:
        raise FieldError(p, field, str(p), f"{what} memfrac can read ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise FieldError(p, field, str(p), f"{what}, not {file_kind(st.st_mode)}")
    return p


def file_kind(mode: int) -> str:
    """What a non-regular path is, in words (for messages)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def read_text(path: str | os.PathLike[str], field: str = "", what: str = "a UTF-8 text file") -> str:
    """A regular file's text, strictly UTF-8 (the offending byte and its offset named otherwise)."""
    p = readable_file(path, field, what)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise FieldError(p, field, str(p), f"{what} memfrac can read ({e.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = data[e.start : e.start + 1]
        raise FieldError(p, "encoding", f"byte 0x{bad.hex()} at offset {e.start}", "UTF-8 text") from None


def read_json(path: str | os.PathLike[str], what: str = "a JSON file") -> Any:
    """A regular UTF-8 file parsed as strict JSON (NaN and Infinity are refused: they are not JSON)."""

    def no_constants(name: str) -> Any:
        raise ValueError(name)

    text = read_text(path, "", what)
    try:
        return json.loads(text, parse_constant=no_constants)
    except json.JSONDecodeError as e:  # a syntax error has no field: say where it is
        raise MemfracError(f"{path}: not JSON ({e.msg} at line {e.lineno} column {e.colno}); {what} expected") from None
    except ValueError as e:
        raise FieldError(path, "", str(e), "JSON numbers (NaN and Infinity are not JSON)") from None
    except RecursionError:
        raise FieldError(path, "", "nesting too deep", "JSON nested less than ~1000 levels") from None


def json_object(path: str | os.PathLike[str], what: str = "a JSON object") -> dict[str, Any]:
    """`read_json` that must give an object at the top."""
    doc = read_json(path, what)
    if not isinstance(doc, dict):
        raise FieldError(path, "(top level)", doc, what)
    return doc


def writable_file(path: str | os.PathLike[str], field: str) -> Path:
    """An output path memfrac may write a file to: not a directory or special file; its directory exists
    (or can be made) and is writable. Checked before the work, so hours of work are not lost to a typo."""
    p = Path(path)
    if p.exists() or p.is_symlink():
        try:
            st = p.stat()
        except OSError as e:
            raise FieldError(field, "", str(p), f"a file path memfrac can write ({e.strerror})") from None
        if not stat.S_ISREG(st.st_mode):
            raise FieldError(field, "", str(p), f"a file path, not {file_kind(st.st_mode)}")
        if not os.access(p, os.W_OK):
            raise FieldError(field, "", str(p), "a file path memfrac can write (this one is read-only)")
        return p
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise FieldError(field, "", str(p), f"a file path under a directory ({parent} is not one)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise FieldError(field, "", str(p), f"a file path memfrac can write ({parent} is not writable)")
    return p
