#!/usr/bin/env bash
# All 2-GPU DDP captures in one go (Kineto per rank, then Nsight Systems).
#
#   bash tools/capture/capture_ddp.sh OUTDIR
#
# Writes OUTDIR/{kineto/ddp_<variant>/rank{0,1}.pt.trace.json.gz + truth,
# nsys/ddp_<variant>.sqlite.gz + truth, logs/}. Failures are logged, not fatal.
# KINETO_VARIANTS / NSYS_VARIANTS pick the variants, KINETO_ACTIVE (default 4)
# the profiled steps per Kineto trace, NSYS_STEPS (default 5) the nsys steps.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CAP=$ROOT/tools/capture
O=${1:?usage: capture_ddp.sh OUTDIR}
mkdir -p "$O"/kineto "$O"/nsys "$O"/logs
export PYTHONUNBUFFERED=1
# NVLink multicast must stay off on these machines (see device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
PY=${PY:-python3}
NPROC=${NPROC:-2}
SUM=$O/logs/summary.txt
: >"$SUM"

NSYS=$(command -v nsys || true)
[ -z "$NSYS" ] && NSYS=$(ls /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys 2>/dev/null | sort | tail -1)
NSYS_LD=$ROOT/.nsyslibs:${LD_LIBRARY_PATH:-}
export STALLSCOPE_NSYS_VERSION="$(LD_LIBRARY_PATH=$NSYS_LD $NSYS --version 2>&1 | head -1)"

echo "=== env $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv || true
nvidia-smi topo -m || true
echo "nsys: $NSYS -> $STALLSCOPE_NSYS_VERSION"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())" || true

# Global budget: whatever is left of it caps each capture's timeout, so the
# whole script ends (and the caller can pack results) inside the device limit.
DEADLINE=${DEADLINE:-480}
cap() {  # cap NAME TIMEOUT_S CMD...
    local name=$1 tmo=$2; shift 2
    local left=$((DEADLINE - SECONDS))
    if [ "$left" -lt 20 ]; then
        echo "=== [$name] SKIPPED: global deadline reached" | tee -a "$SUM"
        return 124
    fi
    [ "$tmo" -gt "$left" ] && tmo=$left
    local t0=$SECONDS
    echo "=== [$name] start $(date -u +%T)"
    timeout "$tmo" "$@" >"$O/logs/$name.log" 2>&1
    local rc=$?
    echo "=== [$name] rc=$rc in $((SECONDS - t0)) s"
    tail -n 6 "$O/logs/$name.log" | cut -c1-300
    echo "$name rc=$rc s=$((SECONDS - t0))" >>"$SUM"
    return $rc
}

RUN="$PY -m torch.distributed.run --standalone --nproc_per_node $NPROC"

# ---- 1. Kineto, one trace per rank ------------------------------------------
for v in ${KINETO_VARIANTS-ddp_overlap ddp_no_overlap ddp_straggler}; do
    cap "kineto_$v" 180 $RUN "$CAP/ddp_scenarios.py" --variant "$v" --out "$O/kineto/$v" \
        --active "${KINETO_ACTIVE:-4}"
done

# ---- 2. Nsight Systems of the whole torchrun launch (all ranks, one report) --
# No osrt here by default: with -t cuda,nvtx,osrt the NCCL/torchrun threads'
# polling produced 380k-545k OSRT_API rows (17-23 MB SQLite per report).
NSYS_TRACE=${NSYS_TRACE:-cuda,nvtx}
if [ -n "$NSYS" ]; then
    for v in ${NSYS_VARIANTS:-ddp_overlap ddp_straggler}; do
        steps=${NSYS_STEPS:-5}
        ncmd="nsys profile -t $NSYS_TRACE -s none --cpuctxsw=none --trace-fork-before-exec=true -o $v python3 -m torch.distributed.run --standalone --nproc_per_node $NPROC tools/capture/ddp_scenarios.py --variant $v --profiler none --nvtx --warmup 2 --steps $steps"
        cap "nsys_$v" 240 env LD_LIBRARY_PATH="$NSYS_LD" "$NSYS" profile -t "$NSYS_TRACE" -s none \
            --cpuctxsw=none --trace-fork-before-exec=true --force-overwrite=true \
            -o "$O/nsys/$v" $RUN "$CAP/ddp_scenarios.py" --variant "$v" --profiler none \
            --nvtx --warmup 2 --steps "$steps" --out "$O/nsys" --trace-format nsys-sqlite \
            --external-command "$ncmd"
        if [ -f "$O/nsys/$v.nsys-rep" ]; then
            cap "nsysexport_$v" 200 env LD_LIBRARY_PATH="$NSYS_LD" "$NSYS" export --type sqlite \
                -o "$O/nsys/$v.sqlite" "$O/nsys/$v.nsys-rep"
            [ -f "$O/nsys/$v.sqlite" ] && gzip -9 -f "$O/nsys/$v.sqlite"
        else
            echo "    no $v.nsys-rep"
        fi
    done
fi

echo "=== summary"
cat "$SUM"
$PY "$CAP/check_traces.py" "$O" --json "$O/logs/check.json" 2>&1 | cut -c1-400
du -ah "$O" | sort -h | tail -n 30
