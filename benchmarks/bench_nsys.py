"""Whole-process load speed and memory on Nsight Systems SQLite exports: stallscope against nsys-ai.

    python benchmarks/bench_nsys.py [FILE.sqlite ...] [--runs 3] [--peer-python PY] [--base CMD]

Each run starts a fresh process, as a user would:

* stallscope: ``stallscope ingest --store <new temp dir> FILE`` (read every
  table it uses, build the canonical tables, write the Parquet store);
* nsys-ai: ``nsys_ai.profile.open(FILE)`` with its default policy, on a symlink
  to FILE in a new temp dir, so nothing is cached: it attaches the export
  through DuckDB's sqlite extension, writes its Parquet cache
  (``FILE.nsys-cache/``: kernels joined to their names, NVTX with text, CUDA
  API, memcpy, memset, sync, overhead, strings, threads, GPUs), opens views
  over it and reads the profile's metadata (devices, streams, counts). With
  ``--peer-mode map`` (or ``both``) it also builds its NVTX -> kernel map at
  load (``NSYS_AI_ALWAYS_BUILD_NVTX_KERNEL_MAP=1``), which its default defers
  to the first NVTX query and which stallscope builds at ingest.

``--base CMD`` times a second stallscope (the code before a change, say) in the
same rounds, so that before and after see the same load. Start-up and imports count. Wall time is measured around the child process;
CPU time (user + system, all threads) and peak RSS are the child's own
``ru_utime + ru_stime`` and ``ru_maxrss`` (from ``os.wait4``). Runs of the tools
alternate, so a busy machine slows all alike; the table gives the median wall
and CPU time and the largest peak RSS over the runs. Throughput ratio is the
peer's median wall time over stallscope's (> 1: stallscope is faster).

nsys-ai lives in its own virtual environment. It needs DuckDB's sqlite
extension, which DuckDB downloads on first use; where that cannot happen (no
network), install the extension from PyPI for the exact DuckDB version::

    python3 -m venv /tmp/nsysaivenv
    /tmp/nsysaivenv/bin/pip install nsys-ai==0.3.0 duckdb==1.5.5 \\
        duckdb-extension-sqlite-scanner==1.5.5

This script then installs the packaged extension into DuckDB's extension
folder once (said so), before any timing. By default the first of this
Python, /tmp/nsysaivenv/bin/python, python3 and python that can import
``nsys_ai`` is used; with none, nsys-ai is skipped (said so).

Default inputs: ``benchmarks/data/nsys/*.sqlite`` (see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchlib import Runs, find_python, machine, run_child, stallscope_cmd

HERE = Path(__file__).resolve().parent
# Issue #15: at least as fast as nsys-ai whole-process, with no more peak memory (the 5x of
# the earlier Nsight issue was left blocked: below Python's start-up on sub-second exports).
TARGET_RATIO = 1.0
MAP_ENV = "NSYS_AI_ALWAYS_BUILD_NVTX_KERNEL_MAP"
# Runs in the peer's Python: the timed load, then a check that it really built its
# cache (its fallbacks, direct SQLite or raw sqlite3, would time something else).
_PEER_RUN = (
    "import logging, sys, time\n"
    "logging.disable(logging.CRITICAL)\n"
    "t = time.perf_counter()\n"
    "import nsys_ai.profile\n"
    "prof = nsys_ai.profile.open(sys.argv[1])\n"
    "seconds = time.perf_counter() - t\n"
    "ok = prof.db is not None and prof.cache_error is None\n"
    "print(f'nsys-ai kernels {prof.meta.kernel_count} nvtx {prof.meta.nvtx_count}')\n"
    "prof.close()\n"
    "if not ok:\n"
    "    sys.exit(f'nsys-ai did not build its cache: {prof.cache_error}')\n"
    "print(f'nsys-ai load seconds: {seconds:.3f}')\n"
)
# Runs in the peer's Python: make DuckDB's sqlite extension loadable without a download.
_PEER_EXTENSION = (
    "import duckdb, pathlib, sys\n"
    "con = duckdb.connect()\n"
    "try:\n"
    "    con.execute('LOAD sqlite_scanner')\n"
    "except duckdb.Error:\n"
    "    try:\n"
    "        import duckdb_extension_sqlite_scanner as pkg\n"
    "    except ImportError:\n"
    "        sys.exit('no sqlite extension for DuckDB ' + duckdb.__version__)\n"
    "    root = pathlib.Path(pkg.__file__).parent\n"
    "    [ext] = root.glob(f'extensions/v{duckdb.__version__}/sqlite_scanner.duckdb_extension')\n"
    "    con.execute(f\"INSTALL '{ext}'\")\n"
    "    con.execute('LOAD sqlite_scanner')\n"
    "    print(f'installed {ext}')\n"
)


def find_peer_python(choice: str | None) -> str | None:
    """The first candidate Python that can import ``nsys_ai`` (exits if ``choice`` cannot)."""
    return find_python("nsys_ai.profile", choice, "/tmp/nsysaivenv/bin/python", "--peer-python")


def prepare_peer(python: str) -> None:
    """Make the peer's DuckDB able to attach SQLite files (exits with the reason if it cannot)."""
    done = subprocess.run([python, "-c", _PEER_EXTENSION], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(
            f"nsys-ai's DuckDB cannot read SQLite: {done.stderr.strip()[-500:]}\n"
            "install the extension for its DuckDB version, e.g.\n"
            "  pip install duckdb==1.5.5 duckdb-extension-sqlite-scanner==1.5.5"
        )
    if done.stdout.strip():
        print(f"nsys-ai setup (once, not timed): {done.stdout.strip()}", file=sys.stderr)


def bench_stallscope(path: Path, runs: Runs, cmd: list[str]) -> list[dict]:
    """One ``stallscope ingest`` into a fresh store; returns the traces' ``meta.json``."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        # Run outside the checkout: with ``python -m``, a checkout in the working
        # directory would shadow the stallscope that ``--stallscope`` asks for.
        argv = [*cmd, "ingest", "--no-analyze", "--store", str(store), str(path.resolve())]
        wall, cpu, rss, _ = run_child(argv, cwd=tmp)
        metas = [json.loads(p.read_text()) for p in sorted(store.glob("jobs/*/*/meta.json"))]
    runs.add(wall, cpu, rss)
    runs.inner.append(max(m["ingest_seconds"] for m in metas))
    return metas


def bench_peer(python: str, path: Path, runs: Runs, build_map: bool) -> None:
    """One ``nsys_ai.profile.open`` on a symlink to ``path`` in a fresh folder (fresh cache)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSYS_AI_")}
    if build_map:
        env[MAP_ENV] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        link = Path(tmp) / path.name
        os.symlink(path.resolve(), link)
        wall, cpu, rss, text = run_child([python, "-c", _PEER_RUN, str(link)], env=env)
        if not (Path(tmp) / f"{link.stem}.nsys-cache").is_dir():
            raise RuntimeError(f"nsys-ai wrote no cache beside {link}:\n{text[-2000:]}")
    runs.add(wall, cpu, rss)
    match = re.search(r"nsys-ai load seconds: ([\d.]+)", text)
    if match:
        runs.inner.append(float(match.group(1)))


def versions(peer_python: str | None) -> dict[str, str]:
    """Versions of stallscope and its readers, and of nsys-ai and its DuckDB."""
    from importlib.metadata import version

    out = {p: version(p) for p in ("stallscope", "duckdb", "pyarrow", "numpy")}
    if peer_python:
        probe = subprocess.run(
            [
                peer_python,
                "-c",
                "from importlib.metadata import version as v; import platform;"
                "print(v('nsys-ai'), v('duckdb'), v('pyarrow'), platform.python_version())",
            ],
            capture_output=True,
            text=True,
        )
        nsys_ai, duckdb, pyarrow, py = probe.stdout.split()
        out.update(
            {
                "nsys-ai": nsys_ai,
                "nsys-ai's duckdb": duckdb,
                "nsys-ai's pyarrow": pyarrow,
                "nsys-ai's python": py,
            }
        )
    return out


def default_inputs() -> list[Path]:
    """``benchmarks/data/nsys/*.sqlite``, smallest first."""
    return sorted((HERE / "data" / "nsys").glob("*.sqlite"), key=lambda p: p.stat().st_size)


@dataclass
class Row:
    """Everything measured on one input."""

    path: Path
    ours: Runs
    peers: dict[str, Runs]  # peer mode -> runs
    base: Runs | None = None  # another stallscope (``--base``: before a change), if asked
    events: int = 0  # host + GPU events over the traces stallscope wrote
    traces: int = 0


def measure(path: Path, args: argparse.Namespace, peer: str | None, modes: list[str]) -> Row:
    """Alternate the tools ``args.runs`` times on ``path``; a failing tool is recorded, not fatal."""
    row = Row(path, Runs(), {mode: Runs() for mode in modes} if peer else {})
    row.base = Runs() if args.base else None
    for i in range(args.runs):
        if row.base is not None and row.base.error is None:
            try:
                bench_stallscope(path, row.base, stallscope_cmd(args.base))
            except RuntimeError as exc:
                row.base.error = _last_line(str(exc))
        if row.ours.error is None:
            try:
                metas = bench_stallscope(path, row.ours, stallscope_cmd(args.stallscope))
                row.events = sum(m["event_count"] for m in metas)
                row.traces = len(metas)
            except RuntimeError as exc:
                row.ours.error = _last_line(str(exc))
        for mode, runs in row.peers.items():
            if runs.error is None:
                try:
                    bench_peer(peer, path, runs, build_map=mode == "map")
                except RuntimeError as exc:
                    runs.error = _last_line(str(exc))
        said = [f"stallscope {_said(row.ours)}"]
        said += [f"base {_said(row.base)}"] if row.base is not None else []
        said += [
            f"nsys-ai{'' if m == 'default' else ' +map'} {_said(r)}" for m, r in row.peers.items()
        ]
        print(f"  {path.name} run {i + 1}: " + "; ".join(said), file=sys.stderr)
    return row


def _said(runs: Runs) -> str:
    if runs.error:
        return f"failed ({runs.error})"
    return f"{runs.wall[-1]:.2f} s {runs.rss_mb[-1]:.0f} MB"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "failed"


def table(rows: list[Row]) -> list[str]:
    """The markdown table: one line per input and peer mode."""
    out = [
        "| input | MB | events | peer | stallscope s | peer s | ratio | stallscope CPU s"
        " | peer CPU s | CPU ratio | stallscope peak RSS MB | peer peak RSS MB"
        " | in-process s (stallscope / peer) |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        mb = row.path.stat().st_size / 1e6
        peers = row.peers or {"-": Runs(error="skipped")}
        sides = [("", row.ours)] + ([(" (base)", row.base)] if row.base is not None else [])
        for (side, ours), (mode, theirs) in itertools.product(sides, peers.items()):
            label = {"default": "nsys-ai", "map": "nsys-ai +map"}.get(mode, "-")
            cells = [
                row.path.name + side,
                f"{mb:.1f}",
                f"{row.events:,}" if row.events else "-",
                label,
                _cell(ours, ours.median),
                _cell(theirs, theirs.median),
                _ratio(theirs.median, ours.median),
                _cell(ours, ours.median_cpu),
                _cell(theirs, theirs.median_cpu),
                _ratio(theirs.median_cpu, ours.median_cpu),
                _cell(ours, ours.peak, "{:.0f}"),
                _cell(theirs, theirs.peak, "{:.0f}"),
                f"{_inner(ours)} / {_inner(theirs)}",
            ]
            out.append("| " + " | ".join(cells) + " |")
    return out


def _cell(runs: Runs, value: float, fmt: str = "{:.2f}") -> str:
    if runs.error:
        return "fails" if runs.error != "skipped" else "-"
    return fmt.format(value)


def _ratio(theirs: float, ours: float) -> str:
    if theirs != theirs or ours != ours:  # NaN: a tool failed or was skipped
        return "-"
    return f"{theirs / ours:.2f}x"


def _inner(runs: Runs) -> str:
    return f"{statistics.median(runs.inner):.2f}" if runs.inner and not runs.error else "-"


def verdicts(rows: list[Row]) -> list[str]:
    """One line per input and peer mode: the throughput target and the memory comparison."""
    out = []
    for row in rows:
        for mode, theirs in row.peers.items():
            ours = row.ours
            name = "nsys-ai" + ("" if mode == "default" else " +map")
            if ours.error or theirs.error:
                who = "stallscope" if ours.error else name
                out.append(f"{row.path.name} vs {name}: {who} failed: {ours.error or theirs.error}")
                continue
            ratio = theirs.median / ours.median
            out.append(
                f"{row.path.name} vs {name}: throughput {ratio:.2f}x (target >= {TARGET_RATIO:.0f}x:"
                f" {'met' if ratio >= TARGET_RATIO else 'NOT met'}); peak RSS {ours.peak:.0f} MB"
                f" vs {theirs.peak:.0f} MB (target: no more:"
                f" {'met' if ours.peak <= theirs.peak else 'NOT met'})"
            )
    return out


def totals(rows: list[Row]) -> list[str]:
    """Throughput over several inputs together: total MB over the sum of median wall times."""
    done = [r for r in rows if not r.ours.error]
    if len(done) < 2:
        return []
    out = []
    for mode in done[0].peers:
        both = [r for r in done if not r.peers[mode].error]
        if len(both) < 2:
            continue
        mb = sum(r.path.stat().st_size for r in both) / 1e6
        ours = sum(r.ours.median for r in both)
        theirs = sum(r.peers[mode].median for r in both)
        name = "nsys-ai" + ("" if mode == "default" else " +map")
        out.append(
            f"all {len(both)} inputs both tools read ({mb:.1f} MB): stallscope {ours:.2f} s"
            f" ({mb / ours:.1f} MB/s), {name} {theirs:.2f} s ({mb / theirs:.1f} MB/s),"
            f" ratio {theirs / ours:.2f}x"
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("inputs", nargs="*", type=Path, help="nsys SQLite exports (.sqlite)")
    parser.add_argument("--runs", type=int, default=3, help="runs per tool and input (default 3)")
    parser.add_argument("--peer-python", default=None, help="a Python that can import nsys_ai")
    parser.add_argument("--no-peer", action="store_true", help="time stallscope alone")
    parser.add_argument(
        "--peer-mode",
        choices=("default", "map", "both"),
        default="default",
        help="nsys-ai as installed (default), with its NVTX->kernel map built at load (map), or both",
    )
    parser.add_argument(
        "--base",
        default=None,
        metavar="CMD",
        help="another stallscope to time in the same rounds (e.g. the code before a change,"
        " as --stallscope); its rows are marked (base)",
    )
    parser.add_argument(
        "--stallscope",
        default=None,
        metavar="CMD",
        help="command that runs stallscope (default: the stallscope next to this Python);"
        " e.g. 'env PYTHONPATH=/tmp/old python -m stallscope.cli' to time another checkout",
    )
    args = parser.parse_args()
    inputs = args.inputs or default_inputs()
    if not inputs:
        sys.exit("no inputs: see docs/benchmarks.md to make benchmarks/data/nsys/*.sqlite")
    peer = None if args.no_peer else find_peer_python(args.peer_python)
    if peer is None and not args.no_peer:
        print(
            "nsys-ai skipped: no Python here can import nsys_ai. Install it in its own venv:\n"
            "  python3 -m venv /tmp/nsysaivenv && /tmp/nsysaivenv/bin/pip install nsys-ai==0.3.0"
            " duckdb==1.5.5 duckdb-extension-sqlite-scanner==1.5.5\n"
            "and pass --peer-python /tmp/nsysaivenv/bin/python",
            file=sys.stderr,
        )
    if peer:
        prepare_peer(peer)
    modes = ["default", "map"] if args.peer_mode == "both" else [args.peer_mode]
    for key, value in {**machine(), **versions(peer)}.items():
        print(f"{key}: {value}")
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[:3]
    print(f"load average before: {' '.join(load)} (other work on the machine slows both tools)")
    print(f"runs: {args.runs} per tool and input (median wall and CPU, largest peak RSS)\n")
    rows = [measure(path, args, peer, modes) for path in inputs]
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[:3]
    print("\n".join(table(rows)))
    print(f"\nload average after: {' '.join(load)}")
    for line in totals(rows) + verdicts(rows):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
