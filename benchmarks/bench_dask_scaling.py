"""Ingest throughput per Dask worker count (issue #15: >= 0.8x linear up to 16 workers).

    python benchmarks/bench_dask_scaling.py [--workers 1,2,4,8,16] [--ranks 256]
        [--big-ranks 32 --big-mb 30] [--job DIR] [--no-ceiling] [--json FILE]

Jobs: ``--ranks`` tiny ranks (the real 2-rank ``ddp_straggler`` sample
replicated with rewritten ranks, as ``bench_ranks.py`` grows it: 1.5 MB of
JSON a rank) and ``--big-ranks`` ranks of about ``--big-mb`` MB of JSON each
(the same rank traces, each repeated in time by ``make_big_trace.build``
until it is that big; the big job runs first), or ``--job``, a folder of rank files. Files are gzip
level 1, as a profiler writes them. 0 skips a job.

For each job and W, a fresh ``distributed.LocalCluster`` of W worker
processes (one thread each; each worker first ingests one sample rank into a
throwaway store, so it is as warm as a worker of a cluster that ingested
before: what a long-lived cluster sustains) and ``stallscope ingest
--no-analyze --progress-jsonl --scheduler ADDRESS`` into a fresh store, as a
user runs it. Measured per row:

* **command s**: the whole command (start-up, connection, hashing, parsing,
  publishing; not the cluster's start), and its speed-up over the first W;
* **parse phase s**: from the first parse task's start to the last one's end
  on the workers (the scheduler's task stream): the part the workers share,
  and the **throughput** over it: MB of JSON (decompressed) per second and
  ranks per second, with its share of linear (``(rate_W / rate_W0) / (W / W0)``;
  the issue asks >= 0.8);
* **task s**: the median parse task (one rank) and the mean of the workers'
  first tasks; ``task / task at W0`` says how much slower one rank gets when W
  ranks run at once on one host (contention);
* **fixed s**: the command's time outside the parse phase (start-up and
  connection, the hash round, the gather, the catalog writes and the publish);
* each worker's peak RSS and that peak less its RSS before the ingest
  (``/proc/self/clear_refs``, Linux; the largest over the workers), and that
  against the largest rank's decompressed JSON (issue #15: <= 1.5x). Ranks of a
  realistic size (50-500 MB): ``--ranks 0 --big-ranks 2W --big-mb 100`` (or 200).

First (unless ``--no-ceiling``) it times the host alone: the same JSON decode
(``json.loads`` of a sample rank, 12 times) in W plain processes at once,
each process's time against one process's: what this host's cores give
memory-heavy single-thread Python work, with no Dask and no stallscope.

The workers import stallscope from this process's ``sys.path``: to time
another version, run this script with that version importable (``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_ranks  # noqa: E402
import benchlib  # noqa: E402
import make_big_trace  # noqa: E402

_SAMPLE: dict = {}


# -- jobs ----------------------------------------------------------------------------------


def _write_rank(args: tuple[int, int, int, str]) -> int:
    """Write rank ``rank`` of a ``world``-rank job, its events repeated ``copies`` times (in a
    pool process; the sample loaded once). Returns its JSON bytes."""
    rank, world, copies, folder = args
    if not _SAMPLE:
        _SAMPLE.update(bench_ranks.load_sample())
    data = json.dumps(bench_ranks.rank_trace(_SAMPLE, rank, world)).encode()
    if copies > 1:
        out = io.BytesIO()
        with contextlib.redirect_stderr(io.StringIO()):  # (it reports each copy)
            make_big_trace.build(data, copies, out)
        data = out.getvalue()
    (Path(folder) / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(data, 1))
    return len(data)


def build_job(world: int, copies: int, folder: Path) -> None:
    """A ``world``-rank job of ``bench_ranks`` ranks, each repeated ``copies`` times in time."""
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [(r, world, copies, str(folder)) for r in range(world)]
    with ProcessPoolExecutor(min(os.cpu_count() or 1, 16)) as pool:
        list(pool.map(_write_rank, jobs))


def json_mb(job: Path) -> list[float]:
    """Each rank file of ``job``, decompressed, MB."""
    sizes = []
    for path in sorted(job.iterdir()):
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as fh:
                sizes.append(len(fh.read()) / 1e6)
        elif path.is_file():
            sizes.append(path.stat().st_size / 1e6)
    return sizes


# -- the host alone --------------------------------------------------------------------------


def _decode_job(barrier, results) -> None:
    """In a process: decode a sample rank's JSON 12 times once every process is ready;
    put the seconds it took."""
    data = gzip.decompress((bench_ranks.SAMPLE / "rank0.pt.trace.json.gz").read_bytes())
    json.loads(data)
    barrier.wait()
    started = time.perf_counter()
    for _ in range(12):
        json.loads(data)
    results.put(time.perf_counter() - started)


def host_ceiling(workers: list[int]) -> dict[int, float]:
    """Per W: the mean time of one process's JSON decode with W processes decoding at once,
    over the time with one (1.0: no slowdown)."""
    ctx = get_context("fork")
    times = {}
    for w in sorted({1, *workers}):
        barrier, results = ctx.Barrier(w), ctx.Queue()
        procs = [ctx.Process(target=_decode_job, args=(barrier, results)) for _ in range(w)]
        for proc in procs:
            proc.start()
        times[w] = statistics.mean(results.get() for _ in range(w))
        for proc in procs:
            proc.join()
    return {w: times[w] / times[1] for w in workers}


# -- one ingest --------------------------------------------------------------------------------


def _warm_and_reset() -> float:
    """On a worker: ingest one sample rank into a throwaway store (the worker is then as
    warm as one that ingested before: modules imported, DuckDB and Arrow started), then
    reset the peak RSS; the RSS now, MB."""
    from stallscope.cluster import RankFile, ingest_rank
    from stallscope.store import Store

    sample = bench_ranks.SAMPLE / "rank0.pt.trace.json.gz"
    root = tempfile.mkdtemp(prefix="bench_warm_")
    try:
        staging = Store(root).new_staging()
        item = RankFile(sample.name, sample.stat().st_size, str(sample))
        ingest_rank(root, str(staging), "warm", "0" * 64, item, False)
    finally:
        shutil.rmtree(root, ignore_errors=True)
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


def run_command(cmd: list[str]) -> tuple[float, float, float, float | None]:
    """(start, end, client CPU s, time of the ``publishing`` line) of one ``ingest
    --progress-jsonl`` command; times are ``time.time()``."""
    started = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    publishing = None
    tail = []
    for line in proc.stderr:
        if '"publishing"' in line and publishing is None:
            publishing = time.time()
        tail = (tail + [line])[-20:]
    _, status, usage = os.wait4(proc.pid, 0)
    ended = time.time()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{''.join(tail)}")
    return started, ended, usage.ru_utime + usage.ru_stime, publishing


def measure(cmd: list[str], job: Path, workers: int, work: Path) -> dict:
    from distributed import Client, LocalCluster, get_task_stream
    from distributed.utils import key_split

    store = work / f"store_w{workers}"
    shutil.rmtree(store, ignore_errors=True)
    cluster = LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
        memory_limit=0,
    )  # fmt: skip
    client = Client(cluster)
    try:
        before = list(client.run(_warm_and_reset).values())
        with get_task_stream(client) as stream:
            started, ended, client_cpu, publishing = run_command(
                [*cmd, "ingest", "--no-analyze", "--progress-jsonl", "--store", str(store),
                 "--scheduler", cluster.scheduler_address, str(job)]
            )  # fmt: skip
        peaks = client.run(_peak_mb)
        after = [peaks[w] for w in peaks]
    finally:
        client.close()
        cluster.close()
    shutil.rmtree(store, ignore_errors=True)
    tasks: dict[str, list[tuple[float, float, str]]] = {}
    for record in stream.data:
        for span in record["startstops"]:
            if span["action"] == "compute":
                tasks.setdefault(key_split(record["key"]), []).append(
                    (span["start"], span["stop"], record["worker"])
                )
    parse = sorted(tasks.get("ingest_rank", []))
    hashing = tasks.get("hash_file", [])
    firsts: dict[str, float] = {}
    for start, stop, worker in parse:
        firsts.setdefault(worker, stop - start)
    phase = max(stop for _, stop, _ in parse) - parse[0][0]
    return {
        "workers": workers,
        "command_s": ended - started,
        "client_cpu_s": client_cpu,
        "parse_phase_s": phase,
        "before_parse_s": parse[0][0] - started,
        "hash_round_s": (max(s for _, s, _ in hashing) - min(s for s, _, _ in hashing))
        if hashing
        else 0.0,
        "after_parse_s": ended - max(stop for _, stop, _ in parse),
        "publish_s": (ended - publishing) if publishing else float("nan"),
        "task_median_s": statistics.median(stop - start for start, stop, _ in parse),
        "task_busy_s": sum(stop - start for start, stop, _ in parse),
        "first_task_s": statistics.mean(firsts.values()),
        "worker_peak_mb": max(after),
        "worker_rank_mb": max(a - b for a, b in zip(after, before, strict=False)),
    }


# -- report --------------------------------------------------------------------------------------


def summarize(rows: list[dict], sizes: list[float], ceiling: dict[int, float]) -> None:
    """Add the rates and shares of linear to each row (against the first row)."""
    mb, ranks = sum(sizes), len(sizes)
    first = rows[0]
    for r in rows:
        scale = r["workers"] / first["workers"]
        r.update(
            ranks=ranks,
            json_mb=mb,
            largest_rank_mb=max(sizes),
            mb_per_s=mb / r["parse_phase_s"],
            ranks_per_s=ranks / r["parse_phase_s"],
            command_mb_per_s=mb / r["command_s"],
            share_of_linear=(first["parse_phase_s"] / r["parse_phase_s"]) / scale,
            command_share_of_linear=(first["command_s"] / r["command_s"]) / scale,
            task_slowdown=r["task_median_s"] / first["task_median_s"],
            host_slowdown=ceiling.get(r["workers"], float("nan")),
            rank_memory_ratio=r["worker_rank_mb"] / max(sizes),
        )


def print_table(title: str, rows: list[dict]) -> None:
    r0 = rows[0]
    print(f"\n{title}: {r0['ranks']} ranks, {r0['json_mb']:.0f} MB of JSON "
          f"(largest rank {r0['largest_rank_mb']:.1f} MB)\n")  # fmt: skip
    print(
        "| workers | command s | command share of linear | parse phase s | MB/s | ranks/s "
        "| share of linear (target >= 0.8) | task s (median / first) | task slowdown "
        "| host slowdown (JSON decode) | fixed s (before / after parse) | publish s "
        "| worker peak MB (less idle) | less idle / largest rank (target <= 1.5) |"
    )
    print("|---:" * 14 + "|")
    for r in rows:
        print(
            f"| {r['workers']} | {r['command_s']:.1f} | {r['command_share_of_linear']:.2f} "
            f"| {r['parse_phase_s']:.1f} | {r['mb_per_s']:.1f} | {r['ranks_per_s']:.1f} "
            f"| **{r['share_of_linear']:.2f}** | {r['task_median_s']:.2f} / {r['first_task_s']:.2f} "
            f"| {r['task_slowdown']:.2f}x | {r['host_slowdown']:.2f}x "
            f"| {r['before_parse_s']:.1f} / {r['after_parse_s']:.1f} | {r['publish_s']:.2f} "
            f"| {r['worker_peak_mb']:.0f} ({r['worker_rank_mb']:.0f}) "
            f"| **{r['rank_memory_ratio']:.2f}x** |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4,8,16", help="W,W,... (default 1,2,4,8,16)")
    parser.add_argument("--ranks", type=int, default=256, help="tiny ranks (256; 0: none)")
    parser.add_argument("--big-ranks", type=int, default=32, help="big ranks (32; 0: none)")
    parser.add_argument("--big-mb", type=float, default=30.0, help="MB of JSON a big rank (30)")
    parser.add_argument("--job", help="a folder of rank files to ingest instead of both")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the host's own test")
    parser.add_argument("--stallscope", help="command that runs stallscope (default: this venv's)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    cmd = benchlib.stallscope_cmd(args.stallscope)
    workers = [int(w) for w in args.workers.split(",")]
    print(f"machine: {benchlib.machine()}\nCPUs: {os.cpu_count()}\n", flush=True)
    ceiling = {} if args.no_ceiling else host_ceiling(workers)
    if ceiling:
        print("host slowdown of a JSON decode, W processes at once: "
              + ", ".join(f"W={w} {s:.2f}x" for w, s in ceiling.items()), flush=True)  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="bench_scaling_"))
    results = {}
    try:
        jobs = []
        if args.job:
            jobs.append(("given job", Path(args.job)))
        else:
            copies = max(1, round(args.big_mb / 1.5))  # a sample rank holds ~1.5 MB of JSON
            for title, world, reps in ((f"~{args.big_mb:g} MB ranks", args.big_ranks, copies),
                                       ("tiny ranks", args.ranks, 1)):  # fmt: skip
                if world > 0:
                    build_job(world, reps, work / f"job{world}x{reps}")
                    jobs.append((title, work / f"job{world}x{reps}"))
        for title, job in jobs:
            sizes = json_mb(job)
            rows = []
            for w in workers:
                rows.append(measure(cmd, job, w, work))
                print(
                    f"{title} W={w}: " + json.dumps({k: round(v, 3) for k, v in rows[-1].items()}),
                    flush=True,
                )  # fmt: skip (kept if a later row never comes)
            summarize(rows, sizes, ceiling)
            print_table(title, rows)
            results[title] = rows
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"ceiling": ceiling, "jobs": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
