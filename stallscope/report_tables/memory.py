"""The ``memory`` analyzer's report tables (rows built by analyzers/memory.py)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from stallscope.report_tables import ReportTable, Row

ORDER = 120  # after the core tables (the memory analyzer's report position)


class MemoryDeviceRow(Row, kw_only=True, omit_defaults=True):
    """One device's memory peaks (``memory``; devices with allocator events). Sizes in bytes,
    times in ns; null where the source does not record it (``source`` says which). The
    ``snapshot_*`` fields (added 2026-12-02, present only on a device whose trace has a memory
    snapshot paired with it) are the snapshot's, at the time it was taken."""

    source: Annotated[
        str,
        Meta(
            description="allocator (allocator totals: Kineto, snapshots), allocator_deltas "
            "(running sum of the events from 0), segments (driver-level only: nsys)"
        ),
    ]
    events: Annotated[int, Meta(description="allocator events of the device")]
    allocated_peak_bytes: Annotated[int | None, Meta(description="null: segments only")]
    allocated_peak_ns: Annotated[int | None, Meta(description="first time the peak is reached")]
    reserved_peak_bytes: Annotated[int | None, Meta(description="null: no reserved totals")]
    reserved_peak_ns: int | None
    allocated_at_reserved_peak_bytes: Annotated[
        int | None, Meta(description="highest allocated while the reservation is at its peak")
    ]
    capacity_bytes: Annotated[int | None, Meta(description="device memory; null: unknown")]
    capacity_source: Annotated[
        str, Meta(description="devices.total_mem_bytes, product table (<name>) or unknown")
    ]
    headroom_pct: Annotated[
        float | None,
        Meta(description="% of capacity above the reserved peak (else allocated peak)"),
    ]
    fragmentation_pct: Annotated[
        float | None, Meta(description="reserved peak unused at its fullest, % of it")
    ]
    largest_free_block_bytes: Annotated[
        int | None, Meta(description="snapshots only (a paired snapshot's, when it was taken)")
    ]
    snapshot_trace: Annotated[
        str | None, Meta(description="trace id of the memory snapshot paired with this trace")
    ] = None
    snapshot_ns: Annotated[
        int | None,
        Meta(description="the snapshot's last event on this trace's clock; null: not placeable"),
    ] = None
    snapshot_reserved_bytes: Annotated[
        int | None, Meta(description="the snapshot's segments, total size")
    ] = None
    snapshot_allocated_bytes: Annotated[
        int | None, Meta(description="the snapshot's live blocks, total size")
    ] = None
    snapshot_fragmentation_pct: Annotated[
        float | None, Meta(description="share of the snapshot's segments free, %")
    ] = None


class MemoryLiveRow(Row, kw_only=True):
    """The allocations live at a device's allocated peak, by the operator (or Python stack)
    that made them (``memory``; at most 10 per device, most bytes first)."""

    op: Annotated[
        str,
        Meta(description="operator, stack, '(outside any op)' or '(allocated before the capture)'"),
    ]
    bytes: int
    count: Annotated[int | None, Meta(description="allocations; null: before the capture")]


TABLES = (
    ReportTable("memory_devices", MemoryDeviceRow, "memory: peaks, capacity, headroom per device"),
    ReportTable(
        "memory_live_at_peak", MemoryLiveRow, "memory: allocations live at the allocated peak"
    ),
    ReportTable(
        "memory_live_at_snapshot",
        MemoryLiveRow,
        "memory: a paired snapshot's live blocks when it was taken, by Python stack (rows of "
        "the device's trace). Added 2026-12-02",
    ),
)
