#!/usr/bin/env python3
"""Per-step facts read back from the committed sample traces (stdlib only).

    python3 tools/capture/review_traces.py sample_traces            # print
    python3 tools/capture/review_traces.py sample_traces --write     # merge

For every Kineto trace the step windows are the CPU ``ProfilerStep#N`` ranges;
for every Nsight Systems SQLite export they are the NVTX ``step N`` ranges of
each process.  Within each window it measures GPU busy time (union of kernels,
memcpys and memsets of that process), GPU idle, kernels, memcpy bytes by kind,
synchronize calls and, for NCCL, how much collective time overlapped other
kernels.  --write stores the result under "trace_review" in the truth JSON
next to the trace.  These numbers are a plain reading of the trace made while
capturing; they are NOT independent of it (the planted amounts and the
measured-in-run facts in the truth file are).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile

NOTE = (
    "Computed by tools/capture/review_traces.py from this trace. Windows are "
    "the CPU ProfilerStep#N ranges (Kineto) or NVTX 'step N' ranges (nsys). "
    "gpu_busy = union of kernel+memcpy+memset intervals clipped to the window. "
    "A reading of the trace, not an independent ground truth."
)


def _load_json(path):
    with open(path) as fh:
        return json.load(fh)


def union(iv):
    iv = sorted(iv)
    tot = 0.0
    if not iv:
        return 0.0
    cs, ce = iv[0]
    for s, e in iv[1:]:
        if s > ce:
            tot += ce - cs
            cs, ce = s, e
        else:
            ce = max(ce, e)
    return tot + ce - cs


def clip(iv, lo, hi):
    return [(max(s, lo), min(e, hi)) for s, e in iv if e > lo and s < hi]


def overlap_with(a_iv, b_iv):
    """Total length of union(a) that is covered by union(b)."""
    return union(a_iv) + union(b_iv) - union(a_iv + b_iv)


def med(vals):
    vals = [v for v in vals if v is not None]
    return round(statistics.median(vals), 3) if vals else None


def is_nccl(name):
    return "nccl" in name.lower()


def review_steps(windows, kernels, copies, syncs, launches, loaders):
    """windows: [(name, t0, t1)] in us; kernels: [(t0, t1, name)];
    copies: [(t0, t1, kind, bytes)] (kind None for memset)."""
    steps = []
    for name, lo, hi in windows:
        kin = [(s, e, n) for s, e, n in kernels if e > lo and s < hi]
        gpu = [(s, e) for s, e, _ in kin] + [(s, e) for s, e, _, _ in copies]
        busy = union(clip(gpu, lo, hi))
        kbusy = union(clip([(s, e) for s, e, _ in kin], lo, hi))
        nccl = [(s, e) for s, e, n in kin if is_nccl(n)]
        other = [(s, e) for s, e, n in kin if not is_nccl(n)]
        mc = {}
        for s, e, kind, b in copies:
            if kind and lo <= s < hi:
                m = mc.setdefault(kind, {"count": 0, "bytes": 0, "ms": 0.0})
                m["count"] += 1
                m["bytes"] += b
                m["ms"] = round(m["ms"] + (e - s) / 1e3, 3)
        sc = {}
        for s, n in syncs:
            if lo <= s < hi:
                sc[n] = sc.get(n, 0) + 1
        st = {
            "step": name,
            "window_ms": round((hi - lo) / 1e3, 3),
            "gpu_busy_ms": round(busy / 1e3, 3),
            "gpu_idle_ms": round((hi - lo - busy) / 1e3, 3),
            "gpu_busy_frac": round(busy / (hi - lo), 4) if hi > lo else None,
            "kernel_busy_ms": round(kbusy / 1e3, 3),
            "kernel_busy_frac": round(kbusy / (hi - lo), 4) if hi > lo else None,
            "kernels_started": sum(1 for s, _, _ in kin if lo <= s < hi),
            "kernel_ms_median": med([(e - s) / 1e3 for s, e, _ in kin if lo <= s < hi]),
            "memcpy": mc,
            "sync_calls": sc,
            "launch_calls": sum(1 for s, _ in launches if lo <= s < hi),
            "launch_call_us_median": med([d for s, d in launches if lo <= s < hi]),
            "dataloader_ms": [round(d / 1e3, 3) for s, d in loaders if lo <= s < hi] or None,
        }
        if nccl:
            ov = overlap_with(nccl, other)
            st.update(
                {
                    "nccl_kernels": len(nccl),
                    "nccl_union_ms": round(union(nccl) / 1e3, 3),
                    "nccl_overlapped_ms": round(ov / 1e3, 3),
                    "nccl_exposed_ms": round((union(nccl) - ov) / 1e3, 3),
                    "nccl_overlap_frac": round(ov / union(nccl), 4) if union(nccl) else None,
                    "nccl_max_kernel_ms": round(max(e - s for s, e in nccl) / 1e3, 3),
                }
            )
        steps.append(st)
    keys = [
        "window_ms",
        "gpu_busy_ms",
        "gpu_idle_ms",
        "gpu_busy_frac",
        "kernel_busy_ms",
        "kernel_busy_frac",
        "kernels_started",
        "kernel_ms_median",
        "launch_calls",
        "launch_call_us_median",
        "nccl_kernels",
        "nccl_union_ms",
        "nccl_overlapped_ms",
        "nccl_exposed_ms",
        "nccl_overlap_frac",
        "nccl_max_kernel_ms",
    ]
    medians = {k: med([s.get(k) for s in steps]) for k in keys if any(k in s for s in steps)}
    return {"note": NOTE, "median_over_steps": medians, "per_step": steps}


def kineto_review(path):
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        tr = json.load(f)
    return kineto_review_trace(tr)


def kineto_review_trace(tr):
    """Per-step review of a loaded Kineto trace (dict with traceEvents)."""
    ev = tr["traceEvents"]
    windows, kernels, copies, syncs, launches, loaders = [], [], [], [], [], []
    for e in ev:
        c, n = e.get("cat"), e.get("name", "")
        if e.get("ph") != "X":
            continue
        ts, dur = float(e["ts"]), float(e.get("dur", 0))
        if c == "user_annotation" and n.startswith("ProfilerStep#"):
            windows.append((n, ts, ts + dur))
        elif c == "kernel":
            kernels.append((ts, ts + dur, n))
        elif c == "gpu_memcpy":
            copies.append((ts, ts + dur, n, int(e.get("args", {}).get("bytes", 0))))
        elif c == "gpu_memset":
            copies.append((ts, ts + dur, None, 0))
        elif c in ("cuda_runtime", "cuda_driver"):
            if "ynchronize" in n:
                syncs.append((ts, n))
            if "Launch" in n:
                launches.append((ts, dur))
        elif "DataLoader" in n:
            loaders.append((ts, dur))
    windows.sort(key=lambda w: w[1])
    r = review_steps(windows, kernels, copies, syncs, launches, loaders)
    di = tr.get("distributedInfo")
    if di:
        r["rank"] = di.get("rank")
    return r


COPY_KIND = {1: "HtoD", 2: "DtoH", 8: "DtoD", 10: "PtoP"}
MEM_KIND = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed"}


def nsys_review(path):
    tmp = tempfile.mkdtemp()
    try:
        db = os.path.join(tmp, "x.sqlite")
        with gzip.open(path, "rb") as fi, open(db, "wb") as fo:
            shutil.copyfileobj(fi, fo)
        con = sqlite3.connect(db)
        tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}

        def rows(sql, table):
            return con.execute(sql).fetchall() if table in tables else []

        strings = dict(con.execute("select id, value from StringIds"))
        pid = lambda g: (g >> 24) & 0xFFFFFF  # noqa: E731
        wins = {}
        for s, e, text, tid, gtid in con.execute(
            "select start, end, text, textId, globalTid from NVTX_EVENTS where end is not null"
        ):
            t = text if text is not None else strings.get(tid)
            if t and t.startswith("step "):
                wins.setdefault(pid(gtid), []).append((t, s / 1e3, e / 1e3))
        out = {
            "note": NOTE + " Times from nsys are in ns in the file; here in us/ms.",
            "processes": [],
        }
        for p, w in sorted(wins.items()):
            krows = [
                r
                for r in rows(
                    "select start, end, shortName, globalPid, deviceId from "
                    "CUPTI_ACTIVITY_KIND_KERNEL",
                    "CUPTI_ACTIVITY_KIND_KERNEL",
                )
                if pid(r[3]) == p
            ]
            kernels = [(s / 1e3, e / 1e3, strings.get(n, "")) for s, e, n, _, _ in krows]
            devices = sorted({r[4] for r in krows})
            copies = []
            for s, e, b, ck, sk, dk, g in rows(
                "select start, end, bytes, copyKind, srcKind, dstKind, globalPid "
                "from CUPTI_ACTIVITY_KIND_MEMCPY",
                "CUPTI_ACTIVITY_KIND_MEMCPY",
            ):
                if pid(g) == p:
                    kind = (
                        f"Memcpy {COPY_KIND.get(ck, ck)} "
                        f"({MEM_KIND.get(sk, sk)} -> {MEM_KIND.get(dk, dk)})"
                    )
                    copies.append((s / 1e3, e / 1e3, kind, b))
            for s, e, g in rows(
                "select start, end, globalPid from CUPTI_ACTIVITY_KIND_MEMSET",
                "CUPTI_ACTIVITY_KIND_MEMSET",
            ):
                if pid(g) == p:
                    copies.append((s / 1e3, e / 1e3, None, 0))
            syncs, launches = [], []
            for s, e, n, g in rows(
                "select start, end, nameId, globalTid from CUPTI_ACTIVITY_KIND_RUNTIME",
                "CUPTI_ACTIVITY_KIND_RUNTIME",
            ):
                if pid(g) != p:
                    continue
                nm = strings.get(n, "")
                if "ynchronize" in nm:
                    syncs.append((s / 1e3, nm.split("_v")[0]))
                if "Launch" in nm:
                    launches.append((s / 1e3, (e - s) / 1e3))
            loaders = []
            for s, e, text, tid, gtid in con.execute(
                "select start, end, text, textId, globalTid from NVTX_EVENTS where end is not null"
            ):
                t = text if text is not None else strings.get(tid)
                if t == "data_loading" and pid(gtid) == p:
                    loaders.append((s / 1e3, (e - s) / 1e3))
            r = review_steps(
                sorted(w, key=lambda x: x[1]), kernels, copies, syncs, launches, loaders
            )
            r["pid"] = p
            r["cuda_device_ids"] = devices
            out["processes"].append(r)
        con.close()
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("root")
    ap.add_argument("--write", action="store_true", help="merge into truth JSON")
    a = ap.parse_args(argv)
    notes_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "review_notes.json")
    notes = _load_json(notes_path) if os.path.exists(notes_path) else {}

    def add_notes(tp, t):
        rel = os.path.relpath(tp, a.root).replace(os.sep, "/")
        if rel in notes:
            t["review_notes"] = notes[rel]

    for dp, _, fns in sorted(os.walk(a.root)):
        kin = sorted(f for f in fns if f.endswith(".pt.trace.json.gz"))
        truths = [f for f in fns if f.endswith(".truth.json")]
        if kin:
            res = {}
            for f in kin:
                res[f] = kineto_review(os.path.join(dp, f))
                print(f"{os.path.join(dp, f)}: {json.dumps(res[f]['median_over_steps'])}")
            if a.write and len(truths) == 1:
                tp = os.path.join(dp, truths[0])
                t = _load_json(tp)
                t["trace_review"] = res if len(res) > 1 else next(iter(res.values()))
                add_notes(tp, t)
                with open(tp, "w") as fo:
                    json.dump(t, fo, indent=1)
        for f in sorted(fns):
            if f.endswith(".sqlite.gz"):
                r = nsys_review(os.path.join(dp, f))
                for p in r["processes"]:
                    print(
                        f"{os.path.join(dp, f)} pid {p['pid']} dev {p['cuda_device_ids']}: "
                        f"{json.dumps(p['median_over_steps'])}"
                    )
                tp = os.path.join(dp, f.replace(".sqlite.gz", ".truth.json"))
                if a.write and os.path.exists(tp):
                    t = _load_json(tp)
                    t["trace_review"] = r
                    add_notes(tp, t)
                    with open(tp, "w") as fo:
                        json.dump(t, fo, indent=1)
    if a.write:  # truth files without a trace next to them (ncu)
        for rel, n in notes.items():
            tp = os.path.join(a.root, rel)
            if rel.startswith("ncu/") and os.path.exists(tp):
                t = _load_json(tp)
                t["review_notes"] = n
                with open(tp, "w") as fo:
                    json.dump(t, fo, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
