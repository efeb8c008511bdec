"""`memfrac calibrate`: fit, print, write calibration.json and (on request) the patch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from profiler.calibrate.codec import write_calibration
from profiler.calibrate.fit import calibrate
from profiler.calibrate.render import render_text
from profiler.calibrate.upstream import make_patch
from profiler.core.errors import MemfracError
from profiler.core.validate import writable_file


def run_calibrate(
    results: list[str],
    quantile: float = 1.0,
    margin_mib: float = 256.0,
    json_out: bool = False,
    out: str | None = None,
    emit_patch: str | None = None,
) -> int:
    """The command: print the calibration (text, or one JSON object); write calibration.json and the patch."""
    if out:
        writable_file(out, "--out")  # before the fit: a directory given as --out is one line, not lost work
    if emit_patch and emit_patch != "-":
        writable_file(emit_patch, "--emit-patch")
    cal = calibrate(results, quantile, margin_mib)
    patch, refusal = None, None
    if emit_patch:
        try:
            patch = make_patch(cal)
        except MemfracError as e:  # said after the calibration itself is printed and written
            refusal = e
    if emit_patch != "-":
        print(json.dumps(cal.as_dict(), indent=1) if json_out else render_text(cal))
    say = (lambda m: print(m, file=sys.stderr)) if json_out or emit_patch == "-" else print
    if out:
        d = write_calibration(cal, out)
        say(f"wrote {out}: {len(d['terms'])} term(s) fitted ({', '.join(d['terms']) or 'none'}), rules {d['rules']}")
    if refusal is not None:
        raise refusal
    if patch is not None:
        if emit_patch == "-":
            sys.stdout.write(patch.diff)
        else:
            Path(emit_patch).write_text(patch.diff)
            say(f"wrote {emit_patch}: a patch for sglang {patch.version}'s {patch.hook}")
        say(f"patch replaces: {', '.join(patch.replaced)}")
        for k, why in patch.left:
            say(f"patch leaves {k}: {why}")
    return 0
