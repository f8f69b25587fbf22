"""``memory``: GPU memory peaks, fragmentation, headroom and allocator churn.

Reads the ``memory`` table (one row per caching-allocator call, from Kineto
``[memory]`` events: docs/schema.md). Definitions (docs/analyzers/memory.md),
per trace and device:

* allocated(t) = the allocator's ``Total Allocated`` after each call (when the
  trace lacks it: the running sum of ``bytes``, counted from 0 at the first
  event, since memory allocated before the capture is not visible);
* ``mem_allocated_peak_bytes`` = max allocated(t); ``mem_reserved_peak_bytes``
  = max ``Total Reserved``;
* ``mem_fragmentation_pct`` = (reserved peak − the highest allocated while the
  reservation is at its peak) / reserved peak × 100: the share of the peak
  reservation no live tensor used even at its fullest;
* ``mem_headroom_pct`` = (capacity − reserved peak) / capacity × 100, capacity
  from the devices table (``total_mem_bytes``) or :data:`CAPACITY_BY_NAME`;
* churn: per ``ProfilerStep``, the reserved total changing inside the step, or
  ``cudaMalloc``/``cudaFree`` host calls inside it.

A source that records only segments (nsys CUDA memory usage events: the driver-level
allocations, ``total_allocated`` NULL, every row a ``segment_*`` action) gives the
reserved peak, headroom and churn only: what was allocated, fragmentation and the
tensors live at the peak are not in such a trace, and its findings say so.

A CUDA memory snapshot paired with a trace of its rank (given together: one job) keeps
the trace's figures above and adds its own state when it was taken (segments, free share,
largest free block, live blocks by Python stack), its last event placed on the trace's
clock when the two line up (:class:`SnapshotState`; docs/analyzers/memory.md#paired).

:func:`measure` computes every number (:class:`DeviceMeasure` per device); :func:`speak`
writes the findings, :func:`metrics`, :func:`device_row` and :func:`live_rows` the metrics
and table rows, from those numbers only.

Findings: an ``info`` summary per device (peak and when, the operators whose
allocations are live at the peak); headroom < ``headroom_pct`` (high);
fragmentation > ``fragmentation_pct`` (medium, expandable segments advice);
allocator churn in every step (medium).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from stallscope.analyzers.base import (
    AnalyzerResult,
    AnalyzerSpec,
    Finding,
    Metric,
    Threshold,
    Where,
)
from stallscope.jobdata import JobData
from stallscope.report_tables.memory import MemoryDeviceRow, MemoryLiveRow

GIB = 1 << 30
# Device memory by product name, for traces whose devices table has no
# total_mem_bytes (e.g. nsys, or Kineto without deviceProperties). Longest
# match first; the figures are the usable totals CUDA reports.
CAPACITY_BY_NAME: tuple[tuple[str, int], ...] = (
    ("H200", 141 * 10**9),
    ("H100 NVL", 94 * 10**9),
    ("H100", 80 * GIB),
    ("A100-SXM4-40GB", 40 * GIB),
    ("A100-PCIE-40GB", 40 * GIB),
    ("A100 40GB", 40 * GIB),
    ("A100", 80 * GIB),
    ("B200", 180 * 10**9),
)
# Host calls that are the allocator reaching the driver (churn evidence).
DRIVER_ALLOC_CALLS = ("cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync")
# Ops that only allocate: an allocation made inside them is charged to their parent.
ALLOCATING_OPS = ("aten::empty", "aten::empty_strided", "aten::empty_like", "aten::resize_",
                  "aten::zeros", "aten::ones", "aten::new_empty", "aten::new_empty_strided",
                  "aten::full", "aten::new_zeros", "aten::new_ones", "aten::zeros_like")  # fmt: skip
SEGMENT_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")
TOP_OPS = 10
BEFORE_CAPTURE = "(allocated before the capture)"
OUTSIDE = "(outside any op)"
EXPANDABLE = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
SNAPSHOT_SOURCE = "memory-snapshot"  # the catalog source of a CUDA memory snapshot's trace
EPOCH_FLOOR_NS = 10**18  # Unix-epoch ns are above this since 2001: smaller snapshot times are not
CLOCK_GAP_NS = 600 * 10**9  # a paired snapshot's events within 10 min of the trace's: one clock


@dataclass
class DeviceMemory:
    """One device's allocator history, in event order (times in ns, sizes in bytes)."""

    ts_ns: np.ndarray
    delta: np.ndarray
    allocated: np.ndarray
    reserved: np.ndarray | None  # None when the trace has no Total Reserved
    addr: np.ndarray
    tid: np.ndarray
    allocated_from_deltas: bool = False
    allocated_known: bool = True  # False: segment rows only (nsys), ``allocated`` is all 0
    stack: np.ndarray | None = None  # the allocating Python frames (snapshots), else None
    largest_free_block: int | None = None  # snapshots: the largest inactive block at the end


@dataclass
class Peaks:
    """Peak figures of one device (see the module docstring)."""

    allocated_peak: int | None  # None: the source sees no tensor allocations (nsys)
    allocated_peak_ns: int | None
    allocated_peak_index: int | None
    reserved_peak: int | None = None
    reserved_peak_ns: int | None = None
    allocated_at_reserved_peak: int | None = None
    fragmentation_pct: float | None = None


def device_memory(cols: dict[str, np.ndarray]) -> DeviceMemory:
    """A :class:`DeviceMemory` from the memory table's columns of one device (event order).

    Columns may be numpy masked arrays (DuckDB's NULLs); a null total makes
    the whole series unknown (older traces have none at all).
    """
    delta = np.nan_to_num(_floats(cols["bytes"])).astype(np.int64)
    segment = np.zeros(delta.size, dtype=bool)
    if "action" in cols:  # segment rows change the reservation, not what is allocated
        segment = np.isin(np.asarray(cols["action"], dtype=object), SEGMENT_ACTIONS)
        delta = np.where(segment, 0, delta)
    totals = _floats(cols["total_allocated"])
    from_deltas = bool(np.isnan(totals).any())
    allocated = np.cumsum(delta) if from_deltas else totals.astype(np.int64)
    reserved_raw = _floats(cols["total_reserved"])
    reserved = None if np.isnan(reserved_raw).any() else reserved_raw.astype(np.int64)
    return DeviceMemory(
        ts_ns=np.asarray(cols["ts_ns"], dtype=np.int64),
        delta=delta,
        allocated=allocated,
        reserved=reserved,
        addr=_ints(cols["addr"], missing=-1),
        tid=_ints(cols["tid"], missing=-1),
        allocated_from_deltas=from_deltas,
        allocated_known=not (from_deltas and segment.size > 0 and bool(segment.all())),
        stack=np.asarray(cols["stack"], dtype=object) if "stack" in cols else None,
    )


def _floats(column: np.ndarray) -> np.ndarray:
    """As float64 with NaN for NULL (exact for the byte counts a GPU has: < 2**53)."""
    if np.ma.isMaskedArray(column):
        return np.ma.asarray(column, dtype=np.float64).filled(np.nan)
    return np.asarray(column, dtype=np.float64)


def _ints(column: np.ndarray, *, missing: int) -> np.ndarray:
    """As int64, NULL -> ``missing`` (addresses need all 64 bits: no float round trip)."""
    if np.ma.isMaskedArray(column):
        return np.ma.asarray(column).astype(np.int64).filled(missing)
    return np.asarray(column, dtype=np.int64)


def peaks(mem: DeviceMemory) -> Peaks:
    """Allocated and reserved peaks (the first time each is reached) and the fragmentation."""
    index = int(np.argmax(mem.allocated))
    out = Peaks(int(mem.allocated[index]), int(mem.ts_ns[index]), index)
    if mem.reserved is None:
        return out
    r_index = int(np.argmax(mem.reserved))
    top = int(mem.reserved[r_index])
    at_top = mem.reserved == top
    used = int(mem.allocated[at_top].max())
    out.reserved_peak, out.reserved_peak_ns = top, int(mem.ts_ns[r_index])
    out.allocated_at_reserved_peak = used
    out.fragmentation_pct = round(100.0 * (top - used) / top, 3) if top > 0 else 0.0
    return out


def live_at(mem: DeviceMemory, index: int) -> np.ndarray:
    """Indices of the allocations (positive ``delta``) still live just after event ``index``.

    An allocation is freed by the first later event with the same address and
    a negative delta; frees of blocks allocated before the capture are ignored.
    """
    live: dict[int, int] = {}
    for i in range(index + 1):
        if mem.delta[i] > 0:
            live[int(mem.addr[i])] = i
        elif mem.delta[i] < 0:
            live.pop(int(mem.addr[i]), None)
    return np.array(sorted(live.values()), dtype=np.int64)


def capacity_bytes(row: dict[str, Any] | None) -> tuple[int | None, str]:
    """(device memory in bytes or None, where it came from)."""
    if not row:
        return None, "unknown"
    total = row.get("total_mem_bytes")
    if total is not None and total == total and int(total) > 0:
        return int(total), "devices.total_mem_bytes"
    name = str(row.get("name") or "")
    for key, size in CAPACITY_BY_NAME:
        if key.lower() in name.lower():
            return size, f"product table ({key})"
    return None, "unknown"


def run(job: JobData, params: dict[str, float]) -> AnalyzerResult:
    """Measure every device (:func:`measure`), then speak: metrics, findings and table rows
    are written only from the measurements."""
    result = AnalyzerResult()
    for m in measure(job):
        result.metrics.extend(metrics(m))
        result.findings.extend(speak(m, params))
        result.tables.memory_devices.append(device_row(m))
        result.tables.memory_live_at_peak.extend(live_rows(m))
        if m.snapshot is not None:
            result.tables.memory_live_at_snapshot.extend(live_rows(m, m.snapshot.live))
    return result


class SnapshotState(msgspec.Struct, kw_only=True):
    """A paired memory snapshot's view of one device (:func:`measure_snapshot`): the
    allocator's state when the snapshot was taken, from its segments and recorded history.

    Sizes in bytes. ``last_event_ns`` is the snapshot's last recorded event on the timeline
    trace's clock (None when the two clocks cannot be lined up: see
    :func:`snapshot_clock_offset`); the state is the one at the dump, at or after it.
    """

    trace: str  # the snapshot's trace id
    file_name: str  # its base name (the catalog's ``name``)
    events: int  # the snapshot's allocator events of the device
    last_event_ns: int | None
    after_trace_ns: int | None  # last_event_ns minus the trace's last allocator event
    reserved_bytes: int | None  # the segments' total size; None: no segments recorded
    allocated_bytes: int | None  # the live (active) blocks' total
    fragmentation_pct: float | None  # (reserved - allocated) / reserved, % (3 decimals)
    largest_free_block_bytes: int | None  # the largest inactive block
    free_blocks: int  # inactive blocks
    live: list[dict[str, Any]]  # op (the Python stack), bytes, count: the TOP_OPS largest


class DeviceMeasure(msgspec.Struct, kw_only=True):
    """Every number of one device's memory (:func:`measure_device`); no prose.

    Sizes in bytes, times in ns on the trace's clock. ``source`` is
    :func:`memory_source`'s; with ``segments`` the allocated side is unknown
    (``peaks.allocated_peak`` None, no live allocations).
    """

    where: Where
    source: str  # allocator, allocator_deltas or segments
    events: int  # allocator events of the device (free_block rows not counted)
    first_ns: int  # the first event
    last_ns: int  # the last event
    peaks: Peaks
    capacity_bytes: int | None  # the device's memory; None: unknown
    capacity_source: str  # where capacity_bytes comes from (:func:`capacity_bytes`)
    held_bytes: int  # the reserved peak, else (no reserved totals) the allocated peak
    headroom_pct: float | None  # (capacity - held) / capacity, %; None without a capacity
    window: list[int]  # the peak event to the next event
    live_at_peak: list[dict[str, Any]]  # op, bytes, count: the :data:`TOP_OPS` largest
    largest_free_block: int | None  # snapshots: the largest inactive block at the end
    driver_frees: int  # segments only: events that shrank the reservation
    steps: list[dict[str, Any]]  # churn per ProfilerStep (:func:`step_churn`); [] without steps
    whole: dict[str, int] | None  # churn over the capture (:func:`capture_churn`), without steps
    snapshot: SnapshotState | None = None  # a memory snapshot paired with this trace's rank
    snapshot_only: bool = False  # measured from a snapshot alone: no host calls, no steps recorded

    @property
    def allocated_from_deltas(self) -> bool:
        return self.source == "allocator_deltas"


def measure(job: JobData) -> list[DeviceMeasure]:
    """Every device with allocator events, trace by trace (job order), device by device.

    A memory snapshot paired with a timeline trace of its rank (the job's ingest gave it that
    rank: docs/analyzers/memory.md#paired) adds its state to that trace's device
    (:attr:`DeviceMeasure.snapshot`); a device only the snapshot recorded is measured from
    the snapshot alone, as a snapshot that is a job of its own."""
    out = []
    paired: set[tuple[str, int]] = set()  # (snapshot trace, device) added to a timeline's
    for ref in job.traces:
        rank = int(ref.meta.get("rank", 0))
        if ref.meta.get("source") == SNAPSHOT_SOURCE:
            continue
        snapshots = _snapshots_of(job, rank)
        for device, mem in trace_memory(job, ref.trace_id).items():
            m = measure_device(job, Where(ref.trace_id, rank, device), mem)
            for snap in snapshots:
                if device in snap[1]:
                    m.snapshot = measure_snapshot(job, snap[0], snap[1][device], ref, m)
                    m.largest_free_block = m.snapshot.largest_free_block_bytes
                    paired.add((snap[0].trace_id, device))
                    break
            out.append(m)
    for ref in job.traces:
        if ref.meta.get("source") != SNAPSHOT_SOURCE:
            continue
        rank = int(ref.meta.get("rank", 0))
        for device, mem in trace_memory(job, ref.trace_id).items():
            if (ref.trace_id, device) not in paired:
                m = measure_device(job, Where(ref.trace_id, rank, device), mem)
                m.snapshot_only = True
                out.append(m)
    return sorted(out, key=lambda m: _job_order(job, m))


def _job_order(job: JobData, m: DeviceMeasure) -> tuple[int, int]:
    """Trace (job order) then device: the order the report always had."""
    ids = [r.trace_id for r in job.traces]
    return ids.index(m.where.trace), m.where.device or 0


def _snapshots_of(job: JobData, rank: int) -> list[tuple[Any, dict[int, DeviceMemory]]]:
    """The memory snapshots of ``rank`` beside its timeline (their ref, then each device's
    history), in job order."""
    return [
        (ref, trace_memory(job, ref.trace_id))
        for ref in job.traces
        if ref.meta.get("source") == SNAPSHOT_SOURCE and int(ref.meta.get("rank", 0)) == rank
    ]


def trace_memory(job: JobData, trace: str) -> dict[int, DeviceMemory]:
    """Each device's allocator history in one trace (devices in ascending order)."""
    cols = job.numpy(
        "SELECT device, ts_ns, bytes, total_allocated, total_reserved, addr, tid, action, stack "
        "FROM memory WHERE trace_id = ? AND action IS DISTINCT FROM 'free_block' "
        "ORDER BY device, ts_ns, seq",
        [trace],
    )
    free_blocks = dict(
        job.sql(
            "SELECT device, max(bytes) FROM memory WHERE trace_id = ? AND action = 'free_block' "
            "GROUP BY device",
            [trace],
        ).fetchall()
    )
    out = {}
    for device in np.unique(cols["device"]):
        mask = cols["device"] == device
        mem = device_memory({k: v[mask] for k, v in cols.items()})
        mem.largest_free_block = free_blocks.get(device)
        out[int(device)] = mem
    return out


def measure_device(job: JobData, where: Where, mem: DeviceMemory) -> DeviceMeasure:
    """One device's peaks, capacity and headroom, what is live at the peak and churn."""
    if mem.allocated_known:
        top = peaks(mem)
        index = top.allocated_peak_index
        held = top.reserved_peak if top.reserved_peak is not None else top.allocated_peak
        ops = live_ops(job, where.trace, mem, index)
        ops = _with_earlier(ops, top.allocated_peak, mem.allocated_from_deltas)
    else:  # driver-level segments only (nsys): the reserved side
        index = int(np.argmax(mem.reserved))
        top = Peaks(None, None, None, int(mem.reserved[index]), int(mem.ts_ns[index]))
        held, ops = top.reserved_peak, []
    capacity, capacity_source = capacity_bytes(_device_row(job, where.trace, where.device))
    steps = step_churn(job, where.trace, mem)
    return DeviceMeasure(
        where=where,
        source=memory_source(mem),
        events=int(mem.ts_ns.size),
        first_ns=int(mem.ts_ns[0]),
        last_ns=int(mem.ts_ns[-1]),
        peaks=top,
        capacity_bytes=capacity,
        capacity_source=capacity_source,
        held_bytes=held,
        headroom_pct=round(100.0 * (capacity - held) / capacity, 3) if capacity else None,
        window=_peak_window(mem, index),
        live_at_peak=ops,
        largest_free_block=mem.largest_free_block,
        driver_frees=0
        if mem.allocated_known
        else int((np.diff(mem.reserved, prepend=0) < 0).sum()),
        steps=steps,
        whole=None if steps else capture_churn(job, where.trace, mem),
    )


def measure_snapshot(
    job: JobData, ref: Any, mem: DeviceMemory, timeline: Any, m: DeviceMeasure
) -> SnapshotState:
    """The state a paired snapshot ``ref`` recorded for ``m``'s device (``mem``: its history
    there), placed on the clock of the ``timeline`` trace when the clocks line up."""
    free = job.numpy(
        "SELECT bytes FROM memory WHERE trace_id = ? AND device = ? AND action = 'free_block'",
        [ref.trace_id, m.where.device],
    )["bytes"]
    known = mem.reserved is not None and not mem.allocated_from_deltas
    reserved = int(mem.reserved[-1]) if known else None
    allocated = int(mem.allocated[-1]) if known else None
    offset = snapshot_clock_offset(timeline.meta, mem, m)
    last = None if offset is None else int(mem.ts_ns[-1]) - offset
    live = live_ops(job, ref.trace_id, mem, int(mem.ts_ns.size) - 1)
    return SnapshotState(
        trace=ref.trace_id,
        file_name=str(ref.meta.get("name") or ref.trace_id),
        events=int(mem.ts_ns.size),
        last_event_ns=last,
        after_trace_ns=None if last is None else last - m.last_ns,
        reserved_bytes=reserved,
        allocated_bytes=allocated,
        fragmentation_pct=round(100.0 * (reserved - allocated) / reserved, 3) if reserved else None,
        largest_free_block_bytes=int(free.max()) if free.size else None,
        free_blocks=int(free.size),
        live=_with_earlier(live, allocated, mem.allocated_from_deltas),
    )


def snapshot_clock_offset(
    timeline: dict[str, Any], mem: DeviceMemory, m: DeviceMeasure
) -> int | None:
    """ns to subtract from a snapshot's times to put them on the timeline trace's clock, or
    None when they cannot be lined up.

    A snapshot's times are Unix-epoch µs (``time_us``; PyTorch ≥ 2.1); a trace's are
    counted from its ``base_time_ns`` (Kineto ``baseTimeNanoseconds``, nsys the session
    start; a Kineto trace without one counts from the epoch). The two are taken as one clock
    only when the snapshot's recorded events then overlap the trace's allocator events, or
    come within :data:`CLOCK_GAP_NS` of them: otherwise (a snapshot without times, a trace
    on another clock, or a snapshot of another run) its time is not placed on the trace.
    """
    if mem.ts_ns.size == 0 or int(mem.ts_ns[0]) < EPOCH_FLOOR_NS:
        return None
    base = timeline.get("base_time_ns")
    offset = int(base) if isinstance(base, int) else 0
    first, last = int(mem.ts_ns[0]) - offset, int(mem.ts_ns[-1]) - offset
    if first > m.last_ns + CLOCK_GAP_NS or last < m.first_ns - CLOCK_GAP_NS:
        return None
    return offset


def metrics(m: DeviceMeasure) -> list[Metric]:
    """The device's metrics: the allocated peak, the reserved peak and fragmentation (when the
    source has them), the headroom (when the capacity is known)."""
    w, top = m.where, m.peaks
    named: dict[str, tuple[Any, str]] = {}
    if top.allocated_peak is not None:
        named["mem_allocated_peak_bytes"] = (top.allocated_peak, "bytes")
    if top.reserved_peak is not None:
        named["mem_reserved_peak_bytes"] = (top.reserved_peak, "bytes")
    if top.fragmentation_pct is not None:
        named["mem_fragmentation_pct"] = (top.fragmentation_pct, "%")
    if m.headroom_pct is not None:
        named["mem_headroom_pct"] = (m.headroom_pct, "%")
    return [Metric(w.trace, w.rank, w.device, k, v, unit) for k, (v, unit) in named.items()]


def speak(m: DeviceMeasure, params: dict[str, float]) -> list[Finding]:
    """The device's findings in report order, written only from ``m``: the summary, then
    headroom, fragmentation and churn when they pass their thresholds."""
    segments = m.source == "segments"
    out = [_segments_summary(m) if segments else _summary(m)]
    if m.headroom_pct is not None and m.headroom_pct < params["headroom_pct"]:
        out.append(_headroom(m))
    frag = m.peaks.fragmentation_pct
    if not segments and frag is not None and frag > params["fragmentation_pct"]:
        out.append(_fragmentation(m))
    if m.steps and all(s["reserved_changes"] or s["driver_calls"] for s in m.steps):
        out.append(_churn(m))
    elif m.whole is not None and sum(m.whole.values()) >= params["churn_events_no_steps"]:
        out.append(_churn_unstepped(m))
    return out


def memory_source(mem: DeviceMemory) -> str:
    """What the device's events record: ``allocator`` (allocator totals), ``allocator_deltas``
    (no totals: allocated is the running sum from 0) or ``segments`` (driver-level only)."""
    if not mem.allocated_known:
        return "segments"
    return "allocator_deltas" if mem.allocated_from_deltas else "allocator"


def device_row(m: DeviceMeasure) -> MemoryDeviceRow:
    """The device's row of the report's ``memory_devices`` table: the figures of its summary
    finding's evidence (bytes, ns, %), with where the capacity came from and the headroom."""
    w, top = m.where, m.peaks
    return MemoryDeviceRow(
        trace=w.trace,
        rank=w.rank,
        device=w.device,
        source=m.source,
        events=m.events,
        allocated_peak_bytes=top.allocated_peak,
        allocated_peak_ns=top.allocated_peak_ns,
        reserved_peak_bytes=top.reserved_peak,
        reserved_peak_ns=top.reserved_peak_ns,
        allocated_at_reserved_peak_bytes=top.allocated_at_reserved_peak,
        capacity_bytes=m.capacity_bytes,
        capacity_source=m.capacity_source,
        headroom_pct=m.headroom_pct,
        fragmentation_pct=top.fragmentation_pct,
        largest_free_block_bytes=None if m.source == "segments" else m.largest_free_block,
        **_snapshot_columns(m.snapshot),
    )


def _snapshot_columns(snap: SnapshotState | None) -> dict[str, Any]:
    """The ``snapshot_*`` fields of a device row (none without a paired snapshot)."""
    if snap is None:
        return {}
    return {
        "snapshot_trace": snap.trace,
        "snapshot_ns": snap.last_event_ns,
        "snapshot_reserved_bytes": snap.reserved_bytes,
        "snapshot_allocated_bytes": snap.allocated_bytes,
        "snapshot_fragmentation_pct": snap.fragmentation_pct,
    }


def live_rows(m: DeviceMeasure, ops: list[dict[str, Any]] | None = None) -> list[MemoryLiveRow]:
    """The device's rows of the ``memory_live_at_peak`` table (as in the summary's
    ``live_at_peak``: op, bytes, count; most bytes first), or of ``ops`` (a paired snapshot's
    live blocks: ``memory_live_at_snapshot``)."""
    w = m.where
    return [
        MemoryLiveRow(trace=w.trace, rank=w.rank, device=w.device, op=o["op"], bytes=o["bytes"],
                      count=o["count"])
        for o in (m.live_at_peak if ops is None else ops)
    ]  # fmt: skip


def _device_row(job: JobData, trace: str, device: int) -> dict[str, Any] | None:
    cur = job.sql(
        "SELECT name, total_mem_bytes FROM devices WHERE trace_id = ? AND device = ?",
        [trace, device],
    )
    found = cur.fetchone()
    return None if found is None else {"name": found[0], "total_mem_bytes": found[1]}


def _peak_window(mem: DeviceMemory, index: int) -> list[int]:
    """From the peak event to the next event (how long the peak held), in ns."""
    start = int(mem.ts_ns[index])
    end = int(mem.ts_ns[index + 1]) if index + 1 < mem.ts_ns.size else start
    return [start, max(end, start)]


def live_ops(job: JobData, trace: str, mem: DeviceMemory, index: int) -> list[dict[str, Any]]:
    """All live allocations at event ``index`` by the operator that made them, most bytes first.

    The operator is the allocation's Python stack when the data has one
    (snapshots), else the innermost CPU op on the allocating thread whose span
    holds the allocation, skipping pure allocation ops (:data:`ALLOCATING_OPS`)
    unless nothing else holds it; ``(outside any op)`` when no op holds it.
    """
    live = live_at(mem, index)
    if live.size == 0:
        return []
    ops = job.numpy(
        "SELECT h.tid, h.start_ns, h.end_ns, n.name FROM host h "
        "JOIN names n ON n.trace_id = h.trace_id AND n.name_id = h.name_id "
        "WHERE h.trace_id = ? AND h.kind = 'cpu_op' ORDER BY h.tid, h.start_ns, h.end_ns DESC",
        [trace],
    )
    index_of_ops = _OpIndex(ops)
    totals: dict[str, list[int]] = {}
    for i in live:
        stack = mem.stack[i] if mem.stack is not None else None
        name = (
            stack
            if isinstance(stack, str) and stack
            else index_of_ops.enclosing(int(mem.tid[i]), int(mem.ts_ns[i]))
        )
        entry = totals.setdefault(name, [0, 0])
        entry[0] += int(mem.delta[i])
        entry[1] += 1
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return [{"op": op, "bytes": b, "count": n} for op, (b, n) in ranked]


def _with_earlier(
    ops: list[dict[str, Any]], total: int | None, from_deltas: bool
) -> list[dict[str, Any]]:
    """The :data:`TOP_OPS` largest of ``ops`` plus the bytes live then that were allocated
    before the capture began (the ``total`` allocated minus what the capture saw allocated;
    nothing when allocated is counted from the events: ``from_deltas``)."""
    earlier = (total or 0) - sum(o["bytes"] for o in ops)
    if not from_deltas and earlier > 0:
        ops = [*ops, {"op": BEFORE_CAPTURE, "bytes": int(earlier), "count": None}]
    return sorted(ops, key=lambda o: (-o["bytes"], o["op"]))[:TOP_OPS]


class _OpIndex:
    """CPU ops per thread, sorted by start (outer first on equal starts), for innermost-op lookups."""

    WINDOW = 512  # ops before the allocation checked first; the whole prefix only when needed

    def __init__(self, ops: dict[str, np.ndarray]):
        self.by_tid: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        tids = np.asarray(ops["tid"])
        for tid in np.unique(tids):
            mask = tids == tid
            self.by_tid[int(tid)] = (
                np.asarray(ops["start_ns"])[mask],
                np.asarray(ops["end_ns"])[mask],
                np.asarray(ops["name"], dtype=object)[mask],
            )

    def enclosing(self, tid: int, ts: int) -> str:
        """The innermost op on ``tid`` holding ``ts`` that is not a pure allocation op; the
        innermost allocation op when only such ops hold it (a bare ``torch.empty``)."""
        if tid not in self.by_tid:
            return OUTSIDE
        starts, ends, names = self.by_tid[tid]
        stop = int(np.searchsorted(starts, ts, side="right"))
        allocating = None
        for lo in (max(0, stop - self.WINDOW), 0):
            holding = lo + np.flatnonzero(ends[lo:stop] >= ts)
            for i in holding[::-1]:  # latest start first: the innermost op
                name = str(names[i])
                if name in ALLOCATING_OPS:
                    allocating = allocating or name
                elif not name.startswith("ProfilerStep#"):
                    return name
            if lo == 0:
                break
        return allocating or OUTSIDE


def capture_churn(job: JobData, trace: str, mem: DeviceMemory) -> dict[str, int]:
    """Reserved changes and cudaMalloc/cudaFree calls over the whole capture."""
    changes = int((np.diff(mem.reserved) != 0).sum()) if mem.reserved is not None else 0
    return {"reserved_changes": changes, "driver_calls": len(_driver_calls(job, trace))}


def _driver_calls(job: JobData, trace: str) -> np.ndarray:
    """Start times (ns) of the host's cudaMalloc/cudaFree calls (:data:`DRIVER_ALLOC_CALLS`)."""
    return job.numpy(
        "SELECT h.start_ns FROM host h JOIN names n ON n.trace_id = h.trace_id "
        "AND n.name_id = h.name_id WHERE h.trace_id = ? AND h.kind IN ('runtime', 'driver') "
        f"AND n.name IN ({', '.join('?' for _ in DRIVER_ALLOC_CALLS)})",
        [trace, *DRIVER_ALLOC_CALLS],
    )["start_ns"]


def step_churn(job: JobData, trace: str, mem: DeviceMemory) -> list[dict[str, Any]]:
    """Per step: reserved changes and cudaMalloc/cudaFree calls inside it (empty without steps)."""
    steps = job.numpy(
        "SELECT step, start_ns, end_ns FROM ranges WHERE trace_id = ? AND kind = 'step' "
        "ORDER BY start_ns",
        [trace],
    )
    if steps["start_ns"].size == 0:
        return []
    calls = _driver_calls(job, trace)
    changed = np.zeros(mem.ts_ns.size, dtype=bool)
    if mem.reserved is not None and mem.reserved.size > 1:
        changed[1:] = np.diff(mem.reserved) != 0
    lows, highs = steps["start_ns"], steps["end_ns"]
    changes = counts_within(mem.ts_ns[changed], lows, highs)
    driver = counts_within(calls, lows, highs)
    out = []
    for i, (step, lo, hi) in enumerate(zip(steps["step"], lows, highs, strict=True)):
        out.append(
            {
                "step": None if step is None or step != step else int(step),
                "start_ns": int(lo),
                "end_ns": int(hi),
                "reserved_changes": int(changes[i]),
                "driver_calls": int(driver[i]),
            }
        )
    return out


def counts_within(times: np.ndarray, lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
    """How many of ``times`` (ns) lie in each closed range ``[lows[i], highs[i]]`` (0 for a
    reversed one). One sort and two sorted searches: a mask over every time per step cost
    times x steps, the square of a trace's length when its steps are kept."""
    t = np.sort(np.asarray(times, dtype=np.int64))
    n = np.searchsorted(t, highs, side="right") - np.searchsorted(t, lows, side="left")
    return np.maximum(n, 0)


def _mb(value: int | None) -> str:
    return "?" if value is None else f"{value / 2**20:,.1f} MiB"


def _summary(m: DeviceMeasure) -> Finding:
    """The info summary of a device whose allocated memory is known."""
    top, capacity, headroom, ops = m.peaks, m.capacity_bytes, m.headroom_pct, m.live_at_peak
    after_ms = (top.allocated_peak_ns - m.first_ns) / 1e6
    lines = [
        f"Allocated peaked at {_mb(top.allocated_peak)}, {after_ms:,.3f} ms after the first "
        "allocator event of the capture"
    ]
    if top.reserved_peak is not None:
        lines.append(
            f"the allocator reserved at most {_mb(top.reserved_peak)} "
            f"({top.fragmentation_pct:.1f}% of it unused at its peak)"
        )
    if capacity:
        lines.append(f"{headroom:.1f}% of the device's {_mb(capacity)} left free")
    if ops:
        lines.append(
            "live at the peak: " + ", ".join(f"{o['op']} {_mb(o['bytes'])}" for o in ops[:3])
        )
    caveat = (
        " The trace records no allocator totals: allocated is counted from 0 at the first event, "
        "so memory allocated before the capture is missing."
        if m.allocated_from_deltas
        else ""
    )
    return Finding(
        analyzer="memory",
        trace=m.where.trace,
        rank=m.where.rank,
        device=m.where.device,
        severity="info",
        title=f"GPU {m.where.device} memory peak {_mb(top.allocated_peak)} allocated"
        + (f", {_mb(top.reserved_peak)} reserved" if top.reserved_peak is not None else ""),
        detail="; ".join(lines) + "." + caveat + _snapshot_text(m),
        recommendation="See the Memory page for the timeline; the ops live at the peak are the "
        "ones to shrink (activation checkpointing, smaller batch, lower precision).",
        evidence={
            "key": "summary",
            "events": m.events,
            "allocated_peak_bytes": top.allocated_peak,
            "allocated_peak_ns": top.allocated_peak_ns,
            "reserved_peak_bytes": top.reserved_peak,
            "reserved_peak_ns": top.reserved_peak_ns,
            "allocated_at_reserved_peak_bytes": top.allocated_at_reserved_peak,
            "capacity_bytes": capacity,
            "allocated_from_deltas": m.allocated_from_deltas,
            "largest_free_block_bytes": m.largest_free_block,
            "live_at_peak": ops,
            **_snapshot_evidence(m),
        },
        windows=[m.window],
    )


def _snapshot_text(m: DeviceMeasure) -> str:
    """The summary's sentences on a paired snapshot ("" without one): its state, when it was
    taken on the trace's clock, and which figures came from which source."""
    snap = m.snapshot
    if snap is None:
        return ""
    if snap.after_trace_ns is None:
        when = "its times cannot be placed on this trace's clock"
    else:
        ms = snap.after_trace_ns / 1e6
        when = (
            f"its last event {abs(ms):,.3f} ms {'after' if ms >= 0 else 'before'} this trace's "
            "last allocator event"
        )
    if snap.reserved_bytes is None:
        state = "it recorded no segments, so its state then is not known"
    else:
        state = (
            f"its segments held {_mb(snap.reserved_bytes)}, {_mb(snap.allocated_bytes)} of it "
            f"allocated ({snap.fragmentation_pct:.1f}% free"
            + (
                f", the largest free block {_mb(snap.largest_free_block_bytes)})"
                if snap.largest_free_block_bytes is not None
                else ")"
            )
        )
    live = ", ".join(f"{o['op']} {_mb(o['bytes'])}" for o in snap.live[:3])
    return (
        f" Memory snapshot {snap.file_name} ({when}): when it was taken, {state}"
        + (f"; live then: {live}" if live else "")
        + ". The peaks, headroom and churn are from this trace's allocator events; the state "
        "at the snapshot, its free blocks and the stacks are from the snapshot."
    )


def _snapshot_evidence(m: DeviceMeasure) -> dict[str, Any]:
    """``{"snapshot": ...}``: the paired snapshot's figures (nothing without one)."""
    return {} if m.snapshot is None else {"snapshot": msgspec.to_builtins(m.snapshot)}


NOT_SHOWN = (
    "nsys records the process's driver-level allocations (the caching allocator's segments and "
    "the CUDA libraries' own buffers), not tensors: what was allocated, the fragmentation of the "
    "reservation and the tensors live at the peak cannot be told from this trace"
)


def _segments_summary(m: DeviceMeasure) -> Finding:
    """The info summary of a segments-only device (nsys): the reserved peak and what is not shown."""
    top, capacity, headroom = m.peaks, m.capacity_bytes, m.headroom_pct
    after_ms = (top.reserved_peak_ns - m.first_ns) / 1e6
    frees = m.driver_frees
    lines = [
        f"The process held at most {_mb(top.reserved_peak)} of device memory from the driver, "
        f"{after_ms:,.3f} ms after its first device allocation in the trace "
        f"({m.events - frees} allocations, {frees} frees)"
    ]
    if capacity:
        lines.append(f"{headroom:.1f}% of the device's {_mb(capacity)} left free")
    return Finding(
        analyzer="memory",
        trace=m.where.trace,
        rank=m.where.rank,
        device=m.where.device,
        severity="info",
        title=f"GPU {m.where.device} memory peak {_mb(top.reserved_peak)} reserved "
        "(allocated not recorded)",
        detail="; ".join(lines) + ". " + NOT_SHOWN + "." + _snapshot_text(m),
        recommendation="For allocated memory, fragmentation and the tensors live at the peak, "
        "capture the same run with torch.profiler.profile(profile_memory=True) or a CUDA memory "
        "snapshot (torch.cuda.memory._record_memory_history).",
        evidence={
            "key": "summary",
            "events": m.events,
            "allocated_peak_bytes": None,
            "allocated_peak_ns": None,
            "reserved_peak_bytes": top.reserved_peak,
            "reserved_peak_ns": top.reserved_peak_ns,
            "allocated_at_reserved_peak_bytes": None,
            "capacity_bytes": capacity,
            "allocated_from_deltas": False,
            "allocated_known": False,
            "largest_free_block_bytes": None,
            "live_at_peak": [],
            **_snapshot_evidence(m),
        },
        windows=[m.window],
    )


def _headroom(m: DeviceMeasure) -> Finding:
    held, capacity, headroom = m.held_bytes, m.capacity_bytes, m.headroom_pct
    return Finding(
        analyzer="memory",
        trace=m.where.trace,
        rank=m.where.rank,
        device=m.where.device,
        severity="high",
        title=f"GPU {m.where.device} has {headroom:.1f}% memory headroom",
        detail=(
            f"The allocator held {_mb(held)} of the device's {_mb(capacity)} "
            f"({m.capacity_source}): "
            "a larger batch, a longer sequence or another process's context can run out of memory."
        ),
        recommendation="Free headroom before scaling up: activation checkpointing, a smaller "
        "micro-batch, lower-precision weights or optimizer state, or sharding (FSDP/ZeRO).",
        evidence={
            "key": "headroom",
            "held_bytes": held,
            "capacity_bytes": capacity,
            "capacity_source": m.capacity_source,
            "headroom_pct": headroom,
        },  # fmt: skip
        windows=[m.window],
    )


def _fragmentation(m: DeviceMeasure) -> Finding:
    top = m.peaks
    unused = top.reserved_peak - top.allocated_at_reserved_peak
    snap = m.snapshot
    block = (
        f"When the memory snapshot was taken, {snap.fragmentation_pct:.1f}% of its "
        f"{_mb(snap.reserved_bytes)} of segments was free, the largest free block "
        f"{_mb(snap.largest_free_block_bytes)} (the snapshot's segments, not the peak)."
        if snap is not None and snap.fragmentation_pct is not None
        else f"When the snapshot was taken, the largest free block was {_mb(m.largest_free_block)}."
        if m.largest_free_block is not None
        else "The trace has no segment map, so the largest free block is not known."
    )
    return Finding(
        analyzer="memory",
        trace=m.where.trace,
        rank=m.where.rank,
        device=m.where.device,
        severity="medium",
        title=f"GPU {m.where.device}: {top.fragmentation_pct:.1f}% of reserved memory unused at its peak",
        detail=(
            f"While the allocator held its peak of {_mb(top.reserved_peak)}, live tensors used at "
            f"most {_mb(top.allocated_at_reserved_peak)}: {_mb(unused)} sat in cached blocks "
            "that could not serve the requests (fragmentation, or blocks cached for sizes no "
            "longer asked for). " + block
        ),
        recommendation=f"Set {EXPANDABLE} so segments grow in place instead of splitting "
        "into unusable pieces; keep tensor sizes stable across steps (pad variable lengths).",
        evidence={
            "key": "fragmentation",
            "reserved_peak_bytes": top.reserved_peak,
            "allocated_at_reserved_peak_bytes": top.allocated_at_reserved_peak,
            "unused_bytes": unused,
            "fragmentation_pct": top.fragmentation_pct,
            "largest_free_block_bytes": m.largest_free_block,
        },
        windows=[m.window],
    )


def _churn(m: DeviceMeasure) -> Finding:
    churn = m.steps
    changes = sum(s["reserved_changes"] for s in churn)
    calls = sum(s["driver_calls"] for s in churn)
    same = (
        " (nsys records each cudaMalloc/cudaFree as a reservation change: the two counts are "
        "the same calls)"
        if m.source == "segments"
        else ""
    )
    return Finding(
        analyzer="memory",
        trace=m.where.trace,
        rank=m.where.rank,
        device=m.where.device,
        severity="medium",
        title=f"GPU {m.where.device}: the allocator grows or shrinks its reservation in every step",
        detail=(
            f"In each of the {len(churn)} steps the reserved total changed or the allocator "
            f"called cudaMalloc/cudaFree ({changes} reservation changes, {calls} driver calls in "
            f"all){same}. Each cudaMalloc/cudaFree synchronizes the device and costs up to "
            "milliseconds."
        ),
        recommendation="Keep the cache warm: avoid torch.cuda.empty_cache() in the loop, keep "
        f"shapes stable, or set {EXPANDABLE}.",
        evidence={
            "key": "churn",
            "steps": churn,
            "reserved_changes": changes,
            "driver_calls": calls,
        },  # fmt: skip
        windows=[[s["start_ns"], s["end_ns"]] for s in churn[:20]],
    )


def _churn_unstepped(m: DeviceMeasure) -> Finding:
    """Churn over a capture without steps. A snapshot alone records neither host calls nor
    steps: its text says the calls were not recorded (not that there were none)."""
    whole = m.whole or {"reserved_changes": 0, "driver_calls": 0}
    span = [m.first_ns, m.last_ns]
    over = f"{(span[1] - span[0]) / 1e6:,.1f} ms"
    if m.snapshot_only:
        detail = (
            f"The reserved total changed {whole['reserved_changes']} times over {over}; host calls "
            "not recorded (snapshot only)."
        )
        first = (
            "Pair the snapshot with a profiler trace of the same run (torch.profiler with a "
            "schedule, so steps are marked) to see the host's calls per step; "
        )
    else:
        detail = (
            f"The reserved total changed {whole['reserved_changes']} times and the host made "
            f"{whole['driver_calls']} cudaMalloc/cudaFree calls over {over}. The trace has no "
            "step markers (ProfilerStep#N), so whether this happens in every step cannot be told."
        )
        first = "Profile with a schedule (torch.profiler.schedule) so steps are marked; "
    return Finding(
        analyzer="memory",
        trace=m.where.trace,
        rank=m.where.rank,
        device=m.where.device,
        severity="low",
        title=f"GPU {m.where.device}: the allocator went back to the driver "
        f"{whole['reserved_changes'] + whole['driver_calls']} times during the capture",
        detail=detail,
        recommendation=first + "avoid torch.cuda.empty_cache() in the loop, keep shapes stable, "
        f"or set {EXPANDABLE}.",
        evidence={"key": "churn", **whole}
        | ({"host_calls_recorded": False} if m.snapshot_only else {}),
        windows=[span],
    )


SPEC = AnalyzerSpec(
    id="memory",
    order=120,
    per_rank=True,
    title="GPU memory",
    description="Allocated and reserved peaks, fragmentation, headroom and allocator churn "
    "from the allocator's events (Kineto profile_memory=True, CUDA memory snapshots; nsys "
    "--cuda-memory-usage=true gives the reserved side only).",
    run=run,
    thresholds=(
        Threshold(
            "headroom_pct",
            5.0,
            "%",
            "Free device memory below which headroom is flagged",
            maximum=100,
        ),
        Threshold(
            "fragmentation_pct",
            20.0,
            "%",
            "Unused share of the reserved peak above which fragmentation is flagged",
            maximum=100,
        ),
        Threshold(
            "churn_events_no_steps",
            10.0,
            "count",
            "Without step markers: reservation changes plus cudaMalloc/cudaFree calls in "
            "the capture from which churn is reported (low)",
        ),
    ),  # fmt: skip
)
