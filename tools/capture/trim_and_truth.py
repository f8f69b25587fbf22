#!/usr/bin/env python3
"""Post-process realistic_2gpu.py captures: trim, gzip, fill busy/idle, pack.

Standard library only (runs where torch is absent).

    python3 tools/capture/trim_and_truth.py process DIR [--install ROOT --prefix P]
    python3 tools/capture/trim_and_truth.py pack DIR DEST [--max-mb 15]

process: for every DIR/kineto/<scenario>/rank*.pt.trace.json.gz it keeps only
the profiled steps (the CPU ``ProfilerStep#N`` ranges named in the truth file's
capture.profiled_steps, else all present), plus the GPU work and flow arrows
launched inside them, and rewrites the file gzipped (level 9).  It then reads
per-rank GPU busy/idle per step from the trimmed traces (union of kernels,
memcpys and memsets inside each step window) into the truth file's
``gpu_busy`` and ``trace_review``.  For every DIR/nsys/<scenario>.sqlite.gz it
does the same from the NVTX ``step N`` windows (a process maps to its rank by
its CUDA device id), after dropping the activity rows outside those steps into ``<scenario>.nsys.truth.json``, and copies the
unprofiled measurements of the Kineto run of the same scenario into it
(``unprofiled_from_kineto_run``).  A trace without a truth file gets a minimal
one.  --install copies the results into a sample_traces-like ROOT as
kineto/<P><scenario>/ and nsys/<P><scenario>.{sqlite.gz,truth.json}.

pack: puts every file under DIR (except .nsys-rep and .qdstrm) into as few
DEST/<name>-<i>.tar.gz as fit --max-mb each (the device tool brings back at
most 8 files of 16 MiB).

gpu_busy fields (all times integer ns): per_rank[] = {rank, source, steps,
window_ns_median, busy_ns_median, idle_ns_median, busy_frac_median,
busy_frac_min, per_step[] = {step, window_ns, busy_ns, idle_ns, busy_frac}};
min_busy_frac_median = the lower of the ranks' medians;
all_ranks_busy_at_least_70pct (None when the trace holds no GPU work, e.g. a
CPU dry run).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import sqlite3
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import review_traces  # noqa: E402  (same folder, stdlib only)

SCHEMA = "stallscope-sample-truth/1"
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
BUSY_TARGET = 0.70
STEP_RE = re.compile(r"^ProfilerStep#\d+$")


# ------------------------------------------------------------------ Kineto


def load_json_gz(path: str) -> dict:
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        return json.load(f)


def step_windows(events: list[dict]) -> list[tuple[str, float, float]]:
    """CPU ProfilerStep#N windows (name, start_us, end_us), sorted by start."""
    w = [
        (e["name"], float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") == "user_annotation"
        and STEP_RE.match(e.get("name", ""))
    ]
    return sorted(w, key=lambda x: x[1])


def _overlaps(e: dict, lo: float, hi: float) -> bool:
    ts = float(e["ts"])
    return ts < hi and ts + float(e.get("dur", 0)) > lo


def trim_kineto(trace: dict, keep_steps: list[str] | None = None) -> tuple[dict, dict]:
    """Keep the profiled steps of a Kineto trace.

    Keeps metadata ('M'), CPU events overlapping the kept steps' span, the
    runtime/driver calls there and the GPU events and 'ac2g' flows they
    launched (by correlation id), the GPU step annotations of kept steps and
    other events inside the span.  Returns (new trace, stats).
    Raises ValueError when the trace has no ProfilerStep# window to keep.
    """
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        raise ValueError("not a Kineto trace: no traceEvents list")
    wins = step_windows(events)
    if keep_steps:
        wins = [w for w in wins if w[0] in set(keep_steps)]
    if not wins:
        raise ValueError("no ProfilerStep# window to keep")
    lo, hi = wins[0][1], max(w[2] for w in wins)
    kept_names = {w[0] for w in wins}
    corr: set = set()
    out: list[dict] = []
    for e in events:
        ph, cat = e.get("ph"), e.get("cat")
        runtime = ph == "X" and cat in ("cuda_runtime", "cuda_driver")
        if runtime and "ts" in e and _overlaps(e, lo, hi):
            c = (e.get("args") or {}).get("correlation")
            if c is not None:
                corr.add(c)
    gpu_end = hi
    for e in events:
        ph, cat = e.get("ph"), e.get("cat")
        if ph == "M":
            out.append(e)
        elif ph == "X" and cat in GPU_CATS:
            c = (e.get("args") or {}).get("correlation")
            name = e.get("name", "")
            if cat == "gpu_user_annotation" and STEP_RE.match(name):
                keep = name in kept_names
            elif c is not None and c != 0:
                keep = c in corr
            else:
                keep = _overlaps(e, lo, hi)
            if keep:
                out.append(e)
                gpu_end = max(gpu_end, float(e["ts"]) + float(e.get("dur", 0)))
        elif ph in ("s", "f", "t") and cat == "ac2g":
            if e.get("id") in corr:
                out.append(e)
        elif ph == "X" and cat == "Trace":
            e = dict(e, ts=lo, dur=hi - lo)
            out.append(e)
        elif "ts" in e and ph != "X":
            if lo <= float(e["ts"]) <= hi:
                out.append(e)
        elif ph == "X" and _overlaps(e, lo, hi):
            out.append(e)
    new = {k: v for k, v in trace.items() if k != "traceEvents"}
    new["traceEvents"] = out
    stats = {
        "events_before": len(events),
        "events_after": len(out),
        "kept_steps": [w[0] for w in wins],
        "window_us": [round(lo, 3), round(hi, 3)],
        "gpu_work_ends_us_after_window": round(max(0.0, gpu_end - hi), 3),
    }
    return new, stats


def write_json_gz(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    with gzip.open(tmp, "wt", compresslevel=9) as f:
        json.dump(obj, f, separators=(",", ":"))
    os.replace(tmp, path)


def busy_from_review(review: dict, rank, source: str) -> dict:
    """gpu_busy entry of one rank from a review_traces per-step review."""
    per = []
    for s in review.get("per_step", []):
        w = int(round(s["window_ms"] * 1e6))
        b = int(round(s["gpu_busy_ms"] * 1e6))
        per.append(
            {
                "step": s["step"],
                "window_ns": w,
                "busy_ns": b,
                "idle_ns": w - b,
                "busy_frac": round(b / w, 4) if w else None,
            }
        )

    def med(key):
        v = sorted(p[key] for p in per if p[key] is not None)
        if not v:
            return None
        m = len(v) // 2
        x = v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2
        return x if key == "busy_frac" else int(round(x))

    fr = [p["busy_frac"] for p in per if p["busy_frac"] is not None]
    return {
        "rank": rank,
        "source": source,
        "steps": len(per),
        "window_ns_median": med("window_ns"),
        "busy_ns_median": med("busy_ns"),
        "idle_ns_median": med("idle_ns"),
        "busy_frac_median": round(med("busy_frac"), 4) if fr else None,
        "busy_frac_min": min(fr) if fr else None,
        "per_step": per,
    }


def gpu_busy_block(per_rank: list[dict], note: str) -> dict:
    has_gpu = any((r.get("busy_ns_median") or 0) > 0 for r in per_rank)
    meds = [r["busy_frac_median"] for r in per_rank if r.get("busy_frac_median") is not None]
    low = min(meds) if meds else None
    return {
        "note": note,
        "per_rank": sorted(per_rank, key=lambda r: (r["rank"] is None, r["rank"])),
        "min_busy_frac_median": low,
        "busy_target": BUSY_TARGET,
        "all_ranks_busy_at_least_70pct": (low >= BUSY_TARGET)
        if has_gpu and low is not None
        else None,
    }


def rank_of(trace: dict, filename: str):
    di = trace.get("distributedInfo") or {}
    if isinstance(di.get("rank"), int):
        return di["rank"]
    m = re.search(r"rank(\d+)", filename)
    return int(m.group(1)) if m else None


def minimal_truth(scenario: str) -> dict:
    return {
        "schema": SCHEMA,
        "scenario": scenario,
        "description": "minimal truth written by trim_and_truth.py: no capture truth was found",
        "planted": None,
    }


def process_kineto_dir(d: str, trim: bool = True) -> str | None:
    """Trim every rank trace in folder d and fill its truth file; returns its path."""
    traces = sorted(f for f in os.listdir(d) if f.endswith(".pt.trace.json.gz"))
    if not traces:
        return None
    scenario = os.path.basename(os.path.normpath(d))
    truths = sorted(f for f in os.listdir(d) if f.endswith(".truth.json") and ".nsys." not in f)
    tp = os.path.join(d, truths[0] if truths else f"{scenario}.truth.json")
    truth = review_traces._load_json(tp) if os.path.exists(tp) else minimal_truth(scenario)
    keep = (truth.get("capture") or {}).get("profiled_steps")
    keep = [s for s in keep if STEP_RE.match(s)] if keep else None
    per_rank, reviews, trims = [], {}, {}
    for f in traces:
        path = os.path.join(d, f)
        tr = load_json_gz(path)
        if trim:
            present = {w[0] for w in step_windows(tr["traceEvents"])}
            tr, st = trim_kineto(tr, [s for s in keep if s in present] if keep else None)
            write_json_gz(path, tr)
            st["bytes_gz"] = os.path.getsize(path)
            trims[f] = st
        rv = review_traces.kineto_review_trace(tr)
        reviews[f] = rv
        per_rank.append(busy_from_review(rv, rank_of(tr, f), f"kineto {f} (ProfilerStep# windows)"))
    truth["gpu_busy"] = gpu_busy_block(
        per_rank,
        "Read from the trimmed Kineto traces by tools/capture/trim_and_truth.py: busy = "
        "union of kernel, memcpy and memset intervals inside each CPU ProfilerStep# "
        "window. A reading of the trace, not independent of it.",
    )
    truth["trace_review"] = reviews
    if trim:
        truth["trimmed"] = trims
    with open(tp, "w") as f:
        json.dump(truth, f, indent=1)
    return tp


NSYS_TIMED_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    "NVTX_EVENTS",
    "OSRT_API",
    "PROFILER_OVERHEAD",
)
NSYS_STEP_RE = re.compile(r"^step \d+$")


def trim_nsys(path: str) -> dict:
    """Drop the rows of an nsys SQLite (.sqlite.gz, rewritten in place) that end
    before the first NVTX 'step N' range or start after the last one, in the
    timed activity tables only (kernels, copies, memsets, runtime calls,
    synchronizations, NVTX, OS runtime, profiler overhead); metadata tables
    stay.  Returns row counts before/after.  ValueError without step ranges."""
    tmp = tempfile.mkdtemp()
    try:
        db = os.path.join(tmp, "t.sqlite")
        with gzip.open(path, "rb") as fi, open(db, "wb") as fo:
            shutil.copyfileobj(fi, fo)
        con = sqlite3.connect(db)
        tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
        strings = (
            dict(con.execute("select id, value from StringIds")) if "StringIds" in tables else {}
        )
        spans = [
            (s, e)
            for s, e, text, tid in con.execute(
                "select start, end, text, textId from NVTX_EVENTS where end is not null"
            )
            if NSYS_STEP_RE.match((text if text is not None else strings.get(tid)) or "")
        ]
        if not spans:
            con.close()
            raise ValueError(f"{os.path.basename(path)}: no NVTX 'step N' range to keep")
        lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
        before, after = {}, {}
        for t in NSYS_TIMED_TABLES:
            if t not in tables:
                continue
            before[t] = con.execute(f"select count(*) from {t}").fetchone()[0]
            con.execute(f"delete from {t} where coalesce(end, start) < ? or start > ?", (lo, hi))
            after[t] = con.execute(f"select count(*) from {t}").fetchone()[0]
        con.commit()
        con.execute("vacuum")
        con.close()
        with open(db, "rb") as fi, gzip.open(path + ".tmp", "wb", compresslevel=9) as fo:
            shutil.copyfileobj(fi, fo)
        os.replace(path + ".tmp", path)
        return {
            "rows_before": before,
            "rows_after": after,
            "window_ns": [lo, hi],
            "bytes_gz": os.path.getsize(path),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def process_nsys_file(path: str, kineto_root: str | None, trim: bool = True) -> str:
    """Fill <scenario>.nsys.truth.json next to an nsys <scenario>.sqlite.gz."""
    d, f = os.path.split(path)
    scenario = f[: -len(".sqlite.gz")]
    tp = os.path.join(d, f"{scenario}.nsys.truth.json")
    if not os.path.exists(tp) and os.path.exists(os.path.join(d, f"{scenario}.truth.json")):
        tp = os.path.join(d, f"{scenario}.truth.json")
    truth = review_traces._load_json(tp) if os.path.exists(tp) else minimal_truth(scenario)
    if trim:
        truth["trimmed"] = trim_nsys(path)
    rv = review_traces.nsys_review(path)
    per_rank = []
    for p in rv["processes"]:
        devs = p.get("cuda_device_ids") or []
        rank = devs[0] if len(devs) == 1 else None  # rank r uses cuda:r
        per_rank.append(busy_from_review(p, rank, f"nsys pid {p['pid']} (NVTX 'step N' windows)"))
    truth["gpu_busy"] = gpu_busy_block(
        per_rank,
        "Read from the nsys SQLite by tools/capture/trim_and_truth.py: busy = union of "
        "kernel, memcpy and memset intervals of each process inside its NVTX 'step N' "
        "windows; rank = CUDA device id. Not independent of the trace.",
    )
    truth["trace_review"] = rv
    ktp = os.path.join(kineto_root, scenario, f"{scenario}.truth.json") if kineto_root else None
    if ktp and os.path.exists(ktp):
        k = review_traces._load_json(ktp)
        truth["unprofiled_from_kineto_run"] = {
            "note": "the nsys run traces the whole process; unprofiled step times come "
            "from the Kineto run of the same scenario (a separate launch)",
            "pair": k.get("pair"),
            "job_step_ns": (k.get("measured") or {}).get("job_step_ns"),
            "planted": k.get("planted"),
        }
    with open(tp, "w") as fo:
        json.dump(truth, fo, indent=1)
    return tp


def install(cap: str, root: str, prefix: str) -> list[str]:
    """Copy processed captures into a sample_traces-like layout."""
    done = []
    kin = os.path.join(cap, "kineto")
    for scn in sorted(os.listdir(kin)) if os.path.isdir(kin) else []:
        src = os.path.join(kin, scn)
        files = [f for f in os.listdir(src) if f.endswith((".pt.trace.json.gz", ".truth.json"))]
        if not files:
            continue
        dst = os.path.join(root, "kineto", prefix + scn)
        os.makedirs(dst, exist_ok=True)
        for f in files:
            name = f"{prefix}{f}" if f.endswith(".truth.json") else f
            shutil.copy2(os.path.join(src, f), os.path.join(dst, name))
            done.append(os.path.join(dst, name))
    ns = os.path.join(cap, "nsys")
    for f in sorted(os.listdir(ns)) if os.path.isdir(ns) else []:
        if f.endswith(".sqlite.gz"):
            scn = f[: -len(".sqlite.gz")]
            os.makedirs(os.path.join(root, "nsys"), exist_ok=True)
            pairs = [(f, f"{prefix}{f}"), (f"{scn}.nsys.truth.json", f"{prefix}{scn}.truth.json")]
            for a, b in pairs:
                if os.path.exists(os.path.join(ns, a)):
                    shutil.copy2(os.path.join(ns, a), os.path.join(root, "nsys", b))
                    done.append(os.path.join(root, "nsys", b))
    return done


def process(cap: str, trim: bool = True) -> list[str]:
    out = []
    kin = os.path.join(cap, "kineto")
    if os.path.isdir(kin):
        for scn in sorted(os.listdir(kin)):
            if os.path.isdir(os.path.join(kin, scn)):
                tp = process_kineto_dir(os.path.join(kin, scn), trim=trim)
                if tp:
                    out.append(tp)
    ns = os.path.join(cap, "nsys")
    if os.path.isdir(ns):
        for f in sorted(os.listdir(ns)):
            if f.endswith(".sqlite.gz"):
                out.append(
                    process_nsys_file(
                        os.path.join(ns, f), kin if os.path.isdir(kin) else None, trim=trim
                    )
                )
    return out


# ------------------------------------------------------------------ pack


def pack(
    src: str, dest: str, name: str = "cap2gpu", max_mb: float = 15.0, max_tars: int = 7
) -> list[str]:
    """Greedy first-fit of the files under src into tar.gz files of <= max_mb."""
    limit = int(max_mb * 1024 * 1024)
    files = []
    for dp, _, fns in os.walk(src):
        for f in fns:
            if f.endswith((".nsys-rep", ".qdstrm")):
                continue
            p = os.path.join(dp, f)
            files.append(
                (os.path.getsize(p), os.path.relpath(p, os.path.dirname(os.path.normpath(src))))
            )
    bins: list[list] = []
    for size, rel in sorted(files, reverse=True):
        for b in bins:
            if b[0] + size <= limit:
                b[0] += size
                b[1].append(rel)
                break
        else:
            bins.append([size, [rel]])
    if len(bins) > max_tars:
        raise SystemExit(
            f"pack: {len(bins)} tars needed, more than {max_tars}: raise --max-mb or drop files"
        )
    os.makedirs(dest, exist_ok=True)
    base = os.path.dirname(os.path.normpath(src))
    made = []
    for i, (_size, rels) in enumerate(bins, 1):
        t = os.path.join(dest, f"{name}-{i}.tar.gz")
        with tarfile.open(t, "w:gz", compresslevel=6) as tf:
            for rel in sorted(rels):
                tf.add(os.path.join(base, rel), arcname=rel)
        if os.path.getsize(t) > limit:
            print(f"pack: warning: {t} is {os.path.getsize(t)} B, over {limit} B", file=sys.stderr)
        made.append(t)
    return made


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="trim_and_truth.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("process", help="trim Kineto traces, fill busy/idle into truth files")
    p.add_argument("dir", help="a capture folder holding kineto/ and/or nsys/")
    p.add_argument("--no-trim", action="store_true", help="read only, keep traces as they are")
    p.add_argument("--install", metavar="ROOT", help="copy the results into ROOT (sample_traces)")
    p.add_argument("--prefix", default="", help="name prefix for --install")
    k = sub.add_parser("pack", help="tar.gz the capture folder into files that fit the limit")
    k.add_argument("dir")
    k.add_argument("dest")
    k.add_argument("--name", default="cap2gpu")
    k.add_argument("--max-mb", type=float, default=15.0)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        if a.cmd == "process":
            if not os.path.isdir(a.dir):
                raise SystemExit(f"trim_and_truth: no such folder: {a.dir}")
            for tp in process(a.dir, trim=not a.no_trim):
                t = review_traces._load_json(tp)
                gb = t.get("gpu_busy") or {}
                pr = [(r["rank"], r["busy_frac_median"]) for r in gb.get("per_rank") or []]
                saving = (t.get("pair") or {}).get("expected_saving_ns_per_step")
                print(
                    f"{tp}: busy (rank, median frac) {pr}; >=70% "
                    f"{gb.get('all_ranks_busy_at_least_70pct')}; saving/step {saving} ns"
                )
            if a.install:
                for p in install(a.dir, a.install, a.prefix):
                    print(f"installed {p}")
        else:
            for t in pack(a.dir, a.dest, a.name, a.max_mb):
                print(f"{t} {os.path.getsize(t)} B")
    except (ValueError, OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"trim_and_truth: {e}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
