"""A log run's verdict is decided once: `profiler.analyse.compare.compare` with what the log supports (its own
fraction, the rule sets' label, the runtime need over the candidates); ingest never patches it afterwards."""

from __future__ import annotations

import ast
import inspect
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest

import profiler.ingest as ingest_pkg
from profiler.analyse.compare import LogJudging, compare
from profiler.analyse.verdict import run_verdict
from profiler.ingest.judge import judge
from profiler.logs import parse_log
from profiler.logs.reserve import log_reservation
from tests.conftest import LOG_FIXTURES

LOGS = sorted(LOG_FIXTURES.glob("*.log"))


def test_no_ingest_module_patches_a_comparison() -> None:
    """dataclasses.replace on a Comparison was how ingest re-decided compare's verdict (issue 16): gone."""
    for f in Path(inspect.getfile(ingest_pkg)).parent.glob("*.py"):
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "replace":
                args = [ast.unparse(a) for a in node.args]
                assert not args or args[0] not in ("c", "comparison"), f"{f.name}:{node.lineno} patches a comparison"


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_judge_is_compare_with_the_logs_own_terms(path: Path) -> None:
    for m, again in zip(parse_log(path), parse_log(path), strict=True):
        c, j = judge(m)
        lr = log_reservation(again)
        again.mfs, again.mfs_origin, again.mfs_how = lr.mfs, lr.mfs_origin, lr.mfs_how
        direct = compare(again, lr.headline, judging=LogJudging(again.mfs, lr.rules, j.need, lr.rule_sets))
        assert asdict(direct) == asdict(c), m.id
        assert c.rules == lr.rules and c.mfs == m.mfs, m.id
        if m.mfs is None:
            assert c.slack_mib is None and c.recommended_mfs is None, m.id
        # the one decision is the verdict module's, with the judged figures and that need
        got = run_verdict(m, c.headroom_mib, c.used_after_kv_mib, c.headroom_startup_mib, j.need)
        assert c.verdict == got[0], m.id


def test_rule_sets_are_carried_as_a_list_into_results(ingested):
    """A log judged with a range of candidate rule sets stores the list itself (results.parquet `rule_sets`), and
    calibration reads that list: no prose label parsed back."""
    from profiler.results.frames import rule_sets_of
    from profiler.results.store import load_results

    df = load_results(ingested)
    for _, row in df.drop_duplicates("run_id").iterrows():
        sets = rule_sets_of(row)
        label = str(row["rules"]) if row["rules"] is not pd.NA else ""
        if " … " in label:  # "0.5.3 … 0.5.8 (6 rule sets)": the list has its ends and its count
            lo, hi = label.split(" (")[0].split(" … ")
            assert sets[0] == lo and sets[-1] == hi and f"({len(sets)} rule sets)" in label, (label, sets)
        elif label and label != "none":
            assert sets == (label,), (label, sets)
