"""What every analyzer declares and returns.

An analyzer is one module with a module-level :data:`SPEC` (:class:`AnalyzerSpec`)
whose ``run(job, params)`` is pure: it reads the job's canonical tables
through SQL and returns an :class:`AnalyzerResult` (an analyzer whose
``SPEC.per_rank`` is set is given one rank's traces at a time, and
``SPEC.combine_ranks`` joins the ranks' results). Thresholds are declared
once in ``SPEC.thresholds``; the CLI turns them into flags and the dashboard
into widgets, so both read the same declaration.

Inside an analyzer, a function that measures (returns a typed measurement of
one :class:`Where`: numbers and tables, no prose) is kept apart from the one
that speaks (writes the metrics and findings from it): docs/architecture.md.
:class:`Finding` becomes the report's
:class:`~stallscope.report_types.FindingEntry` (the ``stallscope.report/1`` types).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

import msgspec

from stallscope.report_types import FindingEntry, Metric, Severity, Tables, plain_number

SEVERITIES: tuple[str, ...] = get_args(Severity)  # worst first
SEVERITY_RANK = {
    name: rank for rank, name in enumerate(reversed(SEVERITIES))
}  # info=0 ... critical=4


@dataclass(frozen=True)
class Threshold:
    """A tunable number of an analyzer: name, default, unit and help text."""

    name: str
    default: float
    unit: str
    help: str
    minimum: float = 0.0
    maximum: float | None = None


class Where(msgspec.Struct, frozen=True):
    """Which trace, rank and device (None: the trace as a whole) a measurement is of."""

    trace: str
    rank: int
    device: int | None = None


class Finding(msgspec.Struct, kw_only=True):
    """A problem (or notable fact) with its evidence and the fix.

    ``impact_ns`` is the GPU time lost (0 when not a time loss); ``saving_ns``
    the estimated reduction of the job's total step time if the finding were
    fixed (None where the analyzer does not estimate it; the method is
    documented per analyzer); ``windows`` are [start_ns, end_ns] intervals on
    the trace's clock that show it. An analyzer may still add to ``evidence``
    and ``windows`` after building it (the report reads them at the end).
    """

    analyzer: str
    trace: str
    rank: int
    device: int | None
    severity: Severity
    title: str
    detail: str
    recommendation: str
    impact_ns: int = 0
    evidence: dict[str, Any] = {}
    windows: list[list[int]] = []
    saving_ns: int | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    @property
    def id(self) -> str:
        device = "-" if self.device is None else str(self.device)
        key = self.evidence.get("key", "")
        return f"{self.analyzer}:{self.trace}:{device}" + (f":{key}" if key else "")

    def to_entry(self) -> FindingEntry:
        """This finding as the report holds it (:class:`~stallscope.report_types.FindingEntry`)."""
        return FindingEntry(
            id=self.id,
            trace=self.trace,
            rank=self.rank,
            device=self.device,
            analyzer=self.analyzer,
            severity=self.severity,
            title=self.title,
            detail=self.detail,
            recommendation=self.recommendation,
            impact_ns=int(self.impact_ns),
            saving_ns=None if self.saving_ns is None else int(self.saving_ns),
            evidence=self.evidence,
            windows=[[int(a), int(b)] for a, b in self.windows],
        )

    def to_dict(self) -> dict[str, Any]:
        """This finding as its JSON object (keys in report order)."""
        return msgspec.to_builtins(self.to_entry(), enc_hook=plain_number)


class AnalyzerResult(msgspec.Struct):
    """What an analyzer returns: findings, metrics, and the rows of the report's typed
    tables (:class:`~stallscope.report_types.Tables`) its measure functions fill."""

    findings: list[Finding] = []
    metrics: list[Metric] = []
    tables: Tables = msgspec.field(default_factory=Tables)

    def extend(self, other: AnalyzerResult) -> None:
        """Append ``other``'s findings, metrics and table rows to this result."""
        self.findings.extend(other.findings)
        self.metrics.extend(other.metrics)
        self.tables.extend(other.tables)


def concatenate(results: list[AnalyzerResult]) -> AnalyzerResult:
    """The findings, metrics and table rows of ``results``, in order."""
    out = AnalyzerResult()
    for result in results:
        out.extend(result)
    return out


@dataclass(frozen=True)
class AnalyzerSpec:
    """Declaration of one analyzer: id, what it does, thresholds, entry point."""

    id: str  # the module's name (analyzers/<id>.py)
    title: str
    description: str
    run: Callable[[Any, dict[str, float]], AnalyzerResult]
    thresholds: tuple[Threshold, ...] = ()
    # For a ``per_rank`` analyzer (run over each rank alone): the job's result from the
    # ranks' results, in rank order; None = their concatenation.
    combine_ranks: Callable[[list[AnalyzerResult]], AnalyzerResult] | None = None
    # Its place in the report (analyzers run and their findings tie-break in this order;
    # unique among the analyzers, checked when they are discovered). Required.
    order: int = -1
    # Whether it reads one rank at a time: ``report.analyze_job`` then runs it over every
    # rank's traces alone (JobData.rank_parts: a connection over that rank's Parquet files,
    # so a query costs the same at 8 ranks as at 256) and joins the ranks' results with
    # ``combine_ranks``. Contract, checked by tests/test_rank_parts.py: the joined result
    # equals ``run`` over the whole job. The others (overlap, nccl_wait: they match
    # collectives across ranks) get the whole job and read per-rank data through
    # JobData.part_of. Left False, an analyzer runs over the whole job: correct, but slower.
    per_rank: bool = False

    def params(self, overrides: dict[str, float] | None = None) -> dict[str, float]:
        """Defaults merged with overrides keyed by threshold name."""
        values = {t.name: t.default for t in self.thresholds}
        for key, value in (overrides or {}).items():
            if key in values and value is not None:
                values[key] = float(value)
        return values


def graded_thresholds(
    share_help: str, impact_help: str, *, min_impact_ms: float = 1.0
) -> tuple[Threshold, ...]:
    """The ladder :func:`graded_severity` reads: ``share_pct_{low,medium,high,critical}`` (3, 10, 25, 50 %)
    and ``min_impact_ms``. ``share_help`` says what the share is of; ``impact_help`` what the floor applies to."""
    ladder = tuple(
        Threshold(
            f"share_pct_{level}",
            default,
            "%",
            f"{share_help} for a {level}-severity finding",
            maximum=100,
        )
        for level, default in (("low", 3.0), ("medium", 10.0), ("high", 25.0), ("critical", 50.0))
    )
    return (*ladder, Threshold("min_impact_ms", min_impact_ms, "ms", impact_help))


def graded_severity(
    share_pct: float, impact_ns: int, params: dict[str, float], *, prefix: str = "share_pct"
) -> str | None:
    """The worst severity whose ``<prefix>_<level>`` threshold ``share_pct`` reaches.

    None when ``impact_ns`` is below the ``min_impact_ms`` threshold or no
    level is reached; levels an analyzer does not declare are skipped.
    """
    if impact_ns < params["min_impact_ms"] * 1e6:
        return None
    for level in ("critical", "high", "medium", "low"):
        key = f"{prefix}_{level}"
        if key in params and share_pct >= params[key]:
            return level
    return None


def pct(part: float, whole: float) -> float:
    """``part`` as a percentage of ``whole``, rounded to 3 decimals (0 when ``whole`` is 0)."""
    return round(100.0 * part / whole, 3) if whole else 0.0


def severity_at_least(severity: str, floor: str) -> bool:
    return SEVERITY_RANK[severity] >= SEVERITY_RANK[floor]
