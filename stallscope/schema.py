"""The canonical tables, declared once: each column's name, type, meaning and the formats that fill it.

Everything else is derived from :data:`TABLES` or tested against it:

* the Arrow schemas every parser's output is conformed to before it is
  written (:func:`arrow_schema`, ``stallscope.ingest.canonical.conform``);
* the store's views: a table that no trace of a job has a file for is an
  empty view with these columns (:data:`EMPTY_SELECTS`, ``stallscope.store``);
* the column tables of docs/schema.md (``tools/gen_schema_docs.py`` writes
  them; tests/test_schema.py fails when they drift);
* the checks that each format's parser writes these columns in this order
  and fills only the columns declared for it (tests/test_schema.py, on the
  sample traces).

Adding a table: declare it here, give ``CanonicalTrace``
(``stallscope.ingest.canonical``) a field for it, fill it in the parser of
each format that provides it, and run ``python tools/gen_schema_docs.py``.
Adding a column: declare it here, fill it in the parsers (the Kineto SQL,
``stallscope.ingest.kineto.canonical``, writes every column in this order;
other parsers are conformed), run the doc tool.

This module imports nothing heavy (pyarrow only inside :func:`arrow_schema`):
the store and the CLI's start-up read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

# The formats that write canonical tables (``source`` in each trace's catalog row).
KINETO, NSYS, NCU, SNAPSHOT = "kineto", "nsys", "ncu", "memory-snapshot"
TIMELINE = (KINETO, NSYS)

# Column types: Arrow name -> (DuckDB name, docs name).
TYPES = {
    "string": ("VARCHAR", "text"),
    "int32": ("INTEGER", "int32"),
    "int64": ("BIGINT", "int64"),
    "double": ("DOUBLE", "double"),
    "bool": ("BOOLEAN", "bool"),
}


@dataclass(frozen=True)
class Column:
    """One column: ``type`` is a key of :data:`TYPES`; ``formats`` the formats that fill it
    (``None``: every format of its table); every column may be NULL."""

    name: str
    type: str
    meaning: str
    formats: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Table:
    """One canonical table: one Parquet file per trace, one view per store or job."""

    name: str
    title: str
    formats: tuple[str, ...]  # the formats whose traces may hold rows of it
    columns: tuple[Column, ...]

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def filled_by(self, column: Column) -> tuple[str, ...]:
        return self.formats if column.formats is None else column.formats


def _c(name: str, type_: str, meaning: str, *formats: str) -> Column:
    return Column(name, type_, meaning, formats or None)


_TRACE = _c("trace_id", "string", "the trace (12 hex digits; `catalog.trace_id`)")
_NAME_ID = "name, interned in `names`"

GPU = Table("gpu", "GPU activities", TIMELINE, (
    _TRACE,
    _c("device", "int32", "GPU index (Kineto `args.device`, else `pid`; nsys `deviceId`, for sync rows the GPU of their context)"),
    _c("stream", "int64", "stream id (Kineto `args.stream`, else the number in `tid`; nsys `streamId`); -1 when unknown"),
    _c("kind", "string", "`kernel`, `memcpy`, `memset`, `sync`"),
    _c("start_ns", "int64", "start, ns on the trace's clock"),
    _c("end_ns", "int64", "end, ns (exclusive)"),
    _c("name_id", "int32", "kernel / copy / sync " + _NAME_ID),
    _c("correlation", "int64", "links to the launching runtime/driver call in `host`"),
    _c("external_id", "int64", "links to the CPU operator (Kineto `External id`)", KINETO),
    _c("grid_x", "int32", "launch grid, x (blocks)"),
    _c("grid_y", "int32", "launch grid, y"),
    _c("grid_z", "int32", "launch grid, z"),
    _c("block_x", "int32", "block, x (threads)"),
    _c("block_y", "int32", "block, y"),
    _c("block_z", "int32", "block, z"),
    _c("registers_per_thread", "int32", "registers per thread"),
    _c("shared_mem_bytes", "int64", "static + dynamic shared memory per block"),
    _c("static_shared_mem_bytes", "int64", "static shared memory per block (nsys splits it; Kineto does not)", NSYS),
    _c("dynamic_shared_mem_bytes", "int64", "dynamic shared memory per block", NSYS),
    _c("bytes", "int64", "bytes copied or set"),
    _c("copy_kind", "string", "`HtoD`, `DtoH`, `DtoD`, `HtoH`, `PtoP`"),
    _c("src_kind", "string", "memory kind: `pageable`, `pinned`, `device`, `managed`, `array`, `host` (pinned-ness unknown)"),
    _c("dst_kind", "string", "as `src_kind`; a memset's kind is its `dst_kind`"),
    _c("sync_kind", "string", "`event_sync`, `stream_sync`, `context_sync`, `stream_wait_event`"),
    _c("est_occupancy_pct", "double", "Kineto's `est. achieved occupancy %`: a grid-capped estimate, **not a measurement**", KINETO),
    _c("blocks_per_sm", "double", "Kineto's launch estimate", KINETO),
    _c("warps_per_sm", "double", "Kineto's launch estimate", KINETO),
    _c("is_comm", "bool", "a communication kernel (see below)"),
))  # fmt: skip

HOST = Table("host", "host activities", TIMELINE, (
    _TRACE,
    _c("pid", "int64", "process (a non-numeric label gets a stable 62-bit hash)"),
    _c("tid", "int64", "thread (as `pid`)"),
    _c("kind", "string", "`cpu_op`, `runtime` (CUDA/HIP runtime API), `driver` (CUDA driver API such as `cuLaunchKernelEx`), `python`, `annotation` (`record_function`, `ProfilerStep#N`, NVTX ranges), `overhead`, `osrt` (an OS runtime call traced by nsys: `read`, `pthread_cond_wait`, `clock_nanosleep`, …)"),
    _c("start_ns", "int64", "start, ns"),
    _c("end_ns", "int64", "end, ns (exclusive)"),
    _c("name_id", "int32", _NAME_ID),
    _c("correlation", "int64", "runtime/driver calls: matches `gpu.correlation`"),
    _c("external_id", "int64", "Kineto `External id`", KINETO),
    _c("input_dims", "string", "operator input shapes, Kineto `Input Dims` (older traces: `Input dims`) as its JSON text, one list per input (`[[128, 1], [32768, 2048], []]`; `[]` for a scalar or a non-tensor); NULL when the trace was profiled without `record_shapes=True`", KINETO),
    _c("input_types", "string", "Kineto `Input type` as its JSON text (`[\"long int\", \"c10::BFloat16\", \"Scalar\"]`), beside `input_dims`", KINETO),
))  # fmt: skip

RANGES = Table("ranges", "steps and annotations", TIMELINE, (
    _TRACE,
    _c("kind", "string", "`step` (`ProfilerStep#N`; from nsys also an NVTX `step N` range, see [formats/nsys.md](formats/nsys.md#steps)), `annotation` (host `record_function`/user ranges), `gpu_annotation` (ranges projected on a GPU stream; nsys: per NVTX range, device and stream, the span of the GPU work launched inside it), `nvtx` (an NVTX range that is not a step)"),
    _c("name_id", "int32", _NAME_ID),
    _c("domain", "string", "NVTX domain (NULL for the default domain, `NCCL` for NCCL's ranges)", NSYS),
    _c("pid", "int64", "process of a host range"),
    _c("tid", "int64", "thread of a host range"),
    _c("device", "int32", "GPU of a GPU-projected range"),
    _c("stream", "int64", "stream of a GPU-projected range"),
    _c("start_ns", "int64", "start, ns"),
    _c("end_ns", "int64", "end, ns (exclusive)"),
    _c("step", "int64", "N of `ProfilerStep#N` (or of an NVTX `step N`)"),
    _c("external_id", "int64", "Kineto `External id`", KINETO),
))  # fmt: skip

COLLECTIVES = Table("collectives", "one row per communication kernel per rank", TIMELINE, (
    _TRACE,
    _c("rank", "int32", "the trace's rank"),
    _c("device", "int32", "GPU index"),
    _c("stream", "int64", "stream id"),
    _c("pg_name", "string", "process group name; nsys: the NCCL communicator id when its NVTX payload was exported"),
    _c("pg_desc", "string", "process group description", KINETO),
    _c("pg_ranks", "string", "process group ranks (`\"[0, 1]\"`)", KINETO),
    _c("group_size", "int32", "process group size", KINETO),
    _c("seq", "int64", "collective sequence number when the trace records it", KINETO),
    _c("order_in_group", "int64", "0-based order of this collective within its process group on this device (the fallback for matching across ranks)"),
    _c("op", "string", "`allreduce`, `allgather`, `reducescatter`, `alltoall`, `broadcast`, `reduce`, `sendrecv`, `send`, `recv`, `barrier`, or the raw name (nsys: from the kernel name, else the enclosing NCCL NVTX range)"),
    _c("in_nelems", "int64", "input elements, from the kernel's metadata", KINETO),
    _c("out_nelems", "int64", "output elements", KINETO),
    _c("dtype", "string", "element type", KINETO),
    _c("in_bytes", "int64", "elements × dtype size (NULL when the dtype is unknown)", KINETO),
    _c("out_bytes", "int64", "as `in_bytes`, of the output", KINETO),
    _c("start_ns", "int64", "start of the kernel, ns"),
    _c("end_ns", "int64", "end of the kernel, ns (exclusive)"),
    _c("name_id", "int32", "the kernel's " + _NAME_ID),
    _c("correlation", "int64", "the kernel's `gpu.correlation`"),
    _c("external_id", "int64", "the kernel's `gpu.external_id`", KINETO),
    _c("from_metadata", "bool", "true when found through collective metadata (nsys: the NCCL NVTX range it was launched in) rather than the name"),
))  # fmt: skip

NAMES = Table("names", "interned names", (KINETO, NSYS, NCU), (
    _TRACE,
    _c("name_id", "int32", "the id other tables carry"),
    _c("name", "string", "the name"),
))  # fmt: skip

THREADS = Table("threads", "process and thread names", TIMELINE, (
    _TRACE,
    _c("pid", "int64", "process"),
    _c("tid", "int64", "thread"),
    _c("kind", "string", "what the name names (Kineto `process_name`/`thread_name`; nsys `PROCESSES`/`ThreadNames`)"),
    _c("name", "string", "the name"),
))  # fmt: skip

_DEV = (KINETO, NSYS, NCU)
DEVICES = Table("devices", "device limits", _DEV, (
    _TRACE,
    _c("device", "int32", "GPU index"),
    _c("name", "string", "device name (`NVIDIA H100 80GB HBM3`)"),
    _c("compute_major", "int32", "compute capability, major"),
    _c("compute_minor", "int32", "compute capability, minor"),
    _c("sm_count", "int32", "streaming multiprocessors"),
    _c("regs_per_sm", "int32", "32-bit registers per SM"),
    _c("regs_per_block", "int32", "32-bit registers per block"),
    _c("smem_per_sm", "int64", "shared memory per SM, bytes"),
    _c("smem_per_block", "int64", "shared memory per block, bytes"),
    _c("smem_per_block_optin", "int64", "shared memory per block with opt-in, bytes"),
    _c("max_threads_per_sm", "int32", "resident threads per SM"),
    _c("max_threads_per_block", "int32", "threads per block"),
    _c("max_blocks_per_sm", "int32", "resident blocks per SM"),
    _c("warp_size", "int32", "threads per warp"),
    _c("total_mem_bytes", "int64", "device memory, bytes"),
))  # fmt: skip

KERNEL_METRICS = Table("kernel_metrics", "Nsight Compute metrics", (NCU,), (
    _TRACE,
    _c("kernel_index", "int64", "ncu result `ID` (launch order of the profiled kernels)"),
    _c("name_id", "int32", "kernel name as ncu prints it (`names` of the ncu trace)"),
    _c("pid", "int64", "`Process ID`"),
    _c("device", "int32", "`Device`"),
    _c("stream", "int64", "`Stream`"),
    _c("grid_x", "int32", "`Grid Size` x (else `launch__grid_dim_x`)"),
    _c("grid_y", "int32", "`Grid Size` y"),
    _c("grid_z", "int32", "`Grid Size` z"),
    _c("block_x", "int32", "`Block Size` x (else `launch__block_dim_x`)"),
    _c("block_y", "int32", "`Block Size` y"),
    _c("block_z", "int32", "`Block Size` z"),
    _c("section", "string", "details page: the section (`Occupancy`, `GPU Speed Of Light Throughput`…); NULL on the raw page"),
    _c("metric", "string", "raw page: metric name (`sm__warps_active.avg.pct_of_peak_sustained_active`); details page: the label (`Achieved Occupancy`); rule results: `rule:<Rule Name>`"),
    _c("value", "double", "the number, thousands separators removed (locale detected per file), **in `unit` as exported**; NULL when not a number (`nan`, `n/a`, text)"),
    _c("value_text", "string", "the cell when it is not a number (`CachePreferNone`, `nan`); for a rule: `<type>: <description>`"),
    _c("unit", "string", "the units row (raw page) or `Metric Unit` (details page), e.g. `Kbyte/block`, `ms`, `%`; a rule's speedup: `% (global)`/`% (local)`"),
    _c("timeline_trace_id", "string", "the timeline trace of the same rank in which this kernel was found (NULL: no timeline, or no match)"),
    _c("timeline_name_id", "int32", "the kernel's `name_id` in that timeline trace"),
    _c("timeline_correlation", "int64", "the timeline launch paired with this profile by order (k-th profile of a kernel ↔ k-th launch of it); NULL when the timeline has fewer launches"),
    _c("timeline_start_ns", "int64", "that launch's start, ns"),
    _c("timeline_end_ns", "int64", "that launch's end, ns"),
))  # fmt: skip

# -- memory: Kineto [memory] events, CUDA memory snapshots, nsys CUDA memory usage events --------
_TENSORS = (KINETO, SNAPSHOT)  # the formats that see tensor allocations (nsys sees segments only)
MEMORY = Table("memory", "GPU allocator events", (KINETO, SNAPSHOT, NSYS), (
    _TRACE,
    _c("device", "int32", "`Device Id`; nsys `deviceId`"),
    _c("ts_ns", "int64", "the event's time, same clock as the other tables (snapshots: `time_us` × 1000)"),
    _c("bytes", "int64", "`Bytes`: > 0 an allocation, < 0 a free (nsys: a device-memory allocation or free, signed)"),
    _c("total_allocated", "int64", "the allocator's allocated total *after* the call; NULL in older traces (2021) that lack it", *_TENSORS),
    _c("total_reserved", "int64", "the allocator's reserved total after the call; nsys: the running sum of the process's device allocations on this GPU from 0 at its first event (the caching allocator's segments plus what CUDA libraries allocate themselves)"),
    _c("addr", "int64", "`Addr`: the block's address (pairs a free with its allocation; nsys `address`)"),
    _c("pid", "int64", "the process that called the allocator", KINETO, NSYS),
    _c("tid", "int64", "the thread that called the allocator (links the call to the CPU op around it; nsys: the thread of the `cudaMalloc`/`cudaFree` call with the same correlation id)", KINETO, NSYS),
    _c("external_id", "int64", "`External id` when the trace gives one (Kineto does not today)", KINETO),
    _c("seq", "int64", "position among the trace's memory rows in file order (ties in `ts_ns` keep it)"),
    _c("source", "string", "`kineto`, `snapshot` or `nsys`"),
    _c("action", "string", "Kineto: `alloc` (bytes ≥ 0) or `free`; snapshots: the entry's action, `bytes` its size signed (+ grows, − shrinks; a segment row's bytes are reserved, not allocated), or `free_block`: a free block when the snapshot was taken (`bytes` its size, `ts_ns` the last entry's, no totals); nsys: `segment_alloc`/`segment_free` (a driver-level allocation: reserved, never a tensor)"),
    _c("stack", "string", "up to 4 Python frames of the allocation, PyTorch's own skipped, innermost first (`name (file.py:line) ← ...`)", SNAPSHOT),
))  # fmt: skip

TABLES: tuple[Table, ...] = (
    GPU,
    HOST,
    RANGES,
    COLLECTIVES,
    NAMES,
    THREADS,
    DEVICES,
    KERNEL_METRICS,
    MEMORY,
)
TABLE_NAMES: tuple[str, ...] = tuple(t.name for t in TABLES)
BY_NAME: dict[str, Table] = {t.name: t for t in TABLES}


# -- Rank cards (crossrank-fast, issue #15): a derived per-rank summary, not a canonical
# table. Written next to each rank's Parquet at ingest (``rank_card.parquet``) by the
# worker that ingests the rank; read by the cross-rank step (stallscope.rank_card).
RANK_CARD = Table("rank_card", "one rank's summary for the cross-rank step (derived)", TIMELINE, (
    _TRACE,
    _c("kind", "string", "`device` (one per GPU), `step` (one per step range), `collective` (one per communication kernel), `launcher` (one per GPU and host process that launched work on it), `sync` (one per blocking host call) or `kernel` (the top compute kernels by summed time)"),
    _c("device", "int64", "the GPU (`device`, `collective`, `launcher`, `kernel` rows)"),
    _c("step", "int64", "the step number (`step` rows); the step of the GPU operation starting with the kernel (`collective` rows; −1 none)"),
    _c("pid", "int64", "the process of the step range, launcher or blocking call"),
    _c("name", "string", "the collective op (`collective`) or kernel name (`kernel`)"),
    _c("start_ns", "int64", "`device`: start of its step scope (stallscope.scope; NULL without steps); `step`: the range's start; `collective`: the kernel's start; `sync`: the call's start"),
    _c("end_ns", "int64", "the matching end, ns"),
    _c("compute_ns", "int64", "`device`: summed non-communication kernel time; `kernel`: summed time of that kernel, ns"),
    _c("comm_ns", "int64", "`device`: summed communication kernel time (waits included), ns"),
    _c("first_ns", "int64", "`device`: first kernel start, ns"),
    _c("last_ns", "int64", "`device`: last kernel end, ns"),
    _c("bytes", "int64", "`collective`: its size, `coalesce(in_bytes, out_bytes)`"),
    _c("count", "int64", "`kernel`: launches"),
    _c("flag", "bool", "`device`: the trace shows DistributedDataParallel (its forward range or reducer)"),
))  # fmt: skip
DERIVED_TABLES: tuple[Table, ...] = (RANK_CARD,)


def empty_select(table: str) -> str:
    """A DuckDB subquery of no rows with ``table``'s columns: ``(SELECT NULL::VARCHAR trace_id, ...)``."""
    columns = ", ".join(f"NULL::{TYPES[c.type][0]} {c.name}" for c in BY_NAME[table].columns)
    return f"(SELECT {columns})"


# Each table as an empty subquery (select from it ``WHERE false``): the view of a table that
# no trace has a file for (a store written before the table existed, a job without such data).
EMPTY_SELECTS: dict[str, str] = {t.name: empty_select(t.name) for t in TABLES}


@cache
def arrow_schema(table: str) -> pa.Schema:
    """The Arrow schema of ``table`` (every field nullable), as ingest writes it."""
    import pyarrow as pa

    types = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(),
             "double": pa.float64(), "bool": pa.bool_()}  # fmt: skip
    return pa.schema([pa.field(c.name, types[c.type]) for c in BY_NAME[table].columns])


def empty_table(table: str) -> pa.Table:
    """``table`` with no rows."""
    return arrow_schema(table).empty_table()


def markdown_columns(table: str) -> str:
    """The docs/schema.md column table of ``table`` (``tools/gen_schema_docs.py``)."""
    spec = BY_NAME[table]
    lines = ["| column | type | filled by | meaning |", "|---|---|---|---|"]
    for column in spec.columns:
        formats = ", ".join(f"`{f}`" for f in spec.filled_by(column))
        meaning = column.meaning.replace("|", "\\|")
        lines.append(f"| {column.name} | {TYPES[column.type][1]} | {formats} | {meaning} |")
    return "\n".join(lines) + "\n"


# -- catalog: one row per trace (meta.json), the ``catalog`` table of every store connection ---
@dataclass(frozen=True)
class CatalogField:
    """One field of a trace's catalog row. ``type``: a key of :data:`TYPES` (a column of the
    ``catalog`` table, stallscope.store.create_catalog) or ``list`` (in meta.json only);
    ``job``: a field of the job's row (its annotations), not of each trace's meta.json."""

    name: str
    type: str
    meaning: str
    job: bool = False

    @property
    def in_table(self) -> bool:
        return self.type in TYPES and not self.job


CATALOG: tuple[CatalogField, ...] = tuple(CatalogField(*f) for f in (
    ("trace_id", "string", "12 hex digits, derived from the job id and the file's hash"),
    ("job_id", "string", "12 hex digits, derived from the hashes of all the job's files"),
    ("name", "string", "file name as uploaded; when one file holds several traces (an nsys report of several processes or GPUs) with the trace's label in parentheses"),
    ("source", "string", "`kineto`, `nsys` (Nsight Systems), `ncu` (Nsight Compute), `memory-snapshot` (a PyTorch CUDA memory snapshot)"),
    ("source_version", "string", "Kineto `schemaVersion` (NULL for the 2021 bare-array schema); nsys `EXPORT_SCHEMA_VERSION`"),
    ("rank", "int32", "from `distributedInfo`, else the file name, else 0; an `ncu` trace takes the rank of the timeline it describes ([below](#kernel_metrics--nsight-compute-metrics)); nsys: one trace per process (per GPU in a multi-GPU process), [rank rules](formats/nsys.md#ranks)"),
    ("world_size", "int32", "from `distributedInfo`, else the number of ranks"),
    ("backend", "string", "`distributedInfo.backend` (nccl, gloo, …); nsys: `nccl` when the file shows NCCL"),
    ("file_name", "string", "the stored (compressed) file's path as given at upload (the SQL page shows base names)"),
    ("file_hash", "string", "SHA-256 of that file (hex, as `sha256sum` prints it)"),
    ("file_bytes", "int64", "its size in bytes"),
    ("uploaded_by", "string", "user name (`--user`, `$STALLSCOPE_USER`, login) of the first upload (each upload is kept: [store.md](store.md#uploads))"),
    ("uploaded_at", "string", "ISO-8601 UTC time of the first upload"),
    ("event_count", "int64", "trace events other than metadata (`ph: \"M\"`) events; nsys: rows of `gpu` + `host`"),
    ("gpu_event_count", "int64", "rows of `gpu`"),
    ("kernel_count", "int64", "rows of `gpu` of kind `kernel`"),
    ("span_ns", "int64", "first start to last end of the trace's kernels, memcpys and memsets"),
    ("base_time_ns", "int64", "Kineto `baseTimeNanoseconds` when present; nsys: the session start in Unix-epoch ns (its times count from it)"),
    ("ingest_seconds", "double", "wall time this trace's ingest took"),
    ("stallscope_version", "string", "the stallscope that ingested it"),
    ("devices", "list", "`{device, name, sm_count}` of each device with GPU activity"),
    ("warnings", "list", "what ingest repaired or dropped"),
    ("tags", "list", "job annotation (`annotations.json`, editable)", True),
    ("notes", "string", "job annotation (`annotations.json`, editable)", True),
))  # fmt: skip
CATALOG_FIELDS: dict[str, CatalogField] = {f.name: f for f in CATALOG}
# The ``catalog`` table: (name, DuckDB type) of every scalar field of meta.json, in order.
CATALOG_COLUMNS: tuple[tuple[str, str], ...] = tuple(
    (f.name, TYPES[f.type][0]) for f in CATALOG if f.in_table
)


def markdown_catalog() -> str:
    """The docs/schema.md table of the catalog fields (``tools/gen_schema_docs.py``)."""
    lines = ["| field | type | `catalog` table | meaning |", "|---|---|---|---|"]
    for f in CATALOG:
        kind = TYPES[f.type][1] if f.type in TYPES else f.type
        where = "yes" if f.in_table else ("no: the job's row" if f.job else "no: meta.json only")
        lines.append(f"| {f.name} | {kind} | {where} | {f.meaning.replace('|', chr(92) + '|')} |")
    return "\n".join(lines) + "\n"
