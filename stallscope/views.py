"""Tables the dashboard draws, derived from the core (no streamlit here).

Each function takes a report dict or a :class:`JobData` and returns a pandas
DataFrame with documented columns.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from stallscope.analyzers.base import SEVERITY_RANK
from stallscope.jobdata import JobData


def findings_of(
    report: dict[str, Any], analyzer: str, key: str | None = None
) -> list[dict[str, Any]]:
    """Findings of one analyzer (optionally only those whose evidence.key is ``key``)."""
    return [
        f
        for f in report["findings"]
        if f["analyzer"] == analyzer and (key is None or f["evidence"].get("key") == key)
    ]


def grouped_findings(findings: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Findings ranked worst first, the same finding on several ranks or GPUs grouped.

    "The same" is the same analyzer, severity and kind (``evidence.key``, else
    ``evidence.cause``); each group is ranked by its worst member (severity,
    then ``impact_ns``), which comes first. A finding alone is a group of one,
    and so is every ``info`` finding (per-device facts: headlines, tables).
    An 8-rank job whose ranks all wait on the host shows one entry, not eight.
    """
    ranked = sorted(findings, key=lambda f: (-SEVERITY_RANK[f["severity"]], -f["impact_ns"]))
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for index, f in enumerate(ranked):
        kind = f["evidence"].get("key", f["evidence"].get("cause"))
        key = (index,) if f["severity"] == "info" else (f["analyzer"], f["severity"], str(kind))
        groups.setdefault(key, []).append(f)
    return list(groups.values())


def wait_matrix(job: JobData) -> pd.DataFrame:
    """Per matched collective and rank: wait (ns) before the last rank arrived.

    Columns: ``collective`` (0-based instance index in time order), ``op``,
    ``rank``, ``wait_ms``, ``last`` (this rank arrived last). Empty without
    matched collectives. Collectives are matched with the job's skew tolerance
    (:mod:`stallscope.job_settings`: apply the thresholds first), as in the report.
    """
    from stallscope.collectives import match_collectives

    match = match_collectives(job)
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
