"""One rank's canonical tables in Arrow, and how a parser's output is conformed to them.

The tables and their columns are declared once, in :mod:`stallscope.schema`
(docs/schema.md is generated from it). Times are int64 nanoseconds on the
trace's own clock; names are interned in ``names`` (``name_id`` columns
elsewhere). One :class:`CanonicalTrace` is one rank of one job.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from stallscope.schema import TABLE_NAMES, arrow_schema, empty_table

# canonical devices column -> Kineto ``deviceProperties`` key (nsys and ncu readers
# build the same dicts); types from the declared ``devices`` table.
DEVICE_KEYS: dict[str, str] = {
    "name": "name",
    "compute_major": "computeMajor",
    "compute_minor": "computeMinor",
    "sm_count": "numSms",
    "regs_per_sm": "regsPerMultiprocessor",
    "regs_per_block": "regsPerBlock",
    "smem_per_sm": "sharedMemPerMultiprocessor",
    "smem_per_block": "sharedMemPerBlock",
    "smem_per_block_optin": "sharedMemPerBlockOptin",
    "max_threads_per_sm": "maxThreadsPerMultiprocessor",
    "max_threads_per_block": "maxThreadsPerBlock",
    "max_blocks_per_sm": "maxBlocksPerMultiprocessor",
    "warp_size": "warpSize",
    "total_mem_bytes": "totalGlobalMem",
}


class CanonicalTrace:
    """One rank's data in canonical form, ready for the store: its tables by their declared
    name (:data:`stallscope.schema.TABLES`), read and set as attributes (``trace.gpu``,
    ``trace.memory = table``) or given as keywords. A table a format does not provide is left
    out and reads as the declared empty table; a name the schema does not declare is an error.
    A table added to the schema needs nothing here. A parser may hold a big table as an
    ``ingest.streamed.WrittenTable`` instead (already written to Parquet, batch by batch: the
    ingest moves that file into the trace's folder).
    """

    def __init__(
        self,
        *,
        event_count: int = 0,
        dropped_events: int = 0,
        warnings: list[str] | None = None,
        **tables: pa.Table,
    ) -> None:
        unknown = sorted(set(tables) - set(TABLE_NAMES))
        if unknown:
            raise TypeError(f"CanonicalTrace: no declared table {unknown} (stallscope/schema.py)")
        self._tables: dict[str, pa.Table] = dict(tables)
        self.event_count = event_count
        self.dropped_events = dropped_events
        self.warnings = list(warnings or [])

    def __getattr__(self, name: str) -> pa.Table:
        if name.startswith("_") or name not in TABLE_NAMES:
            raise AttributeError(name)
        return self._tables.setdefault(name, empty_table(name))

    def __setattr__(self, name: str, value: Any) -> None:
        if name in TABLE_NAMES:
            self._tables[name] = value
        else:
            object.__setattr__(self, name, value)

    def tables(self) -> dict[str, pa.Table]:
        """Every declared table, in schema order (empty where not provided)."""
        return {name: getattr(self, name) for name in TABLE_NAMES}


def devices_table(trace_id: str, properties: Any) -> pa.Table:
    """Device limits from a list of Kineto-style ``deviceProperties`` dicts (:data:`DEVICE_KEYS`)."""
    rows = [p for p in properties or [] if isinstance(p, dict)]
    schema = arrow_schema("devices")
    columns: dict[str, list[Any]] = {name: [] for name in schema.names}
    for index, prop in enumerate(rows):
        columns["trace_id"].append(trace_id)
        columns["device"].append(_as_int(prop.get("id", index)))
        for col, key in DEVICE_KEYS.items():
            value = prop.get(key)
            if schema.field(col).type == pa.string():
                columns[col].append(value if isinstance(value, str) and value else None)
            else:
                columns[col].append(_as_int(value))
    return pa.Table.from_pydict(columns, schema=schema)


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and -(1 << 63) <= value < (1 << 63):
        return value
    if isinstance(value, float) and value == value and abs(value) < 9e18:
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def conform(name: str, table: pa.Table) -> pa.Table:
    """``table`` with the declared columns of ``name`` first (missing ones as nulls), extras after.

    A column of another type is cast to the declared type (kept as it is when
    it cannot be cast), so the store's views always have every column,
    whatever format a trace came from.
    """
    if name not in TABLE_NAMES:
        return table
    reference = arrow_schema(name)
    columns, fields = [], []
    for ref_field in reference:
        out_field = ref_field
        if ref_field.name in table.column_names:
            column = table[ref_field.name]
            if column.type != ref_field.type:
                try:
                    column = column.cast(ref_field.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    out_field = ref_field.with_type(column.type)
        else:
            column = pa.nulls(table.num_rows, ref_field.type)
        columns.append(column)
        fields.append(out_field)
    for extra in table.column_names:
        if extra not in reference.names:
            columns.append(table[extra])
            fields.append(table.schema.field(extra))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))
