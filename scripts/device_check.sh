#!/usr/bin/env bash
# device_check.sh: every GPU-only measurement of the series in one run, for a bare machine with one NVIDIA GPU, no
# internet and no .venv (it uses the machine's python3 and whatever torch it has, and records the versions).
#
#   bash scripts/device_check.sh                          # results into $OUT (or: bash scripts/device_check.sh OUT_DIR)
#   bash scripts/device_check.sh OUT_DIR --cpu-dry-run    # here: every section on the CPU, tiny sizes, gloo (CI)
#
# MNIST must be in data/MNIST/raw (copy data/ along; `python -m mnist_helpers.data --check` verifies it).
# Sections, most valuable first, each in its own process under its own time limit; the limits are also cut to
# what is left of DEVICE_CHECK_BUDGET_S (default 450 s), so the whole run, start-up included, ends within 8 minutes:
#   machine            versions (torch, CUDA, cuDNN, NCCL, torchvision), nvidia-smi, matmul peaks (IEEE fp32, TF32, bf16, fp16)
#   time_to_accuracy   scripts/bench_speedrun.py, the fixed-schedule protocol: the article's recipe (2 seeds, its
#                      5 epochs) vs the ladder's fastest GPU step `graphs` and its 99.5% twin `fast995` (25 seeds
#                      each, interleaved, the test set scored once at the end; targets: the mean final accuracy at
#                      99.0% / 99.5%, at >= 80x / >= 10x the article's training time, CUDA events)
#   speedrun_chain     notebook 10's ladder on the GPU, one seed per step
#   amp                IEEE fp32 vs TF32 vs bf16 vs fp16 + GradScaler (speed, peak memory, accuracy); batch 128/512/2048
#   loader             DataLoader to the GPU, pin_memory off/on x 0/2/4/8 workers
#   allocator          the caching allocator (fragmentation, expandable_segments, empty_cache cost, allocated vs reserved)
#   nccl               NCCL all_reduce at world size 1 per size: launch overhead at world size 1, not communication
#                      (one GPU has no peer; bandwidth and ring/tree need 2 or more GPUs)
#   notebooks          last, with what is left of the budget: notebooks 00-11 in the quick profile on the GPU under
#                      nbmake, in order, each on a copy in its own pytest under its own limit (DEVICE_CHECK_NOTEBOOK_LIMIT,
#                      default 120 s, cut to what is left); OUT/notebooks/ gets notebooks.json (each notebook's status
#                      and seconds, rewritten after each) and executed_notebooks.tar.gz (the executed copies and logs).
#                      Needs nbmake and ipykernel importable by PYTHON: if they are not, wheels in DEVICE_CHECK_WHEELS
#                      (default .whl/; carry it) are installed into the scratch folder, else the section is skipped
#                      and says why. Not part of --cpu-dry-run unless named in DEVICE_CHECK_SECTIONS;
#                      DEVICE_CHECK_NOTEBOOKS="path ..." runs those notebooks instead of notebooks/[0-9]*.ipynb.
# Every section rewrites its JSON after each row or run and every run is guarded, so a failure or a time limit
# keeps what finished. All files go to a scratch folder, packed after every section into OUT/device_check.tar.gz,
# with manifest.json (each section's status: ok, errors, timeout, failed, skipped), time_to_accuracy.json,
# speedrun_chain.json and machine.json beside it: 5 files in OUT (7 with the 2 of OUT/notebooks/). To keep them:
# python scripts/device_check.py --keep OUT_DIR (files them, and the GPU claims judged from
# them, under results/reference/<machine label>/), then make claims.
# Options by environment: DEVICE_CHECK_SECTIONS="machine nccl" (a subset), DEVICE_CHECK_LIMIT_<section>=S,
# DEVICE_CHECK_BUDGET_S, PYTHON (default: .venv/bin/python if present, else python3).
set -u -o pipefail

usage() { echo "usage: bash scripts/device_check.sh [OUT_DIR] [--cpu-dry-run]   (OUT_DIR defaults to \$OUT)" >&2; exit 2; }
DRY=0
OUT_ARG=
for arg in "$@"; do
    case "$arg" in
        --cpu-dry-run) DRY=1 ;;
        -h|--help) usage ;;
        -*) echo "device_check: unknown option $arg" >&2; usage ;;
        *) [ -z "$OUT_ARG" ] || usage; OUT_ARG=$arg ;;
    esac
done
OUT_DIR=${OUT_ARG:-${OUT:-}}
[ -n "$OUT_DIR" ] || { echo "device_check: no output folder: give one (bash scripts/device_check.sh OUT_DIR) or set OUT" >&2; exit 2; }

START=$(date +%s)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x "$REPO/.venv/bin/python" ]; then PY=$REPO/.venv/bin/python; else PY=$(command -v python3 || true); fi
fi
[ -n "$PY" ] || { echo "device_check: no python3 on PATH (set PYTHON=...)" >&2; exit 1; }
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/device_check.XXXXXX")
RES=$WORK/device_check
mkdir -p "$RES/logs"
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" MNIST_OFFLINE=1 PYTHONUNBUFFERED=1
export DEVICE_CHECK_DRY=$DRY DEVICE_CHECK_RES=$RES
BUDGET=${DEVICE_CHECK_BUDGET_S:-450}
SLOW=1
if [ "$DRY" = 1 ]; then BUDGET=${DEVICE_CHECK_BUDGET_S:-1200}; SLOW=3; fi  # a busy CPU tests code paths, not the budget
DRIVER=("$REPO/scripts/device_check.py")  # the sections (a script: it runs the lessons' code)
SECTIONS=${DEVICE_CHECK_SECTIONS:-machine time_to_accuracy speedrun_chain amp loader allocator nccl notebooks}
# a CPU dry run does not run the notebooks (12 of them on a CPU take far longer than the rest) unless named
[ "$DRY" = 0 ] || [ -n "${DEVICE_CHECK_SECTIONS:-}" ] || SECTIONS=${SECTIONS% notebooks}

echo "device_check: python $PY; results packed into $OUT_DIR; budget ${BUDGET}s"
"$PY" -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' \
    || { echo "device_check: $PY cannot import torch" >&2; exit 1; }
if [ "$DRY" = 0 ] && ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "device_check: no usable NVIDIA GPU here (torch.cuda.is_available() is False); to test this script on" \
         "a CPU: bash scripts/device_check.sh $OUT_DIR --cpu-dry-run" >&2
    exit 1
fi
"$PY" -m mnist_helpers.data --check > "$RES/logs/data_check.log" 2>&1 || { cat "$RES/logs/data_check.log" >&2;
    echo "device_check: MNIST missing or corrupt under data/ (no internet here): copy data/MNIST/raw along" \
         "(the run tool: carry [\"data\"])" >&2; exit 1; }

# section NAME LIMIT_S: one section in its own process; record rc, seconds and limit; pack; never stop.
section() {
    local name=$1 limit=$2 t0 rc left var
    case " $SECTIONS " in *" $name "*) ;; *) return ;; esac
    var=DEVICE_CHECK_LIMIT_$name
    limit=${!var:-$(( limit * SLOW ))}
    t0=$(date +%s)
    left=$(( START + BUDGET - t0 - 15 ))  # 15 s kept for the kill grace and the last packing
    if [ "$left" -lt 10 ]; then
        echo "=== $name skipped: no time left in the ${BUDGET}s budget"
        printf '%s\t%s\t%s\t%s\n' "$name" -1 0 0 >> "$RES/manifest.tsv"
    else
        [ "$limit" -le "$left" ] || limit=$left
        echo "=== $name (limit ${limit}s, elapsed $(( t0 - START ))s)"
        timeout --kill-after=5 "$limit" "$PY" "${DRIVER[@]}" --section "$name" 2>&1 | tee "$RES/logs/$name.log"
        rc=${PIPESTATUS[0]}
        printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$limit" >> "$RES/manifest.tsv"
        [ "$rc" = 0 ] || echo "--- $name failed or timed out (rc $rc); continuing"
    fi
    "$PY" "${DRIVER[@]}" --finalize "$OUT_DIR" --total-seconds "$(( $(date +%s) - START ))" \
        || echo "--- packing after $name failed"
}

# notebooks_section LIMIT_S: each notebook of 00-11 (or DEVICE_CHECK_NOTEBOOKS) on a copy in RES/notebooks/, in its
# own `pytest --nbmake --overwrite` under its own limit, in the quick profile; a row per notebook in notebooks.tsv and
# the report (RES/notebooks.json, OUT/notebooks/) rewritten after each, so a time limit keeps what finished.
notebooks_section() {
    local limit=$1 t0 left nb base t rc started status_rc=0 wheels
    case " $SECTIONS " in *" notebooks "*) ;; *) return ;; esac
    limit=${DEVICE_CHECK_LIMIT_notebooks:-$(( limit * SLOW ))}
    local per=${DEVICE_CHECK_NOTEBOOK_LIMIT:-$(( 120 * SLOW ))}
    local dir=$RES/notebooks logs=$RES/logs/notebooks
    mkdir -p "$dir" "$logs"
    : > "$RES/notebooks.todo"
    local -a books=("$REPO"/notebooks/[0-9]*.ipynb)
    # shellcheck disable=SC2206  # a list of paths, split on spaces (globs allowed)
    [ -z "${DEVICE_CHECK_NOTEBOOKS:-}" ] || books=($DEVICE_CHECK_NOTEBOOKS)
    for nb in "${books[@]}"; do [ -f "$nb" ] && basename "$nb" >> "$RES/notebooks.todo"; done
    t0=$(date +%s)
    left=$(( START + BUDGET - t0 - 15 ))
    [ "$limit" -le "$left" ] || limit=$left
    if ! "$PY" -c 'import nbmake, ipykernel' 2>/dev/null; then
        wheels=${DEVICE_CHECK_WHEELS:-$REPO/.whl}
        if compgen -G "$wheels/*.whl" >/dev/null; then
            echo "=== notebooks: installing the wheels in $wheels (nbmake, ipykernel, their needs) into $WORK/site"
            if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" \
                    "$wheels"/*.whl > "$logs/pip.log" 2>&1; then
                export PYTHONPATH="$PYTHONPATH:$WORK/site"
            else
                echo "--- pip could not install them (log: logs/pip.log in OUT/notebooks/executed_notebooks.tar.gz)"
            fi
        fi
    fi
    if ! "$PY" -c 'import nbmake, ipykernel' 2>/dev/null; then
        echo "nbmake or ipykernel does not import with $PY: put their wheels (and their needs) in" \
             "${DEVICE_CHECK_WHEELS:-.whl/} and carry that folder" > "$RES/notebooks.skipped"
        echo "=== notebooks skipped: $(cat "$RES/notebooks.skipped")"
        status_rc=-1
    elif [ "$limit" -lt 10 ]; then
        echo "no time left in the ${BUDGET}s budget" > "$RES/notebooks.skipped"
        echo "=== notebooks skipped: no time left in the ${BUDGET}s budget"
        status_rc=-1
    else
        echo "=== notebooks (limit ${limit}s, at most ${per}s each, elapsed $(( t0 - START ))s)"
        for nb in "${books[@]}"; do
            [ -f "$nb" ] || continue
            base=$(basename "$nb")
            left=$(( t0 + limit - $(date +%s) ))
            if [ "$left" -lt 10 ]; then
                printf '%s\t%s\t%s\t%s\n' "$base" -1 0 0 >> "$RES/notebooks.tsv"
                status_rc=124
            else
                t=$(( per < left ? per : left ))
                cp "$nb" "$dir/$base"  # a copy: --overwrite writes the outputs into it, not into the checkout
                started=$(date +%s)
                ( cd "$dir" && MNIST_PROFILE=quick MNIST_RESULTS_DIR="$WORK/results" \
                    timeout --kill-after=5 "$t" "$PY" -m pytest --nbmake --nbmake-timeout="$t" --overwrite \
                    -p no:cacheprovider -q "$base" ) > "$logs/${base%.ipynb}.log" 2>&1
                rc=$?
                printf '%s\t%s\t%s\t%s\n' "$base" "$rc" "$(( $(date +%s) - started ))" "$t" >> "$RES/notebooks.tsv"
                echo "  $base: rc $rc in $(( $(date +%s) - started )) s (limit ${t}s)"
            fi
            "$PY" "${DRIVER[@]}" --notebooks-report "$OUT_DIR" || echo "--- the notebooks report failed"
        done
    fi
    "$PY" "${DRIVER[@]}" --notebooks-report "$OUT_DIR" > /dev/null || echo "--- the notebooks report failed"
    printf '%s\t%s\t%s\t%s\n' notebooks "$status_rc" "$(( $(date +%s) - t0 ))" "$limit" >> "$RES/manifest.tsv"
    "$PY" "${DRIVER[@]}" --finalize "$OUT_DIR" --total-seconds "$(( $(date +%s) - START ))" \
        || echo "--- packing after notebooks failed"
}

# Limits (s): 25 + 240 + 75 + 40 + 35 + 20 + 15 = 450 s, cut to the budget as it runs out; the notebooks get what
# the others leave (on the H200 of 2026-12-04 the 7 sections took 237 s: about 200 s for the notebooks).
section machine 25
section time_to_accuracy 240
section speedrun_chain 75
section amp 40
section loader 35
section allocator 20
section nccl 15
notebooks_section 450
echo "device_check: done in $(( $(date +%s) - START )) s; $(find "$OUT_DIR" -type f | wc -l) files in $OUT_DIR"
