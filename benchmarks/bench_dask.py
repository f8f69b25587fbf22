"""Ingest and analyze an N-rank job on a local Dask cluster of W workers (``--scheduler``).

    python benchmarks/bench_dask.py [--workers 0,1,2,4,8,16] [--ranks 8,64,256]
                                    [--stallscope CMD] [--keep DIR]

Needs stallscope and dask.distributed only (``pip install 'stallscope[dask]'``),
run from a checkout (it reads ``sample_traces/``). For each N, an N-rank job is
built from the real 2-rank sample ``sample_traces/kineto/ddp_straggler`` as
``bench_ranks.py`` builds it (rank 1, the straggler, sleeps 50 ms before every
forward; every other rank is rank 0's trace with its rank, world size and
trace id rewritten). For each W, a fresh ``distributed.LocalCluster`` of W
worker processes (one thread each) is started, then, as a user runs them,
``stallscope ingest --scheduler ADDRESS`` into a fresh store and
``stallscope analyze JOB --scheduler ADDRESS --format json``. W = 0 is the
baseline without Dask: ``stallscope ingest`` and ``stallscope analyze``
(``--jobs``: every CPU) on this machine alone.

Printed per (N, W): ingest and analysis wall seconds (the whole commands, Python
start-up and the connection to the scheduler included; the cluster's start is
not), the client command's peak memory, each worker's peak RSS (largest and
mean, ``ru_maxrss`` of the worker processes, which live for that one N), the
store's size, whether the straggler is named (every ``nccl_wait`` finding of a
waiting rank names rank 1) and whether the report equals the first W's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_ranks  # noqa: E402
import benchlib  # noqa: E402


def _peak_rss_mb() -> float:
    """This process's peak resident set, MB (run on each worker)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def store_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / (1 << 20)


def measure(cmd: list[str], job: Path, world: int, workers: int, work: Path) -> dict:
    """One (N, W) run: a fresh store (and cluster for W > 0); see the module docstring."""
    store = work / f"store{world}w{workers}"
    shutil.rmtree(store, ignore_errors=True)
    out = work / f"report{world}w{workers}.json"
    cluster = client = None
    extra: list[str] = []
    if workers:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
            memory_limit=0,
        )  # fmt: skip
        client = Client(cluster)
        extra = ["--scheduler", cluster.scheduler_address]
    try:
        ingest_s, _, ingest_mb, _ = benchlib.run_child(
            [*cmd, "ingest", "--no-analyze", "--store", str(store), *extra, str(job)]
        )
        (job_id,) = [p.name for p in (store / "jobs").iterdir() if p.is_dir()]
        analyze_s, _, analyze_mb, _ = benchlib.run_child(
            [
                *cmd,
                "analyze",
                "--recompute",
                "--store",
                str(store),
                *extra,
                job_id,
                "--format",
                "json",
                "-o",
                str(out),
            ]  # fmt: skip
        )
        peaks = list(client.run(_peak_rss_mb).values()) if client else []
    finally:
        if client is not None:
            client.close()
            cluster.close()
    report = json.loads(out.read_text())
    waits, named = bench_ranks.straggler_named(report)
    return {
        "ranks": world,
        "workers": workers,
        "ingest_s": ingest_s,
        "analyze_s": analyze_s,
        "client_mb": max(ingest_mb, analyze_mb),
        "worker_max_mb": max(peaks, default=0.0),
        "worker_mean_mb": sum(peaks) / len(peaks) if peaks else 0.0,
        "store_mb": store_mb(store),
        "waiting": waits,
        "straggler_named": named,
        "report": report,
    }


def print_table(rows: list[dict]) -> None:
    print(
        "| ranks | workers | ingest s | analyze s | client peak MB | worker peak MB (max / mean) "
        "| store MB | straggler named | same report |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for r in rows:
        workers = r["workers"] or "none (this machine)"
        peaks = f"{r['worker_max_mb']:.0f} / {r['worker_mean_mb']:.0f}" if r["workers"] else "-"
        named = "yes" if r["straggler_named"] else "NO"
        print(
            f"| {r['ranks']} | {workers} | {r['ingest_s']:.1f} | {r['analyze_s']:.1f} "
            f"| {r['client_mb']:.0f} | {peaks} | {r['store_mb']:.1f} "
            f"| {named} ({r['waiting']} waiting ranks) | {'yes' if r['same'] else 'NO'} |"
        )


def _numbers(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: not a comma-separated list of numbers"
        ) from None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=_numbers, default=[0, 1, 2], metavar="W,W,...",
                        help="Dask workers per run; 0 = no Dask (default 0,1,2)")  # fmt: skip
    parser.add_argument("--ranks", type=_numbers, default=[8, 32], metavar="N,N,...",
                        help="ranks of the job (default 8,32)")  # fmt: skip
    parser.add_argument("--stallscope", help="command that runs stallscope (default: this venv's)")
    parser.add_argument("--keep", metavar="DIR", help="build jobs and stores here and keep them")
    args = parser.parse_args()
    cmd = benchlib.stallscope_cmd(args.stallscope)
    print(f"machine: {benchlib.machine()}\ncommand: {' '.join(cmd)}\nCPUs: {os.cpu_count()}\n")
    sample = bench_ranks.load_sample()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_dask_"))
    rows = []
    try:
        for world in sorted(args.ranks):
            job = work / f"job{world}"
            if not job.is_dir():
                bench_ranks.build_job(sample, world, job)
            first = None
            for workers in args.workers:
                row = measure(cmd, job, world, workers, work)
                first = first or row["report"]
                row["same"] = row.pop("report") == first
                rows.append(row)
                print(
                    f"N={world} W={workers}: ingest {row['ingest_s']:.1f} s, "
                    f"analyze {row['analyze_s']:.1f} s",
                    flush=True,
                )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print_table(rows)
    return 0 if all(r["straggler_named"] and r["same"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
