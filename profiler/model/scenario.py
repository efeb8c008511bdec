"""Declarative scenarios: what to start, on which GPU, in which PD role — validated, then expanded.

A scenario file is TOML. Either one scenario at top level, or `[[scenario]]` entries sharing an optional
`[defaults]` table. A `[matrix]` table (top level, or `[scenario.matrix]` per entry) maps keys — dotted for
nested tables, e.g. `"decode_graph.max_bs"` — to lists of values, and expands into their cartesian product
with readable generated names. Every bad input fails with one `ScenarioError` naming the file, the key,
the bad value and the allowed values.
"""

from __future__ import annotations

import itertools
import math
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

from profiler.core.errors import MemfracError, ScenarioError
from profiler.core.validate import GPU_MAX_MIB, GPU_MIN_MIB, read_text
from profiler.model.a2a import A2A_BACKENDS, BACKENDS
from profiler.model.gpus import Gpu, gpu_by_name, gpu_from_mib, known_gpus
from profiler.model.modelcfg import ModelShape, load_model_shape

Mode = Literal["null", "prefill", "decode"]
MODES = ("null", "prefill", "decode")
#: In a file, `mode = "pd"` is a real prefill/decode pair: it expands into `<name>-prefill` and `<name>-decode`,
#: both with `pair = "<name>"`, started together (profiler.measure.runner.pair); `[prefill]` / `[decode]` tables
#: override keys for one role.
FILE_MODES = (*MODES, "pd")
PAIR_ROLES = ("prefill", "decode")
TRANSFER_BACKENDS = ("mooncake_tcp", "mooncake", "nixl")  # sglang 0.5.23 --disaggregation-transfer-backend (memfrac's)
ROUTERS = ("rust", "mini_lb")  # sglang-router 0.3.2: the Rust router, or `--mini-lb` (its Python load balancer)
GRAPH_BACKENDS = ("full", "breakable", "disabled")
DEEPEP_MODES = ("auto", "normal", "low_latency")
DEEPEP_V2_MODES = ("direct", "hybrid")
#: sglang's switch for post-capture KV sizing (PR #30157; off by default).
POST_CAPTURE_ENV = "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING"
SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")

#: Where bundled model configs live; a scenario's `model` is a directory name under it (or a path).
BUNDLED_MODELS = Path(__file__).resolve().parents[2] / "scenarios" / "models"


@dataclass(frozen=True, slots=True)
class GraphSettings:
    """One phase's CUDA-graph settings as the user gave them (None = let sglang decide)."""

    backend: str | None = None
    max_bs: int | None = None
    bs: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class RunSettings:
    """How `memfrac run` drives a worker of this scenario (bounded in time and requests)."""

    startup_timeout_s: float = 900.0
    load_timeout_s: float = 300.0
    load_requests: int | None = None  # None: the role's worst case (max_running_requests / admitted chunks)
    output_len: int = 256
    stop_grace_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Scenario:
    """One fully specified configuration to explain, resolve, or run. Immutable; built by `load_scenarios`."""

    name: str
    model: str
    model_path: str
    gpu: Gpu
    mode: Mode = "null"
    tp: int = 1
    pp: int = 1
    dp: int = 1
    attn_dp: int = 1
    ep: int = 1
    decode_graph: GraphSettings = GraphSettings()
    prefill_graph: GraphSettings = GraphSettings()
    disable_cuda_graph: bool = False
    disable_cuda_graph_padding: bool = False
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    context_length: int | None = None
    speculative_algorithm: str | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    # the draft model (EAGLE, EAGLE3, STANDALONE): a directory name under scenarios/models/ or a path, like `model`;
    # its config.json shapes the draft's dummy weights (--speculative-draft-model-path)
    speculative_draft_model: str | None = None
    speculative_draft_model_path: str | None = None
    moe_a2a_backend: str = "none"
    deepep_mode: str = "auto"
    deepep_v2_mode: str = "direct"
    a2a_dispatch_tokens: int | None = None  # the backend's per-rank dispatch capacity (its own env variable)
    moe_runner_backend: str | None = None  # --moe-runner-backend (flashinfer's all-to-all needs a flashinfer runner)
    post_capture_kv_sizing: bool = False  # SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1
    mem_fraction_static: float | None = None
    kv_cache_dtype: str = "auto"
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    run: RunSettings = RunSettings()
    pair: str | None = None  # the PD pair this scenario is one role of (mode = "pd" in the file)
    transfer_backend: str | None = None  # prefill (and a pair's decode): None = mooncake_tcp
    router: str = "rust"  # a pair's router (sglang-router 0.3.2)
    source: str = ""
    matrix: tuple[tuple[str, Any], ...] = ()  # the matrix values that produced this scenario

    @property
    def shape(self) -> ModelShape:
        return load_model_shape(self.model_path)

    @property
    def gpus_needed(self) -> int:
        """GPUs one worker of this scenario occupies: tp × pp, times dp replicas (attention-DP lives inside tp)."""
        return self.tp * self.pp * self.dp

    @property
    def deepep_dispatch_tokens(self) -> int | None:
        """The DeepEP dispatch capacity this scenario sets (None: sglang's default, 128, or not DeepEP)."""
        return self.a2a_dispatch_tokens if self.moe_a2a_backend == "deepep" else None

    @property
    def env_dict(self) -> dict[str, str]:
        """The environment the worker (and the resolver) sees: `env`, the backend's capacity, post-capture."""
        env = dict(self.env)
        tokens_env = BACKENDS[self.moe_a2a_backend].tokens_env
        if self.a2a_dispatch_tokens is not None and tokens_env:
            env.setdefault(tokens_env, str(self.a2a_dispatch_tokens))
        if self.post_capture_kv_sizing:
            env.setdefault(POST_CAPTURE_ENV, "1")
        return env

    def with_(self, **changes: Any) -> Scenario:
        return replace(self, **changes)


# ------------------------------------------------------------------------------------------------------
# Schema: key → (validator, allowed-values text). Validators raise ValueError with no text on bad input.
# ------------------------------------------------------------------------------------------------------


def _int(lo: int = 1, hi: int | None = None, allow_none: bool = True, allow_minus_one: bool = False) -> Callable:
    def check(v: Any) -> int | None:
        if v is None and allow_none:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError
        if allow_minus_one and v == -1:
            return v
        if v < lo or (hi is not None and v > hi):
            raise ValueError
        return v

    return check


def _choice(options: Iterable[str], allow_none: bool = False) -> Callable:
    opts = tuple(options)

    def check(v: Any) -> str | None:
        if v is None and allow_none:
            return None
        if not isinstance(v, str) or v not in opts:
            raise ValueError
        return v

    return check


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError
    return v


def _fraction(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < 1:
        raise ValueError
    return float(v)


def _bs_list(v: Any) -> tuple[int, ...] | None:
    if v is None:
        return None
    if not isinstance(v, list) or not v or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in v):
        raise ValueError
    return tuple(sorted(set(v)))


def _str_list(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or any(not isinstance(x, str) for x in v):
        raise ValueError
    return tuple(v)


def _env(v: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(v, dict):
        raise ValueError
    out = []
    for k, x in v.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) or not isinstance(x, str | int | float | bool):
            raise ValueError
        out.append((k, str(x).lower() if isinstance(x, bool) else str(x)))
    return tuple(sorted(out))


def _positive_float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:  # TOML has nan and inf
        raise ValueError
    return float(v)


_GRAPH_KEYS: dict[str, tuple[Callable, str]] = {
    "backend": (_choice(GRAPH_BACKENDS, allow_none=True), " | ".join(GRAPH_BACKENDS)),
    "max_bs": (_int(1), "an integer ≥ 1"),
    "bs": (_bs_list, "a non-empty list of integers ≥ 1"),
}
_RUN_KEYS: dict[str, tuple[Callable, str]] = {
    "startup_timeout_s": (_positive_float, "finite seconds > 0"),
    "load_timeout_s": (_positive_float, "finite seconds > 0"),
    "load_requests": (_int(1), "an integer ≥ 1"),
    "output_len": (_int(1), "an integer ≥ 1"),
    "stop_grace_s": (_positive_float, "finite seconds > 0"),
}
_SCALAR_KEYS: dict[str, tuple[Callable, str]] = {
    "name": (_str, "a non-empty string"),
    "mode": (_choice(FILE_MODES), " | ".join(FILE_MODES) + ' (the string "null": a unified worker; "pd": a pair)'),
    "tp": (_int(1, 512, allow_none=False), "an integer 1..512"),
    "pp": (_int(1, 64, allow_none=False), "an integer 1..64"),
    "dp": (_int(1, 512, allow_none=False), "an integer 1..512"),
    "attn_dp": (_int(1, 512, allow_none=False), "an integer 1..512 that divides tp"),
    "ep": (_int(1, 512, allow_none=False), "an integer 1..512 that divides tp"),
    "disable_cuda_graph": (_bool, "true | false"),
    "disable_cuda_graph_padding": (_bool, "true | false"),
    "chunked_prefill_size": (_int(1, allow_minus_one=True), "an integer ≥ 1, or -1 to disable chunking"),
    "max_prefill_tokens": (_int(1), "an integer ≥ 1"),
    "max_running_requests": (_int(1), "an integer ≥ 1"),
    "max_total_tokens": (_int(1), "an integer ≥ 1"),
    "context_length": (_int(1), "an integer ≥ 1"),
    "speculative_algorithm": (_choice(SPEC_ALGORITHMS, allow_none=True), " | ".join(SPEC_ALGORITHMS)),
    "speculative_num_draft_tokens": (_int(1), "an integer ≥ 1"),
    "speculative_num_steps": (_int(1), "an integer ≥ 1"),
    "speculative_eagle_topk": (_int(1), "an integer ≥ 1"),
    "moe_a2a_backend": (_choice(A2A_BACKENDS), " | ".join(A2A_BACKENDS) + " (sglang 0.5.23's choices)"),
    "deepep_mode": (_choice(DEEPEP_MODES), " | ".join(DEEPEP_MODES)),
    "deepep_v2_mode": (_choice(DEEPEP_V2_MODES), " | ".join(DEEPEP_V2_MODES) + " (moe_a2a_backend = deepep_v2)"),
    "a2a_dispatch_tokens": (_int(1), "an integer ≥ 1 (the backend's per-rank dispatch capacity)"),
    "deepep_dispatch_tokens": (_int(1), "an integer ≥ 1 (SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK)"),
    "moe_runner_backend": (_str, "a string: sglang's --moe-runner-backend choice (sglang checks it)"),
    "post_capture_kv_sizing": (_bool, f"true | false ({POST_CAPTURE_ENV}=1, sglang PR #30157)"),
    "mem_fraction_static": (_fraction, "a number strictly between 0 and 1 (omit it to let sglang derive it)"),
    "kv_cache_dtype": (
        _choice(("auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2")),
        "auto | bf16 | fp8_e4m3 | fp8_e5m2",
    ),
    "extra_args": (_str_list, 'a list of strings, e.g. ["--enable-symm-mem"]'),
    "env": (_env, "a table of NAME = value"),
    "transfer_backend": (_choice(TRANSFER_BACKENDS), " | ".join(TRANSFER_BACKENDS)),
    "router": (_choice(ROUTERS), " | ".join(ROUTERS) + " (a pair's router, sglang-router 0.3.2)"),
}
_TABLES = {"decode_graph": _GRAPH_KEYS, "prefill_graph": _GRAPH_KEYS, "run": _RUN_KEYS}
_SPECIAL = {"model", "gpu", "matrix", "speculative_draft_model", *PAIR_ROLES}
# Cross-key rules (attn_dp divides tp, speculative settings, context_length ≤ the model's, …) are sglang's:
# `profiler.engine.validation` resolves every scenario with the real resolver before anything starts.
ALL_KEYS = sorted([*_SCALAR_KEYS, *_TABLES, *_SPECIAL])


# ------------------------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------------------------


def load_scenarios(path: str | Path, models_dir: Path | None = None) -> list[Scenario]:
    """Read, validate and expand a scenario file into concrete scenarios (matrix expanded, names unique)."""
    p = Path(path)
    f = str(path)
    if not p.exists():
        raise MemfracError(f"scenario file not found: {f}")
    if p.is_dir():
        raise MemfracError(f"{f} is a directory; give a scenario .toml file")
    text = read_text(p, what="a scenario .toml file (UTF-8 text)")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise MemfracError(f"{f}: not valid TOML: {e}") from None
    return scenarios_from_doc(doc, f, models_dir or BUNDLED_MODELS, base_dir=p.parent)


def scenarios_from_doc(
    doc: Mapping[str, Any], f: str, models_dir: Path, base_dir: Path | None = None
) -> list[Scenario]:
    """Validate and expand an already parsed scenario document (see module docstring for the layout)."""
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ScenarioError(f, "defaults", defaults, "a table of keys every [[scenario]] shares")
    defaults = dict(defaults)
    if "scenario" in doc:
        entries = doc["scenario"]
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise ScenarioError(f, "scenario", entries, "an array of tables ([[scenario]])")
        stray = sorted(set(doc) - {"scenario", "defaults"})
        if stray:
            raise ScenarioError(
                f, stray[0], doc[stray[0]], "with [[scenario]] entries only [defaults] may sit at top level"
            )
        raw_entries = [(f"scenario[{i}]", {**defaults, **e}) for i, e in enumerate(entries)]
    else:
        raw_entries = [("", {**defaults, **{k: v for k, v in doc.items() if k != "defaults"}})]
    out: list[Scenario] = []
    for prefix, entry in raw_entries:
        out.extend(_expand_entry(entry, f, prefix, models_dir, base_dir))
    seen: dict[str, int] = {}
    for s in out:
        seen[s.name] = seen.get(s.name, 0) + 1
    dups = [n for n, c in seen.items() if c > 1]
    if dups:
        raise ScenarioError(f, "name", dups[0], "unique names (two scenarios expand to the same name; rename one)")
    if not out:
        raise ScenarioError(f, "scenario", [], "at least one scenario")
    return out


def _key(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _expand_entry(
    entry: dict[str, Any], f: str, prefix: str, models_dir: Path, base_dir: Path | None
) -> list[Scenario]:
    matrix = entry.pop("matrix", None) or {}
    if not isinstance(matrix, dict):
        raise ScenarioError(f, _key(prefix, "matrix"), matrix, "a table of key = [values...]")
    axes: list[tuple[str, list[Any]]] = []
    for mk, values in matrix.items():
        top = mk.split(".", 1)[0]
        if top not in ALL_KEYS or top in ("matrix", "name"):
            raise ScenarioError(
                f,
                _key(prefix, f"matrix.{mk}"),
                values,
                "keys: " + ", ".join(k for k in ALL_KEYS if k not in ("matrix", "name")),
            )
        if not isinstance(values, list) or not values:
            raise ScenarioError(f, _key(prefix, f"matrix.{mk}"), values, "a non-empty list of values")
        axes.append((mk, values))
    base_name = entry.get("name")
    if base_name is None:
        raise ScenarioError(f, _key(prefix, "name"), None, "a non-empty string (every scenario needs a name)")
    combos = list(itertools.product(*[vals for _, vals in axes])) if axes else [()]
    out = []
    for combo in combos:
        e = _deep_copy(entry)
        chosen: list[tuple[str, Any]] = []
        for (mk, _), v in zip(axes, combo, strict=True):
            if not _set_dotted(e, mk, v):
                top = mk.split(".", 1)[0]
                raise ScenarioError(f, _key(prefix, top), e.get(top), f"a table (the matrix sets {mk})")
            chosen.append((mk, v))
        if chosen:
            e["name"] = _generated_name(str(base_name), chosen)
        if e.get("mode") == "pd":
            out.extend(_pair_roles(e, f, prefix, models_dir, base_dir, tuple(chosen)))
            continue
        for role in PAIR_ROLES:
            if role in e:
                raise ScenarioError(f, _key(prefix, role), e[role], 'a per-role table only with mode = "pd"')
        out.append(_build(e, f, prefix, models_dir, base_dir, tuple(chosen)))
    return out


def _pair_roles(
    e: dict[str, Any], f: str, prefix: str, models_dir: Path, base_dir: Path | None, chosen: tuple[tuple[str, Any], ...]
) -> list[Scenario]:
    """`mode = "pd"`: one scenario per role, `<name>-prefill` and `<name>-decode`, each with `pair = <name>`."""
    name = str(e["name"])
    out = []
    for role in PAIR_ROLES:
        over = e.get(role) or {}
        if not isinstance(over, dict):
            raise ScenarioError(f, _key(prefix, role), over, f"a table of keys for the {role} worker")
        bad = sorted(set(over) & {"name", "mode", "matrix", "router", *PAIR_ROLES})
        if bad:
            raise ScenarioError(
                f, _key(prefix, f"{role}.{bad[0]}"), over[bad[0]], "a key of one worker (not the pair's)"
            )
        r = {k: _deep_copy(v) for k, v in e.items() if k not in PAIR_ROLES}
        r.update(_deep_copy(over))
        r.update(name=f"{name}-{role}", mode=role)
        s = _build(r, f, _key(prefix, role) if over else prefix, models_dir, base_dir, chosen)
        out.append(replace(s, pair=name))
    return out


def _deep_copy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deep_copy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deep_copy(v) for v in d]
    return d


def _set_dotted(d: dict[str, Any], dotted: str, value: Any) -> bool:
    """Set a dotted key; False when a part on the way is not a table (the caller names it)."""
    parts = dotted.split(".")
    for p in parts[:-1]:
        d = d.setdefault(p, {})
        if not isinstance(d, dict):
            return False
    d[parts[-1]] = value
    return True


def _generated_name(base: str, chosen: list[tuple[str, Any]]) -> str:
    """`llama8b` + mode=decode, gpu=H200, decode_graph.max_bs=64 → `llama8b-decode-H200-max_bs64`."""
    parts = [base]
    for key, v in chosen:
        leaf = key.rsplit(".", 1)[-1]
        if isinstance(v, list):
            parts.append(f"{leaf}{'_'.join(str(x) for x in v)}")
        elif isinstance(v, bool):
            parts.append(leaf if v else f"no_{leaf}")
        elif isinstance(v, str):
            parts.append(
                v
                if key in ("mode", "gpu", "model", "moe_a2a_backend", "deepep_mode", "deepep_v2_mode")
                else f"{leaf}-{v}"
            )
        elif v is None:
            parts.append(f"{leaf}-auto")
        else:
            parts.append(f"{leaf}{v}")
    return re.sub(r"[^A-Za-z0-9_.+=-]", "_", "-".join(parts))


def _resolve_model(value: Any, f: str, key: str, models_dir: Path, base_dir: Path | None) -> tuple[str, str]:
    if not isinstance(value, str) or not value:
        raise ScenarioError(
            f, key, value, "a model directory name under scenarios/models/ or a path to a directory with config.json"
        )
    candidates = [models_dir / value, Path(value)]
    if base_dir is not None:
        candidates.insert(1, base_dir / value)
    for c in candidates:
        if (c / "config.json").is_file():
            load_model_shape(str(c.resolve()))  # its config.json checked here, before sglang is asked about it
            return value, str(c.resolve())
    have = sorted(p.name for p in models_dir.iterdir() if (p / "config.json").is_file()) if models_dir.is_dir() else []
    raise ScenarioError(f, key, value, "one of " + ", ".join(have) + " (or a path to a directory holding config.json)")


def _resolve_gpu(value: Any, f: str, key: str) -> Gpu:
    names = ", ".join(g.name for g in known_gpus())
    if isinstance(value, int) and not isinstance(value, bool):
        if not GPU_MIN_MIB <= value <= GPU_MAX_MIB:
            raise ScenarioError(f, key, value, f"a GPU name ({names}) or memory.total in MiB, "
                                f"{GPU_MIN_MIB}..{GPU_MAX_MIB} (a GPU holds 1 GiB … 1 TiB)")  # fmt: skip
        return gpu_from_mib(value)
    if isinstance(value, str):
        try:
            return gpu_by_name(value)
        except MemfracError:
            pass
    raise ScenarioError(f, key, value, f"a GPU name ({names}) or nvidia-smi memory.total in MiB (an integer)")


def _build(
    e: dict[str, Any], f: str, prefix: str, models_dir: Path, base_dir: Path | None, chosen: tuple[tuple[str, Any], ...]
) -> Scenario:
    unknown = sorted(set(e) - set(ALL_KEYS))
    if unknown:
        k = unknown[0]
        raise ScenarioError(f, _key(prefix, k), e[k], "known keys: " + ", ".join(ALL_KEYS))
    kw: dict[str, Any] = {}
    if "model" not in e:
        raise ScenarioError(f, _key(prefix, "model"), None, "a model directory name under scenarios/models/")
    kw["model"], kw["model_path"] = _resolve_model(e["model"], f, _key(prefix, "model"), models_dir, base_dir)
    if "gpu" not in e:
        raise ScenarioError(f, _key(prefix, "gpu"), None, "a GPU name or memory.total in MiB")
    kw["gpu"] = _resolve_gpu(e["gpu"], f, _key(prefix, "gpu"))
    if e.get("speculative_draft_model") is not None:
        kw["speculative_draft_model"], kw["speculative_draft_model_path"] = _resolve_model(
            e["speculative_draft_model"], f, _key(prefix, "speculative_draft_model"), models_dir, base_dir
        )
    for k, (check, allowed) in _SCALAR_KEYS.items():
        if k in e:
            try:
                kw[k] = check(e[k])
            except ValueError:
                raise ScenarioError(f, _key(prefix, k), e[k], allowed) from None
    for table, schema in _TABLES.items():
        if table not in e:
            continue
        sub = e[table]
        if not isinstance(sub, dict):
            raise ScenarioError(f, _key(prefix, table), sub, "a table with keys " + ", ".join(schema))
        vals: dict[str, Any] = {}
        for k, v in sub.items():
            if k not in schema:
                raise ScenarioError(f, _key(prefix, f"{table}.{k}"), v, "known keys: " + ", ".join(schema))
            check, allowed = schema[k]
            try:
                vals[k] = check(v)
            except ValueError:
                raise ScenarioError(f, _key(prefix, f"{table}.{k}"), v, allowed) from None
        kw[table] = RunSettings(**vals) if table == "run" else GraphSettings(**vals)
    _a2a_fields(kw, e, f, prefix)
    kw["source"] = f
    kw["matrix"] = chosen
    return Scenario(**kw)


def _a2a_fields(kw: dict[str, Any], e: dict[str, Any], f: str, prefix: str) -> None:
    """Per-backend fields, checked against the backend they belong to (the rest is sglang's to check).

    memfrac's own keys become environment variables sglang reads only when a buffer is created, long after
    its resolver ran, so nothing else would catch a capacity given to a backend that has none, or one above
    what the backend's kernels assert.
    """
    name = kw.get("moe_a2a_backend", "none")
    b = BACKENDS[name]
    if "deepep_dispatch_tokens" in kw:
        if name != "deepep":
            raise ScenarioError(
                f, _key(prefix, "deepep_dispatch_tokens"), e["deepep_dispatch_tokens"],
                f"only with moe_a2a_backend = deepep (use a2a_dispatch_tokens for {name})",
            )  # fmt: skip
        if "a2a_dispatch_tokens" in kw:
            raise ScenarioError(
                f, _key(prefix, "deepep_dispatch_tokens"), e["deepep_dispatch_tokens"],
                "one of deepep_dispatch_tokens and a2a_dispatch_tokens, not both",
            )  # fmt: skip
        kw["a2a_dispatch_tokens"] = kw.pop("deepep_dispatch_tokens")
        key = "deepep_dispatch_tokens"
    else:
        key = "a2a_dispatch_tokens"
    tokens = kw.get("a2a_dispatch_tokens")
    if tokens is not None:
        if b.tokens_env is None:
            takes = ", ".join(x.name for x in BACKENDS.values() if x.tokens_env)
            raise ScenarioError(
                f,
                _key(prefix, key),
                tokens,
                f"only with a backend that has a dispatch buffer ({takes}); {name} has none",
            )
        if b.tokens_max is not None and tokens > b.tokens_max:
            raise ScenarioError(
                f, _key(prefix, key), tokens,
                f"1..{b.tokens_max} for {name} ({b.tokens_env}; its kernels tag token counts with "
                f"FINISHED_SUM_TAG = 1024 and sglang asserts it when the buffer is created)",
            )  # fmt: skip
    if "deepep_v2_mode" in kw and name != "deepep_v2":
        raise ScenarioError(
            f, _key(prefix, "deepep_v2_mode"), kw["deepep_v2_mode"], "only with moe_a2a_backend = deepep_v2"
        )


def scenario_fields() -> list[str]:
    """Names of the Scenario record's fields (for tables and stores)."""
    return [x.name for x in fields(Scenario)]


def single_scenario(
    model: str, gpu: str | int, *, models_dir: Path | None = None, f: str = "<args>", **keys: Any
) -> Scenario:
    """Build one scenario from keyword values, validated exactly like a file."""
    doc = {"name": keys.pop("name", "adhoc"), "model": model, "gpu": gpu, **keys}
    return scenarios_from_doc(doc, f, models_dir or BUNDLED_MODELS)[0]


def scenario_dict(s: Scenario) -> dict[str, Any]:
    """A JSON-ready view of a scenario (for records and stores)."""
    out: dict[str, Any] = {}
    for fld in fields(Scenario):
        v = getattr(s, fld.name)
        if isinstance(v, Gpu):
            v = {"name": v.name, "total_mib": v.total_mib}
        elif isinstance(v, GraphSettings | RunSettings):
            v = {
                x.name: (list(getattr(v, x.name)) if isinstance(getattr(v, x.name), tuple) else getattr(v, x.name))
                for x in fields(v)
            }
        elif fld.name == "env":
            v = dict(v)
        elif fld.name == "matrix":
            v = [[k, x] for k, x in v]
        elif isinstance(v, tuple):
            v = list(v)
        out[fld.name] = v
    return out


__all__ = [
    "MODES",
    "GraphSettings",
    "RunSettings",
    "Scenario",
    "load_scenarios",
    "scenario_dict",
    "scenario_fields",
    "single_scenario",
]


def pick_scenario(path: str | Path, name: str | None, flag: str = "--scenario", instead: str = "") -> Scenario:
    """The one scenario of `path` a command acts on: the one named, or the only one (else a one-line error
    naming what the file holds and the flag that picks one)."""
    scenarios = load_scenarios(path)
    names = ", ".join(x.name for x in scenarios[:8]) + (", …" if len(scenarios) > 8 else "")
    if name is not None:
        for x in scenarios:
            if x.name == name:
                return x
        raise MemfracError(f"{path}: no scenario named {name!r}; it has: {names}")
    if len(scenarios) > 1:
        raise MemfracError(f"{path} holds {len(scenarios)} scenarios; pick one with {flag} NAME ({names}){instead}")
    return scenarios[0]
