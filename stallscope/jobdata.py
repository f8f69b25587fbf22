"""Read access to one job's canonical tables, for analyzers and front ends.

A :class:`JobData` wraps the store's Parquet files of the job's traces in a
private in-memory DuckDB connection with views named after the canonical
tables (``gpu``, ``host``, ``ranges``, ``collectives``, ``names``, ``threads``,
``devices``) plus ``catalog``. It is read-only and cheap to create.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import duckdb
import numpy as np

from stallscope.store import Store, TraceRef


class JobData:
    """The traces (ranks) of one job, queryable with SQL."""

    def __init__(self, store: Store, traces: list[TraceRef]):
        self.store = store
        self.traces = sorted(traces, key=lambda r: r.meta.get("rank", 0))
        self.job_id = self.traces[0].job_id if self.traces else ""
        self.cache: dict[
            Any, Any
        ] = {}  # derived results shared by analyzers (e.g. idle attribution)

    @cached_property
    def con(self) -> duckdb.DuckDBPyConnection:
        return self.store.connect(self.traces)

    def sql(self, query: str, params: list[Any] | None = None) -> duckdb.DuckDBPyConnection:
        """Run a query on this job's views; returns the cursor (fetchall/fetchnumpy...)."""
        return self.con.execute(query, params or [])

    def numpy(self, query: str, params: list[Any] | None = None) -> dict[str, np.ndarray]:
        """Query result as a dict of numpy arrays (columnar, no per-row objects)."""
        return self.con.execute(query, params or []).fetchnumpy()

    def devices(self, trace_id: str, kinds: tuple[str, ...] = ("kernel",)) -> list[int]:
        """Devices of a trace with GPU activity of these kinds, ascending (cached)."""
        key = ("devices", trace_id, kinds)
        if key not in self.cache:
            marks = ", ".join("?" for _ in kinds)
            rows = self.sql(
                f"SELECT DISTINCT device FROM gpu WHERE trace_id = ? AND kind IN ({marks}) ORDER BY 1",
                [trace_id, *kinds],
            ).fetchall()
            self.cache[key] = [int(r[0]) for r in rows]
        return self.cache[key]

    def close(self) -> None:
        if "con" in self.__dict__:
            self.con.close()
            del self.__dict__["con"]
