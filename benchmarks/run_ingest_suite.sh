#!/usr/bin/env bash
# The whole Kineto ingest benchmark in one go: make the inputs, compare
# stallscope with HTA on both, then time stallscope's decode workers.
#
#   bash benchmarks/run_ingest_suite.sh [CORPUS_GZ]
#
# CORPUS_GZ defaults to ../shared/corpus/hta/df_index_resolver/df_index_resolver.json.gz.
# Environment: PY (the Python that runs stallscope, default python3),
# HTA_PY (a Python that imports hta; default: found by bench_ingest.py),
# RUNS_SMALL / RUNS_BIG (runs per tool, default 5 / 3),
# SWEEP ("1 2 4 8": STALLSCOPE_DECODE_WORKERS values to time; empty skips),
# PROFILE_WORKERS (N: also print the stage times of the big trace with N workers).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-python3}
SRC=${1:-$HERE/../../shared/corpus/hta/df_index_resolver/df_index_resolver.json.gz}
DATA=$HERE/data
SMALL=$DATA/df_index_resolver.json
BIG=$DATA/df_index_resolver_x9.json
mkdir -p "$DATA"
[ -f "$SMALL" ] || gunzip -c "$SRC" >"$SMALL"
[ -f "$BIG" ] || "$PY" "$HERE/make_big_trace.py" "$SMALL" "$BIG" --copies 9
HTA_ARGS=()
[ -n "${HTA_PY:-}" ] && HTA_ARGS=(--hta-python "$HTA_PY")

echo "### stallscope vs HTA"
"$PY" "$HERE/bench_ingest.py" "$SMALL" --runs "${RUNS_SMALL:-5}" "${HTA_ARGS[@]}"
"$PY" "$HERE/bench_ingest.py" "$BIG" --runs "${RUNS_BIG:-3}" "${HTA_ARGS[@]}"

for workers in ${SWEEP-1 2 4 8}; do
    echo "### STALLSCOPE_DECODE_WORKERS=$workers"
    "$PY" "$HERE/bench_ingest.py" "$SMALL" "$BIG" --runs 2 --no-hta \
        --stallscope "env STALLSCOPE_DECODE_WORKERS=$workers $PY -m stallscope.cli"
done

if [ -n "${PROFILE_WORKERS:-}" ]; then
    echo "### stages, STALLSCOPE_DECODE_WORKERS=$PROFILE_WORKERS"
    STALLSCOPE_DECODE_WORKERS=$PROFILE_WORKERS "$PY" "$HERE/profile_ingest.py" "$BIG"
fi
