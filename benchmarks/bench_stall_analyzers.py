"""Time the stall analyzers together on a ~1M-event single-rank Kineto trace.

    python benchmarks/bench_stall_analyzers.py [TRACE.json] [--runs 3] [--profile]

The trace defaults to ``benchmarks/data/df_index_resolver_x5.json``, made (if
missing) by ``benchmarks/make_big_trace.py`` from the real 54 MB corpus trace
``hta/df_index_resolver`` (216k events, 1 rank, 1 V100), five copies shifted
in time: ~1.08M events. It is ingested once into a temporary store; then:

* in this process, ``analyze_job`` restricted to the stall analyzers
  (utilization, gpu_idle, launch_overhead, host_sync, memcpy, step_breakdown,
  hotspots), each analyzer timed alone, wall and CPU (best of ``--runs``, on a
  fresh ``JobData`` each run so no cache carries over);
* the whole process ``stallscope analyze JOB --format json`` (every analyzer,
  Python start-up included), wall and CPU of the child.

The target (issue "all of this issue's analyzers together under 2 s on a
1M-event trace") is the in-process total. ``--profile`` prints the top
cProfile entries of one restricted run. The machine is shared: the load
average is printed with the results.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stallscope.analyzers import all_specs  # noqa: E402
from stallscope.ingest import ingest_paths  # noqa: E402
from stallscope.jobdata import JobData  # noqa: E402
from stallscope.store import Store  # noqa: E402

STALL = ("utilization", "gpu_idle", "launch_overhead", "host_sync", "memcpy",
         "step_breakdown", "hotspots")  # fmt: skip
DATA = REPO / "benchmarks" / "data"
SRC = REPO.parent / "shared" / "corpus" / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"
STALLSCOPE = Path(sys.executable).with_name("stallscope")


def make_trace(out: Path, copies: int = 5) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    script = REPO / "benchmarks" / "make_big_trace.py"
    subprocess.run(
        [sys.executable, str(script), str(SRC), str(out), "--copies", str(copies)], check=True
    )


def run_once(store: Store, job_id: str, specs) -> dict[str, tuple[float, float]]:
    job = JobData(store, store.traces(job_id))
    times = {}
    for spec in specs:
        w, c = time.perf_counter(), time.process_time()
        spec.run(job, spec.params())
        times[spec.id] = (time.perf_counter() - w, time.process_time() - c)
    job.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", nargs="?", type=Path, default=DATA / "df_index_resolver_x5.json")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if not args.trace.is_file():
        make_trace(args.trace)
    specs = [s for s in all_specs() if s.id in STALL]
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store").ensure()
        t = time.perf_counter()
        (res,) = ingest_paths(store, [str(args.trace)])
        ingest_s = time.perf_counter() - t
        ref = store.traces(res.job_id)[0]
        events = ref.meta.get("event_count")
        print(f"trace {args.trace.name}: {events:,} events, ingested in {ingest_s:.1f} s")
        print(
            f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, cores {os.cpu_count()}"
        )

        runs = [run_once(store, res.job_id, specs) for _ in range(args.runs)]
        print(f"\n{'analyzer':>16} {'wall s':>8} {'CPU s':>8}   (best of {args.runs})")
        for spec in specs:
            w = min(r[spec.id][0] for r in runs)
            c = min(r[spec.id][1] for r in runs)
            print(f"{spec.id:>16} {w:8.3f} {c:8.3f}")
        totals = [(sum(v[0] for v in r.values()), sum(v[1] for v in r.values())) for r in runs]
        best = min(totals)
        print(f"{'total':>16} {best[0]:8.3f} {best[1]:8.3f}   all runs wall: "
              + ", ".join(f"{w:.2f}" for w, _ in totals))  # fmt: skip

        walls, cpus = [], []
        for _ in range(args.runs):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            subprocess.run(
                [str(STALLSCOPE), "analyze", "--recompute", res.job_id, "--format", "json", "--store", str(store.root)],
                check=False, stdout=subprocess.DEVNULL,
            )  # fmt: skip
            walls.append(time.perf_counter() - t)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        print(f"\nstallscope analyze --format json (all analyzers, whole process): "
              f"wall {min(walls):.2f} s (runs {', '.join(f'{w:.2f}' for w in walls)}), "
              f"CPU {min(cpus):.2f} s")  # fmt: skip
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            run_once(store, res.job_id, specs)
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
