"""Canonical tables a parser streams to Parquet itself, batch by batch, never whole in memory.

A parser whose output comes from a query (nsys: DuckDB) can hand
:func:`write_split` a record-batch reader of the rows of *every* trace of its
file, sorted by the trace index ``tix``; each trace's rows go to that trace's
own Parquet file as they come, conformed to the declared schema
(``canonical.conform``) and compressed as the ingest writes every table
(:data:`PARQUET_OPTIONS`). The trace's :class:`CanonicalTrace` then holds a
:class:`WrittenTable` in place of an Arrow table: the file, its row count and
what the ingest's checks need (``limits.check_times``: the smallest and
largest start and end; ``limits.negative_durations``: rows whose end was
before their start, written with duration 0, as the ingest repairs them).
The ingest moves the file into the trace's folder instead of writing it.

The files are the same rows, values, types and order as writing the
materialised tables; only the row-group boundaries may differ (a batch's
rows of one trace form one group). Where that cannot be promised, a column
not already of its declared type (``conform`` would cast the whole table, or
keep it uncast when some value does not fit), :func:`write_split` returns
None before writing anything and the caller materialises the table instead.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from stallscope.ingest.canonical import conform
from stallscope.schema import TABLE_NAMES, arrow_schema

PARQUET_OPTIONS = {"compression": "zstd", "compression_level": 1}  # every canonical table's file
BATCH_ROWS = 1 << 20  # pyarrow's default row group (1 Mi rows): about one group per batch
_IN_FLIGHT = 2  # pieces queued for the writer thread at most (bounds the memory held)
_TIMES = ("start_ns", "end_ns")


@dataclass
class WrittenTable:
    """One canonical table already written to ``path`` by its parser (module docstring).

    ``bounds``: column (``start_ns``, ``end_ns``) -> (min, max) over the rows
    as parsed (None, None when no value), before any repair;
    ``negative_durations``: rows whose ``end_ns`` was before ``start_ns``
    (written with ``end_ns = start_ns``); ``name_ids``: the distinct
    ``name_id`` values of the rows (the trace's ``names`` table keeps those).
    """

    path: Path
    num_rows: int
    column_names: list[str]
    bounds: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    negative_durations: int = 0
    name_ids: pa.Array = field(default_factory=lambda: pa.array([], pa.int32()))

    def move_to(self, target: Path) -> None:
        """Put the file at ``target`` (same filesystem: the ingest's staging folder); ``path``
        names it there from then on."""
        os.replace(self.path, target)
        self.path = target


def exact_types(table: str, schema: pa.Schema) -> bool:
    """Whether every declared column of ``table`` in ``schema`` is already of its declared type."""
    if table not in TABLE_NAMES:
        return False
    declared = arrow_schema(table)
    return all(schema.field(f.name).type == f.type for f in declared if f.name in schema.names)


def write_split(
    reader: pa.RecordBatchReader, table: str, paths: list[Path]
) -> list[WrittenTable] | None:
    """Write the rows of ``reader`` (sorted by ``tix``, 0 .. len(paths) - 1) to ``paths[tix]``.

    A reader without a ``tix`` column (one trace's rows) needs one path: every
    row goes there. Returns one :class:`WrittenTable` per path (a trace without
    rows gets an empty file of the same schema), or None, having written
    nothing, when a column is not of its declared type (module docstring).
    """
    split = "tix" in reader.schema.names
    if not split and len(paths) != 1:
        raise ValueError("write_split: rows without a tix column go to exactly one path")
    body_schema = pa.schema([f for f in reader.schema if f.name != "tix"])
    if not exact_types(table, body_schema):
        return None
    schema = conform(table, body_schema.empty_table()).schema
    parts = [_Part(path, schema) for path in paths]
    pending: deque[Future] = deque()
    # One writer thread: Arrow encodes and compresses without the GIL while the next
    # batch comes from the query; FIFO, so each file gets its pieces in order.
    with ThreadPoolExecutor(max_workers=1) as writer:
        try:
            for batch in reader:
                if batch.num_rows == 0:
                    continue
                if split:
                    tix = batch.column("tix").to_numpy(zero_copy_only=False)
                    bounds = np.searchsorted(tix, np.arange(len(paths) + 1), side="left")
                    body = pa.Table.from_batches([batch]).drop_columns(["tix"])
                else:
                    bounds = np.array([0, batch.num_rows])
                    body = pa.Table.from_batches([batch])
                for index, part in enumerate(parts):
                    lo, hi = int(bounds[index]), int(bounds[index + 1])
                    if hi > lo:
                        piece = conform(table, body.slice(lo, hi - lo))
                        pending.append(writer.submit(part.add, piece))
                while len(pending) > _IN_FLIGHT:
                    pending.popleft().result()
            while pending:
                pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
            wait(pending)
            written = [part.close() for part in parts]
    return written


class _Part:
    """One trace's file: written piece by piece, with the stats of :class:`WrittenTable`."""

    def __init__(self, path: Path, schema: pa.Schema):
        self.path, self.schema = path, schema
        self.writer = pq.ParquetWriter(path, schema, **PARQUET_OPTIONS)
        self.rows, self.negative = 0, 0
        self.lows: dict[str, list[int]] = {c: [] for c in _TIMES if c in schema.names}
        self.highs: dict[str, list[int]] = {c: [] for c in self.lows}
        self.ids: list[pa.Array] = []

    def add(self, piece: pa.Table) -> None:
        for column in self.lows:
            bounds = pc.min_max(piece[column])
            if bounds["min"].is_valid:
                self.lows[column].append(bounds["min"].as_py())
                self.highs[column].append(bounds["max"].as_py())
        if len(self.lows) == 2:
            backwards = int(pc.sum(pc.less(piece["end_ns"], piece["start_ns"])).as_py() or 0)
            if backwards:
                ends = pc.max_element_wise(piece["end_ns"], piece["start_ns"])
                index = piece.schema.get_field_index("end_ns")
                piece = piece.set_column(index, piece.schema.field(index), ends)
                self.negative += backwards
        if "name_id" in piece.column_names:
            self.ids.append(pc.unique(piece["name_id"]))
        self.writer.write_table(piece, row_group_size=BATCH_ROWS)
        self.rows += piece.num_rows

    def close(self) -> WrittenTable:
        self.writer.close()
        ids_type = (
            self.schema.field("name_id").type if "name_id" in self.schema.names else pa.int32()
        )
        ids = pa.chunked_array(self.ids, type=ids_type) if self.ids else pa.array([], ids_type)
        return WrittenTable(
            path=self.path,
            num_rows=self.rows,
            column_names=list(self.schema.names),
            bounds={
                c: (min(lo), max(self.highs[c])) if lo else (None, None)
                for c, lo in self.lows.items()
            },
            negative_durations=self.negative,
            name_ids=pc.unique(ids) if len(ids) else pa.array([], ids_type),
        )
