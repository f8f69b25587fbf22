"""Findings grouped across ranks, and the rank distribution of each group.

One grouping serves the dashboard (:mod:`stallscope.views` re-exports
:func:`grouped_findings`) and the text, Markdown and HTML reports
(:mod:`stallscope.render`): the same finding (same analyzer and kind) on many
ranks is one entry, led by its worst rank, with the distribution of its
impact over the ranks and the ranks that stand out named. Pure functions of
report dicts: no pandas, no streamlit.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stallscope.analyzers.base import SEVERITY_RANK

OUTLIER_MADS = 3.0  # an outlier lies beyond median + OUTLIER_MADS × (1.4826 × MAD) ...
OUTLIER_MIN_EXCESS = 0.10  # ... and at least 10 % above the median (identical ranks have MAD 0)
MAD_TO_SIGMA = 1.4826  # MAD × this estimates the standard deviation of normal data
OUTLIERS_LISTED = 8  # outliers named per group; the rest are counted ("and N more")
RANGES_LISTED = 12  # rank ranges written out ("0, 2-127"); the rest are counted


def finding_kind(finding: dict[str, Any]) -> str:
    """The kind of a finding within its analyzer: ``evidence.key``, else ``evidence.cause``."""
    evidence = finding.get("evidence") or {}
    return str(evidence.get("key", evidence.get("cause", "")))


def grouped_findings(
    findings: Sequence[dict[str, Any]], jobs: Mapping[str, str] | None = None
) -> list[list[dict[str, Any]]]:
    """Findings ranked worst first, the same finding on several ranks or GPUs grouped.

    "The same" is the same analyzer and kind (:func:`finding_kind`), both
    ``info`` or both not (a per-device fact never joins a problem); with
    ``jobs`` (trace id -> job id) also the same job, so that a report over
    several jobs never merges different runs. Each group is ordered worst
    first (severity, then ``impact_ns``, then rank; ties keep the input order) and the
    groups by their worst member, which speaks for the group. An 8-rank job
    whose ranks all wait on the host shows one entry, not eight.
    """
    ranked = sorted(
        findings, key=lambda f: (-SEVERITY_RANK[f["severity"]], -f["impact_ns"], f["rank"])
    )
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for f in ranked:
        job = jobs.get(f["trace"]) if jobs else None
        key = (job, f["analyzer"], finding_kind(f), f["severity"] == "info")
        groups.setdefault(key, []).append(f)
    return list(groups.values())


@dataclass(frozen=True)
class Spread:
    """The rank distribution of one group's impact (ns).

    ``members`` findings on ``ranks`` (distinct, ascending); ``per`` is
    ``"rank"`` when every member is on its own rank, else ``"GPU"``.
    ``outliers``: (rank, device, impact_ns) of the members beyond the median
    by :data:`OUTLIER_MADS` scaled MADs and :data:`OUTLIER_MIN_EXCESS`, worst first.
    ``severities``: member count by severity, worst first.
    """

    members: int
    ranks: list[int]
    per: str
    min_ns: int
    median_ns: float
    p99_ns: int
    max_ns: int
    outliers: list[tuple[int, int | None, int]] = field(default_factory=list)
    severities: dict[str, int] = field(default_factory=dict)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0 < q <= 100) of ``values`` (not empty)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def outlier_cut(values: Sequence[float]) -> float:
    """The value above which a member is an outlier: median + 3 scaled MADs, at least 10 % above."""
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    return median + max(OUTLIER_MADS * MAD_TO_SIGMA * mad, OUTLIER_MIN_EXCESS * abs(median))


def spread(group: Sequence[dict[str, Any]]) -> Spread:
    """The :class:`Spread` of a group from :func:`grouped_findings` (not empty)."""
    impacts = [int(f["impact_ns"]) for f in group]
    ranks = sorted({int(f["rank"]) for f in group})
    cut = outlier_cut(impacts) if len(group) > 2 else math.inf
    outliers = sorted(
        ((int(f["rank"]), f["device"], int(f["impact_ns"])) for f in group if f["impact_ns"] > cut),
        key=lambda o: (-o[2], o[0]),
    )
    severities: dict[str, int] = {}
    for f in group:
        severities[f["severity"]] = severities.get(f["severity"], 0) + 1
    return Spread(
        members=len(group),
        ranks=ranks,
        per="rank" if len(ranks) == len(group) else "GPU",
        min_ns=min(impacts),
        median_ns=statistics.median(impacts),
        p99_ns=int(percentile(impacts, 99)),
        max_ns=max(impacts),
        outliers=outliers,
        severities=dict(sorted(severities.items(), key=lambda s: -SEVERITY_RANK[s[0]])),
    )


def rank_ranges(ranks: Sequence[int], limit: int = RANGES_LISTED) -> str:
    """Ascending ranks as ranges, ``"0, 2-127"``; past ``limit`` ranges, ``", and N more ranks"``."""
    runs: list[tuple[int, int]] = []
    for r in sorted(set(ranks)):
        if runs and r == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], r)
        else:
            runs.append((r, r))
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:limit])
    rest = sum(b - a + 1 for a, b in runs[limit:])
    return text + (f", and {rest} more rank{'s' if rest != 1 else ''}" if rest else "")


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.2f}"


def _where(rank: int, device: int | None, per: str) -> str:
    return f"rank {rank}" + ("" if per == "rank" or device is None else f" gpu {device}")


def spread_text(group: Sequence[dict[str, Any]], limit: int = OUTLIERS_LISTED) -> str:
    """One line on a group of several findings: where, how its impact spreads, the outliers.

    ``"Same finding on 127 ranks (0, 2-127): ms lost per rank min 1.00, median 2.00,
    p99 9.00, max 9.00; outliers: rank 5 (9.00 ms); high on 3, medium on 124."``
    Empty for a group of one.
    """
    if len(group) < 2:
        return ""
    s = spread(group)
    noun = "rank" if len(s.ranks) == 1 else "ranks"
    where = f"{len(s.ranks)} {noun} ({rank_ranges(s.ranks)})"
    if s.per == "GPU":
        where = f"{s.members} GPUs of {where}"
    text = f"Same finding on {where}"
    if s.max_ns > 0:
        text += (
            f": ms lost per {s.per} min {_ms(s.min_ns)}, median {_ms(s.median_ns)}, "
            f"p99 {_ms(s.p99_ns)}, max {_ms(s.max_ns)}"
        )
        if s.outliers:
            named = ", ".join(
                f"{_where(r, d, s.per)} ({_ms(ns)} ms)" for r, d, ns in s.outliers[:limit]
            )
            more = len(s.outliers) - limit
            text += f"; outliers: {named}" + (f", and {more} more" if more > 0 else "")
        elif s.members > 2:
            text += "; no outliers"
    if len(s.severities) > 1:
        text += "; " + ", ".join(f"{sev} on {n}" for sev, n in s.severities.items())
    return text + "."
