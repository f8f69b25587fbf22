"""The canonical tables every ingest format produces (see docs/schema.md).

Times are int64 nanoseconds on the trace's own clock; names are interned in
``names`` (``name_id`` columns elsewhere). One :class:`CanonicalTrace` is one
rank of one job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

TABLES = (
    "gpu", "host", "ranges", "collectives", "names", "threads", "devices", "kernel_metrics", "memory",
)  # fmt: skip

DEVICE_COLUMNS: dict[str, tuple[str, pa.DataType]] = {
    # canonical column: (Kineto deviceProperties key, type)
    "name": ("name", pa.string()),
    "compute_major": ("computeMajor", pa.int32()),
    "compute_minor": ("computeMinor", pa.int32()),
    "sm_count": ("numSms", pa.int32()),
    "regs_per_sm": ("regsPerMultiprocessor", pa.int32()),
    "regs_per_block": ("regsPerBlock", pa.int32()),
    "smem_per_sm": ("sharedMemPerMultiprocessor", pa.int64()),
    "smem_per_block": ("sharedMemPerBlock", pa.int64()),
    "smem_per_block_optin": ("sharedMemPerBlockOptin", pa.int64()),
    "max_threads_per_sm": ("maxThreadsPerMultiprocessor", pa.int32()),
    "max_threads_per_block": ("maxThreadsPerBlock", pa.int32()),
    "max_blocks_per_sm": ("maxBlocksPerMultiprocessor", pa.int32()),
    "warp_size": ("warpSize", pa.int32()),
    "total_mem_bytes": ("totalGlobalMem", pa.int64()),
}

# Nsight Compute metrics, one row per (profiled kernel, metric); docs/schema.md.
KERNEL_METRICS_SCHEMA = pa.schema(
    [("trace_id", pa.string()), ("kernel_index", pa.int64()), ("name_id", pa.int32()),
     ("pid", pa.int64()), ("device", pa.int32()), ("stream", pa.int64())]
    + [(f"{kind}_{axis}", pa.int32()) for kind in ("grid", "block") for axis in "xyz"]
    + [("section", pa.string()), ("metric", pa.string()), ("value", pa.float64()),
       ("value_text", pa.string()), ("unit", pa.string()),
       ("timeline_trace_id", pa.string()), ("timeline_name_id", pa.int32()),
       ("timeline_correlation", pa.int64()), ("timeline_start_ns", pa.int64()),
       ("timeline_end_ns", pa.int64())]
)  # fmt: skip


# GPU caching-allocator events, one row per allocation or free; docs/schema.md.
MEMORY_SCHEMA = pa.schema(
    [("trace_id", pa.string()), ("device", pa.int32()), ("ts_ns", pa.int64()),
     ("bytes", pa.int64()), ("total_allocated", pa.int64()), ("total_reserved", pa.int64()),
     ("addr", pa.int64()), ("pid", pa.int64()), ("tid", pa.int64()),
     ("external_id", pa.int64()), ("seq", pa.int64()), ("source", pa.string()),
     ("action", pa.string()), ("stack", pa.string())]
)  # fmt: skip


@dataclass
class CanonicalTrace:
    """One rank's data in canonical form, ready for the store."""

    gpu: pa.Table
    host: pa.Table
    ranges: pa.Table
    collectives: pa.Table
    names: pa.Table
    threads: pa.Table
    devices: pa.Table
    kernel_metrics: pa.Table = field(default_factory=KERNEL_METRICS_SCHEMA.empty_table)
    memory: pa.Table = field(default_factory=MEMORY_SCHEMA.empty_table)
    event_count: int = 0
    dropped_events: int = 0
    warnings: list[str] = field(default_factory=list)

    def tables(self) -> dict[str, pa.Table]:
        return {name: getattr(self, name) for name in TABLES}


def devices_table(trace_id: str, properties: Any) -> pa.Table:
    """Device limits from a list of Kineto-style ``deviceProperties`` dicts."""
    rows = [p for p in properties or [] if isinstance(p, dict)]
    columns: dict[str, list[Any]] = {"trace_id": [], "device": []}
    for col in DEVICE_COLUMNS:
        columns[col] = []
    for index, prop in enumerate(rows):
        columns["trace_id"].append(trace_id)
        columns["device"].append(_as_int(prop.get("id", index)))
        for col, (key, dtype) in DEVICE_COLUMNS.items():
            value = prop.get(key)
            if dtype == pa.string():
                columns[col].append(value if isinstance(value, str) and value else None)
            else:
                columns[col].append(_as_int(value))
    schema = pa.schema(
        [("trace_id", pa.string()), ("device", pa.int32())]
        + [(col, dtype) for col, (_, dtype) in DEVICE_COLUMNS.items()]
    )
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


_ARROW_TYPES = {
    "int64": pa.int64(),
    "int32": pa.int32(),
    "string": pa.string(),
    "double": pa.float64(),
    "bool": pa.bool_(),
}


def reference_schemas() -> dict[str, pa.Schema]:
    """The canonical schema of every table, as the Kineto parser writes it.

    Kineto's SQL is the reference layout (docs/schema.md); every other parser
    is conformed to it before writing, so the store's views always have every
    column, whatever format a trace came from. Read from the generated
    ``reference_schemas`` module (``tools/gen_reference_schemas.py``, checked
    by a test) rather than by running that SQL on an empty trace in every
    process.
    """
    global _REFERENCE
    if _REFERENCE is None:
        from stallscope.ingest.reference_schemas import COLUMNS

        _REFERENCE = {
            table: pa.schema([pa.field(name, _ARROW_TYPES[kind]) for name, kind in columns])
            for table, columns in COLUMNS.items()
        }
    return _REFERENCE


_REFERENCE: dict[str, pa.Schema] | None = None


def conform(name: str, table: pa.Table) -> pa.Table:
    """``table`` with the reference columns of ``name`` first (missing ones as nulls), extras after."""
    reference = reference_schemas().get(name)
    if reference is None:
        return table
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
