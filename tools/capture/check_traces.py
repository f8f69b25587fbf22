#!/usr/bin/env python3
"""Sanity-check captured sample traces with the standard library only.

    python3 tools/capture/check_traces.py sample_traces        # human summary
    python3 tools/capture/check_traces.py DIR --json out.json  # also dump facts

Kineto (*.pt.trace.json[.gz]): events, ProfilerStep#, DataLoader ranges,
kernels, memcpys, sync calls, NCCL kernels and their 'Collective name' args,
distributedInfo.  Nsight Systems (*.sqlite[.gz]): kernel/memcpy/runtime/NVTX/
OSRT row counts.  Nsight Compute (*.raw.csv[.gz]): one line per profiled
kernel with launch configuration and occupancy metrics.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gzip
import io
import json
import os
import shutil
import sqlite3
import sys
import tempfile


def _open_text(path):
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def kineto(path):
    with _open_text(path) as f:
        tr = json.load(f)
    evs = tr.get("traceEvents", [])
    f = {"file": path, "bytes": os.path.getsize(path), "events": len(evs)}
    cats = {}
    steps = {}
    dl = []
    kern = 0
    kern_dur = 0.0
    nccl = []
    memcpy = {}
    syncs = {}
    coll_args = set()
    gpu_ts = []
    for e in evs:
        c = e.get("cat")
        n = e.get("name", "")
        cats[c] = cats.get(c, 0) + 1
        if n.startswith("ProfilerStep#") and e.get("ph") == "X":
            # CPU range (user_annotation) and its GPU projection
            # (gpu_user_annotation: first to last kernel of that step)
            key = "gpu" if c == "gpu_user_annotation" else "cpu"
            steps.setdefault(n, {})[key] = round(float(e.get("dur", 0)) / 1e3, 2)
        if "DataLoader" in n and e.get("ph") == "X":
            dl.append(float(e.get("dur", 0)))
        if c == "kernel":
            kern += 1
            kern_dur += float(e.get("dur", 0))
            gpu_ts.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))))
            if "nccl" in n.lower():
                a = e.get("args", {})
                nccl.append((n, float(e.get("dur", 0)), a.get("Collective name")))
                for k in a:
                    if k[:1].isupper() and k not in ("External id",):
                        coll_args.add(k)
        if c == "gpu_memcpy":
            m = memcpy.setdefault(n, [0, 0])
            m[0] += 1
            m[1] += int(e.get("args", {}).get("bytes", 0))
            gpu_ts.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))))
        if c in ("cuda_runtime", "cuda_driver") and "ynchronize" in n:
            syncs[n] = syncs.get(n, 0) + 1
    # union of GPU busy time (kernels + memcpy) over the kernel span
    busy = 0.0
    span = 0.0
    if gpu_ts:
        gpu_ts.sort()
        cs, ce = gpu_ts[0]
        for s, e_ in gpu_ts[1:]:
            if s > ce:
                busy += ce - cs
                cs, ce = s, e_
            else:
                ce = max(ce, e_)
        busy += ce - cs
        span = max(e for _, e in gpu_ts) - gpu_ts[0][0]
    f.update(
        {
            "cats": {k: v for k, v in sorted(cats.items(), key=lambda kv: -kv[1])},
            "profiler_steps_ms": {
                k: v for k, v in sorted(steps.items(), key=lambda kv: int(kv[0].split("#")[1]))
            },
            "dataloader_ranges": len(dl),
            "dataloader_ms_mean": round(sum(dl) / len(dl) / 1e3, 3) if dl else None,
            "kernels": kern,
            "kernel_ms_total": round(kern_dur / 1e3, 3),
            "gpu_busy_ms_union": round(busy / 1e3, 3),
            "gpu_span_ms": round(span / 1e3, 3),
            "gpu_busy_frac_of_span": round(busy / span, 4) if span else None,
            "memcpy": memcpy,
            "sync_calls": syncs,
            "nccl_kernels": len(nccl),
            "nccl_with_collective_name": sum(1 for x in nccl if x[2]),
            "nccl_collectives": sorted({x[2] for x in nccl if x[2]}),
            "nccl_max_ms": round(max((x[1] for x in nccl), default=0) / 1e3, 3),
            "nccl_arg_keys": sorted(coll_args),
            "distributedInfo": tr.get("distributedInfo"),
            "devices": [d.get("name") for d in tr.get("deviceProperties", [])],
        }
    )
    return f


def nsys(path):
    tmp = None
    db = path
    if path.endswith(".gz"):
        tmp = tempfile.mkdtemp()
        db = os.path.join(tmp, "x.sqlite")
        with gzip.open(path, "rb") as fi, open(db, "wb") as fo:
            shutil.copyfileobj(fi, fo)
    f = {"file": path, "bytes": os.path.getsize(path), "sqlite_bytes": os.path.getsize(db)}
    try:
        con = sqlite3.connect(db)
        tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
        f["n_tables"] = len(tables)
        for t in (
            "CUPTI_ACTIVITY_KIND_KERNEL",
            "CUPTI_ACTIVITY_KIND_MEMCPY",
            "CUPTI_ACTIVITY_KIND_RUNTIME",
            "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
            "NVTX_EVENTS",
            "OSRT_API",
            "TARGET_INFO_GPU",
        ):
            if t in tables:
                f[t] = con.execute(f"select count(*) from {t}").fetchone()[0]
            else:
                f[t] = None
        if "NVTX_EVENTS" in tables:
            try:
                rows = con.execute(
                    "select coalesce(n.text, s.value) from NVTX_EVENTS n "
                    "left join StringIds s on n.textId = s.id"
                ).fetchall()
                names = [r[0] for r in rows if r[0]]
                f["nvtx_step_ranges"] = sum(1 for n in names if n.startswith("step "))
                f["nvtx_data_loading"] = sum(1 for n in names if n == "data_loading")
            except sqlite3.Error as e:
                f["nvtx_error"] = str(e)
        if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
            try:
                f["memcpy_by_kind"] = [
                    list(r)
                    for r in con.execute(
                        "select copyKind, srcKind, count(*), sum(bytes) from "
                        "CUPTI_ACTIVITY_KIND_MEMCPY group by copyKind, srcKind"
                    )
                ]
            except sqlite3.Error as e:
                f["memcpy_error"] = str(e)
        if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
            f["kernel_ms_total"] = round(
                con.execute("select sum(end-start) from CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
                / 1e6,
                3,
            )
        if "TARGET_INFO_GPU" in tables:
            with contextlib.suppress(sqlite3.Error):
                f["gpus"] = [r[0] for r in con.execute("select name from TARGET_INFO_GPU")]
        con.close()
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return f


NCU_COLS = [
    "Kernel Name",
    "launch__grid_size",
    "launch__block_size",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_warps",
    "launch__occupancy_limit_blocks",
    "sm__maximum_warps_per_active_cycle_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "gpu__time_duration.sum",
]


def ncu(path):
    with _open_text(path) as fh:
        rows = list(csv.reader(fh))
    f = {"file": path, "bytes": os.path.getsize(path), "rows": len(rows)}
    if not rows:
        return f
    hdr = rows[0]
    f["columns"] = len(hdr)
    idx = {c: hdr.index(c) for c in NCU_COLS if c in hdr}
    f["missing_columns"] = [c for c in NCU_COLS if c not in idx]
    data = [r for r in rows[1:] if r and len(r) == len(hdr)]
    # second row of --page raw is units
    if data and "Kernel Name" in idx and data[0][idx["Kernel Name"]] == "":
        data = data[1:]
    f["kernels"] = []
    for r in data:
        f["kernels"].append({c: r[i][:60] for c, i in idx.items()})
    return f


def ncu_details(path):
    with _open_text(path) as fh:
        rows = list(csv.reader(fh))
    f = {"file": path, "bytes": os.path.getsize(path), "rows": len(rows)}
    if rows:
        hdr = rows[0]
        f["header"] = hdr
        try:
            ik = hdr.index("Kernel Name")
            f["kernels"] = sorted({r[ik] for r in rows[1:] if len(r) > ik})
        except ValueError:
            pass
        try:
            im, iv = hdr.index("Metric Name"), hdr.index("Metric Value")
            f["theoretical_occupancy"] = [
                r[iv] for r in rows[1:] if len(r) > iv and r[im] == "Theoretical Occupancy"
            ]
            f["achieved_occupancy"] = [
                r[iv] for r in rows[1:] if len(r) > iv and r[im] == "Achieved Occupancy"
            ]
        except ValueError:
            pass
    return f


def classify(name):
    if ".pt.trace.json" in name:
        return kineto
    if name.endswith((".sqlite", ".sqlite.gz")):
        return nsys
    if name.endswith((".raw.csv", ".raw.csv.gz")):
        return ncu
    if name.endswith((".details.csv", ".details.csv.gz")):
        return ncu_details
    return None


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--json", help="write all facts here")
    a = ap.parse_args(argv)
    facts = []
    for dp, _, fns in sorted(os.walk(a.root)):
        for fn in sorted(fns):
            fn_ = classify(fn)
            if fn_ is None:
                continue
            p = os.path.join(dp, fn)
            try:
                r = fn_(p)
            except Exception as e:  # noqa: BLE001
                r = {"file": p, "error": repr(e)}
            facts.append(r)
            print("----", p, f"{os.path.getsize(p) / 1e6:.3f} MB")
            for k, v in r.items():
                if k in ("file", "header"):
                    continue
                s = json.dumps(v) if not isinstance(v, str) else v
                print(f"   {k}: {s[:400]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(facts, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
