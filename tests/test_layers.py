"""The stages of profiler/ import only from the stages before them, and no modules import each other in a circle.

Every import counts: top-level, inside a function, under TYPE_CHECKING. A stage may import its own modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

#: The pipeline, first to last (README "How it works"). `profiler/__init__.py` and `profiler/data` are no stage.
STAGES = ("core", "model", "engine", "logs", "measure", "analyse", "results", "calibrate", "ingest", "sweep",
          "selfcheck", "face")  # fmt: skip
PKG = ROOT / "profiler"


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "profiler":
                out |= {f"profiler.{a.name}" for a in node.names if a.name != "__version__"}
            elif node.module.startswith("profiler."):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("profiler.")}
    return out


def _graph() -> dict[str, set[str]]:
    mods = {_module(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        targets = set()
        for imp in _imports(path):
            while imp not in mods and "." in imp:  # `from profiler.x import y` where y is a name, not a module
                imp = imp.rsplit(".", 1)[0]
            if imp in mods and imp != name:
                targets.add(imp)
        graph[name] = targets
    return graph


def _stage(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in STAGES) else None


def test_every_module_sits_in_a_stage() -> None:
    loose = [m for m in _graph() if m != "profiler" and _stage(m) not in STAGES]
    assert not loose, f"modules outside the stages {STAGES}: {loose}"


def test_no_import_climbs_back_up_a_stage() -> None:
    up = [
        f"{src} → {dst}"
        for src, dsts in _graph().items()
        for dst in dsts
        if (a := _stage(src)) and (b := _stage(dst)) and STAGES.index(b) > STAGES.index(a)
    ]
    assert not up, "imports that run back up a stage:\n" + "\n".join(sorted(up))


def test_no_import_circles() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, f"modules importing each other in a circle: {circles}"


def test_the_checker_sees_a_climb_and_a_circle(tmp_path: Path) -> None:
    """The checks above can fail: a lazy import inside a function is an import like any other."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from profiler.face.cli import main\n\nif 0:\n    import profiler.sweep.plan\n")
    assert _imports(f) == {"profiler.face.cli", "profiler.sweep.plan"}
    assert _stage("profiler.face.cli") == "face" and _stage("profiler.core") == "core"


def test_units_are_binary() -> None:
    """One meaning of MiB and GiB (profiler/core/units.py): 1 MiB = 2**20 bytes, 1 GiB = 1024 MiB = 2**30 bytes."""
    from profiler.core import units
    from profiler.model import a2a, deepep, postcapture

    assert (units.BYTES_PER_MIB, units.BYTES_PER_GIB, units.MIB_PER_GIB) == (1_048_576, 1_073_741_824, 1024.0)
    assert a2a.MIB is deepep.MIB is postcapture.MIB is units.BYTES_PER_MIB
