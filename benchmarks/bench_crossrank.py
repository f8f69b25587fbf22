"""Cross-rank analysis after ingest, 8 to 1,024 ranks, on a local Dask cluster (issue #15).

    python benchmarks/bench_crossrank.py [--ranks 8,64,256,1024] [--workers 16]
        [--ingest-workers 1,4] [--ingest-scaling-at 64] [--keep DIR] [--json FILE]

Needs stallscope and dask.distributed, run from a checkout (it reads
``sample_traces/``). Each N-rank job is grown from the real 2-rank sample
``ddp_straggler`` as ``bench_ranks.py`` grows it (rank 1, the straggler, sleeps
50 ms before every forward), its rank files written by a process pool. Per N:

* **ingest**: ``stallscope ingest --no-analyze --scheduler`` on a fresh
  ``LocalCluster`` of ``--workers`` processes (one thread each): wall seconds,
  each worker's peak RSS (``ru_maxrss``); at ``--ingest-scaling-at`` ranks also
  with each of ``--ingest-workers``;
* **phases** (one child process, ``--phases``): the analysis split as
  ``report.analyze_job`` runs it: triage (the rank cards' screen), the
  cross-rank analyzers (``overlap``, ``nccl_wait``: matching, waits,
  stragglers, lateness, the what-if and the critical path) and the per-rank
  analyzers on the triaged ranks; wall and CPU seconds of each;
* **analyze**: the whole command ``analyze --recompute --jobs 1`` (wall, CPU
  seconds of the process and its threads, peak RSS) and ``analyze
  --scheduler`` (wall; it also stores the report);
* **page** (largest N): in a fresh process, the stored report read and the
  Distributed page's data built without a browser or Streamlit (the report's
  overlap rows and grouped waiting findings, the wait matrix from the cards
  and collectives, the binned heatmap when plotly is there);
* whether every waiting rank's ``nccl_wait`` finding names rank 1 and its
  main cause.

The fitted exponents are least-squares slopes of log(seconds) against log(N).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_ranks  # noqa: E402
import benchlib  # noqa: E402

_SAMPLE: dict = {}


def _write_rank(args: tuple[int, int, str]) -> None:
    """Write one rank of a ``world``-rank job (in a pool process; the sample loaded once)."""
    import gzip

    rank, world, folder = args
    if not _SAMPLE:
        _SAMPLE.update(bench_ranks.load_sample())
    data = json.dumps(bench_ranks.rank_trace(_SAMPLE, rank, world)).encode()
    (Path(folder) / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(data, 1))


def build_job(world: int, folder: Path) -> None:
    """The ``world``-rank job of ``bench_ranks.build_job``, its files written in parallel."""
    folder.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(_write_rank, [(r, world, str(folder)) for r in range(world)], chunksize=8))


def _peak_rss_mb() -> float:
    """This process's peak resident set, MB (run on each worker)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def ingest(cmd: list[str], job: Path, store: Path, workers: int) -> dict:
    """Ingest ``job`` into a fresh ``store`` on a fresh cluster of ``workers`` workers."""
    from distributed import Client, LocalCluster

    shutil.rmtree(store, ignore_errors=True)
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                           dashboard_address=":0", memory_limit=0)  # fmt: skip
    client = Client(cluster)
    try:
        wall, cpu, mb, _ = benchlib.run_child(
            [*cmd, "ingest", "--no-analyze", "--store", str(store),
             "--scheduler", cluster.scheduler_address, str(job)]
        )  # fmt: skip
        peaks = list(client.run(_peak_rss_mb).values())
    finally:
        client.close()
        cluster.close()
    return {"workers": workers, "ingest_s": wall, "client_mb": mb,
            "worker_peak_mb": max(peaks, default=0.0)}  # fmt: skip


PHASES = """
import json, sys, time, resource
from stallscope.store import Store
from stallscope.jobdata import JobData
from stallscope import job_settings, report
from stallscope.analyzers import all_specs
from stallscope.rank_triage import select_ranks
def clock():
    return time.perf_counter(), time.process_time()
def since(t):
    return {"wall_s": time.perf_counter() - t[0], "cpu_s": time.process_time() - t[1]}
store = Store(sys.argv[1]); refs = store.traces(sys.argv[2]); out = {}
specs = all_specs()
t = clock(); job = JobData(store, refs); job_settings.apply(job, None)
selection = select_ranks(job); out["triage"] = since(t)
chosen = None if selection is None else selection.analyzed
t = clock()
for part in job.rank_parts():
    if chosen is not None and int(part.traces[0].meta.get("rank") or 0) not in chosen:
        continue
    for spec in specs:
        if spec.per_rank:
            spec.run(part, spec.params(None))
out["per_rank"] = since(t); out["per_rank"]["ranks"] = len(chosen) if chosen else len(refs)
t = clock(); findings = []
for spec in specs:
    if not spec.per_rank:
        findings += spec.run(job, spec.params(None)).findings
out["cross_rank"] = since(t)
waits = [f for f in findings if f.analyzer == "nccl_wait" and "straggler_rank" in f.evidence]
causes = sorted({(f.evidence.get("lateness") or {}).get("main_cause") for f in waits}, key=str)
out["straggler"] = {"waiting": len(waits),
                    "named": bool(waits) and all(f.evidence["straggler_rank"] == 1 for f in waits),
                    "causes": causes}
out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""

PAGE = """
import json, sys, time
t0 = time.perf_counter()
from stallscope.store import Store
from stallscope import report_store
from stallscope.jobdata import JobData
from stallscope.views import findings_of, grouped_findings, wait_matrix
store = Store(sys.argv[1]); job_id = sys.argv[2]; refs = store.traces(job_id)
t1 = time.perf_counter()
report = report_store.load(store, job_id, report_store.report_key([r.trace_id for r in refs], None))
t2 = time.perf_counter()
overlap = [f for f in findings_of(report, "overlap") if "comm_ns" in f["evidence"]]
groups = list(grouped_findings([f for f in findings_of(report, "nccl_wait") if f["severity"] != "info"]))
job = JobData(store, refs)
waits = wait_matrix(job)
job.close()
t3 = time.perf_counter()
figure = None
try:
    from stallscope.rank_charts import wait_heatmap
    wait_heatmap(waits); figure = time.perf_counter() - t3
except ImportError as exc:
    figure = f"skipped ({exc})"
print(json.dumps({"imports_s": t1 - t0, "report_read_s": t2 - t1, "page_data_s": t3 - t2,
                  "heatmap_s": figure, "report_found": report is not None,
                  "overlap_rows": len(overlap), "waiting_groups": len(groups),
                  "wait_rows": len(waits)}))
"""


def child_json(code: str, *args: str) -> tuple[dict, float, float]:
    """(printed JSON, wall s, CPU s) of ``python -c code args`` run from a temp dir."""
    wall, cpu, _, text = benchlib.run_child(
        [sys.executable, "-c", code, *args], cwd=tempfile.gettempdir()
    )
    return json.loads(text.strip().splitlines()[-1]), wall, cpu


def analyze(cmd: list[str], store: Path, job_id: str, extra: list[str]) -> dict:
    wall, cpu, mb, _ = benchlib.run_child(
        [*cmd, "analyze", "--store", str(store), job_id, "--format", "json", "-o",
         os.devnull, *extra]
    )  # fmt: skip
    return {"wall_s": wall, "cpu_s": cpu, "peak_mb": mb}


def measure(cmd: list[str], world: int, work: Path, args, row: dict, save) -> dict:
    """Fill ``row`` for one N step by step, calling ``save()`` after each (a run cut short
    keeps what it measured)."""
    job = work / f"job{world}"
    t = time.perf_counter()
    if not job.is_dir():
        build_job(world, job)
    row.update(ranks=world, build_s=time.perf_counter() - t)
    store = work / f"store{world}"
    row["ingest"] = [ingest(cmd, job, store, args.workers)]
    save()
    (job_id,) = [p.name for p in (store / "jobs").iterdir() if p.is_dir()]
    row["phases"], _, row["phases_cpu_s"] = child_json(PHASES, str(store), job_id)
    save()
    from distributed import LocalCluster

    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      dashboard_address=":0", memory_limit=0) as cluster:  # fmt: skip
        row["analyze_dask"] = analyze(
            cmd, store, job_id, ["--scheduler", cluster.scheduler_address]
        )
    save()
    if world == max(args.ranks):  # the report is stored now: the page reads it
        row["page"], row["page_wall_s"], _ = child_json(PAGE, str(store), job_id)
        save()
    row["analyze_jobs1"] = analyze(cmd, store, job_id, ["--recompute", "--jobs", "1"])
    save()
    if world == args.ingest_scaling_at:
        for w in args.ingest_workers:
            row["ingest"].append(ingest(cmd, job, work / f"store{world}w{w}", w))
            shutil.rmtree(work / f"store{world}w{w}", ignore_errors=True)
            save()
    print(json.dumps(row), flush=True)
    return row


def fit(rows: list[dict], value) -> float:
    """The fitted exponent of ``value(row)`` against the rank count."""
    return benchlib.loglog_slope([r["ranks"] for r in rows], [max(value(r), 1e-6) for r in rows])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    numbers = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    parser.add_argument("--ranks", type=numbers, default=[8, 64, 256, 1024])
    parser.add_argument("--workers", type=int, default=16, help="Dask workers (default 16)")
    parser.add_argument("--ingest-workers", type=numbers, default=[], help="more ingests at one N")
    parser.add_argument("--ingest-scaling-at", type=int, default=64)
    parser.add_argument("--stallscope", help="command that runs stallscope (default: this venv's)")
    parser.add_argument("--keep", metavar="DIR")
    parser.add_argument("--json", metavar="FILE", help="write the rows here too")
    args = parser.parse_args()
    cmd = benchlib.stallscope_cmd(args.stallscope)
    print(f"machine: {benchlib.machine()}\nCPUs: {os.cpu_count()}\n", flush=True)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_crossrank_"))
    rows = []
    try:

        def save() -> None:
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=1))

        for world in sorted(args.ranks):
            rows.append({})
            measure(cmd, world, work, args, rows[-1], save)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if len(rows) > 1:
        print(
            "exponent cross-rank wall:",
            round(fit(rows, lambda r: r["phases"]["cross_rank"]["wall_s"]), 2),
        )
        print(
            "exponent analyze --jobs 1 CPU-s:",
            round(fit(rows, lambda r: r["analyze_jobs1"]["cpu_s"]), 2),
        )
    return 0 if all(r["phases"]["straggler"]["named"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
