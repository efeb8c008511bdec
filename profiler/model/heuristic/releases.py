"""Every sglang release since 0.4.0, in order: its publication day and the rule set it computes the fraction by.

The list is PyPI's (`pip index versions --pre sglang`), release candidates included (no 0.5.0 final was
published: 0.5.0rc0–rc2 then 0.5.1). `date` is the build day stamped in the release's wheel (the zip entries'
dates, `RECORD`'s), which is the day it was uploaded to PyPI within a day; `rules` names the group of releases
whose memory rules are identical (`rules.RULE_SETS`), found by diffing each release's resolution code against
the previous one's. Other modules date log formats by release with `releases_between`.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

from profiler.core.errors import MemfracError
from profiler.model.heuristic.rules import RULE_SETS, RuleSet

if TYPE_CHECKING:
    from packaging.version import Version


class Release(NamedTuple):
    """One sglang release: version as PyPI spells it, wheel build day (ISO) or None, rule-set name."""

    version: str
    date: str | None
    rules: str

    @property
    def rule_set(self) -> RuleSet:
        return RULE_SETS[self.rules]


RELEASES: tuple[Release, ...] = (
    Release("0.4.0", "2024-12-03", "0.4.0"),
    Release("0.4.0.post1", "2024-12-06", "0.4.0.post1"),
    Release("0.4.0.post2", "2024-12-21", "0.4.0.post1"),
    Release("0.4.1", "2024-12-25", "0.4.0.post1"),
    Release("0.4.1.post1", "2024-12-27", "0.4.0.post1"),
    Release("0.4.1.post2", "2024-12-29", "0.4.0.post1"),
    Release("0.4.1.post3", "2024-12-29", "0.4.0.post1"),
    Release("0.4.1.post4", "2025-01-05", "0.4.0.post1"),
    Release("0.4.1.post5", "2025-01-11", "0.4.0.post1"),
    Release("0.4.1.post6", "2025-01-15", "0.4.0.post1"),
    Release("0.4.1.post7", "2025-01-20", "0.4.0.post1"),
    Release("0.4.2", "2025-01-27", "0.4.0.post1"),
    Release("0.4.2.post1", "2025-01-31", "0.4.0.post1"),
    Release("0.4.2.post2", "2025-02-05", "0.4.0.post1"),
    Release("0.4.2.post3", "2025-02-07", "0.4.0.post1"),
    Release("0.4.2.post4", "2025-02-10", "0.4.0.post1"),
    Release("0.4.3", "2025-02-14", "0.4.0.post1"),
    Release("0.4.3.post1", "2025-02-17", "0.4.0.post1"),
    Release("0.4.3.post2", "2025-02-17", "0.4.0.post1"),
    Release("0.4.3.post3", "2025-03-06", "0.4.0.post1"),
    Release("0.4.3.post4", "2025-03-06", "0.4.0.post1"),
    Release("0.4.4", "2025-03-13", "0.4.0.post1"),
    Release("0.4.4.post1", "2025-03-14", "0.4.0.post1"),
    Release("0.4.4.post2", "2025-03-27", "0.4.0.post1"),
    Release("0.4.4.post3", "2025-03-29", "0.4.0.post1"),
    Release("0.4.4.post4", "2025-04-05", "0.4.4.post4"),
    Release("0.4.5", "2025-04-07", "0.4.4.post4"),
    Release("0.4.5.post1", "2025-04-16", "0.4.4.post4"),
    Release("0.4.5.post2", "2025-04-20", "0.4.4.post4"),
    Release("0.4.5.post3", "2025-04-22", "0.4.5.post3"),
    Release("0.4.6", "2025-04-27", "0.4.5.post3"),
    Release("0.4.6.post1", "2025-04-28", "0.4.5.post3"),
    Release("0.4.6.post2", "2025-05-01", "0.4.6.post2"),
    Release("0.4.6.post3", "2025-05-09", "0.4.6.post2"),
    Release("0.4.6.post4", "2025-05-13", "0.4.6.post2"),
    Release("0.4.6.post5", "2025-05-24", "0.4.6.post5"),
    Release("0.4.7", "2025-06-10", "0.4.7"),
    Release("0.4.7.post1", "2025-06-16", "0.4.7.post1"),
    Release("0.4.8", "2025-06-24", "0.4.7.post1"),
    Release("0.4.8.post1", "2025-06-26", "0.4.7.post1"),
    Release("0.4.9", "2025-07-06", "0.4.9"),
    Release("0.4.9.post1", "2025-07-09", "0.4.9"),
    Release("0.4.9.post2", "2025-07-12", "0.4.9"),
    Release("0.4.9.post3", "2025-07-22", "0.4.9.post3"),
    Release("0.4.9.post4", "2025-07-26", "0.4.9.post3"),
    Release("0.4.9.post5", "2025-07-28", "0.4.9.post3"),
    Release("0.4.9.post6", "2025-07-29", "0.4.9.post3"),
    Release("0.4.10", "2025-07-31", "0.4.9.post3"),
    Release("0.4.10.post1", "2025-08-01", "0.4.9.post3"),
    Release("0.4.10.post2", "2025-08-03", "0.4.9.post3"),
    Release("0.5.0rc0", "2025-08-08", "0.4.9.post3"),
    Release("0.5.0rc1", "2025-08-13", "0.4.9.post3"),
    Release("0.5.0rc2", "2025-08-14", "0.4.9.post3"),
    Release("0.5.1", "2025-08-23", "0.4.9.post3"),
    Release("0.5.1.post1", "2025-08-24", "0.4.9.post3"),
    Release("0.5.1.post2", "2025-08-25", "0.4.9.post3"),
    Release("0.5.1.post3", "2025-08-27", "0.4.9.post3"),
    Release("0.5.2rc0", "2025-09-01", "0.4.9.post3"),
    Release("0.5.2rc1", "2025-09-02", "0.4.9.post3"),
    Release("0.5.2rc2", "2025-09-05", "0.4.9.post3"),
    Release("0.5.2", "2025-09-11", "0.5.2"),
    Release("0.5.3rc0", "2025-09-15", "0.5.2"),
    Release("0.5.3rc2", "2025-10-06", "0.5.3"),
    Release("0.5.3", "2025-10-06", "0.5.3"),
    Release("0.5.3.post1", "2025-10-09", "0.5.3.post1"),
    Release("0.5.3.post2", "2025-10-15", "0.5.3.post1"),
    Release("0.5.3.post3", "2025-10-16", "0.5.3.post1"),
    Release("0.5.4", "2025-10-24", "0.5.3.post1"),
    Release("0.5.4.post1", "2025-10-27", "0.5.4.post1"),
    Release("0.5.4.post2", "2025-11-01", "0.5.4.post1"),
    Release("0.5.4.post3", "2025-11-05", "0.5.4.post1"),
    Release("0.5.5", "2025-11-06", "0.5.4.post1"),
    Release("0.5.5.post1", "2025-11-10", "0.5.5.post1"),
    Release("0.5.5.post2", "2025-11-12", "0.5.5.post1"),
    Release("0.5.5.post3", "2025-11-17", "0.5.5.post1"),
    Release("0.5.6", "2025-12-03", "0.5.5.post1"),
    Release("0.5.6.post1", "2025-12-08", "0.5.5.post1"),
    Release("0.5.6.post2", "2025-12-11", "0.5.5.post1"),
    Release("0.5.7", "2026-01-01", "0.5.7"),
    Release("0.5.8", "2026-01-23", "0.5.8"),
    Release("0.5.8.post1", "2026-02-05", "0.5.8"),
    Release("0.5.9", "2026-02-23", "0.5.9"),
    Release("0.5.10rc0", "2026-03-27", "0.5.10"),
    Release("0.5.10", "2026-04-05", "0.5.10"),
    Release("0.5.10.post1", "2026-04-08", "0.5.10"),
    Release("0.5.11", "2026-05-07", "0.5.11"),
    Release("0.5.12", "2026-05-16", "0.5.12"),
    Release("0.5.12.post1", "2026-05-23", "0.5.12"),
    Release("0.5.13", "2026-06-11", "0.5.13"),
    Release("0.5.13.post1", "2026-06-15", "0.5.13"),
    Release("0.5.14", "2026-06-26", "0.5.14"),
    Release("0.5.15", "2026-07-10", "0.5.15"),
    Release("0.5.15.post1", "2026-07-14", "0.5.15"),
    Release("0.5.16", "2026-07-25", "0.5.16"),
    Release("0.5.17", "2026-08-08", "0.5.17"),
    Release("0.5.18", "2026-08-21", "0.5.18"),
    Release("0.5.19", "2026-09-04", "0.5.19"),
    Release("0.5.20", "2026-09-18", "0.5.20"),
    Release("0.5.21", "2026-10-01", "0.5.20"),
    Release("0.5.22", "2026-10-15", "0.5.22"),
    Release("0.5.23", "2026-10-30", "0.5.23"),
)
OLDEST, NEWEST = RELEASES[0], RELEASES[-1]

#: The sglang release memfrac pins (pyproject's `sglang` extra) and models when none is named; its rule set is
#: `rules.DEFAULT_RULES`. Every "default 0.5.23" in the code is this name.
DEFAULT_RELEASE = "0.5.23"


def parse_version(spec: str) -> Version:
    """'v0.4.10.post1' → Version('0.4.10.post1'); a bad spelling is a MemfracError naming it.

    `packaging` is imported here, not at the top: `memfrac selfcheck` imports this module (for DEFAULT_RELEASE)
    and must run on a bare GPU image with torch alone, which does not bring `packaging`; only release
    arithmetic needs it."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(spec.strip())
    except InvalidVersion:
        raise MemfracError(
            f"unknown sglang release {spec!r}: give a release like 0.4.10.post1 or 0.5.17 "
            f"({OLDEST.version} … {NEWEST.version} are known)"
        ) from None


@lru_cache(maxsize=1)
def _by_version() -> dict[Version, Release]:
    from packaging.version import Version

    return {Version(r.version): r for r in RELEASES}


def release(v: str) -> Release:
    """The release `v` exactly (with or without a leading `v`); MemfracError for one PyPI never had."""
    r = _by_version().get(parse_version(v))
    if r is None:
        raise MemfracError(
            f"sglang {v} is not a published release ({OLDEST.version} … {NEWEST.version} are known; "
            "see profiler/model/heuristic/releases.py)"
        )
    return r


def releases_between(lo: str | None, hi: str | None) -> list[Release]:
    """The releases from `lo` to `hi`, both inclusive, in version order (None: open at that end)."""
    a = parse_version(lo) if lo is not None else None
    b = parse_version(hi) if hi is not None else None
    return [r for v, r in _by_version().items() if (a is None or v >= a) and (b is None or v <= b)]


def rule_sets_for(versions: Iterable[str]) -> list[RuleSet]:
    """The distinct rule sets of these releases, in release order."""
    names = {release(v).rules for v in versions}
    return [RULE_SETS[n] for n in dict.fromkeys(r.rules for r in RELEASES) if n in names]


def rules_name_for(spec: str) -> str:
    """The rule-set name for a release spec: an exact release, else the newest release not above it.

    A spec between known releases (an unpublished `.postN`, a dev build) gets the rules of the newest release
    at or below it; one newer than {NEWEST.version} gets {NEWEST.version}'s; older than 0.4.0 is refused.
    """
    v = parse_version(spec)
    exact = _by_version().get(v)
    if exact is not None:
        return exact.rules
    from packaging.version import Version

    if v < Version(OLDEST.version):
        raise MemfracError(
            f"sglang {spec} predates {OLDEST.version}: its heuristic is not modelled (memfrac knows "
            f"{OLDEST.version} … {NEWEST.version})"
        )
    best = OLDEST
    for r in RELEASES:
        if Version(r.version) <= v:
            best = r
    return best.rules


def is_newer_than_known(spec: str) -> bool:
    """True for a release newer than the newest memfrac knows (its rules are assumed to be that one's)."""
    from packaging.version import Version

    return parse_version(spec) > Version(NEWEST.version)


def rules_for(spec: str) -> RuleSet:
    """A rule set by release (`0.4.10.post1`, `v0.5.15.post1`, `0.5.0rc2`) or by its name in `RULE_SETS`.

    Every release from 0.4.0 to 0.5.23 is known (`releases.RELEASES`). A release newer than 0.5.23 gets the
    0.5.23 rules (the heuristic has not moved since, as far as memfrac knows; `memfrac explain` says so); one
    older than 0.4.0 is refused.
    """
    if spec in RULE_SETS:
        return RULE_SETS[spec]
    return RULE_SETS[rules_name_for(spec)]
