"""Validation by sglang itself: every scenario resolved by the real resolver before anything starts.

memfrac's schema checks only what sglang cannot (files, models, GPU names, memfrac's own keys); everything
else — attention DP dividing tp, speculative settings, context_length against the model's, a backend's
requirements — is sglang's to say, in its own words. `validate` resolves a batch of scenarios with one
resolver (the installed release in process, an older `--rules` release in one subprocess when it is
installed side by side in `.cache/sglang-releases/<release>`) and `check` turns a refusal into one line per
scenario naming it.

Importing sglang costs seconds (torch, transformers, the argument groups), so outcomes are cached on disk,
keyed by everything the resolver reads: the release, the exact argv, the GPU size and compute capability,
the environment and the bytes of the model's config.json (and the draft model's). A repeated `explain` or
`sweep --dry-run` does not import sglang at all. `MEMFRAC_CACHE_DIR` moves the cache; `MEMFRAC_SGLANG_RELEASES`
the releases.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from profiler.core.errors import MemfracError
from profiler.engine.oracle import GPU_CAPABILITY, OracleResult, Resolver, resolve_batch_subprocess
from profiler.model.heuristic.rules import version_tuple
from profiler.model.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]
CACHE_VERSION = 1


def releases_dir() -> Path:
    return Path(os.environ.get("MEMFRAC_SGLANG_RELEASES") or ROOT / ".cache" / "sglang-releases")


def cache_dir() -> Path:
    return Path(os.environ.get("MEMFRAC_CACHE_DIR") or Path.home() / ".cache" / "memfrac")


def installed_version() -> str | None:
    """The installed sglang's version from its metadata (no import), or None."""
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def side_by_side(release: str) -> Path | None:
    """The directory of an older release installed beside the main one (`make old-releases`), if any."""
    base = releases_dir()
    want = version_tuple(release)[:3]
    if (base / release / ".installed").exists():
        return base / release
    if base.is_dir():
        for d in sorted(base.iterdir()):
            if (d / ".installed").exists() and version_tuple(d.name)[:3] == want:
                return d
    return None


@dataclass(frozen=True)
class Validation:
    """How a batch of scenarios fared with sglang's own resolver (or why it was not asked)."""

    release: str | None  # the sglang release that resolved them (None: not validated)
    where: str  # "installed" | "side by side" | ""
    results: dict[str, OracleResult] = field(default_factory=dict)  # by scenario name
    seconds: float = 0.0
    cached: int = 0
    reason: str = ""  # why not validated
    inexpressible: dict[str, str] = field(default_factory=dict)  # scenario → why that release cannot spell it

    @property
    def validated(self) -> bool:
        return self.release is not None

    @property
    def refused(self) -> list[tuple[str, str]]:
        return [(n, r.error) for n, r in self.results.items() if r.error]

    def fraction(self, name: str) -> float | None:
        r = self.results.get(name)
        return None if r is None else r.mem_fraction_static

    def summary(self) -> str:
        if not self.validated:
            return f"scenarios were not validated by sglang ({self.reason})"
        n = len(self.results)
        bad = len(self.refused)
        where = f"sglang {self.release}" + (" (side by side)" if self.where == "side by side" else "")
        cached = f", {self.cached} from the cache" if self.cached else ""
        if self.inexpressible:
            cached += f"; {len(self.inexpressible)} not expressible in that release, not validated: " + "; ".join(
                f"{k}: {v}" for k, v in list(self.inexpressible.items())[:3]
            )
        return (
            f"validated by {where}: {n - bad}/{n} scenario(s) accepted ({self.seconds:.1f} s{cached})"
            if bad
            else f"validated by {where}: {n} scenario(s) accepted ({self.seconds:.1f} s{cached})"
        )


def _config_digest(model_path: str) -> str:
    try:
        return hashlib.sha256((Path(model_path) / "config.json").read_bytes()).hexdigest()[:16]
    except OSError:
        return "missing"


def _job(s: Scenario, release: str) -> dict[str, Any]:
    from profiler.engine.launch import server_argv

    cap = GPU_CAPABILITY.get(s.gpu.name)
    return {
        "argv": server_argv(s, release),
        "gpu_mem_mib": s.gpu.total_mib,
        "env": s.env_dict,
        "capability": list(cap) if cap else None,
    }


def _key(job: dict[str, Any], release: str, model_path: str, draft_path: str | None = None) -> str:
    digests = [_config_digest(model_path)] + ([_config_digest(draft_path)] if draft_path else [])
    blob = json.dumps([CACHE_VERSION, release, job, *digests], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class _Cache:
    """Outcomes per release in one JSON file (written atomically; a broken file is ignored and rewritten)."""

    def __init__(self, release: str, enabled: bool) -> None:
        self.path = cache_dir() / f"validation-{release}.json"
        self.enabled = enabled
        self.data: dict[str, Any] = {}
        if enabled:
            with contextlib.suppress(OSError, ValueError):
                self.data = json.loads(self.path.read_text())
        self.dirty = False

    def get(self, key: str, release: str) -> OracleResult | None:
        v = self.data.get(key)
        if not isinstance(v, dict):
            return None
        return OracleResult(
            release, v.get("gpu_mem_mib"), tuple(v.get("patched", ())), v.get("mfs"), {}, v.get("error")
        )

    def put(self, key: str, r: OracleResult) -> None:
        self.data[key] = {"mfs": r.mem_fraction_static, "error": r.error, "gpu_mem_mib": r.gpu_mem_mib,
                          "patched": list(r.patched)}  # fmt: skip
        self.dirty = True

    def save(self) -> None:
        if not (self.enabled and self.dirty):
            return
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.data))
            tmp.replace(self.path)


@lru_cache(maxsize=1)
def _installed_resolver() -> Resolver:
    """One resolver per process: building it imports sglang (seconds); resolving is milliseconds."""
    return Resolver(patch=True)


def _resolve_installed(jobs: list[dict[str, Any]]) -> list[OracleResult]:
    r = _installed_resolver()
    out = []
    with contextlib.redirect_stdout(io.StringIO()):
        for j in jobs:
            cap = j.get("capability")
            out.append(r.resolve(j["argv"], j["gpu_mem_mib"], j["env"], tuple(cap) if cap else None))
    return out


def validate(
    scenarios: Sequence[Scenario], rules: str | None = None, *, use_cache: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Validation:  # fmt: skip
    """Resolve every scenario with sglang: the installed release, or `rules`' release side by side. `progress`
    hears one line before sglang is imported (seconds to a minute, silent otherwise) and one when it is done."""
    t0 = time.perf_counter()
    installed = installed_version()
    if installed is None:
        return Validation(None, "", reason="sglang is not installed here: pip install 'memfrac[sglang]'")
    release, where, directory = installed, "installed", None
    if rules is not None and version_tuple(rules)[:3] < version_tuple(installed)[:3]:
        directory = side_by_side(rules)
        if directory is None:
            return Validation(
                None, "", reason=f"--rules {rules} is older than the installed sglang {installed} and sglang {rules} "
                f"is not installed side by side in {releases_dir()} (make old-releases)",
            )  # fmt: skip
        release, where = directory.name, "side by side"
    cache = _Cache(release, use_cache)
    results: dict[str, OracleResult] = {}
    todo: list[tuple[Scenario, dict[str, Any], str]] = []
    inexpressible: dict[str, str] = {}
    for s in scenarios:
        try:
            job = _job(s, release)
        except MemfracError as e:  # a flag that release does not have: nothing to ask its parser
            inexpressible[s.name] = str(e)
            continue
        key = _key(job, release, s.model_path, s.speculative_draft_model_path)
        hit = cache.get(key, release)
        if hit is not None:
            results[s.name] = hit
        else:
            todo.append((s, job, key))
    cached = len(results)
    if todo:
        jobs = [j for _, j, _ in todo]
        if progress is not None:
            progress(importing_line(len(todo), release, where, cached))
        if directory is None:
            got = _resolve_installed(jobs)
        else:
            try:
                got = resolve_batch_subprocess(jobs, [str(directory)])
            except MemfracError as e:  # the release cannot start here: say so, do not pretend it validated
                last = str(e).strip().splitlines()[-1][:300]
                return Validation(None, "", reason=f"sglang {release} (side by side) could not run here: {last}")
        for (s, _, key), r in zip(todo, got, strict=True):
            results[s.name] = r
            cache.put(key, r)
        cache.save()
        if progress is not None:
            progress(f"sglang {release} resolved {len(todo)} scenario(s) in {time.perf_counter() - t0:.0f} s "
                     "(cached: the next run is instant)")  # fmt: skip
    ordered = {s.name: results[s.name] for s in scenarios if s.name in results}
    return Validation(release, where, ordered, time.perf_counter() - t0, cached, inexpressible=inexpressible)


def importing_line(n: int, release: str, where: str, cached: int = 0) -> str:
    """What the user reads while sglang is imported (the first `explain` was silent for ~36 s before)."""
    more = f"; {cached} already cached" if cached else ""
    how = "in a subprocess" if where == "side by side" else "in this process"
    return (f"validating {n} scenario(s) with sglang {release} ({where}, {how}{more}): importing sglang takes "
            "~20–40 s the first time…")  # fmt: skip


def refusal_message(v: Validation, source: str) -> str:
    """One line per refused scenario, each naming the file, the scenario and sglang's own error."""
    return "\n".join(f"{source}: scenario {name!r}: sglang {v.release} refuses it: {err}" for name, err in v.refused)


def check(
    scenarios: Sequence[Scenario], rules: str | None = None, *, enabled: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Validation:  # fmt: skip
    """`validate`, then raise a `MemfracError` (one line per refused scenario) before anything starts."""
    if not enabled:
        return Validation(None, "", reason="--no-validate")
    v = validate(scenarios, rules, progress=progress)
    if v.refused:
        source = scenarios[0].source if scenarios and scenarios[0].source else "<scenarios>"
        raise MemfracError(refusal_message(v, source))
    return v
