"""`memfrac selfcheck` on a bare GPU image: Python, torch, and nothing else (issue 26.5).

scripts/gpu-acceptance.sh runs the tree from PYTHONPATH on a machine whose Python has a CUDA torch and neither
sglang nor network, so selfcheck may import the standard library and torch's own closure, nothing more (not even
memfrac's declared dependencies: nobody installed them there). Two tests hold that:

- a static one: every module `memfrac selfcheck` imports at module level (the CLI, `profiler.selfcheck.run` and
  everything they reach inside `profiler`) is stdlib, torch, or profiler — the import graph read with `ast`;
- a real one: a fresh venv (`python -m venv`, no `--system-site-packages`) whose site-packages hold only torch's
  distribution and the distributions torch requires (linked from this environment's, so nothing is downloaded),
  cached under .cache/bare-torch-venv/ and rebuilt when torch changes; in it `memfrac selfcheck --json` must exit 2
  on this CUDA-less machine with a JSON document whose `refused` says why, and gpu-acceptance.sh must leave a
  selfcheck.json that parses. `packaging` (which the CLI imported at the top until issue 26) must not import there.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

ENTRY_MODULES = ("profiler.face.cli", "profiler.selfcheck.run")
BARE = Path(os.environ.get("MEMFRAC_BARE_VENV") or ROOT / ".cache" / "bare-torch-venv")  # the env var: elsewhere


def _module_file(name: str) -> Path | None:
    p = ROOT.joinpath(*name.split("."))
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").is_file() else None


def _toplevel_imports(path: Path, module: str) -> list[str]:
    """Absolute names imported when `module` executes: module-level statements, inside if/try at module level,
    not under `if TYPE_CHECKING:` and not inside functions (those are lazy)."""
    is_pkg = path.name == "__init__.py"
    found: list[str] = []

    def visit(body: list[ast.stmt]) -> None:
        for n in body:
            if isinstance(n, ast.Import):
                found.extend(a.name for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                if n.level:
                    parts = module.split(".")
                    base = parts[: len(parts) - n.level + (1 if is_pkg else 0)]
                    m = ".".join([*base, n.module] if n.module else base)
                else:
                    m = n.module or ""
                found.append(m)
                found.extend(f"{m}.{a.name}" for a in n.names)  # `from pkg import submodule`
            elif isinstance(n, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(n.test):
                    visit(n.body)
                visit(n.orelse)
            elif isinstance(n, ast.Try):
                visit(n.body)
                for h in n.handlers:
                    visit(h.body)
                visit(n.orelse)
                visit(n.finalbody)

    visit(ast.parse(path.read_text()).body)
    return found


def selfcheck_external_imports() -> dict[str, set[str]]:
    """Every non-profiler top-level package imported at module level on the way to `memfrac selfcheck`, with the
    profiler modules that import it."""
    seen: set[str] = set()
    todo = list(ENTRY_MODULES)
    external: dict[str, set[str]] = {}
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        parts = m.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # a module's packages run first
        f = _module_file(m)
        if f is None:
            continue
        for name in _toplevel_imports(f, m):
            top = name.split(".")[0]
            if top == "profiler":
                todo.append(name)
            else:
                external.setdefault(top, set()).add(m)
    return external


def test_selfcheck_imports_only_stdlib_and_torch_at_module_level():
    allowed = set(sys.stdlib_module_names) | {"torch", "__future__"}
    bad = {k: sorted(v) for k, v in selfcheck_external_imports().items() if k not in allowed}
    assert not bad, f"`memfrac selfcheck` imports at module level what a bare GPU image lacks: {bad}"


def test_the_import_walk_sees_a_module_level_import(tmp_path, monkeypatch):
    """The walk is not blind: a module-level `from packaging.version import Version` is found, a function-level
    one and a TYPE_CHECKING one are not."""
    f = tmp_path / "m.py"
    f.write_text(
        "from typing import TYPE_CHECKING\nfrom packaging.version import Version\nif TYPE_CHECKING:\n"
        "    import pandas\ntry:\n    import rich\nexcept ImportError:\n    pass\n"
        "def f():\n    import numpy\n"
    )
    names = {n.split(".")[0] for n in _toplevel_imports(f, "profiler.x.m")}
    assert names == {"typing", "packaging", "rich"}


# --- the real bare venv ------------------------------------------------------------------------------------------


def _requirement_names(dist: md.Distribution) -> list[str]:
    from packaging.requirements import Requirement

    out = []
    for spec in dist.requires or []:
        r = Requirement(spec)
        if r.marker is None or r.marker.evaluate({"extra": ""}):
            out.append(r.name)
    return out


def _torch_closure() -> list[md.Distribution]:
    """torch's distribution and every distribution it requires (markers evaluated, no extras), from this env."""
    todo, seen, dists = ["torch"], set(), []
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            d = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # an optional platform package this environment lacks: the bare venv lacks it too
        dists.append(d)
        todo += _requirement_names(d)
    return dists


def _bare_venv() -> Path:
    """The cached bare venv's python: torch's closure linked into a fresh venv's site-packages."""
    torch = pytest.importorskip("torch")
    dists = _torch_closure()
    stamp_text = "\n".join(sorted(f"{d.metadata['Name']}=={d.version}" for d in dists)) + "\n"
    py = BARE / "bin" / "python"
    stamp = BARE / ".bare-installed"
    if stamp.is_file() and stamp.read_text() == stamp_text and py.exists():
        return py
    shutil.rmtree(BARE, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(BARE)], check=True, timeout=60)
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True, timeout=60,
        ).stdout.strip()
    )
    for d in dists:
        tops = {Path(str(f)).parts[0] for f in d.files or [] if not str(f).startswith("..")}
        for top in tops:
            src = Path(d.locate_file(top))
            if src.exists() and not (site / top).exists() and top != "__pycache__":
                (site / top).symlink_to(src)
    assert (site / "torch").exists(), f"torch {torch.__version__} was not linked into {site}"
    stamp.write_text(stamp_text)
    return py


def _bare_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


@pytest.mark.e2e
def test_selfcheck_json_on_a_bare_torch_venv(tmp_path):
    py = _bare_venv()
    env = _bare_env()
    probe = subprocess.run(
        [str(py), "-c", "import sys, torch\nfor m in ('packaging', 'rich', 'pandas', 'numpy', 'sglang', 'pytest'):\n"
         "    try:\n        __import__(m); print(m)\n    except ImportError:\n        pass\n"],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert probe.returncode == 0, probe.stderr
    assert "packaging" not in probe.stdout.split(), "the bare venv is not bare: packaging imports"
    assert "sglang" not in probe.stdout.split() and "pytest" not in probe.stdout.split()

    r = subprocess.run(
        [str(py), "-m", "profiler.face.cli", "selfcheck", "--json", "--probe-dir", str(tmp_path / "probe")],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr, r.stderr  # torch may warn first (no numpy here); memfrac says one line
    doc = json.loads(r.stdout)
    assert doc["schema"] == "memfrac-selfcheck/2" and doc["passed"] is False and doc["checks"] == []
    assert "no CUDA device visible" in doc["refused"]
    assert r.stderr.strip().splitlines()[-1] == f"memfrac selfcheck: {doc['refused']}"

    text = subprocess.run(  # the tables need rich; the refusal does not
        [str(py), "-m", "profiler.face.cli", "selfcheck"], env=env, capture_output=True, text=True, timeout=120,
    )
    assert text.returncode == 2 and text.stdout == "" and "Traceback" not in text.stderr

    out = tmp_path / "acc"
    acc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-acceptance.sh")],
        env={**env, "PYTHON": str(py), "OUT": str(out), "MEMFRAC_ACCEPTANCE_LIMIT_S": "100"},
        capture_output=True, text=True, timeout=150,
    )
    assert acc.returncode == 2, acc.stdout + acc.stderr
    assert json.loads((out / "selfcheck.json").read_text())["refused"] == doc["refused"]
    summary = (out / "summary.txt").read_text()
    assert f"selfcheck refused: {doc['refused']}" in summary and "pytest: not installed" in summary
