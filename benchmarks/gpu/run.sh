#!/usr/bin/env bash
# memtop's one prepared run on a lent GPU machine (docs: benchmarks/README.md, "The GPU run").
#
#   bash benchmarks/gpu/run.sh                 # on the GPU machine: results into $OUT
#   bash benchmarks/gpu/run.sh --rehearse      # here, on CPU: the same script, its own temp OUT
#   bash benchmarks/gpu/run.sh --fetch-wheels  # here, with a network: the wheels into .whl/
#
# The GPU machine (an H200; Python 3.12, torch 2.11 + CUDA 13, no network, no textual /
# plotext / pytest-asyncio / import-linter) gets this checkout with .whl/ carried. This script:
#   1. installs the wheels of benchmarks/gpu/wheels.txt from .whl/ (pip --no-index --no-deps
#      --target, on PYTHONPATH: the image's torch stays the one used);
#   2. checks that everything imports (a missing one is said at the top of summary.md);
#   3. runs python -m benchmarks.gpu.check within a 6-minute limit (it starts no claim after
#      --budget-s and writes its summary after every claim, so a kill keeps what was done);
#   4. runs `python -m pytest -x -q` within 3 minutes;
#   5. packs everything into at most 8 files under $OUT, 2 folders deep at most: summary.md,
#      console.log, gpu_check.json, pytest.txt and gpu_run.tar.gz (every file written; files
#      over 2 MiB are left out of the tarball and listed in summary.md).
# Whole run: about 9.5 minutes at most. The device call (the device tool's README): one prepared
# run, `carry: [".whl"]`, timeout_s 600; give the machine back after, unless a rerun follows at
# once (`GPU_RUN_ONLY=claim,group GPU_RUN_SKIP_PYTEST=1` reruns only what failed). Then, here:
# `python -m benchmarks record-gpu OUT/gpu_check.json` writes the claims into RESULTS.md's rows.
#
# Exit status: 0 when gpu_check and pytest both passed; 1 otherwise; 2 bad use.
set -u -o pipefail

MODE=gpu
OUT_DIR=${OUT:-}
while [ $# -gt 0 ]; do
    case "$1" in
        --rehearse) MODE=rehearse ;;
        --fetch-wheels) MODE=fetch ;;
        --out) OUT_DIR=${2:-}; shift ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) echo "gpu/run.sh: unknown option $1 (--rehearse, --fetch-wheels, --out DIR)" >&2
           exit 2 ;;
    esac
    shift
done

REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
WHEELS=$REPO/.whl
LIST=$REPO/benchmarks/gpu/wheels.txt

if [ "$MODE" = fetch ]; then
    # pip matches manylinux tags exactly: every tag a wheel of the list may carry is named
    exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$WHEELS" -r "$LIST"
fi

if [ "$MODE" = rehearse ]; then
    DEVICE=cpu
    BUDGET_S=${GPU_RUN_BUDGET_S:-40}
    CHECK_LIMIT_S=${GPU_RUN_CHECK_LIMIT_S:-90}
    PYTEST_LIMIT_S=${GPU_RUN_PYTEST_LIMIT_S:-120}
    # the suite would run this rehearsal again: the gpu_check tests stand in for it
    read -r -a PYTEST_ARGS <<< "${GPU_RUN_PYTEST_ARGS:-tests/unit/test_gpu_check.py -q -x -n 0}"
    [ -n "$OUT_DIR" ] || OUT_DIR=$(mktemp -d /tmp/memtop-gpu-rehearsal.XXXXXX)
else
    DEVICE=${GPU_RUN_DEVICE:-cuda}
    BUDGET_S=${GPU_RUN_BUDGET_S:-330}
    CHECK_LIMIT_S=${GPU_RUN_CHECK_LIMIT_S:-360}
    PYTEST_LIMIT_S=${GPU_RUN_PYTEST_LIMIT_S:-180}
    read -r -a PYTEST_ARGS <<< "${GPU_RUN_PYTEST_ARGS:--x -q -n 8}"
fi
if [ -z "$OUT_DIR" ]; then
    echo "gpu/run.sh: \$OUT is not set (the device tool sets it; give --out DIR otherwise)" >&2
    exit 2
fi
mkdir -p "$OUT_DIR" || exit 2
if [ -n "$(ls -A "$OUT_DIR")" ]; then
    echo "gpu/run.sh: $OUT_DIR is not empty" >&2
    exit 2
fi

WORK=$(mktemp -d /tmp/memtop-gpu-run.XXXXXX)
CONSOLE=$WORK/console.log
STAGES=$WORK/stages.tsv
: > "$STAGES"
export PYTHONUNBUFFERED=1 TORCH_CPP_LOG_LEVEL=ERROR KINETO_LOG_LEVEL=5
cd "$REPO" || exit 2

note() { echo "[gpu_run $(date -u +%H:%M:%S)] $*" | tee -a "$CONSOLE"; }

# stage NAME LIMIT_S LOG CMD...: run CMD under a time limit, its output on the console, in
# console.log and in LOG; one line "NAME<TAB>exit<TAB>seconds" in stages.tsv
stage() {
    local name=$1 limit=$2 log=$3 t0 rc
    shift 3
    note "$name: $* (limit ${limit} s)"
    t0=$(date +%s)
    if command -v timeout > /dev/null; then
        timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$log" | tee -a "$CONSOLE"
    else
        "$@" 2>&1 | tee -a "$log" | tee -a "$CONSOLE"
    fi
    rc=${PIPESTATUS[0]}
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" >> "$STAGES"
    note "$name: exit $rc after $(( $(date +%s) - t0 )) s"
    return "$rc"
}

note "mode $MODE, device $DEVICE, repo $REPO, work $WORK, out $OUT_DIR"
{   # the machine, for the record (quick reads; nvidia-smi under its own limit)
    uname -a; echo "cores: $(nproc)"; free -g 2> /dev/null | head -2
    command -v nvidia-smi > /dev/null && timeout 30 nvidia-smi
    "$PY" --version
} 2>&1 | tee "$WORK/machine.txt" >> "$CONSOLE"

# 1. the wheels (on the GPU machine; a rehearsal keeps this machine's packages)
SITE=/tmp/memtop-site
if [ "$MODE" = rehearse ]; then
    note "wheels: rehearsal, this machine's own packages are used"
elif compgen -G "$WHEELS/*.whl" > /dev/null; then
    stage wheels 120 "$WORK/wheels.txt" "$PY" -m pip install -q --no-index --no-deps \
        --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
else
    note "wheels: no .whl/ folder beside the checkout (bash benchmarks/gpu/run.sh --fetch-wheels"
    note "  here, then carry .whl): the dashboard's and the tests' packages may be missing"
fi

# 2. everything imports (the summary says what does not)
stage imports 60 "$WORK/imports.txt" "$PY" - << 'EOF'
import importlib
missing = []
for name in ("torch", "numpy", "pynvml", "textual", "textual_plotext", "plotext", "rich",
             "pytest", "pytest_asyncio", "xdist", "pytest_timeout", "psutil", "importlinter"):
    try:
        mod = importlib.import_module(name)
        print(f"{name:16} {getattr(mod, '__version__', '')} {getattr(mod, '__file__', '')}")
    except Exception as exc:
        missing.append(name)
        print(f"{name:16} MISSING: {type(exc).__name__}: {exc}")
raise SystemExit(1 if missing else 0)
EOF

# 3. the GPU check (its own budget; the limit kills it only if a claim hangs past the budget)
ONLY=()
[ -n "${GPU_RUN_ONLY:-}" ] && ONLY=(--only "$GPU_RUN_ONLY")
stage gpu_check "$CHECK_LIMIT_S" "$WORK/gpu_check.txt" "$PY" -m benchmarks.gpu.check \
    "$WORK/gpu_check" --device "$DEVICE" --budget-s "$BUDGET_S" "${ONLY[@]}"
CHECK_RC=$?

# 4. the test suite on this machine
if [ -n "${GPU_RUN_SKIP_PYTEST:-}" ]; then
    note "pytest: skipped (GPU_RUN_SKIP_PYTEST)"
    PYTEST_RC=0
else
    stage pytest "$PYTEST_LIMIT_S" "$WORK/pytest.txt" "$PY" -m pytest -p no:cacheprovider \
        "${PYTEST_ARGS[@]}"
    PYTEST_RC=$?
fi

# 5. at most 8 files, 2 folders deep, back from $OUT
note "pack: into $OUT_DIR"
"$PY" benchmarks/gpu/pack.py "$WORK" "$OUT_DIR" --mode "$MODE" 2>&1 | tee -a "$CONSOLE"
note "results in $OUT_DIR: $(ls "$OUT_DIR" | tr '\n' ' ')console.log"
cp "$CONSOLE" "$OUT_DIR/console.log"
rm -rf "$WORK"  # all of it is in the tarball (the big files are listed in summary.md)
[ "$CHECK_RC" = 0 ] && [ "$PYTEST_RC" = 0 ]
