"""How ingest throughput grows with Dask workers (issue #15: >= 0.8x linear up to 16).

    python benchmarks/bench_dask_scaling.py [--workers 1,2,4,8,16] [--ranks 256] [--job DIR]

Builds the N-rank job of ``bench_dask.py`` (the real ``ddp_straggler`` sample,
replicated with rewritten ranks) unless ``--job`` names a folder of rank files,
then for each W starts a fresh ``distributed.LocalCluster`` of W worker
processes (one thread each) and times ``stallscope ingest --no-analyze
--scheduler ADDRESS`` into a fresh store, as a user runs it (the whole command:
start-up, connection, planning, publishing; not the cluster's start).

Printed per W: wall seconds, throughput (ranks per second), speed-up over the
first W and its share of linear (``speed-up / (W / W0)``: the issue asks
>= 0.8), and each worker's memory: its peak RSS over the ingest (largest over
the workers) and that peak less the worker's RSS just before the ingest with
the ingest modules already imported (the part a rank costs; the workers'
high-water marks are reset then, through ``/proc/self/clear_refs``, Linux),
against the largest decompressed rank file (the issue asks <= 1.5x).

The workers import stallscope from this process's ``sys.path``: to time
another version, run this script with that version importable (``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_ranks  # noqa: E402
import benchlib  # noqa: E402


def _warm_and_reset() -> float:
    """On a worker: import what an ingest task imports, reset the peak RSS; the RSS now, MB."""
    import stallscope.cluster  # noqa: F401
    import stallscope.ingest.job  # noqa: F401
    import stallscope.ingest.kineto.parse  # noqa: F401

    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass
    return _status_mb("VmRSS")


def _peak_mb() -> float:
    """On a worker: its peak RSS since the last reset, MB."""
    return _status_mb("VmHWM")


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def largest_rank_mb(job: Path) -> float:
    """The largest rank file of ``job``, decompressed, MB."""
    sizes = []
    for path in job.iterdir():
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as fh:
                sizes.append(len(fh.read()))
        elif path.is_file():
            sizes.append(path.stat().st_size)
    return max(sizes) / 1e6


def measure(cmd: list[str], job: Path, workers: int, work: Path) -> dict:
    from distributed import Client, LocalCluster

    store = work / f"store_w{workers}"
    shutil.rmtree(store, ignore_errors=True)
    cluster = LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
        memory_limit=0,
    )  # fmt: skip
    client = Client(cluster)
    try:
        before = list(client.run(_warm_and_reset).values())
        started = time.perf_counter()
        wall, cpu, client_mb, _ = benchlib.run_child(
            [
                *cmd,
                "ingest",
                "--no-analyze",
                "--store",
                str(store),
                "--scheduler",
                cluster.scheduler_address,
                str(job),
            ]  # fmt: skip
        )
        wall = time.perf_counter() - started
        peaks = client.run(_peak_mb)
        after = [peaks[w] for w in peaks]
    finally:
        client.close()
        cluster.close()
    shutil.rmtree(store, ignore_errors=True)
    return {
        "workers": workers,
        "wall_s": wall,
        "client_cpu_s": cpu,
        "client_mb": client_mb,
        "worker_peak_mb": max(after),
        "worker_rank_mb": max(a - b for a, b in zip(after, before, strict=False)),
        "worker_idle_mb": max(before),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4,8,16", help="W,W,... (default 1,2,4,8,16)")
    parser.add_argument("--ranks", type=int, default=256, help="ranks of the built job (256)")
    parser.add_argument("--job", help="a folder of rank files to ingest instead")
    parser.add_argument("--stallscope", help="command that runs stallscope (default: this venv's)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    cmd = benchlib.stallscope_cmd(args.stallscope)
    workers = [int(w) for w in args.workers.split(",")]
    print(f"machine: {benchlib.machine()}\nCPUs: {os.cpu_count()}\n", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench_scaling_"))
    try:
        if args.job:
            job = Path(args.job)
        else:
            job = work / f"job{args.ranks}"
            bench_ranks.build_job(bench_ranks.load_sample(), args.ranks, job)
        ranks = sum(1 for p in job.iterdir() if p.is_file())
        biggest = largest_rank_mb(job)
        rows = []
        for w in workers:
            row = measure(cmd, job, w, work)
            rows.append(row)
            print(f"W={w}: {row['wall_s']:.1f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    first = rows[0]
    print(f"\n{ranks} ranks, largest rank file {biggest:.1f} MB decompressed\n")
    print("| workers | ingest s | ranks/s | speed-up | share of linear | client CPU s "
          "| worker peak MB | worker peak less idle MB (x largest rank) |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        speedup = first["wall_s"] / r["wall_s"]
        linear = speedup / (r["workers"] / first["workers"])
        r.update(speedup=speedup, share_of_linear=linear, ranks=ranks, largest_rank_mb=biggest)
        print(
            f"| {r['workers']} | {r['wall_s']:.1f} | {ranks / r['wall_s']:.1f} | {speedup:.2f}x "
            f"| {linear:.2f} | {r['client_cpu_s']:.1f} | {r['worker_peak_mb']:.0f} "
            f"| {r['worker_rank_mb']:.0f} ({r['worker_rank_mb'] / biggest:.1f}x) |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
