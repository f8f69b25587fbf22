#!/usr/bin/env bash
# All single-GPU captures in one go (Kineto, Nsight Systems, Nsight Compute).
#
#   bash tools/capture/capture_single.sh OUTDIR
#
# Writes OUTDIR/{kineto/<scenario>/,nsys/,ncu/,logs/}. Each capture runs under
# `timeout` and its failure is logged, never fatal, so one broken capture does
# not lose the others. See tools/capture/README.md for the device command.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CAP=$ROOT/tools/capture
O=${1:?usage: capture_single.sh OUTDIR}
mkdir -p "$O"/kineto "$O"/nsys "$O"/ncu "$O"/logs
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
SUM=$O/logs/summary.txt
: >"$SUM"

# ---- tools ---------------------------------------------------------------
NSYS=$(command -v nsys || true)
[ -z "$NSYS" ] && NSYS=$(ls /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys 2>/dev/null | sort | tail -1)
NCU=$(command -v ncu || true)
[ -z "$NCU" ] && NCU=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | sort | tail -1)
# nsys's QdstrmImporter needs libdw.so.1/libelf.so.1, which the image lacks:
# they are carried in .nsyslibs (see README.md). Only nsys gets this path.
NSYS_LD=$ROOT/.nsyslibs:${LD_LIBRARY_PATH:-}
export STALLSCOPE_NSYS_VERSION="$(LD_LIBRARY_PATH=$NSYS_LD $NSYS --version 2>&1 | head -1)"
export STALLSCOPE_NCU_VERSION="$($NCU --version 2>&1 | tail -1)"

echo "=== env $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
echo "nsys: $NSYS -> $STALLSCOPE_NSYS_VERSION"
echo "ncu:  $NCU -> $STALLSCOPE_NCU_VERSION"
$PY - <<'EOF' || true
import torch, platform
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0))
try:
    import cupy; print("cupy", cupy.__version__)
except Exception as e:
    print("cupy import failed", e)
EOF

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

# ---- 1. Kineto traces ----------------------------------------------------
MAXGZ=${MAXGZ:-1600000}
for s in healthy dataloader_stall tiny_kernels pageable_sync cuda_graph occupancy; do
    d=$O/kineto/$s
    cap "kineto_$s" 150 $PY "$CAP/scenarios.py" --scenario "$s" --out "$d"
    f=$d/$s.pt.trace.json.gz
    if [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt "$MAXGZ" ]; then
        echo "    $f is $(stat -c %s "$f") B > $MAXGZ: re-capturing with --active 2"
        rm -f "$d"/*
        cap "kineto_${s}_active2" 150 $PY "$CAP/scenarios.py" --scenario "$s" --out "$d" --active 2
    fi
done

# ---- 2. Nsight Compute ----------------------------------------------------
if [ -n "$NCU" ]; then
    KRE='regex:low_occupancy|well_occupied|nvjet|gemm|xmma|cutlass'
    ccmd="ncu --clock-control none --set full -k '$KRE' -c 6 -o occupancy python3 tools/capture/scenarios.py --scenario occupancy --profiler none --warmup 0 --measure 0 --steps 2"
    cap ncu_occupancy 300 "$NCU" --clock-control none --set full -k "$KRE" -c 6 -f \
        -o "$O/ncu/occupancy" \
        $PY "$CAP/scenarios.py" --scenario occupancy --profiler none --warmup 0 \
        --measure 0 --steps 2 --out "$O/ncu" --trace-format ncu-csv \
        --trace-file occupancy.raw.csv.gz --trace-file occupancy.details.csv.gz \
        --external-command "$ccmd"
    if [ -f "$O/ncu/occupancy.ncu-rep" ]; then
        "$NCU" --import "$O/ncu/occupancy.ncu-rep" --csv --page raw >"$O/ncu/occupancy.raw.csv" 2>>"$O/logs/ncu_export.log"
        "$NCU" --import "$O/ncu/occupancy.ncu-rep" --csv --page details >"$O/ncu/occupancy.details.csv" 2>>"$O/logs/ncu_export.log"
        echo "ncu export rc=$? sizes: $(wc -c "$O"/ncu/*.csv | tr '\n' ' ')"
    fi
else
    echo "no ncu found" | tee -a "$SUM"
fi

# ---- 3. Nsight Systems -> SQLite ------------------------------------------
if [ -n "$NSYS" ]; then
    for s in healthy dataloader_stall tiny_kernels pageable_sync; do
        steps=6
        [ "$s" = tiny_kernels ] && steps=4
        ncmd="nsys profile -t cuda,nvtx,osrt -s none --cpuctxsw=none -o $s python3 tools/capture/scenarios.py --scenario $s --profiler none --nvtx --warmup 2 --steps $steps"
        cap "nsys_$s" 200 env LD_LIBRARY_PATH="$NSYS_LD" "$NSYS" profile -t cuda,nvtx,osrt -s none \
            --cpuctxsw=none --force-overwrite=true -o "$O/nsys/$s" \
            $PY "$CAP/scenarios.py" --scenario "$s" --profiler none --nvtx --warmup 2 \
            --steps $steps --out "$O/nsys" --trace-format nsys-sqlite \
            --trace-file "$s.sqlite.gz" --external-command "$ncmd"
        ls -la "$O/nsys/" | grep -E "^-.* $s\." || true
        if [ -f "$O/nsys/$s.nsys-rep" ]; then
            cap "nsysexport_$s" 200 env LD_LIBRARY_PATH="$NSYS_LD" "$NSYS" export --type sqlite \
                -o "$O/nsys/$s.sqlite" "$O/nsys/$s.nsys-rep"
            [ -f "$O/nsys/$s.sqlite" ] && gzip -9 -f "$O/nsys/$s.sqlite"
        else
            echo "    no $s.nsys-rep (qdstrm import failed?)"
        fi
    done
else
    echo "no nsys found" | tee -a "$SUM"
fi

# ---- 4. read-back summary -------------------------------------------------
echo "=== summary"
cat "$SUM"
$PY "$CAP/check_traces.py" "$O" --json "$O/logs/check.json" 2>&1 | cut -c1-400
du -ah "$O" | sort -h | tail -n 40
