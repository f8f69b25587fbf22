"""The types of the ``stallscope.report/1`` contract (docs/report-schema.md).

One :class:`msgspec.Struct` per JSON object of the report: :class:`Report`,
:class:`TraceEntry` (with :class:`DeviceEntry`), :class:`Metric`,
:class:`FindingEntry`, and the cross-rank critical-path table that the
``nccl_wait`` summary finding carries in its evidence
(:class:`CriticalPathStep`, :class:`CriticalPathSegment`), and the report's
typed tables (:class:`Tables`: one row type per table, filled by the
analyzers' measure functions, read by the dashboard and compare). Field order
is the key order of the JSON output.

The JSON Schema shipped as docs/report-schema.json is generated from these
types (:func:`json_schema`, written by tools/gen_report_schema.py);
:func:`decode_report` reads a report back with strict types, so an unknown
key, a missing required key or a value of the wrong type is an error. Keys
added to ``/1`` after its first release (``warnings``, ``saving_ns``,
``rank_selection``, ``tables``) have defaults: older reports without them still decode and validate.

Times are integer nanoseconds on the trace's clock.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from stallscope.report_tables import Row, declared_tables

REPORT_SCHEMA = "stallscope.report/1"
Severity = Literal["critical", "high", "medium", "low", "info"]

Window = Annotated[list[int], Meta(min_length=2, max_length=2, description="[start_ns, end_ns]")]


class DeviceEntry(msgspec.Struct, forbid_unknown_fields=True):
    """A device with GPU activity in a trace."""

    device: int
    name: Annotated[str | None, Meta(description="null when the trace lacks device properties")]
    sm_count: Annotated[int | None, Meta(description="null when the trace lacks device properties")]


class TraceEntry(msgspec.Struct, forbid_unknown_fields=True):
    """One ingested trace: where it came from and how much it holds."""

    id: Annotated[str, Meta(description="trace id in the store")]
    name: Annotated[str | None, Meta(description="file name")]
    source: Annotated[str | None, Meta(description="input format: kineto, nsys, ncu, ...")]
    source_version: Annotated[str | None, Meta(description="format version (Kineto schemaVersion)")]
    job: Annotated[str, Meta(description="job id; the ranks of one run share it")]
    rank: int | None
    world_size: int | None
    devices: Annotated[list[DeviceEntry], Meta(description="every device with GPU activity")]
    span_ns: Annotated[
        int | None,
        Meta(description="first to last GPU activity (kernels, memcpys, memsets), ns"),
    ]
    event_count: Annotated[int | None, Meta(description="trace events other than metadata")]
    kernel_count: Annotated[int | None, Meta(description="GPU kernels (not memcpy, memset, sync)")]
    warnings: Annotated[
        list[str],
        Meta(description="what ingest noticed about the file; added 2026-11-30 (optional)"),
    ] = []


class Metric(msgspec.Struct, forbid_unknown_fields=True):
    """One number about one trace (and device, where it is per device); docs/metrics.md."""

    trace: Annotated[str, Meta(description="trace id")]
    rank: int
    device: Annotated[int | None, Meta(description="null for per-trace metrics")]
    name: str
    value: float | int | None
    unit: Annotated[str, Meta(description="%, ns, ms, count, bytes or ratio")]

    def to_dict(self) -> dict[str, Any]:
        """This metric as its JSON object (keys in report order)."""
        return msgspec.to_builtins(self, enc_hook=plain_number)


class CriticalPathSegment(msgspec.Struct, forbid_unknown_fields=True):
    """One piece of a step's cross-rank critical path (ns on the ranks' common clock)."""

    rank: int
    what: Annotated[
        str,
        Meta(
            description="a kernel name, 'kernels (N): <longest>', 'collective <kernel>', "
            "'idle: <cause>', 'before capture' or 'gap'"
        ),
    ]
    start_ns: int
    end_ns: int
    duration_ns: int


class CriticalPathStep(msgspec.Struct, forbid_unknown_fields=True):
    """The chain of work that set one step's end, across ranks (earliest first)."""

    step: int
    time_ns: Annotated[int, Meta(description="the job's step time, ns")]
    segments: list[CriticalPathSegment]


# Evidence is analyzer-specific (docs/analyzers/<id>.md); the keys whose shape
# this contract fixes are described here: ``key`` (the finding id's last part)
# and the nccl_wait summary's ``critical_path``.
Evidence = Annotated[
    dict[str, Any],
    Meta(
        description="analyzer-specific facts (documented per analyzer)",
        extra_json_schema={
            "properties": {
                "key": {"type": "string"},
                "critical_path": {
                    "type": "array",
                    "items": {"$ref": "#/$defs/CriticalPathStep"},
                },
            }
        },
    ),
]


class FindingEntry(msgspec.Struct, forbid_unknown_fields=True):
    """A finding as the report holds it (see ``analyzers.base.Finding`` for its meaning)."""

    id: Annotated[str, Meta(description="stable id: analyzer:trace:device[:key]")]
    trace: Annotated[str, Meta(description="trace id")]
    rank: int
    device: Annotated[int | None, Meta(description="null when not device-specific")]
    analyzer: Annotated[str, Meta(description="analyzer id (docs/analyzers/)")]
    severity: Severity
    title: Annotated[str, Meta(description="what")]
    detail: Annotated[str, Meta(description="the numbers behind it")]
    recommendation: Annotated[str, Meta(description="the fix")]
    impact_ns: Annotated[
        int, Meta(description="GPU time lost, ns (0 when the finding is not a time loss)")
    ]
    saving_ns: Annotated[
        int | None,
        Meta(
            description="estimated reduction of the job's total step time if fixed, ns; null: "
            "not estimated. Added 2026-12-01 (optional)"
        ),
    ] = None
    evidence: Evidence = {}
    windows: Annotated[
        list[Window], Meta(description="time windows on the trace's clock that show the problem")
    ] = []


class AnalyzedRank(msgspec.Struct, forbid_unknown_fields=True):
    """One rank the per-rank analyzers read in a triaged job, and why."""

    rank: int
    why: Annotated[str, Meta(description="why this rank was picked (out of line, median, forced)")]


class RankSelection(msgspec.Struct, forbid_unknown_fields=True):
    """Which ranks of a large job the per-rank analyzers read (stallscope.rank_triage)."""

    job: str
    ranks: Annotated[int, Meta(description="the job's rank count")]
    threshold: Annotated[int, Meta(description="jobs of more ranks than this are triaged")]
    all_ranks: Annotated[bool, Meta(description="every rank was analyzed (--all-ranks)")]
    analyzed: list[AnalyzedRank]


# -- typed tables -----------------------------------------------------------------------
# The report's ``tables``: what the analyzers measured, as rows of declared types, so that
# the dashboard and compare read typed columns instead of digging in findings' evidence.
# Each row says where it is of (trace, rank, device). Additive to /1 (2026-12-01).

IDLE_CAUSES = ("dataloader", "host_sync", "memcpy", "launch", "cpu", "queued", "unknown")
"""Causes of GPU idle time, in the order they are charted (``idle_<cause>_ns`` metrics,
:class:`StepRow` columns; stallscope.idle labels them)."""


class KernelRow(Row, kw_only=True):
    """One of a device's top kernels by total GPU time (``hotspots``; ``top_n`` rows)."""

    name: Annotated[str, Meta(description="kernel name as in the trace")]
    category: Annotated[str, Meta(description="gemm, attention, conv, ... (hotspots' rules)")]
    precision: Annotated[str, Meta(description="fp32, bf16, fp16, fp8, ... or unknown")]
    tensor_cores: Annotated[str, Meta(description="yes, no or unknown")]
    count: Annotated[int, Meta(description="launches")]
    total_ns: int
    share_pct: Annotated[float, Meta(description="% of the device's kernel time")]
    mean_ns: int
    median_ns: int
    bound: Annotated[
        str, Meta(description="Nsight Compute's bound when profiled, else how to tell")
    ]


class KernelCategoryRow(Row, kw_only=True):
    """A device's GPU time in one kernel category (``hotspots``; most time first)."""

    category: str
    gpu_ns: Annotated[int, Meta(description="summed durations of kernels, memcpys, memsets")]
    pct: Annotated[float, Meta(description="% of the device's GPU time")]


class OperatorRow(Row, kw_only=True):
    """A CPU operator by the GPU time it launched (``hotspots``; ``top_n`` rows)."""

    name: Annotated[str, Meta(description="operator, '(no operator)' or '(no launch record)'")]
    gpu_ns: int
    kernels: Annotated[int | None, Meta(description="GPU operations it launched")]
    calls: Annotated[int | None, Meta(description="operator instances")]
    share_pct: Annotated[float, Meta(description="% of the device's GPU time")]


class StepRow(Row, kw_only=True):
    """One step of one device (``step_breakdown``): GPU time by category, idle by cause.

    A GPU operation is in the step whose host range launched it; busy, idle and
    window are ns inside the device's span. Rows of a device sum to its totals.
    """

    step: Annotated[int, Meta(description="the ProfilerStep number")]
    step_ms: Annotated[float, Meta(description="the host step's duration, ms")]
    window_ns: Annotated[int, Meta(description="busy_ns + the idle time charged to the step")]
    busy_ns: Annotated[int, Meta(description="union of the step's kernels, copies, memsets")]
    compute_ns: int
    comm_ns: int
    memcpy_ns: Annotated[int, Meta(description="copies and memsets")]
    idle_dataloader_ns: int
    idle_host_sync_ns: int
    idle_memcpy_ns: int
    idle_launch_ns: int
    idle_cpu_ns: int
    idle_queued_ns: int
    idle_unknown_ns: int


class CommOverlapRow(Row, kw_only=True):
    """One device's communication against its compute (``overlap``; devices with
    communication kernels), ns inside the step scope."""

    comm_ns: Annotated[int, Meta(description="union of communication kernels")]
    comm_overlap_pct: Annotated[float, Meta(description="% of comm_ns with compute beside it")]
    exposed_comm_ns: Annotated[int, Meta(description="communication with no compute beside it")]
    exposed_wait_ns: Annotated[
        int, Meta(description="of exposed_comm_ns, waiting for a later rank (0 when one rank)")
    ]
    memcpy_ns: Annotated[int, Meta(description="union of copies and memsets")]
    exposed_memcpy_ns: Annotated[int, Meta(description="copies with no kernel beside them")]


class IterationRow(Row, kw_only=True, omit_defaults=True):
    """One serving iteration of one device (``inference``; at most 2,000 per device).

    Decode iterations with a measured period also carry ``period_ns``,
    ``prefill_ns`` and ``idle_<cause>_ns`` (what the token waited for:
    docs/analyzers/inference.md); the keys are absent on the others.
    """

    index: int
    phase: Annotated[str, Meta(description="prefill, decode, mixed or unknown")]
    name: Annotated[str, Meta(description="the iteration's range name (first 120 characters)")]
    tokens: int
    batch: int
    host_start_ns: int
    host_end_ns: int
    gpu_start_ns: int
    gpu_end_ns: int
    gpu_busy_ns: int
    period_ns: Annotated[
        int | None,
        Meta(description="GPU completion of the previous decode iteration to this one's"),
    ] = None
    prefill_ns: Annotated[int | None, Meta(description="prefill work inside the period")] = None
    idle_sync_ns: int | None = None
    idle_graph_launch_ns: int | None = None
    idle_launch_ns: int | None = None
    idle_issue_ns: int | None = None
    idle_cpu_ns: int | None = None
    idle_queued_ns: int | None = None
    idle_unknown_ns: int | None = None


class OccupancyRow(Row, kw_only=True):
    """One kernel signature (name, grid, block) of a device (``occupancy``; the ones with the
    most GPU time, at most 20), with Nsight Compute's measurements when it was profiled."""

    kernel: str
    launches: int
    gpu_ns: int
    share_pct: Annotated[float, Meta(description="% of the device's kernel time")]
    is_comm: bool
    grid: Annotated[list[int | None], Meta(description="[x, y, z]")]
    block: Annotated[list[int | None], Meta(description="[x, y, z]")]
    registers_per_thread: int | None
    shared_mem_bytes: int | None
    theoretical_occupancy_pct: float | None
    occupancy_from: Annotated[str, Meta(description="where the theoretical occupancy comes from")]
    limiter: Annotated[list[str] | None, Meta(description="the resources that cap it")]
    blocks_per_sm: int | None
    waves_per_sm: float | None
    tail_idle_pct: float | None
    kineto_est_achieved_occupancy_pct: Annotated[
        float | None, Meta(description="Kineto's grid-capped estimate, not a measurement")
    ]
    ncu_achieved_occupancy_pct: Annotated[
        float | None, Meta(description="Nsight Compute's measurement; null: not profiled")
    ]
    ncu_bound: Annotated[
        str | None,
        Meta(description="compute, memory, latency, or how to measure; null: not profiled"),
    ]
    ncu_top_stall: Annotated[
        str | None, Meta(description="'<reason> <share>%' of the top stall; null: not profiled")
    ]


class RankWaitRow(Row, kw_only=True):
    """One rank and device that ``nccl_wait`` reports as waiting in collectives for a later
    rank (one row per waiting finding, same numbers as its evidence), ns."""

    straggler_rank: Annotated[int, Meta(description="the rank whose late arrival cost most wait")]
    waited_ns: Annotated[int, Meta(description="summed waits inside collectives (nccl_wait_ns)")]
    exposed_wait_ns: Annotated[
        int, Meta(description="of waited_ns, with no compute of this rank beside it (impact_ns)")
    ]
    share_of_span_pct: Annotated[
        float, Meta(description="exposed_wait_ns, % of the device's steps (else its GPU span)")
    ]
    wait_outside_capture_ns: Annotated[
        int, Meta(description="wait due to a straggler whose first captured step started later")
    ]
    saving_ns: Annotated[
        int | None,
        Meta(
            description="summed step time saved were the straggler on time (the finding's "
            "saving_ns); null: not estimated"
        ),
    ]


class CriticalPathRow(Row, kw_only=True):
    """One step's cross-rank critical path (``nccl_wait``; first steps of multi-rank jobs). The
    row is of the job's summary finding: its first rank's trace, device null."""

    step: int
    time_ns: Annotated[int, Meta(description="the job's step time, ns")]
    segments: list[CriticalPathSegment]


class CollectiveOpRow(Row, kw_only=True):
    """Matched collectives of one process group and op (``nccl_wait``; the job summary's
    ``ops``). The row is of the summary finding: its first rank's trace, device null."""

    group: Annotated[str, Meta(description="process group")]
    op: str
    count: int
    algorithms: list[str]
    median_bytes: Annotated[int | None, Meta(description="null when some sizes are unknown")]
    median_transfer_ns: int
    median_busbw_gbps: Annotated[float | None, Meta(description="null: no bandwidth known")]
    wait_ns: Annotated[int, Meta(description="summed largest wait of each collective")]


class CoreTables(msgspec.Struct, forbid_unknown_fields=True):
    """The report's typed tables, by name: rows of every job, rank and device, in report
    order. Empty lists where no analyzer measured that table. Added 2026-12-01 (optional)."""

    kernels: Annotated[list[KernelRow], Meta(description="hotspots: top kernels per device")] = []
    kernel_categories: Annotated[
        list[KernelCategoryRow], Meta(description="hotspots: GPU time by kernel category")
    ] = []
    operators: Annotated[
        list[OperatorRow], Meta(description="hotspots: CPU operators by the GPU time they launched")
    ] = []
    steps: Annotated[
        list[StepRow], Meta(description="step_breakdown: per step and device (first 200 steps)")
    ] = []
    comm_overlap: Annotated[
        list[CommOverlapRow], Meta(description="overlap: per device with communication")
    ] = []
    iterations: Annotated[
        list[IterationRow], Meta(description="inference: serving iterations per device")
    ] = []
    occupancy: Annotated[
        list[OccupancyRow], Meta(description="occupancy: kernel signatures per device")
    ] = []
    rank_waits: Annotated[
        list[RankWaitRow],
        Meta(description="nccl_wait: ranks waiting for a straggler. Added 2026-12-01 (optional)"),
    ] = []
    critical_path: Annotated[
        list[CriticalPathRow],
        Meta(description="nccl_wait: each step's cross-rank critical path. Added 2026-12-01"),
    ] = []
    collective_ops: Annotated[
        list[CollectiveOpRow],
        Meta(description="nccl_wait: matched collectives by group and op. Added 2026-12-01"),
    ] = []

    def extend(self, other: CoreTables) -> None:
        """Append ``other``'s rows to these tables, table by table."""
        for name in self.__struct_fields__:
            getattr(self, name).extend(getattr(other, name))


# The report's tables: the core ones above, then those the modules of
# ``stallscope/report_tables/`` declare (one module per analyzer that adds tables, in their
# declared order): an analyzer's new table and its row type live in its own module.
Tables = msgspec.defstruct(
    "Tables",
    [
        (t.name, Annotated[list[t.row], Meta(description=t.description)], [])  # type: ignore[name-defined]
        for t in declared_tables()
    ],
    bases=(CoreTables,),
    module=__name__,
    namespace={"__doc__": CoreTables.__doc__},
)


class Report(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A ``stallscope.report/1`` report: traces, metrics, findings (worst first), rank
    selection, and the analyzers' typed tables."""

    schema: Literal["stallscope.report/1"]
    traces: list[TraceEntry]
    metrics: list[Metric]
    findings: list[FindingEntry]
    rank_selection: Annotated[
        list[RankSelection],
        Meta(
            description="jobs above the triage threshold: the ranks analyzed in detail. "
            "Added 2026-12-01 (optional: present only for such jobs)"
        ),
    ] = []
    tables: Annotated[
        Tables,  # type: ignore[valid-type]
        Meta(
            description="what the analyzers measured, as typed tables (every table, possibly "
            "empty). Added 2026-12-01 (optional: older reports lack it)"
        ),
    ] = msgspec.field(default_factory=Tables)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready objects (keys in report order)."""
        return msgspec.to_builtins(self, enc_hook=plain_number)


def plain_number(value: Any) -> Any:
    """A NumPy scalar as the Python number it holds (``msgspec.to_builtins``'s hook).

    The analyzers compute with NumPy; a value they leave as ``np.float64`` is
    written exactly as the Python float would be.
    """
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot put {type(value).__name__} into a report")


def json_schema(strict: bool = False) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a :class:`Report`, from these types.

    The shipped schema (``strict=False``) accepts keys it does not know: the contract
    grows only by additive keys, so a consumer holding this copy must accept a newer
    report. ``strict=True`` refuses them, as :func:`decode_report` does: stallscope's own
    tests use it, so every key a report carries is declared here.
    """
    (report, _), defs = msgspec.json.schema_components(
        [Report, CriticalPathStep], ref_template="#/$defs/{name}"
    )
    if not strict:
        for definition in defs.values():
            definition.pop("additionalProperties", None)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": REPORT_SCHEMA,
        **report,
        "$defs": defs,
    }


_DECODER = msgspec.json.Decoder(Report)


def decode_report(data: bytes | str) -> Report:
    """A report's JSON as a :class:`Report`, with strict types.

    Raises ``msgspec.ValidationError`` (naming the path, e.g.
    ``$.findings[0].severity``) for an unknown key, a missing required key or a
    value of the wrong type, and ``msgspec.DecodeError`` for text that is not JSON.
    """
    return _DECODER.decode(data)
