#!/usr/bin/env bash
# The realistic one-GPU captures (realistic_1gpu.py) in one go:
#
#   bash tools/capture/capture_realistic.sh OUTDIR
#
# 1. family train  -> OUTDIR/kineto/train_*/         (Kineto trace + truth each)
# 2. family decode -> OUTDIR/kineto/decode_*/
# 3. nsys of train_pageable_d2h with NVTX step ranges -> OUTDIR/nsys/
# Each part runs under `timeout`, capped by a global DEADLINE (seconds, default
# 540), and a failure is logged without stopping the rest. Run from the
# repository root (nsys needs .nsyslibs/ there; see README.md).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
O=${1:?usage: capture_realistic.sh OUTDIR}
mkdir -p "$O"/kineto "$O"/nsys "$O"/logs
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
EXTRA=${EXTRA:-}  # e.g. "--dry-run --rounds 1 --per-round 2" for a CPU check
DEADLINE=${DEADLINE:-540}
SUM=$O/logs/summary.txt
: >"$SUM"

NSYS=$(command -v nsys || true)
[ -z "$NSYS" ] && NSYS=$(ls /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys 2>/dev/null | sort | tail -1)
NSYS_LD=$PWD/.nsyslibs:${LD_LIBRARY_PATH:-}
if [ -n "$NSYS" ]; then
    export STALLSCOPE_NSYS_VERSION="$(LD_LIBRARY_PATH=$NSYS_LD $NSYS --version 2>&1 | head -1)"
fi

echo "=== env $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
echo "nsys: ${NSYS:-none} -> ${STALLSCOPE_NSYS_VERSION:-}"
$PY -c 'import torch, platform; print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0))' || true

cap() {  # cap NAME TIMEOUT_S CMD...
    local name=$1 tmo=$2; shift 2
    local left=$((DEADLINE - SECONDS))
    if [ "$left" -lt 30 ]; then
        echo "=== [$name] SKIPPED: global deadline reached" | tee -a "$SUM"
        return 124
    fi
    [ "$tmo" -gt "$left" ] && tmo=$left
    local t0=$SECONDS
    echo "=== [$name] start $(date -u +%T) (timeout $tmo s)"
    timeout "$tmo" "$@" 2>&1 | grep -v -e '^USDT:' -e 'Profiler clears events' -e '_warn_once(' | tee "$O/logs/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "=== [$name] rc=$rc in $((SECONDS - t0)) s"
    echo "$name rc=$rc s=$((SECONDS - t0))" >>"$SUM"
    return "$rc"
}

cap train 260 $PY "$HERE/realistic_1gpu.py" --family train --out "$O/kineto" $EXTRA
cap decode 200 $PY "$HERE/realistic_1gpu.py" --family decode --out "$O/kineto" $EXTRA

if [ -n "$NSYS" ] && [ $((DEADLINE - SECONDS)) -gt 90 ]; then
    n=train_pageable_d2h
    ncmd="nsys profile -t cuda,nvtx,osrt -s none --cpuctxsw=none -o $n python3 tools/capture/realistic_1gpu.py --nsys $n --warmup 3 --steps 6"
    cap nsys_$n 150 env LD_LIBRARY_PATH="$NSYS_LD" "$NSYS" profile -t cuda,nvtx,osrt -s none \
        --cpuctxsw=none --force-overwrite=true -o "$O/nsys/$n" \
        $PY "$HERE/realistic_1gpu.py" --nsys $n --warmup 3 --steps 6 --out "$O/nsys" \
        --external-command "$ncmd"
    if [ -f "$O/nsys/$n.nsys-rep" ]; then
        cap nsysexport_$n 120 env LD_LIBRARY_PATH="$NSYS_LD" "$NSYS" export --type sqlite \
            -o "$O/nsys/$n.sqlite" "$O/nsys/$n.nsys-rep"
        [ -f "$O/nsys/$n.sqlite" ] && gzip -9 -f "$O/nsys/$n.sqlite"
    else
        echo "    no $n.nsys-rep" | tee -a "$SUM"
    fi
else
    echo "nsys skipped (no nsys or too little time left)" | tee -a "$SUM"
fi

echo "=== summary ($SECONDS s)"
cat "$SUM"
du -ab "$O" | sort -n | tail -n 30
