#!/usr/bin/env bash
# Realistic two-GPU captures (GPT-like model, bf16): Kineto on both ranks for
# every scenario, then one Nsight Systems report (both ranks) per scenario.
#
#   bash tools/capture/capture_2gpu.sh OUTDIR [PACKDIR]
#
# Writes OUTDIR/{kineto/<scenario>/rank{0,1}.pt.trace.json.gz + <scenario>.truth.json,
# nsys/<scenario>.sqlite.gz + <scenario>.nsys.truth.json, logs/}. With PACKDIR,
# everything is packed into PACKDIR/cap2gpu-<i>.tar.gz of at most 15 MiB each
# (the device tool brings back at most 8 files of 16 MiB). Failures are logged,
# not fatal. Trimming and busy/idle come afterwards, on any machine:
#   python3 tools/capture/trim_and_truth.py process OUTDIR
#
# Environment:
#   KINETO_SCENARIOS  default: all six, baseline and fsdp_prefetch first (their
#                     truth is the cross-run reference of the faults)
#   NSYS_SCENARIOS    default: the four faults, then baseline, fsdp_prefetch
#   DEADLINE          global budget in s (default 540): a capture that would
#                     start with < 25 s left is skipped, each timeout is capped
#                     by what is left, and PACK_RESERVE s (20) stay for packing
#   DEVICE_ARGS       extra script flags, e.g. "--device cpu --tiny" (dry run;
#                     nsys is skipped when --device cpu is given)
#   PY, NPROC         python3, 2
#
# Estimated time on 2 x H200 with the default model (see realistic_2gpu.py):
# Kineto ~30-40 s per scenario (~3.5 min for six), nsys ~40-55 s per scenario
# including the SQLite export (~4.5 min for six): ~8 min, inside DEADLINE=540;
# whatever does not fit is skipped and named in logs/summary.txt.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CAP=$ROOT/tools/capture
O=${1:?usage: capture_2gpu.sh OUTDIR [PACKDIR]}
PACKDIR=${2:-}
mkdir -p "$O"/kineto "$O"/nsys "$O"/logs
export PYTHONUNBUFFERED=1
# NVLink multicast must stay off on these machines (see the device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
PY=${PY:-python3}
NPROC=${NPROC:-2}
DEVICE_ARGS=${DEVICE_ARGS:-}
DEADLINE=${DEADLINE:-540}
PACK_RESERVE=${PACK_RESERVE:-20}
KINETO_SCENARIOS=${KINETO_SCENARIOS-baseline fsdp_prefetch loader_stall compute_straggler no_overlap fsdp_no_prefetch}
NSYS_SCENARIOS=${NSYS_SCENARIOS-loader_stall compute_straggler no_overlap fsdp_no_prefetch baseline fsdp_prefetch}
SUM=$O/logs/summary.txt
: >"$SUM"

NSYS=""
case " $DEVICE_ARGS " in
*" --device cpu "*) echo "dry run on the CPU: no nsys" ;;
*)
    NSYS=$(command -v nsys || true)
    [ -z "$NSYS" ] && NSYS=$(ls /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys 2>/dev/null | sort | tail -1)
    ;;
esac
NSYS_LD=$ROOT/.nsyslibs:${LD_LIBRARY_PATH:-}
if [ -n "$NSYS" ]; then
    export STALLSCOPE_NSYS_VERSION="$(LD_LIBRARY_PATH=$NSYS_LD $NSYS --version 2>&1 | head -1)"
fi

echo "=== env $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv 2>/dev/null || true
nvidia-smi topo -m 2>/dev/null || true
echo "nsys: ${NSYS:-none} -> ${STALLSCOPE_NSYS_VERSION:-}"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())" || true

cap() { # cap NAME TIMEOUT_S CMD...
    local name=$1 tmo=$2
    shift 2
    local left=$((DEADLINE - PACK_RESERVE - SECONDS))
    if [ "$left" -lt 25 ]; then
        echo "=== [$name] SKIPPED: global deadline reached" | tee -a "$SUM"
        return 124
    fi
    [ "$tmo" -gt "$left" ] && tmo=$left
    local t0=$SECONDS
    echo "=== [$name] start $(date -u +%T) (timeout $tmo s)"
    timeout "$tmo" "$@" >"$O/logs/$name.log" 2>&1
    local rc=$?
    echo "=== [$name] rc=$rc in $((SECONDS - t0)) s"
    tail -n 4 "$O/logs/$name.log" | cut -c1-300
    echo "$name rc=$rc s=$((SECONDS - t0))" >>"$SUM"
    return $rc
}

# The truth file of the separate run a fault is compared with (cross-run check).
reference_truth() {
    case $1 in
    loader_stall | compute_straggler | no_overlap) echo "$O/kineto/baseline/baseline.truth.json" ;;
    fsdp_no_prefetch) echo "$O/kineto/fsdp_prefetch/fsdp_prefetch.truth.json" ;;
    *) echo "" ;;
    esac
}

RUN="$PY -m torch.distributed.run --standalone --nproc-per-node $NPROC"
SCRIPT=$CAP/realistic_2gpu.py

# ---- 1. Kineto, one trace per rank, plus the unprofiled paired measurement ----
for s in $KINETO_SCENARIOS; do
    ref=$(reference_truth "$s")
    cap "kineto_$s" 150 $RUN "$SCRIPT" --scenario "$s" --out "$O/kineto/$s" $DEVICE_ARGS \
        ${ref:+--baseline-truth "$ref"}
done

# ---- 2. Nsight Systems of the whole torchrun launch (both ranks, one report) ---
# -t cuda,nvtx without osrt, as in capture_ddp.sh (osrt made 17-23 MB SQLite).
NSYS_TRACE=${NSYS_TRACE:-cuda,nvtx}
NSYS_STEPS=${NSYS_STEPS:-5}
if [ -n "$NSYS" ]; then
    for s in $NSYS_SCENARIOS; do
        args="--scenario $s --profiler none --nvtx --warmup 2 --measure 0 --steps $NSYS_STEPS"
        ncmd="nsys profile -t $NSYS_TRACE -s none --cpuctxsw=none --trace-fork-before-exec=true -o $s python3 -m torch.distributed.run --standalone --nproc-per-node $NPROC tools/capture/realistic_2gpu.py $args $DEVICE_ARGS"
        cap "nsys_$s" 180 env LD_LIBRARY_PATH="$NSYS_LD" "$NSYS" profile -t "$NSYS_TRACE" -s none \
            --cpuctxsw=none --trace-fork-before-exec=true --force-overwrite=true \
            -o "$O/nsys/$s" $RUN "$SCRIPT" $args $DEVICE_ARGS --out "$O/nsys" \
            --trace-format nsys-sqlite --external-command "$ncmd"
        if [ -f "$O/nsys/$s.nsys-rep" ]; then
            cap "nsysexport_$s" 120 env LD_LIBRARY_PATH="$NSYS_LD" "$NSYS" export --type sqlite \
                --force-overwrite=true -o "$O/nsys/$s.sqlite" "$O/nsys/$s.nsys-rep"
            [ -f "$O/nsys/$s.sqlite" ] && gzip -9 -f "$O/nsys/$s.sqlite"
        else
            echo "    no $s.nsys-rep"
        fi
    done
fi

echo "=== summary ($SECONDS s)"
cat "$SUM"
du -ah "$O" | sort -h | tail -n 40
if [ -n "$PACKDIR" ]; then
    $PY "$CAP/trim_and_truth.py" pack "$O" "$PACKDIR" --name cap2gpu --max-mb 15 || echo "pack failed"
fi
echo "=== done in $SECONDS s"
