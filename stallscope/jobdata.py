"""Read access to one job's canonical tables, for analyzers and front ends.

A :class:`JobData` wraps the store's Parquet files of the job's traces in a
private in-memory DuckDB connection with a view per canonical table
(:data:`stallscope.schema.TABLES`, docs/schema.md) plus ``catalog``. It is
read-only and cheap to create.

Every query on a view binds and prunes every file under it, so a query about
one trace costs in proportion to the job's rank count: asked once per rank,
such queries cost the square of it. Per-rank work therefore reads a *part*, a
JobData over one rank's traces alone (its timeline and any Nsight Compute
results paired with it): :meth:`JobData.rank_parts` gives each rank's in
turn (``report.analyze_job`` runs the per-rank analyzers on them) and
:meth:`JobData.part_of` the part of one trace (for the per-rank reads of the
analyzers that match collectives across ranks). A job of one rank is its own
part.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import Any

import duckdb
import numpy as np

from stallscope.store import Store, TraceRef, may_hold

# The tables a part loads into memory: those the per-rank analyzers query many times per
# rank (gpu ~24 queries, host and names ~12, ranges ~9); the others (devices, memory: one or
# two; the rest: none) stay views over the rank's files, cheaper to create than to load.
PART_LOADED_TABLES = ("gpu", "host", "names", "ranges")

# DuckDB settings of a job's database while its rank parts are analyzed (JobData.rank_phase).
# A rank's tables are a few thousand rows in one row group: no query of a part runs in
# parallel, and a thread pool only adds hand-offs; and the optimizer passes below, which
# pay off on large inputs, cost ~12 % of a part's instructions (callgrind, docs/benchmarks.md)
# for plans no faster on rows this few (statistics propagation stays: without it a part
# costs more). Only performance settings: results are the same.
RANK_PHASE_THREADS = 1
RANK_PHASE_DISABLED_PASSES = (
    "compressed_materialization", "late_materialization", "common_subplan",
    "join_filter_pushdown", "build_side_probe_side", "common_subexpressions",
    "common_aggregate", "cte_filter_pusher", "filter_pullup", "regex_range",
    "top_n_window_elimination", "window_self_join", "aggregate_reuse",
    "self_join_aggregate", "partial_aggregate_pushdown", "projection_placement",
    "redundant_order_keys", "join_order",
)  # fmt: skip


def rank_phase_settings(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """The settings :meth:`JobData.rank_phase` gives ``con``: one thread, and those of
    :data:`RANK_PHASE_DISABLED_PASSES` this DuckDB has (a pass it does not know would make
    ``SET disabled_optimizers`` fail; older and newer versions name other passes)."""
    known = {row[0] for row in con.execute("SELECT name FROM duckdb_optimizers()").fetchall()}
    passes = [name for name in RANK_PHASE_DISABLED_PASSES if name in known]
    return {"threads": str(RANK_PHASE_THREADS), "disabled_optimizers": ",".join(passes)}


class JobData:
    """The traces (ranks) of one job, queryable with SQL."""

    def __init__(
        self,
        store: Store,
        traces: list[TraceRef],
        *,
        parent: JobData | None = None,
        load: bool = False,
        tables: tuple[str, ...] | None = None,
    ):
        self.store = store
        self.tables = tables  # the canonical tables with a view (None: all)
        self.parent = parent  # a part's job: the part's views live on a cursor of its database
        self.load = load  # a part's tables are read into memory once (for many queries)
        self.traces = sorted(traces, key=lambda r: r.meta.get("rank", 0))
        self.job_id = self.traces[0].job_id if self.traces else ""
        self.cache: dict[
            Any, Any
        ] = {}  # derived results shared by analyzers (e.g. idle attribution)
        self._parts: dict[int, JobData] = {}  # part_of's parts by rank group, open till close()
        self._current = -1  # the rank group of the last part_of

    def rank_groups(self) -> list[list[TraceRef]]:
        """The traces by rank, in rank order (a rank's traces in job order).

        A store job holds one timeline per rank; an Nsight Compute result
        shares the rank of the timeline it describes.
        """
        return [list(group) for group in self._groups]

    @cached_property
    def _groups(self) -> list[list[TraceRef]]:
        groups: dict[Any, list[TraceRef]] = {}
        for ref in self.traces:
            groups.setdefault(ref.meta.get("rank", 0), []).append(ref)
        return list(groups.values())

    @cached_property
    def _group_of(self) -> dict[str, int]:
        """Trace id -> index of its rank's group in ``_groups``."""
        return {r.trace_id: i for i, group in enumerate(self._groups) for r in group}

    def rank_parts(self) -> Iterator[JobData]:
        """One part per rank, in rank order, for many queries on each rank.

        A part is a JobData over one rank's traces whose much-queried tables
        (:data:`PART_LOADED_TABLES`) are read into memory (temporary tables on a
        cursor of this job's database) when it is first queried; its other
        tables are temporary views over the rank's files. Each has its own cache and is closed when the next one
        is asked for (or the loop ends), so at most one rank's rows and derived
        data are held at a time. While the loop runs, this job's database has
        :func:`rank_phase_settings` (:meth:`rank_phase`). A job of one rank yields itself
        (its views, left open, its cache kept; its settings unchanged).
        """
        if len(self._groups) <= 1:
            yield self
            return
        with self.rank_phase():
            for group in self._groups:
                part = JobData(self.store, group, parent=self, load=True)
                try:
                    yield part
                finally:
                    part.close()

    @contextmanager
    def rank_phase(self) -> Iterator[None]:
        """While in this block, this job's database runs with :func:`rank_phase_settings`
        (one thread, fewer optimizer passes: for the many small queries of its rank parts);
        the settings it had are put back at the end. Changes performance only, never a
        result. Use it around the analysis of rank parts, not of the whole job."""
        con = self.con
        settings = rank_phase_settings(con)
        names = list(settings)
        before = con.execute(
            "SELECT " + ", ".join(f"current_setting('{name}')" for name in names)
        ).fetchall()[0]
        try:
            for name, value in settings.items():
                con.execute(f"SET {name} = '{value}'")
            yield
        finally:
            for name, value in zip(names, before, strict=True):
                con.execute(f"SET {name} = '{value}'")

    def part_of(self, trace_id: str) -> JobData:
        """The part of ``trace_id``'s rank, for a few queries: views over that rank's files only.

        ``self`` when the job has one rank. Its results about that rank equal
        the whole job's. Its connection (views: it holds no rows) stays open
        until :meth:`close`, so later passes over the ranks bind nothing
        again; its cache is dropped when a trace of another rank is asked
        for. Raises ``KeyError`` for a trace not in this job.
        """
        index = self._group_of.get(trace_id)
        if index is None:
            raise KeyError(f"trace {trace_id!r} is not in job {self.job_id!r}")
        if len(self._groups) == 1:
            return self
        if index != self._current and self._current in self._parts:
            self._parts[self._current].cache.clear()
        self._current = index
        if index not in self._parts:
            self._parts[index] = JobData(self.store, self._groups[index], parent=self)
        return self._parts[index]

    @cached_property
    def con(self) -> duckdb.DuckDBPyConnection:
        if self.parent is not None:
            load = PART_LOADED_TABLES if self.load else False
            return self.store.connect(self.traces, cursor_of=self.parent.con, load=load)
        return self.store.connect(self.traces, tables=self.tables)

    def may_hold(self, table: str) -> bool:
        """Whether this job's traces may hold rows of canonical ``table`` (by their formats,
        :func:`stallscope.store.may_hold`); when False its view is empty and a query on it
        can be skipped."""
        return may_hold({r.meta.get("source") for r in self.traces}, table)

    def sql(self, query: str, params: list[Any] | None = None) -> duckdb.DuckDBPyConnection:
        """Run a query on this job's views; returns the cursor (fetchall/fetchnumpy...)."""
        return self.con.execute(query, params or [])

    def relation(self, query: str) -> duckdb.DuckDBPyRelation:
        """``query`` as a DuckDB relation (``.to_arrow_table()`` without the DB-API's copy).

        DuckDB (2.x) refuses a relation query while a DB-API result of this connection is
        half read (``sql(...).fetchone()`` leaves the stream open); that result is finished
        first, so whichever analyzer ran before does not matter.
        """
        self.con.execute("SELECT 1").fetchall()  # ends any half-read result
        return self.con.sql(query)

    def numpy(self, query: str, params: list[Any] | None = None) -> dict[str, np.ndarray]:
        """Query result as a dict of numpy arrays (columnar, no per-row objects)."""
        return self.con.execute(query, params or []).fetchnumpy()

    def devices(self, trace_id: str, kinds: tuple[str, ...] = ("kernel",)) -> list[int]:
        """Devices of a trace with GPU activity of these kinds, ascending (cached)."""
        key = ("devices", trace_id, kinds)
        if key not in self.cache:
            found = {d for d, kind in self.device_kinds(trace_id) if kind in kinds}
            self.cache[key] = [int(d) for d in sorted(found)]
        return self.cache[key]

    def device_kinds(self, trace_id: str) -> list[tuple[int | None, str | None]]:
        """The distinct (device, kind) pairs of the trace's ``gpu`` rows, in no set order:
        one query per trace for every analyzer's device lists (cached)."""
        key = ("device_kinds", trace_id)
        if key not in self.cache:
            self.cache[key] = self.sql(
                "SELECT DISTINCT device, kind FROM gpu WHERE trace_id = ?", [trace_id]
            ).fetchall()
        return self.cache[key]

    def steps(self, trace_id: str) -> dict[str, np.ndarray]:
        """The trace's steps (its ``ranges`` rows of kind ``step``): columns ``step``,
        ``start_ns``, ``end_ns`` (ns) as :meth:`numpy` gives them, by start (cached: several
        analyzers read them; callers must not modify the arrays)."""
        key = ("steps", trace_id)
        if key not in self.cache:
            self.cache[key] = self.numpy(
                "SELECT step, start_ns, end_ns FROM ranges WHERE trace_id = ? AND kind = 'step' "
                "ORDER BY start_ns",
                [trace_id],
            )
        return self.cache[key]

    def columns(self, table: str) -> frozenset[str]:
        """The column names of ``table``'s view (cached). A part asks its job: its tables
        are its job's files, which one ingest conformed to one schema."""
        if self.parent is not None:
            return self.parent.columns(table)
        key = ("columns", table)
        if key not in self.cache:
            rows = self.sql(f"SELECT column_name FROM (DESCRIBE {table})").fetchall()
            self.cache[key] = frozenset(row[0] for row in rows)
        return self.cache[key]

    def close(self) -> None:
        for part in self._parts.values():
            part.close()
        self._parts.clear()
        if "con" in self.__dict__:
            self.con.close()
            del self.__dict__["con"]
