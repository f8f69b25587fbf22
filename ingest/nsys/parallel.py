"""Read a big nsys table with several forked processes, one rowid range each.

Python's sqlite3 makes one object per value, so reading a table of millions
of rows is CPU work in the interpreter (most of an nsys ingest). The rows of
``SELECT ... FROM t [WHERE ...]`` are split by rowid into ranges; forked
workers open the file themselves, read their ranges into Arrow and send them
back as IPC streams, which are joined in rowid order: the same table, row
for row, as the one-process read (a plain table scan returns rows in rowid
order, and each range is read the same way).

Where (:func:`read_workers`): on Linux, in the ``stallscope`` command, for
tables of at least :data:`PARALLEL_MIN_ROWS` rows, on machines with at
least ``startup.MIN_CPUS`` usable CPUs, one worker per CPU up to
``startup.MAX_WORKERS`` (``startup.worker_processes``, as for Kineto's decode
workers); ``STALLSCOPE_DECODE_WORKERS=N`` (the same setting as
the Kineto decode workers) sets the count anywhere, ``1`` turns it off. A
worker that dies makes the caller read in one process instead.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import pyarrow as pa

from stallscope.ingest.startup import worker_processes

PARALLEL_MIN_ROWS = 400_000  # below this, forking and sending back cost more than they save
RANGES_PER_WORKER = 4  # smaller ranges even out the workers' shares

# (rows of one range -> Arrow table) for the workers: set just before the pool starts.
ReadRange = Callable[[sqlite3.Connection, int, int], pa.Table]
_JOB: tuple[str, ReadRange] | None = None


class WorkerFailed(Exception):
    """A worker died (killed, out of memory): read in this process instead."""


def read_workers(rows: int) -> int:
    """How many processes read a table of about ``rows`` rows; 1 = this process alone."""
    return worker_processes(rows >= PARALLEL_MIN_ROWS)


def rowid_ranges(lo: int, hi: int, count: int) -> list[tuple[int, int]]:
    """``count`` inclusive ranges covering ``lo..hi`` in order (fewer when there are fewer ids)."""
    count = max(1, min(count, hi - lo + 1))
    step, extra = divmod(hi - lo + 1, count)
    out, start = [], lo
    for i in range(count):
        end = start + step + (1 if i < extra else 0) - 1
        out.append((start, end))
        start = end + 1
    return out


def read_parallel(
    uri: str, ranges: list[tuple[int, int]], read: ReadRange, workers: int
) -> pa.Table:
    """The tables of ``read(connection, first, last)`` over ``ranges``, concatenated in order.

    Exceptions raised by ``read`` in a worker are raised here as they were;
    a dead worker raises :class:`WorkerFailed`.
    """
    global _JOB
    _JOB = (uri, read)
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            parts = [pa.ipc.open_stream(b).read_all() for b in pool.map(_read_in_worker, ranges)]
    except BrokenProcessPool as exc:
        raise WorkerFailed(str(exc)) from None
    finally:
        _JOB = None
    return pa.concat_tables(parts)


_CONNECTION: sqlite3.Connection | None = None  # one per worker process, opened on first use


def _read_in_worker(bounds: tuple[int, int]) -> bytes:
    global _CONNECTION
    assert _JOB is not None, "worker started without a job (not forked?)"
    uri, read = _JOB
    if _CONNECTION is None:
        _CONNECTION = sqlite3.connect(uri, uri=True, check_same_thread=False)
        from stallscope.ingest.nsys.db import harden

        harden(_CONNECTION)
    table = read(_CONNECTION, *bounds)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()
