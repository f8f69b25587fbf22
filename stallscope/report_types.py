"""The types of the ``stallscope.report/1`` contract (docs/report-schema.md).

One :class:`msgspec.Struct` per JSON object of the report: :class:`Report`,
:class:`TraceEntry` (with :class:`DeviceEntry`), :class:`Metric`,
:class:`FindingEntry`, and the cross-rank critical-path table that the
``nccl_wait`` summary finding carries in its evidence
(:class:`CriticalPathStep`, :class:`CriticalPathSegment`). Field order is the
key order of the JSON output.

The JSON Schema shipped as docs/report-schema.json is generated from these
types (:func:`json_schema`, written by tools/gen_report_schema.py);
:func:`decode_report` reads a report back with strict types, so an unknown
key, a missing required key or a value of the wrong type is an error. Keys
added to ``/1`` after its first release (``warnings``, ``saving_ns``) have
defaults: older reports without them still decode and validate.

Times are integer nanoseconds on the trace's clock.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

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


class Report(msgspec.Struct, forbid_unknown_fields=True):
    """A ``stallscope.report/1`` report: traces, metrics, findings (worst first)."""

    schema: Literal["stallscope.report/1"]
    traces: list[TraceEntry]
    metrics: list[Metric]
    findings: list[FindingEntry]

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
