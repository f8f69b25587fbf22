"""Whole-process ingest speed and memory: ``stallscope ingest`` against HTA.

    python benchmarks/bench_ingest.py [TRACE.json ...] [--runs 3] [--hta-python PY]

Each run starts a fresh process, as a user would: ``stallscope ingest`` into
a new, empty store, and HTA's ``TraceAnalysis(trace_dir=DIR)`` on a folder
holding the same file as ``rank-<rank>.json`` (the name HTA's loader wants).
Start-up and imports count. Wall time is measured around the child process;
CPU time (user + system, all threads and worker processes) is the child's
``ru_utime + ru_stime`` (from ``os.wait4``); peak RSS is the child's
``ru_maxrss`` or, if larger, the largest PSS sum over the child and its
worker processes, sampled every 20 ms (:func:`run_child`). Runs of the two
tools alternate, so a busy machine slows both alike; the table gives the
median wall time and the largest peak RSS over the runs.

HTA lives in its own virtual environment (its pins would disturb ours):
``python3 -m venv /tmp/htavenv && /tmp/htavenv/bin/pip install
holistictraceanalysis==0.5.0``, then ``--hta-python /tmp/htavenv/bin/python``.
By default the first of this Python, /tmp/htavenv/bin/python, python3 and
python that can import ``hta`` is used; with none, HTA is skipped (said so).

Default inputs: ``benchmarks/data/*.json`` (see docs/benchmarks.md for how
they are made).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import Runs, find_python, machine, run_child, stallscope_cmd

HERE = Path(__file__).resolve().parent
TARGET_RATIO = 10.0
_HTA_RUN = (
    "import logging, sys, time\n"
    "logging.disable(logging.CRITICAL)\n"
    "from hta.trace_analysis import TraceAnalysis\n"
    "t = time.perf_counter()\n"
    "TraceAnalysis(trace_dir=sys.argv[1])\n"
    "print(f'HTA load seconds: {time.perf_counter() - t:.3f}')\n"
)


def find_hta_python(choice: str | None) -> str | None:
    return find_python("hta", choice, "/tmp/htavenv/bin/python", "--hta-python")


def trace_rank(path: Path) -> int:
    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
    match = re.search(rb'"distributedInfo"\s*:\s*\{[^}]*"rank"\s*:\s*(\d+)', head)
    return int(match.group(1)) if match else 0


def bench_stallscope(trace: Path, runs: Runs, cmd: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        wall, cpu, rss, _ = run_child([*cmd, "ingest", "--store", str(store), str(trace)])
        [meta_path] = store.glob("jobs/*/*/meta.json")
        meta = json.loads(meta_path.read_text())
    runs.wall.append(wall)
    runs.cpu.append(cpu)
    runs.rss_mb.append(rss)
    runs.inner.append(meta["ingest_seconds"])
    return meta


def bench_hta(python: str, trace: Path, runs: Runs) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink(trace.resolve(), Path(tmp) / f"rank-{trace_rank(trace)}.json")
        wall, cpu, rss, text = run_child([python, "-c", _HTA_RUN, tmp])
    runs.wall.append(wall)
    runs.cpu.append(cpu)
    runs.rss_mb.append(rss)
    match = re.search(r"HTA load seconds: ([\d.]+)", text)
    if match:
        runs.inner.append(float(match.group(1)))


def versions(hta_python: str | None) -> dict[str, str]:
    from importlib.metadata import version

    out = {p: version(p) for p in ("stallscope", "duckdb", "pyarrow", "msgspec", "numpy")}
    if hta_python:
        probe = subprocess.run(
            [
                hta_python,
                "-c",
                "from importlib.metadata import version as v; import platform;"
                "print(v('HolisticTraceAnalysis'), v('pandas'), platform.python_version())",
            ],
            capture_output=True,
            text=True,
        )
        hta, pandas, py = probe.stdout.split()
        out.update({"HTA": hta, "HTA's pandas": pandas, "HTA's python": py})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("traces", nargs="*", type=Path, help="Kineto .json files")
    parser.add_argument("--runs", type=int, default=3, help="runs per tool and trace (default 3)")
    parser.add_argument("--hta-python", default=None, help="a Python that can import hta")
    parser.add_argument("--no-hta", action="store_true", help="time stallscope alone")
    parser.add_argument(
        "--stallscope",
        default=None,
        metavar="CMD",
        help="command that runs stallscope (default: the stallscope next to this Python);"
        " e.g. 'env PYTHONPATH=/tmp/old python -m stallscope.cli' to time another checkout",
    )
    args = parser.parse_args()
    traces = args.traces or sorted((HERE / "data").glob("*.json"), key=lambda p: p.stat().st_size)
    if not traces:
        sys.exit("no traces: see docs/benchmarks.md to make benchmarks/data/*.json")
    hta_python = None if args.no_hta else find_hta_python(args.hta_python)
    if hta_python is None and not args.no_hta:
        print(
            "HTA skipped: no Python here can import hta. Install it in its own venv:\n"
            "  python3 -m venv /tmp/htavenv && /tmp/htavenv/bin/pip install holistictraceanalysis==0.5.0\n"
            "and pass --hta-python /tmp/htavenv/bin/python",
            file=sys.stderr,
        )
    info = machine()
    for key, value in {**info, **versions(hta_python)}.items():
        print(f"{key}: {value}")
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[:3]
    print(f"load average before: {' '.join(load)} (other work on the machine slows both tools)")
    print(f"runs: {args.runs} per tool and trace (median wall and CPU, largest peak RSS)\n")

    rows = []
    for trace in traces:
        mb = trace.stat().st_size / 1e6
        ours, theirs = Runs(), Runs()
        meta: dict = {}
        for i in range(args.runs):
            meta = bench_stallscope(trace, ours, stallscope_cmd(args.stallscope))
            if hta_python:
                bench_hta(hta_python, trace, theirs)
            print(
                f"  {trace.name} run {i + 1}: stallscope {ours.wall[-1]:.2f} s {ours.rss_mb[-1]:.0f} MB"
                + (
                    f"; HTA {theirs.wall[-1]:.2f} s {theirs.rss_mb[-1]:.0f} MB"
                    if hta_python
                    else ""
                ),
                file=sys.stderr,
            )
        rows.append((trace, mb, meta.get("event_count"), ours, theirs if hta_python else None))

    print(
        "| input | MB | events | stallscope s | HTA s | stallscope MB/s | HTA MB/s | ratio"
        " | stallscope CPU s | HTA CPU s | CPU ratio | stallscope peak RSS MB | HTA peak RSS MB"
        " | in-process s (stallscope / HTA) |"
    )
    print("|---|" + "---:|" * 13)
    verdicts = []
    for trace, mb, events, ours, theirs in rows:
        t = theirs or Runs(wall=[float("nan")], cpu=[float("nan")], rss_mb=[float("nan")])
        ratio = t.median / ours.median
        cells = [
            trace.name,
            f"{mb:.1f}",
            f"{events:,}",
            f"{ours.median:.2f}",
            f"{t.median:.2f}",
            f"{mb / ours.median:.1f}",
            f"{mb / t.median:.1f}",
            f"{ratio:.1f}x",
            f"{ours.median_cpu:.2f}",
            f"{t.median_cpu:.2f}",
            f"{t.median_cpu / ours.median_cpu:.1f}x",
            f"{ours.peak:.0f}",
            f"{t.peak:.0f}",
            f"{statistics.median(ours.inner):.2f} / "
            + (f"{statistics.median(t.inner):.2f}" if t.inner else "-"),
        ]
        print("| " + " | ".join(cells).replace("nan", "-") + " |")
        if theirs:
            verdicts.append(
                f"{trace.name}: throughput {ratio:.1f}x HTA's (target >= {TARGET_RATIO:.0f}x:"
                f" {'met' if ratio >= TARGET_RATIO else 'NOT met'}); peak RSS {ours.peak:.0f} MB"
                f" vs HTA's {theirs.peak:.0f} MB ({'met' if ours.peak <= theirs.peak else 'NOT met'})"
            )
    print()
    for verdict in verdicts:
        print(verdict)
    return 0


if __name__ == "__main__":
    sys.exit(main())
