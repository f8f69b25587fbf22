"""Do two stallscope commands give the same JSON report for every sample job?

    python benchmarks/check_same_reports.py BEFORE_CMD AFTER_CMD [--ranks 16] [--corpus DIR]
        [--only NAME ...]

E.g. ``/work/main/.venv/bin/stallscope .venv/bin/stallscope``: the same
analysis before and after a change that must not alter findings. Every job
of ``sample_traces/`` (each Kineto scenario folder, each Nsight Systems
export, the Nsight Compute occupancy results with their Kineto timeline) and
an N-rank job grown from ``ddp_straggler`` (``bench_ranks.py``) is ingested
once (by AFTER_CMD) into a temporary store, then analyzed by each command
(``analyze <job id> --format json``); the reports must be equal, key for key
(the report holds no timings). Exit 1 on any difference. ``--corpus`` adds the
corpus's multi-rank jobs (``param/dlrm_kineto``: 8 ranks; ``hta/trace_filter``: 2
sampled ranks) when they are there; ``--only`` keeps the jobs whose name holds one of
the given words (e.g. ``--only ddp_straggler corpus``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import bench_ranks

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"


def sample_jobs() -> dict[str, list[Path]]:
    """Name -> the files of one job, for every sample job."""
    jobs = {f"kineto/{d.name}": [d] for d in sorted((SAMPLES / "kineto").iterdir()) if d.is_dir()}
    jobs["ncu+kineto/occupancy"] = [
        *sorted((SAMPLES / "kineto" / "occupancy").glob("*.json*")),
        *sorted((SAMPLES / "ncu").glob("*.csv")),
    ]
    from stallscope.preload import sample_jobs as preloaded

    for paths, _ in preloaded(SAMPLES):  # every other format's samples: one file, one job
        f = Path(paths[0])
        if f.parent.name != "ncu" and f.parent.parent == SAMPLES:
            jobs[f"{f.parent.name}/{f.name}"] = [f]
    return {
        name: [p for p in files if not p.name.endswith(".truth.json")]
        for name, files in jobs.items()
    }


CORPUS_JOBS = {  # corpus multi-rank jobs: name -> (folder, file glob)
    "corpus/param/dlrm_kineto": ("param/dlrm_kineto", "worker*.pt.trace.json*"),
    "corpus/hta/trace_filter": ("hta/trace_filter", "sampled_rank-*.json*"),
}


def corpus_jobs(corpus: Path) -> dict[str, list[Path]]:
    """The corpus's multi-rank jobs that are present, name -> files."""
    found = {}
    for name, (folder, pattern) in CORPUS_JOBS.items():
        files = sorted((corpus / folder).glob(pattern))
        if files:
            found[name] = files
    return found


def ingest(cmd: list[str], store: Path, files: list[Path]) -> str:
    """The job id of ``files`` ingested as one job."""
    before = set((store / "jobs").iterdir()) if (store / "jobs").is_dir() else set()
    subprocess.run([*cmd, "ingest", "--store", str(store), *map(str, files)], check=True,
                   capture_output=True)  # fmt: skip
    (job,) = set((store / "jobs").iterdir()) - before
    return job.name


def report(cmd: list[str], store: Path, job_id: str) -> dict:
    out = subprocess.run(
        [*cmd, "analyze", "--store", str(store), job_id, "--format", "json"],
        capture_output=True,
        text=True,
    )
    if out.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd)} analyze {job_id} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", help="command that runs stallscope before the change")
    parser.add_argument("after", help="command that runs stallscope after the change")
    parser.add_argument("--ranks", type=int, default=16, help="ranks of the grown job (default 16)")
    parser.add_argument("--corpus", type=Path, help="also the corpus's multi-rank jobs")
    parser.add_argument("--only", nargs="*", help="only the jobs whose name holds one of these")
    args = parser.parse_args()
    before, after = shlex.split(args.before), shlex.split(args.after)
    differ = 0
    with tempfile.TemporaryDirectory(prefix="same_reports_") as tmp:
        store = Path(tmp) / "store"
        jobs = sample_jobs()
        grown = Path(tmp) / f"ddp_straggler_x{args.ranks}"
        jobs[grown.name] = bench_ranks.build_job(bench_ranks.load_sample(), args.ranks, grown)
        if args.corpus:
            jobs.update(corpus_jobs(args.corpus))
        if args.only:
            jobs = {k: v for k, v in jobs.items() if any(w in k for w in args.only)}
        for name, files in jobs.items():
            job_id = ingest(after, store, files)
            a, b = report(before, store, job_id), report(after, store, job_id)
            same = a == b
            differ += not same
            print(
                f"{'same' if same else 'DIFFERENT'}: {name} ({len(a['traces'])} traces, "
                f"{len(a['findings'])} findings, {len(a['metrics'])} metrics)",
                flush=True,
            )
    print(f"\n{len(jobs) - differ} of {len(jobs)} reports equal")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
