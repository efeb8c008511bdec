"""A pasted launch command (`python -m sglang.launch_server …` / `sglang serve …`) → sglang argument names.

Logs without a `server_args=` line often start with the command the user typed: with a shell prompt, env
assignments in front (`SGLANG_X=1 python -m …`), quotes, `--flag=value` or `--flag value`, and backslash
continuations (joined by the caller). Flags become ServerArgs field names (`--tp-size` → tp_size, aliases
such as `--model`/`--tensor-parallel-size` resolved); values are typed (int, float, JSON, else str).
"""

from __future__ import annotations

import json
import re
import shlex
from functools import lru_cache
from typing import Any, NamedTuple

# The programs that take sglang's ServerArgs and size its memory: the server, and bench_one_batch (its ModelRunner
# with the same ServerArgs.add_cli_args flags).
_MODULES = ("sglang.launch_server", "sglang.bench_one_batch")
_LAUNCH = re.compile(r"(?:^|[\s;&|(])(?:\S*python[\d.]*\s+(?:-\S+\s+)*-m\s+sglang\.(?:launch_server|bench_one_batch)\b|"
                     r"sglang\s+serve\b|\S*python[\d.]*\s+\S*sglang/launch_server\.py\b)")  # fmt: skip
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PROMPT = re.compile(r"^(?:\(\S+\)\s*)?[\w.-]+@([\w.-]+):\S*[#$]\s")
# The program word: `python3`, or glued to the prose in front of it ("I execute :python -m sglang.launch_server …",
# sglang-744), as `_LAUNCH` allows (`\S*python`).
_PYTHON = re.compile(r"(?:^|[^\w.-])python[\d.]*$")
_INT = re.compile(r"^-?\d+$")
_FLOAT = re.compile(r"^-?(?:\d+\.\d*|\.\d+|\d+(?:\.\d*)?[eE][-+]?\d+)$")
_SHELL_STOP = frozenset({"|", "||", "&&", ";", "&", ">", ">>", "2>&1", "1>&2", "<"})

# CLI aliases whose dest is not the flag spelled with underscores (read from the 0.3 … 0.5.23 parsers).
ALIASES = {
    "model": "model_path",
    "tensor_parallel_size": "tp_size",
    "tp": "tp_size",
    "data_parallel_size": "dp_size",
    "dp": "dp_size",
    "pipeline_parallel_size": "pp_size",
    "pp": "pp_size",
    "expert_parallel_size": "ep_size",
    "ep": "ep_size",
    "attention_context_parallel_size": "attn_cp_size",
    "attention_data_parallel_size": "attn_dp_size",
    "decode_context_parallel_size": "dcp_size",
    "moe_data_parallel_size": "moe_dp_size",
    "enable_hicache": "enable_hierarchical_cache",
    "nccl_init_addr": "dist_init_addr",
    "speculative_draft_model": "speculative_draft_model_path",
    "context_bucket": "cuda_graph_prefill_max_context",
    "hierarchical_sparse_attention_extra_config": "hisparse_config",
    "fp4_gemm_backend": "fp4_gemm_runner_backend",
    "fp8_gemm_backend": "fp8_gemm_runner_backend",
}


class LaunchCommand(NamedTuple):
    """What a launch command sets: sglang args, environment, and what could not be read."""

    args: dict[str, Any]
    env: dict[str, str]
    hostname: str | None
    leftovers: tuple[str, ...]  # positional tokens sglang would reject or we could not place


def is_launch_command(text: str) -> bool:
    """Cheap test: does this (joined) line run an sglang server?"""
    if "launch_server" not in text and "sglang" not in text:
        return False
    head = text.lstrip()
    if head.startswith("File ") or head.startswith("Example:") or "<model>" in text:
        return False  # a traceback frame, or sglang's own usage hint ("Example: sglang serve --model-path <model>")
    return _LAUNCH.search(text) is not None


@lru_cache(maxsize=8)
def parse_launch_command(text: str) -> LaunchCommand | None:
    """Parse one logical command line (continuations joined); None if it launches no server.
    Cached: treat the result as read-only."""
    if _LAUNCH.search(text) is None:
        return None
    prompt = _PROMPT.match(text)
    tokens = _split(text)
    entry = _entry(tokens)
    if entry is None:
        return None
    i = entry
    while i > 0 and (_ENV.match(tokens[i - 1]) or tokens[i - 1] == "env"):
        i -= 1
    env = dict(tok.partition("=")[::2] for tok in tokens[i:entry] if tok != "env")
    args, leftovers = _flags(tokens[_after_entry(tokens, entry) :])
    return LaunchCommand(args, env, prompt.group(1) if prompt else None, tuple(leftovers))


def _entry(tokens: list[str]) -> int | None:
    """Index of the program word: `python…` that runs launch_server, or `sglang` (serve)."""
    for j, t in enumerate(tokens):
        base = t.rsplit("/", 1)[-1]
        if _PYTHON.search(base) and any(
            x in _MODULES or x.endswith("launch_server.py") for x in tokens[j + 1 : j + 6]
        ):
            return j
        if base == "sglang" and tokens[j + 1 : j + 2] == ["serve"]:
            return j
    return None


def _split(s: str) -> list[str]:
    try:
        tokens = shlex.split(s, comments=False, posix=True)
    except ValueError:  # unbalanced quote (cut paste): fall back to whitespace, quotes stripped
        tokens = [t.strip("'\"") for t in s.split()]
    # A command quoted inline in Markdown ("`python -m sglang.launch_server … --page-size 64`"): the backticks
    # are the quote, not part of the first and last words.
    return [u for t in tokens if (u := t.strip("`"))]


def _after_entry(tokens: list[str], i: int) -> int:
    """Index of the first argument after `… -m sglang.launch_server` / `sglang serve` / `launch_server.py`."""
    for j in range(i, len(tokens)):
        t = tokens[j]
        if t in _MODULES or t.endswith("launch_server.py"):
            return j + 1
        if t == "serve" and j > 0 and tokens[j - 1].endswith("sglang"):
            return j + 1
    return len(tokens)


def _flags(tokens: list[str]) -> tuple[dict[str, Any], list[str]]:
    args: dict[str, Any] = {}
    leftovers: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in _SHELL_STOP or tok.startswith((">", "2>", "1>")):
            break
        if not tok.startswith("--") or tok == "--":
            leftovers.append(tok)
            i += 1
            continue
        name, eq, val = tok[2:].partition("=")
        key = arg_name(name)
        if eq:
            args[key] = typed(val)
            i += 1
            continue
        vals = []
        j = i + 1
        while j < len(tokens) and not tokens[j].startswith("--") and tokens[j] not in _SHELL_STOP:
            if tokens[j].startswith("-") and not _INT.match(tokens[j]) and not _FLOAT.match(tokens[j]):
                break
            vals.append(tokens[j])
            j += 1
        if len(vals) > 1 and _number(vals[0]) and not _number(vals[1]):
            # words after a number: prose after the command ("--port 8000    follow error:", sglang-744), not
            # values (sglang's many-valued flags take numbers alike, or words alike)
            leftovers.extend(vals[1:])
            vals = vals[:1]
        if not vals:
            args[key] = True
        elif len(vals) == 1:
            args[key] = typed(vals[0])
        else:
            args[key] = [typed(v) for v in vals]
        i = j
    return args, leftovers


def _number(tok: str) -> bool:
    return _INT.match(tok) is not None or _FLOAT.match(tok) is not None


def arg_name(flag: str) -> str:
    """`tp-size` → `tp_size`, with sglang's CLI aliases resolved."""
    name = flag.lstrip("-").replace("-", "_")
    return ALIASES.get(name, name)


def typed(value: str) -> Any:
    """A CLI value as sglang's parser would see it: int, float, JSON object/list, else the string."""
    if _INT.match(value):
        return int(value)
    if _FLOAT.match(value):
        return float(value)
    if value[:1] in "{[":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value
