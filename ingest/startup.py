"""Process facts and start-up savings shared by the parsers.

``in_cli()`` tells a ``stallscope`` command process from the dashboard,
tests and notebooks; ``skip_pandas_probe()`` saves the command the pandas
import that pyarrow would otherwise make on its first list conversion;
``duckdb_threads()`` sizes the parsers' DuckDB connections to the machine;
``worker_processes()`` says how many forked workers a parallel decode or read
gets (Kineto pieces, nsys tables).
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from typing import Any

import pyarrow as pa


def in_cli() -> bool:
    """True in a ``stallscope`` command process (``python -m stallscope.cli`` or the script)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name == "stallscope.cli":
        return True
    return os.path.basename(getattr(main, "__file__", None) or "") == "stallscope"


def skip_pandas_probe() -> None:
    """In a ``stallscope`` command process, keep pyarrow from importing pandas.

    The first time ``pa.array`` converts a Python list, pyarrow imports pandas
    only to learn whether the list is a pandas object: 0.2-0.5 s and ~45 MB
    that an ingest never uses. Failing that one import makes pyarrow record
    "no pandas"; ``to_pandas()`` and ``from_pandas()`` still import it on
    demand. Only in the CLI (``__main__`` is the ``stallscope`` command), never
    in the dashboard, tests or notebooks, where a pandas object handed to
    ``pa.array`` later would be read as a plain sequence.
    """
    if "pandas" in sys.modules or not in_cli():
        return
    blocker = NoPandas()
    sys.meta_path.insert(0, blocker)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(blocker)


class NoPandas(importlib.abc.MetaPathFinder):
    """An import hook that refuses pandas (used for one probe, then removed)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"{name} is not needed to ingest", name=name)
        return None


MAX_WORKERS = 8  # each worker adds ~35 MB of private memory; past 8 the serial stages dominate
MIN_CPUS = 4  # measured: on 2 CPUs, Kineto decode workers were slower than one process


def worker_processes(worth_it: bool) -> int:
    """Forked worker processes for a parallel decode or read; 1 means none.

    ``STALLSCOPE_DECODE_WORKERS=N`` sets the count anywhere (``1`` turns workers
    off; not a number: off). Otherwise, when ``worth_it`` (the input is big
    enough to pay for them): one per usable CPU, at most MAX_WORKERS, on Linux,
    in the ``stallscope`` command (never in the dashboard server: forking a
    process that runs many threads is not safe), with at least MIN_CPUS CPUs.
    Never on Windows.
    """
    if sys.platform == "win32":
        return 1
    setting = os.environ.get("STALLSCOPE_DECODE_WORKERS", "").strip()
    if setting:
        try:
            return max(1, min(int(setting), MAX_WORKERS))
        except ValueError:
            return 1
    if not worth_it or sys.platform != "linux" or not in_cli():
        return 1
    cpus = len(os.sched_getaffinity(0))
    return min(cpus, MAX_WORKERS) if cpus >= MIN_CPUS else 1


_THREAD_BUDGET: int | None = None


def set_thread_budget(threads: int | None) -> None:
    """Limit the threads one ingest in this process uses (None: no limit, the machine's CPUs).

    A Dask task sets it to its worker's thread count (``stallscope.cluster``): W
    workers on one host each running DuckDB and Arrow with every CPU would put
    W times too many threads on its cores.
    """
    global _THREAD_BUDGET
    _THREAD_BUDGET = threads if threads and threads > 0 else None


def thread_budget() -> int | None:
    """Threads one ingest may use: :func:`set_thread_budget`, else ``$STALLSCOPE_THREADS``,
    else None (as many as the machine has, within each stage's own cap)."""
    if _THREAD_BUDGET is not None:
        return _THREAD_BUDGET
    try:
        value = int(os.environ.get("STALLSCOPE_THREADS", "") or 0)
    except ValueError:
        return None
    return value if value > 0 else None


def duckdb_threads() -> int:
    """DuckDB threads for the parsers' SQL: the usable CPUs, 2 to 8, or the
    :func:`thread_budget` when one is set (at most 8).

    Results never depend on it (file order breaks every tie); 8 keeps the
    memory of parallel sorts in check on big machines.
    """
    budget = thread_budget()
    if budget is not None:
        return min(8, budget)
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 2
    return max(2, min(8, cpus))


_MALLOC_TRIM: Any = None


def give_back_freed_memory() -> None:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim``; elsewhere nothing).

    Arrow's system pool and DuckDB's results are freed into the C heap, which
    keeps most of those pages: after the decode and between the canonical queries
    of a 486 MB trace that was ~100-150 MB of resident memory in use by nothing, on
    top of the next stage's peak. A call costs about a millisecond.
    """
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        _MALLOC_TRIM = False
        if sys.platform == "linux":
            import ctypes
            import ctypes.util

            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                _MALLOC_TRIM = libc.malloc_trim
            except (OSError, AttributeError):  # musl and others: no malloc_trim
                _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)
