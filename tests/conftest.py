"""Shared test fixtures: paths, the bundled scenarios, and skips that say what to install."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
LOG_FIXTURES = FIXTURES / "logs"  # real logs with hand-written expectations (expected/, INDEX.tsv)
FAKES = ROOT / "tests" / "fakes"
FAKE_WORKER = FAKES / "fake_sglang.py"  # a stand-in sglang server for supervision tests
RELEASES_DIR = ROOT / ".cache" / "sglang-releases"


def have_sglang() -> bool:
    return importlib.util.find_spec("sglang") is not None


needs_sglang = pytest.mark.skipif(
    not have_sglang(), reason="sglang not installed: run `make test` (installs memfrac[sglang])"
)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(autouse=True, scope="session")
def _validation_cache(tmp_path_factory):
    """sglang's validation outcomes (profiler.engine.validation) are cached per test session, not in ~/.cache."""
    import os

    d = tmp_path_factory.mktemp("memfrac-cache")
    old = os.environ.get("MEMFRAC_CACHE_DIR")
    os.environ["MEMFRAC_CACHE_DIR"] = str(d)
    yield d
    if old is None:
        os.environ.pop("MEMFRAC_CACHE_DIR", None)
    else:
        os.environ["MEMFRAC_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def ingested(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every real log fixture (LOG_FIXTURES) ingested once into a results directory; read it, do not write it."""
    from profiler.ingest.core import run_ingest

    out = tmp_path_factory.mktemp("ingested")
    run_ingest([str(LOG_FIXTURES)], out=str(out), echo=lambda s: None, warn=lambda s: None)
    return out
