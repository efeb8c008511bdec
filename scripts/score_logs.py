#!/usr/bin/env python3
"""Score the log parser on a fixture folder of real logs read by hand (logs + expected/*.json + INDEX.tsv).

    python scripts/score_logs.py tests/fixtures/logs-heldout [--json OUT]

Prints values found/expected (%), per-rank readings found/expected, logs fully right (n/N), per class how many
logs cover it and how many are fully right, and each log's misses. The comparison is the fixture test's
(tests/logs/test_logs_fixtures.py) through tests/logs/scoring.py. `--json OUT` writes the same as JSON, with the
time it was recorded and the git commit it scored.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="fixture folder: *.log, expected/*.json, INDEX.tsv")
    ap.add_argument("--json", type=Path, metavar="OUT", help="also write the score as JSON to OUT")
    a = ap.parse_args(argv)
    if not (a.folder / "expected").is_dir():
        print(f"score_logs: error: {a.folder} has no expected/ folder (give a fixture folder such as "
              "tests/fixtures/logs-heldout)", file=sys.stderr)  # fmt: skip
        return 2
    from tests.logs.scoring import render, score_folder

    try:
        score = score_folder(a.folder)
    except ValueError as e:
        print(f"score_logs: error: {e}", file=sys.stderr)
        return 2
    print(render(score))
    if a.json:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
        score = {
            "recorded": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": commit.stdout.strip() or None,
            **score,
        }
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(score, indent=1) + "\n")
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
