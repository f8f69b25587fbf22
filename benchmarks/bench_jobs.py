"""``stallscope analyze --jobs N``: several jobs, and one job of many ranks, with 1 and N processes.

    python benchmarks/bench_jobs.py [--jobs 1,2,4] [--ranks 32] [--repeat 2]

Two workloads, each ingested once into a fresh store (not timed), then
analyzed as a user runs it (``stallscope analyze IDS... --format json --jobs N``,
a whole process: wall seconds, CPU seconds of it and its worker processes,
``os.wait4``), alternating N ``--repeat`` times:

* ``samples``: the Kineto sample jobs (``sample_traces/kineto/*``, the 21 of the
  23 folders that are one job each, of 1 or 2 ranks): a pool over jobs;
* ``ranks``: one job of ``--ranks`` ranks built from the real ``ddp_straggler``
  sample as ``bench_ranks.py`` builds it: a pool over its ranks.

Every N's report must equal N = 1's (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_ranks  # noqa: E402
import benchlib  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def ingest(cmd: list[str], store: Path, folders: list[Path]) -> list[str]:
    """Ingest each folder as one job; the job ids, in order (a folder that is not one job,
    e.g. a trace beside its memory snapshot, is left out)."""
    ids = []
    for folder in folders:
        out = subprocess.run(
            [*cmd, "ingest", "--no-analyze", "--store", str(store), "--json", str(folder)],
            capture_output=True, text=True,
        )  # fmt: skip
        if out.returncode == 0:
            ids.append(json.loads(out.stdout)[0]["job_id"])
    return ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="1,2", help="process counts (default 1,2)")
    parser.add_argument("--ranks", type=int, default=32, help="ranks of the one big job")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--stallscope", help="command that runs stallscope (default: this venv's)")
    args = parser.parse_args()
    counts = [int(n) for n in args.jobs.split(",")]
    cmd = benchlib.stallscope_cmd(args.stallscope)
    print(f"machine: {benchlib.machine()}\ncommand: {' '.join(cmd)}\n")
    work = Path(tempfile.mkdtemp(prefix="bench_jobs_"))
    ok = True
    try:
        big = work / f"job{args.ranks}"
        bench_ranks.build_job(bench_ranks.load_sample(), args.ranks, big)
        samples = sorted(p for p in (REPO / "sample_traces" / "kineto").iterdir() if p.is_dir())
        sample_ids = ingest(cmd, work / "s1", samples)
        workloads = {
            f"samples ({len(sample_ids)} jobs)": sample_ids,
            f"ranks (1 job of {args.ranks})": ingest(cmd, work / "s2", [big]),
        }
        stores = dict(zip(workloads, (work / "s1", work / "s2"), strict=True))
        print("| workload | --jobs | wall s (each run) | CPU s (each run) | same report |")
        print("|---|---:|---|---|---|")
        for name, ids in workloads.items():
            times: dict[int, list[tuple[float, float]]] = {n: [] for n in counts}
            reports: dict[int, str] = {}
            for _ in range(args.repeat):
                for n in counts:
                    out = work / f"r{n}.json"
                    wall, cpu, _, _ = benchlib.run_child(
                        [
                            *cmd,
                            "analyze",
                            "--recompute",
                            "--store",
                            str(stores[name]),
                            *ids,
                            "--format",
                            "json",
                            "--jobs",
                            str(n),
                            "-o",
                            str(out),
                        ]  # fmt: skip
                    )
                    times[n].append((wall, cpu))
                    reports[n] = out.read_text()
            for n in counts:
                same = reports[n] == reports[counts[0]]
                ok &= same
                walls = ", ".join(f"{w:.1f}" for w, _ in times[n])
                cpus = ", ".join(f"{c:.1f}" for _, c in times[n])
                print(f"| {name} | {n} | {walls} | {cpus} | {'yes' if same else 'NO'} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
