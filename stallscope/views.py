"""Tables the dashboard draws, derived from the core (no streamlit here).

Each function takes a report dict or a :class:`JobData` and returns a pandas
DataFrame with documented columns.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from stallscope.finding_groups import grouped_findings
from stallscope.jobdata import JobData

__all__ = [
    "findings_of",
    "grouped_findings",
    "overlap_rows",
    "table_of",
    "table_places",
    "wait_matrix",
]  # grouped_findings: one grouping, shared with render


def findings_of(
    report: dict[str, Any], analyzer: str, key: str | None = None
) -> list[dict[str, Any]]:
    """Findings of one analyzer (optionally only those whose evidence.key is ``key``)."""
    return [
        f
        for f in report["findings"]
        if f["analyzer"] == analyzer and (key is None or f["evidence"].get("key") == key)
    ]


WHERE_COLUMNS = ("trace", "rank", "device")


def table_of(
    report: dict[str, Any], name: str, trace: str | None = None, device: int | None = None
) -> list[dict[str, Any]]:
    """Rows of the report's typed table ``name`` (``stallscope.report_types.Tables``; columns
    documented in docs/report-schema.md). With ``trace``: only that trace's rows of
    ``device`` (None: the rows without a device), without the trace, rank and device
    columns. A report without tables (written before they were added) has no rows."""
    rows = (report.get("tables") or {}).get(name, [])
    if trace is None:
        return list(rows)
    return [
        {k: v for k, v in row.items() if k not in WHERE_COLUMNS}
        for row in rows
        if row["trace"] == trace and row["device"] == device
    ]


def timeline_traces(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's traces that are a rank's timeline (not a companion such as an Nsight
    Compute result: its format says, ``Format.provides``)."""
    from stallscope.ingest.registry import provides

    return [t for t in report["traces"] if provides(t["source"], "timeline")]


def table_places(report: dict[str, Any], name: str) -> list[tuple[str, int, int | None]]:
    """The (trace, rank, device) that table ``name`` has rows of, in report order."""
    return list(dict.fromkeys((r["trace"], r["rank"], r["device"]) for r in table_of(report, name)))


def overlap_rows(report: dict[str, Any]) -> pd.DataFrame:
    """Per rank and GPU (the report's ``comm_overlap`` table): ``rank``, ``GPU``, ``comm ms``,
    ``hidden %``, ``exposed ms``, ``waiting ms`` (exposed time waiting for a late rank);
    sorted by rank and GPU, rounded to 0.01."""
    rows = [
        {
            "rank": r["rank"],
            "GPU": r["device"],
            "comm ms": r["comm_ns"] / 1e6,
            "hidden %": r["comm_overlap_pct"],
            "exposed ms": r["exposed_comm_ns"] / 1e6,
            "waiting ms": r["exposed_wait_ns"] / 1e6,
        }
        for r in table_of(report, "comm_overlap")
    ]
    columns = ["rank", "GPU", "comm ms", "hidden %", "exposed ms", "waiting ms"]
    return pd.DataFrame(rows, columns=columns).sort_values(["rank", "GPU"]).round(2)


def wait_matrix(job: JobData) -> pd.DataFrame:
    """Per matched collective and rank: wait (ns) before the last rank arrived.

    Columns: ``collective`` (0-based instance index in time order), ``op``,
    ``rank``, ``wait_ms``, ``last`` (this rank arrived last). Empty without
    matched collectives. Collectives are matched with the job's skew tolerance
    (:mod:`stallscope.job_settings`: apply the thresholds first), as in the report
    (:func:`stallscope.collectives.match_waits`: the report's match, from the
    ``collectives`` table alone).
    """
    from stallscope.collectives import match_waits

    match = match_waits(job)
    if match is None:
        return pd.DataFrame(columns=["collective", "op", "rank", "wait_ms", "last"])
    rows, inst = match.rows, match.instances
    matched = rows["inst"] >= 0
    frame = pd.DataFrame(
        {
            "inst": rows["inst"][matched],
            "rank": rows["rank"][matched],
            "wait_ms": rows["wait_ns"][matched] / 1e6,
            "last": rows["last"][matched],
        }
    )
    order = pd.Series(inst["start_ns"]).rank(method="first").astype(int) - 1
    frame["collective"] = order.to_numpy()[frame["inst"].to_numpy()]
    frame["op"] = pd.Series(inst["op"]).to_numpy()[frame["inst"].to_numpy()]
    return frame.drop(columns="inst").sort_values(["collective", "rank"]).reset_index(drop=True)
