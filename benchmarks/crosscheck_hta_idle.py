"""Cross-check ``gpu_idle_pct`` against HTA's ``get_temporal_breakdown()``.

    python benchmarks/crosscheck_hta_idle.py [--hta-python /tmp/htavenv2/bin/python] [--markdown]

HTA 0.5.0 lives in its own virtual environment, so this script, run with
stallscope's Python, calls it in a subprocess on a folder holding the trace as
``rank-<N>.json.gz``. For every corpus trace with GPU work it prints, per rank:

* ``HTA %``     — HTA's ``idle_time_pctg`` with its defaults (the last
  ``ProfilerStep`` and GPU operations launched outside the kept steps dropped);
* ``HTA all %`` — the same with ``include_last_profiler_step=True``;
* ``ours %``    — stallscope's ``gpu_idle_pct`` (per device; the rank's devices
  merged when it has several, as HTA merges them);
* ``diff pp``   — ours − HTA.

Then it recomputes ours from the store HTA's way, one rule at a time, each on
top of the previous ones (all idle %, of HTA's span):

1. ``+sync``  — ``cuda_sync`` rows with a stream (``Stream Sync``; HTA's set is
   every row whose ``args.stream`` is an integer other than -1) count as busy;
2. ``+host``  — host events that carry an integer ``args.stream`` (Inductor's
   Triton ``cpu_op`` rows have ``stream: 0``) count as busy, as in HTA;
3. ``+us``    — times rounded as HTA's parser does: start up (``ceil``), end
   down (``floor``) to whole microseconds, so a sub-µs operation gets a negative
   length, and HTA's merge (sort by start, group while start <= running max end)
   then *subtracts* it from the busy time;
4. ``+launch`` — only GPU rows whose correlation id matches a host call that
   started before the last ``ProfilerStep`` ended (HTA's
   ``_filter_irrelevant_gpu_kernels`` with ``include_last_profiler_step=True``,
   applied when the trace has at least two ``ProfilerStep`` names): should equal
   ``HTA all``;
5. ``+last``  — only those launched before the last ``ProfilerStep`` began
   (HTA's default): should equal ``HTA``.

HTA's span is like ours (first start to last end of the set, ``stream != -1``),
and its busy set, like ours, holds kernels, memcpys and memsets (HTA's
*compute* split is kernel-only, its idle figure is not). Results are recorded in
docs/metrics.md ("Differences from HTA's temporal breakdown").
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CORPUS = REPO.parent / "shared" / "corpus"
TL = CORPUS / "tracelens" / "traces"
SETS = {
    "hta/critical_path/alexnet": CORPUS / "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "hta/critical_path/simple_add": CORPUS / "hta/critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz",
    "hta/critical_path/cuda_event_sync": CORPUS / "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz",
    "hta/df_index_resolver": CORPUS / "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/trace_diff/control": CORPUS / "hta/trace_diff/control/control.json.gz",
    "hta/trace_diff/test": CORPUS / "hta/trace_diff/test/test.json.gz",
    "hta/nccl_parser_config": CORPUS / "hta/nccl_parser_config/nccl_data.json.gz",
    "param/dlrm_kineto rank 0": CORPUS / "param/dlrm_kineto/worker0_step_12.1694128201545.pt.trace.json.gz",
    "tracelens/h100 falconsai": TL / "h100/Falconsai_nsfw_image_detection__1016002.json.gz",
    "tracelens/h100 qwen": TL / "h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "tracelens/h100 timesformer": TL / "h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz",
    "tracelens/h100 bert": TL / "h100/gaunernst_bert-small-uncased__1016001.json.gz",
    "tracelens/b200 eager": TL / "b200/eager_trace.json.gz",
    "tracelens/mi300 resnet": TL / "mi300/resnet_act_checkpoint.json.gz",
    "tracelens/mi300 bert": TL / "mi300/gaunernst_bert-small-uncased__1016001.json.gz",
    "tracelens/torch_compile_triton": TL / "torch_compile_triton/trace.json.gz",
}  # fmt: skip

HTA_SNIPPET = r"""
import json, sys, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
out = {}
for last in (False, True):
    a = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=last)
    df = a.get_temporal_breakdown(visualize=False)
    key = "all" if last else "default"
    out[key] = {int(r): [float(p), float(i), float(k)] for r, p, i, k in
                zip(df["rank"], df["idle_time_pctg"], df["idle_time(us)"], df["kernel_time(us)"])}
    if last:
        sym = a.t.symbol_table.get_sym_table()
        out["cats"] = {int(r): {str(sym[c]): int(n) for c, n in t.loc[t["stream"].ne(-1), "cat"].value_counts().items()}
                       for r, t in a.t.traces.items()}
print("HTA_JSON" + json.dumps(out))
"""


def ours(path: Path) -> dict[int, dict]:
    """rank -> stallscope's idle % and the HTA-way recomputations."""
    from stallscope.analyzers import utilization
    from stallscope.ingest import ingest_paths
    from stallscope.jobdata import JobData
    from stallscope.store import Store

    out: dict[int, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store").ensure()
        (res,) = ingest_paths(store, [str(path)])
        job = JobData(store, store.traces(res.job_id))
        result = utilization.run(job, utilization.SPEC.params())
        for ref in job.traces:
            rank = int(ref.meta.get("rank", 0))
            tid = ref.trace_id
            per_dev = {
                m.device: m.value
                for m in result.metrics
                if m.trace == tid and m.name == "gpu_idle_pct"
            }
            gpu = job.numpy(
                "SELECT kind, stream, start_ns, end_ns, coalesce(correlation, -1) AS corr "
                "FROM gpu WHERE trace_id = ?",
                [tid],
            )
            host = job.numpy(
                "SELECT correlation, start_ns FROM host WHERE trace_id = ? AND correlation IS NOT NULL",
                [tid],
            )
            steps = job.numpy(
                "SELECT DISTINCT n.name, r.start_ns, r.end_ns FROM ranges r JOIN names n "
                "ON n.trace_id = r.trace_id AND n.name_id = r.name_id "
                "WHERE r.trace_id = ? AND n.name LIKE '%ProfilerStep%'",
                [tid],
            )
            out[rank] = _variants(per_dev, gpu, host, steps, _host_rows_with_stream(path))
        job.close()
    return out


def _host_rows_with_stream(path: Path) -> list[tuple[int, int]]:
    """(start_ns, end_ns) of non-GPU events carrying an integer ``args.stream``
    (Inductor's Triton ``cpu_op`` rows have ``stream: 0``): HTA takes them for GPU work."""
    import gzip

    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    gpu_cats = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "Kernel", "Memcpy", "Memset"}
    rows = []
    for e in events:
        s = (e.get("args") or {}).get("stream") if isinstance(e, dict) else None
        if e.get("cat") in gpu_cats or e.get("ph") != "X" or isinstance(s, bool):
            continue
        if isinstance(s, int) and s != -1:
            ts = round(float(e["ts"]) * 1000)
            rows.append((ts, ts + round(float(e.get("dur", 0)) * 1000)))
    return rows


def _variants(per_dev: dict, gpu: dict, host: dict, steps: dict, extra: list) -> dict:
    """extra: host rows that HTA counts as GPU work (kind 'host', no correlation)."""
    n = len(extra)
    kind = np.concatenate([np.asarray(gpu["kind"], dtype=object), np.full(n, "host", dtype=object)])
    stream = np.concatenate([np.asarray(gpu["stream"]), np.zeros(n, dtype=np.int64)])
    start, end, corr = (
        np.concatenate([np.asarray(gpu[k], dtype=np.int64), np.asarray(x, dtype=np.int64)])
        for k, x in (
            ("start_ns", [r[0] for r in extra]),
            ("end_ns", [r[1] for r in extra]),
            ("corr", [-1] * n),
        )
    )
    work = np.isin(kind, ["kernel", "memcpy", "memset"])
    v = {"devices": per_dev}
    v["ours"] = _idle_ns(start[work], end[work])  # the rank's devices merged
    busy = work | ((kind == "sync") & (stream != -1))
    v["+sync"] = _idle_ns(start[busy], end[busy])
    busy = busy | (kind == "host")
    v["+host"] = _idle_ns(start[busy], end[busy])
    # HTA parses ts/dur as float µs, then ts = ceil(ts), end = floor(ts + dur)
    q, r = np.divmod(start, 1000)  # float(text) of a 16-digit µs value, as close as float64 gets
    ts_us = q.astype(np.float64) + r / 1000.0
    us_start = np.ceil(ts_us).astype(np.int64)
    us_end = np.floor(ts_us + (end - start) / 1000.0).astype(np.int64)
    v["+us"] = _hta_idle_us(us_start[busy], us_end[busy])
    v["+launch"] = v["+us"]
    v["+last"] = v["+us"]
    names = set(steps["name"]) if len(steps["name"]) else set()
    if len(names) >= 2:
        step_start = (-(-np.asarray(steps["start_ns"], dtype=np.int64) // 1000)).max()
        step_end = (np.asarray(steps["end_ns"], dtype=np.int64) // 1000).max()
        h_corr = np.asarray(host["correlation"], dtype=np.int64)
        h_ts = -(-np.asarray(host["start_ns"], dtype=np.int64) // 1000)  # ceil
        for key, keep_host in (("+launch", h_ts <= step_end), ("+last", h_ts < step_start)):
            launched = np.isin(corr, h_corr[keep_host]) & (corr >= 0)
            keep = busy & (launched | (kind == "host"))  # HTA keeps host rows as CPU rows
            v[key] = _hta_idle_us(us_start[keep], us_end[keep])
    v["counts"] = {
        "sync_busy": int(((kind == "sync") & (stream != -1)).sum()),
        "host": n,
        "sub_us": int((busy & (us_end < us_start)).sum()),
        "no_launch": int((busy & ~np.isin(corr, np.asarray(host["correlation"]))).sum()),
    }
    return v


def _idle_ns(starts: np.ndarray, ends: np.ndarray) -> float | None:
    """stallscope's idle %: span minus the union, in integer ns."""
    from stallscope import intervals

    if not len(starts):
        return None
    span = int(ends.max() - starts.min())
    return 100.0 - 100.0 * intervals.total(starts, ends) / span if span else None


def _hta_idle_us(ts: np.ndarray, end: np.ndarray) -> float | None:
    """HTA's merge_kernel_intervals + _get_idle_time_for_kernels, in integer µs."""
    if not len(ts):
        return None
    order = np.argsort(ts, kind="stable")
    ts, end = ts[order], end[order]
    prev_max = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(end)[:-1]])
    group = np.cumsum(ts > prev_max)
    g_ts = np.minimum.reduceat(ts, np.flatnonzero(np.diff(group, prepend=-1)))
    g_end = np.maximum.reduceat(end, np.flatnonzero(np.diff(group, prepend=-1)))
    kernel_time = int(g_end[-1] - g_ts[0])
    run_time = int(g_end.sum() - g_ts.sum())
    return 100.0 * (kernel_time - run_time) / kernel_time if kernel_time else None


def hta(path: Path, python: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(path, Path(tmp) / "rank-0.json.gz")
        run = subprocess.run(
            [python, "-c", HTA_SNIPPET, tmp], capture_output=True, text=True, timeout=900
        )
    line = next((x for x in run.stdout.splitlines() if x.startswith("HTA_JSON")), None)
    if line is None:
        lines = run.stderr.strip().splitlines() or ["no output"]
        where = next((x.strip() for x in reversed(lines) if x.strip().startswith("assert ")), "")
        return {"error": (lines[-1] + (f" ({where})" if where else ""))[:120]}
    return json.loads(line[len("HTA_JSON") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hta-python", default="/tmp/htavenv2/bin/python")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = parser.parse_args()
    header = ("trace", "rank", "HTA %", "HTA all %", "ours %", "diff pp",
              "+sync", "+host", "+us", "+launch", "+last", "rows: sync/host/sub-µs/no launch")  # fmt: skip
    rows, notes = [], []
    for name, path in SETS.items():
        if not path.is_file():
            print(f"skip {name}: {path} not found", file=sys.stderr)
            continue
        mine, theirs = ours(path), hta(path, args.hta_python)
        for rank, v in sorted(mine.items()):
            if "error" in theirs:
                rows.append(
                    (name, rank, f"error: {theirs['error']}", "", _f(v["ours"])) + ("",) * 7
                )
                continue
            h = _get(theirs["default"], rank)
            h_all = _get(theirs["all"], rank)
            ours_pct = v["ours"]
            if len(v["devices"]) > 1:
                devs = ", ".join(f"dev {d}: {_f(p)}" for d, p in sorted(v["devices"].items()))
                notes.append(f"{name} rank {rank}: {len(v['devices'])} devices ({devs})")
            diff = None if h is None or ours_pct is None else ours_pct - h[0]
            c = v["counts"]
            rows.append((
                name, rank, _f(h and h[0]), _f(h_all and h_all[0]), _f(ours_pct),
                "" if diff is None else f"{diff:+.2f}",
                _f(v["+sync"]), _f(v["+host"]), _f(v["+us"]), _f(v["+launch"]), _f(v["+last"]),
                f"{c['sync_busy']}/{c['host']}/{c['sub_us']}/{c['no_launch']}",
            ))  # fmt: skip
            cats = _get(theirs.get("cats", {}), rank) or {}
            notes.append(f"{name} rank {rank}: HTA busy set by cat {cats}")
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(str(x) for x in row) + " |")
    else:
        for row in [header, *rows]:
            print("  ".join(f"{x!s:>10}" for x in row))
    print()
    for note in notes:
        print(note)


def _get(d: dict, rank: int):
    return d.get(str(rank), d.get(rank))


def _f(value) -> str:
    if value is None:
        return "-"
    return (
        "nan"
        if value != value or (isinstance(value, float) and math.isinf(value))
        else f"{value:.2f}"
    )


if __name__ == "__main__":
    main()
