"""Build the versioned report (docs/report-schema.md) for stored jobs.

:func:`build_report` runs the analyzers over jobs and returns a plain dict
in the ``stallscope.report/1`` contract; renderers live in ``render``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from stallscope.analyzers import all_specs
from stallscope.analyzers.base import SEVERITY_RANK, AnalyzerResult
from stallscope.jobdata import JobData
from stallscope.store import Store, TraceRef

REPORT_SCHEMA = "stallscope.report/1"


def analyze_job(
    job: JobData, overrides: dict[str, dict[str, float]] | None = None
) -> AnalyzerResult:
    """Run every registered analyzer over one job; ``overrides[analyzer][threshold]``."""
    combined = AnalyzerResult()
    for spec in all_specs():
        result = spec.run(job, spec.params((overrides or {}).get(spec.id)))
        combined.findings.extend(result.findings)
        combined.metrics.extend(result.metrics)
    return combined


def trace_entry(ref: TraceRef) -> dict[str, Any]:
    meta = ref.meta
    return {
        "id": ref.trace_id,
        "name": meta.get("name"),
        "source": meta.get("source"),
        "source_version": meta.get("source_version"),
        "job": ref.job_id,
        "rank": meta.get("rank"),
        "world_size": meta.get("world_size"),
        "devices": meta.get("devices", []),
        "span_ns": meta.get("span_ns"),
        "event_count": meta.get("event_count"),
        "kernel_count": meta.get("kernel_count"),
    }


def build_report(
    store: Store,
    jobs: Iterable[list[TraceRef]],
    overrides: dict[str, dict[str, float]] | None = None,
) -> dict[str, Any]:
    """Report over several jobs (each a list of its traces)."""
    report: dict[str, Any] = {"schema": REPORT_SCHEMA, "traces": [], "metrics": [], "findings": []}
    for refs in jobs:
        job = JobData(store, refs)
        try:
            result = analyze_job(job, overrides)
        finally:
            job.close()
        report["traces"].extend(trace_entry(r) for r in job.traces)
        report["metrics"].extend(m.to_dict() for m in result.metrics)
        report["findings"].extend(f.to_dict() for f in result.findings)
    report["findings"].sort(key=lambda f: (-SEVERITY_RANK[f["severity"]], -f["impact_ns"], f["id"]))
    return report


def worst_severity(report: dict[str, Any]) -> str | None:
    findings = report.get("findings", [])
    if not findings:
        return None
    return max((f["severity"] for f in findings), key=lambda s: SEVERITY_RANK[s])
