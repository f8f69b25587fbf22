"""Whole-process ``stallscope ingest``: another git ref's code against this checkout, alternately.

    python benchmarks/ab_ingest.py TRACE.json ... [--base REF] [--new REF] [--runs 3]

Each run is a fresh ``python -m stallscope.cli ingest --store <new temp dir>
TRACE`` (start-up and imports count), the two versions one after the other,
so a busy machine slows both alike. The base ref's files come from ``git
archive`` (``tools/check_same_ingest.py``) and are imported through
``PYTHONPATH``; both sides use this virtual environment's libraries. Per
trace and side: the median wall seconds, the median CPU seconds (user +
system of the process and everything it waited for: the forked ingest
worker, DuckDB's and Arrow's threads), MB of JSON per CPU second, and the
largest peak memory (``ru_maxrss`` or the PSS summed over the process tree,
:func:`benchlib.run_child`). Every run's figures are printed too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchlib import machine, run_child

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from check_same_ingest import base_tree, merge_base  # noqa: E402


def one_run(
    trace: Path, pythonpath: Path | None, tmp: Path, extra: list[str]
) -> tuple[float, float, float]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    store = tmp / "store"
    cmd = [sys.executable, "-m", "stallscope.cli", "ingest", "--store", str(store), *extra]
    cmd.append(str(trace))
    # From tmp: ``python -m`` puts the current folder first on sys.path.
    wall, cpu, peak, _ = run_child(cmd, env=env, cwd=tmp)
    for path in sorted(store.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    store.rmdir()
    return wall, cpu, peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument(
        "--base",
        default=None,
        help="git ref of the old code (default: where this branch left main, git merge-base)",
    )
    parser.add_argument("--new", default=None, help="git ref of the new code (default: this tree)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--no-analyze",
        action="store_true",
        help="pass --no-analyze to the ingest (the ingest alone, without the stored report)",
    )
    args = parser.parse_args()
    args.base = args.base or merge_base()
    print(machine())
    with tempfile.TemporaryDirectory(prefix="ab-ingest-") as tmp_name:
        tmp = Path(tmp_name)
        new = None if args.new is None else base_tree(args.new, tmp / "new")
        sides = {args.base: base_tree(args.base, tmp / "base"), args.new or "this checkout": new}
        for trace in args.traces:
            mb = trace.stat().st_size / 1e6
            runs: dict[str, list[tuple[float, float, float]]] = {side: [] for side in sides}
            for index in range(args.runs):
                for side, path in sides.items():
                    extra = ["--no-analyze"] if args.no_analyze else []
                    result = one_run(trace.resolve(), path, tmp, extra)
                    runs[side].append(result)
                    wall, cpu, peak = result
                    print(f"  {trace.name} run {index + 1} {side}: {wall:.2f} s, {cpu:.2f} CPU s,"
                          f" {peak:,.0f} MB", flush=True)  # fmt: skip
            for side, rows in runs.items():
                wall = statistics.median(r[0] for r in rows)
                cpu = statistics.median(r[1] for r in rows)
                peak = max(r[2] for r in rows)
                print(f"{trace.name} ({mb:.1f} MB) {side}: {wall:.2f} s wall, {cpu:.2f} CPU s,"
                      f" {mb / cpu:.1f} MB/CPU-s, peak {peak:,.0f} MB ({peak / mb:.2f}x),"
                      f" {len(rows)} runs", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
