"""Activate the probe for one worker without installing anything: a generated `*.dist-info` on PYTHONPATH.

sglang discovers general plugins through `importlib.metadata` entry points, so a bare
`memfrac_probe-<ver>.dist-info/` (METADATA + entry_points.txt) in a directory on PYTHONPATH is a plugin;
PYTHONPATH reaches the scheduler processes the worker spawns. The `profiler` package itself must import in
the worker: its parent directory goes on PYTHONPATH too.
"""

from __future__ import annotations

import os
from pathlib import Path

from profiler import __version__
from profiler.measure.probe.plugin import ENV_DIR, PLUGIN_NAME

PACKAGE_PARENT = Path(__file__).resolve().parents[3]


def absolute_list(value: str) -> str:
    """A PATH-style list with every entry absolute, against this process's working directory (an empty entry
    means that directory to Python): a worker starts in its run directory, where a relative entry points
    elsewhere."""
    return os.pathsep.join(os.path.abspath(e or os.curdir) for e in value.split(os.pathsep))


def write_dist_info(plugin_dir: Path) -> Path:
    """Create `<plugin_dir>/memfrac_probe-<ver>.dist-info` and return it."""
    d = plugin_dir / f"{PLUGIN_NAME}-{__version__}.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN_NAME}\nVersion: {__version__}\n")
    entry = f"{PLUGIN_NAME} = profiler.measure.probe.plugin:register"
    (d / "entry_points.txt").write_text(f"[sglang.srt.plugins]\n{entry}\n")
    return d


def probe_env(plugin_dir: Path, out_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment additions that turn the probe on for a worker writing into `out_dir`.

    Every path is absolute: the worker runs in another directory than memfrac. A user-set SGLANG_PLUGINS filter
    keeps its plugins and gains ours; without one every installed plugin loads as it would without memfrac.
    """
    base = dict(os.environ if base is None else base)
    plugin_dir, out_dir = Path(os.path.abspath(plugin_dir)), Path(os.path.abspath(out_dir))
    write_dist_info(plugin_dir)
    parts = [str(plugin_dir), str(PACKAGE_PARENT)]
    if base.get("PYTHONPATH"):
        parts.append(absolute_list(base["PYTHONPATH"]))
    env = {"PYTHONPATH": os.pathsep.join(parts), ENV_DIR: str(out_dir)}
    if base.get("SGLANG_PLUGINS"):
        names = [n.strip() for n in base["SGLANG_PLUGINS"].split(",") if n.strip()]
        if PLUGIN_NAME not in names:
            names.append(PLUGIN_NAME)
        env["SGLANG_PLUGINS"] = ",".join(names)
    return env
