#!/usr/bin/env bash
# memfrac's acceptance run on a GPU machine that has Python with a CUDA torch but neither sglang nor network.
# Run from anywhere inside the working tree (no install: the tree goes on PYTHONPATH):
#
#   OUT=/some/dir bash scripts/gpu-acceptance.sh        # default OUT: ./gpu-acceptance-out
#
# It writes, under $OUT:
#   summary.txt          the machine (nvidia-smi, python, torch, CUDA), each step's exit status and seconds
#   selfcheck.json       `memfrac selfcheck --json` (schema memfrac-selfcheck/2: checks, the life's ledger, readings)
#   selfcheck.stderr     its stderr (one line when it refuses: no CUDA, too little free memory)
#   probe/probe-*.jsonl  the worker life's probe records, as the real Recorder wrote them
#   pytest-gpu.txt       pytest -m gpu tests/selfcheck/test_selfcheck_gpu.py (the same checks, asserted)
#   pytest-cpu.txt       the CPU judges' tests on this machine's Python and torch (no GPU needed)
#
# Hard limit: MEMFRAC_ACCEPTANCE_LIMIT_S seconds for everything (default 540; each step gets what is left, capped),
# so it fits one 10-minute device call. Exit status: 0 when every step passed, else the first failing step's.
# Needs: bash, coreutils `timeout`, python3 with torch (CUDA), pytest for the test steps (skipped with a note
# when missing), rich (the text tables; `--json` does not need it). pynvml is optional.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
OUT="${OUT:-$ROOT/gpu-acceptance-out}"
PY="${PYTHON:-python3}"
LIMIT="${MEMFRAC_ACCEPTANCE_LIMIT_S:-540}"
mkdir -p "$OUT/probe" || exit 2
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
start=$(date +%s)
deadline=$((start + LIMIT))
first_rc=0
S="$OUT/summary.txt"

left() { # seconds left, capped at $1
    local now r
    now=$(date +%s)
    r=$((deadline - now))
    ((r > $1)) && r=$1
    echo "$r"
}

step() { # step NAME CAP OUTFILE ERRFILE CMD...
    local name=$1 cap=$2 out=$3 err=$4
    shift 4
    local t budget rc
    budget=$(left "$cap")
    if ((budget < 10)); then
        echo "$name: not run (time limit of ${LIMIT}s reached)" >>"$S"
        ((first_rc == 0)) && first_rc=124
        return
    fi
    t=$(date +%s)
    timeout -k 10 "$budget" "$@" >"$out" 2>"$err"
    rc=$?
    local what="exit $rc"
    ((rc == 124 || rc == 137)) && what="exit $rc (killed at its ${budget}s limit)"
    echo "$name: $what, $(($(date +%s) - t)) s" >>"$S"
    ((rc != 0 && first_rc == 0)) && first_rc=$rc
}

{
    echo "memfrac GPU acceptance, $(date -u +%Y-%m-%dT%H:%M:%SZ), tree $ROOT ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'no git'))"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv 2>&1
    else
        echo "nvidia-smi: not on PATH"
    fi
    "$PY" - <<'EOF' 2>&1
import sys
print("python", sys.version.split()[0], sys.executable)
try:
    import torch
    ok = torch.cuda.is_available()
    print("torch", torch.__version__, "CUDA", torch.version.cuda, "available", ok,
          *( [torch.cuda.get_device_name(0), f"{torch.cuda.mem_get_info(0)[0] / 2**20:,.0f} MiB free"] if ok else []))
    print("allocator", torch.cuda.get_allocator_backend() if ok else "-")
except Exception as e:
    print("torch: cannot import:", type(e).__name__, e)
for m in ("pytest", "rich", "pynvml", "sglang"):
    try:
        __import__(m)
        print(m, "present")
    except Exception:
        print(m, "absent")
EOF
    echo "PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"
    echo "---"
} >"$S"

step "selfcheck --json" 300 "$OUT/selfcheck.json" "$OUT/selfcheck.stderr" \
    "$PY" -m profiler.face.cli selfcheck --json --probe-dir "$OUT/probe"
"$PY" - "$OUT/selfcheck.json" "$OUT/selfcheck.stderr" >>"$S" 2>&1 <<'EOF'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except Exception as e:
    why = open(sys.argv[2]).read().strip().splitlines()
    print("selfcheck.json: no JSON document;", why[-1] if why else f"{type(e).__name__}: {e}")
    raise SystemExit(0)
if doc.get("refused"):
    print("selfcheck refused:", doc["refused"])
    raise SystemExit(0)
bad = [c for c in doc["checks"] if not c["passed"]]
print(f"selfcheck: {len(doc['checks']) - len(bad)}/{len(doc['checks'])} checks passed on {doc['device']['name']}"
      f" in {doc.get('elapsed_s')} s; ledger closes: {(doc.get('ledger') or {}).get('closes')}")
for c in bad:
    print(f"  FAIL {c['name']}: {c['note']}")
EOF

if "$PY" -c "import pytest" 2>/dev/null; then
    step "pytest -m gpu" 240 "$OUT/pytest-gpu.txt" /dev/null \
        sh -c "'$PY' -m pytest -q -m gpu -p no:cacheprovider tests/selfcheck/test_selfcheck_gpu.py 2>&1"
    step "pytest (CPU judges)" 120 "$OUT/pytest-cpu.txt" /dev/null \
        sh -c "'$PY' -m pytest -q -p no:cacheprovider tests/selfcheck/test_selfcheck.py tests/measure/test_probe_truth.py 2>&1"
else
    echo "pytest: not installed for $PY: the test steps were not run" >>"$S"
fi
echo "total: $(($(date +%s) - start)) s; exit $first_rc" >>"$S"
cat "$S"
exit "$first_rc"
