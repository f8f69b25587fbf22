"""How does ``stallscope analyze`` scale with the length of one trace (not its ranks)?

    python benchmarks/bench_trace_length.py [--copies 10 20 40 80] [--base CMD] [--src FILE]

For each K, a K-times longer Nsight Systems export is built from the real
2-GPU capture ``nsys-ai/mfu_2gpu_before.sqlite`` of the corpus (or
``--src``) by ``make_big_nsys.py`` (its events repeated K times, shifted in
time): one job of 2 GPUs whose capture has no step markers, with every
collective of each copy. It is ingested once (``--no-analyze``, not timed),
then analyzed as a user runs it (``stallscope analyze JOB --recompute
--format json``, a whole process: wall, CPU seconds of all threads and peak
RSS, ``benchlib.run_child``). ``--base CMD`` analyzes each job with a second
stallscope too (the code before a change), alternating, and checks that the
two reports are equal. The fitted exponent is the slope of log(analysis CPU-s)
against log(K): 1 is linear in the trace's length.

Why: a cross-rank explanation (``lateness.explain``) once counted each late
collective's kernels from its step's start, so a trace of one long step (no
step markers, or FSDP's hundreds of collectives a step) cost the square of
its length: 940 CPU-s for the 150-copy export on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import benchlib

HERE = Path(__file__).resolve().parent
CORPUS_SRC = HERE.parent.parent / "shared" / "corpus" / "nsys-ai" / "mfu_2gpu_before.sqlite"


def build_job(src: Path, copies: int, work: Path, cmd: list[str]) -> tuple[Path, str, int]:
    """(store, job id, export bytes) of the ``copies``-times export, ingested without analysis."""
    export = work / f"x{copies}.sqlite"
    subprocess.run(
        [
            sys.executable,
            str(HERE / "make_big_nsys.py"),
            str(src),
            str(export),
            "--copies",
            str(copies),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    store = work / f"store{copies}"
    subprocess.run(
        [*cmd, "ingest", "--no-analyze", "--json", "--store", str(store), str(export)],
        check=True,
        capture_output=True,
    )
    job = next(p.name for p in (store / "jobs").iterdir() if p.is_dir())
    size = export.stat().st_size
    export.unlink()  # the store holds what analyze reads
    return store, job, size


def analyze(cmd: list[str], store: Path, job: str) -> tuple[float, float, float, str]:
    """(wall s, CPU s, peak RSS MB, JSON report) of one whole ``analyze`` process."""
    argv = [*cmd, "analyze", "--store", str(store), "--recompute", "--format", "json", job]
    return benchlib.run_child(argv)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, nargs="+", default=[10, 20, 40, 80])
    parser.add_argument("--src", type=Path, default=CORPUS_SRC, help="a 2-GPU nsys export")
    parser.add_argument("--stallscope", help="the stallscope command to time (default: ours)")
    parser.add_argument("--base", help="a second stallscope command, timed alternately")
    args = parser.parse_args()
    if not args.src.exists():
        print(f"no source export at {args.src} (give --src)", file=sys.stderr)
        return 2
    cmd = benchlib.stallscope_cmd(args.stallscope)
    tools = {
        "stallscope": cmd,
        **({"base": benchlib.stallscope_cmd(args.base)} if args.base else {}),
    }
    print(json.dumps(benchlib.machine()))
    print("| copies | export MB | tool | analyze wall s | analyze CPU s | peak RSS MB |")
    print("|---:|---:|---|---:|---:|---:|")
    points: dict[str, list[tuple[float, float]]] = {name: [] for name in tools}
    differ = False
    with tempfile.TemporaryDirectory(prefix="stallscope-length-") as tmp:
        for copies in args.copies:
            store, job, size = build_job(args.src, copies, Path(tmp), cmd)
            reports = {}
            for name, tool in tools.items():
                wall, cpu, rss, text = analyze(tool, store, job)
                reports[name] = json.loads(text)
                points[name].append((copies, cpu))
                print(
                    f"| {copies} | {size / 1e6:.0f} | {name} | {wall:.2f} | {cpu:.2f} | {rss:,.0f} |"
                )
            if args.base and reports["stallscope"] != reports["base"]:
                print(f"reports differ at {copies} copies", file=sys.stderr)
                differ = True
    for name, pts in points.items():
        if len(pts) > 1:
            print(
                f"{name}: fitted exponent of analysis CPU-s vs trace length: {benchlib.loglog_slope(*zip(*pts, strict=True)):.2f}"
            )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
