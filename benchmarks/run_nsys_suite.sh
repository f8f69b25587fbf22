#!/usr/bin/env bash
# The whole Nsight Systems ingest benchmark in one go: make the inputs, compare
# stallscope with nsys-ai on every export and on a big one, then time
# stallscope's read workers on the big one.
#
#   bash benchmarks/run_nsys_suite.sh [CORPUS_DIR]
#
# CORPUS_DIR (default ../shared/corpus) is searched for *.sqlite exports; the
# big export is made from its mfu_2gpu_before.sqlite (or $BIG_SRC), COPIES
# times over (default 150: 363 MB). The samples (sample_traces/nsys) are
# decompressed into benchmarks/data/nsys.
# Environment: PY (the Python that runs stallscope, default python3), PEER_PY
# (a Python that imports nsys_ai; default: found by bench_nsys.py), RUNS (runs
# per tool, default 3), SWEEP ("1 8": STALLSCOPE_DECODE_WORKERS values to time
# on the big export; empty skips), BASE (a command that runs another stallscope, e.g.
# the code before a change, timed in the same rounds on the big export).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-python3}
CORPUS=${1:-$HERE/../../shared/corpus}
DATA=$HERE/data/nsys
COPIES=${COPIES:-150}
mkdir -p "$DATA"
for gz in "$HERE"/../sample_traces/nsys/*.sqlite.gz; do
    out=$DATA/$(basename "$gz" .gz)
    [ -f "$out" ] || gunzip -c "$gz" >"$out"
done
BIG_SRC=${BIG_SRC:-$(find "$CORPUS" -name mfu_2gpu_before.sqlite | head -1)}
BIG=$DATA/mfu_2gpu_before_x$COPIES.sqlite
[ -f "$BIG" ] || "$PY" "$HERE/make_big_nsys.py" "$BIG_SRC" "$BIG" --copies "$COPIES"
PEER_ARGS=()
[ -n "${PEER_PY:-}" ] && PEER_ARGS=(--peer-python "$PEER_PY")
BASE_ARGS=()
[ -n "${BASE:-}" ] && BASE_ARGS=(--base "$BASE")
mapfile -t SMALL < <(find "$CORPUS" -name '*.sqlite' | sort; ls "$DATA"/*.sqlite | grep -v '_x[0-9]*\.sqlite$')

echo "### stallscope vs nsys-ai: every export"
"$PY" "$HERE/bench_nsys.py" --runs "${RUNS:-3}" "${PEER_ARGS[@]}" "${SMALL[@]}"
echo "### stallscope vs nsys-ai: the big export"
"$PY" "$HERE/bench_nsys.py" --runs "${RUNS:-3}" --peer-mode both "${PEER_ARGS[@]}" "${BASE_ARGS[@]}" "$BIG"

for workers in ${SWEEP-1 8}; do
    echo "### STALLSCOPE_DECODE_WORKERS=$workers"
    "$PY" "$HERE/bench_nsys.py" --no-peer --runs 2 \
        --stallscope "env STALLSCOPE_DECODE_WORKERS=$workers $PY -m stallscope.cli" "$BIG"
done
