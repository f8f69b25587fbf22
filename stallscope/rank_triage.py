"""Which ranks of a large job the per-rank analyzers read: two-tier triage.

A job of at most :data:`DETAIL_ALL_UP_TO` ranks is analyzed in detail on
every rank. Above that, a first pass over every rank (the rank cards of
:mod:`stallscope.rank_card`, read in one query: kernel time, communication
time and span per rank, and the median step time) finds the ranks out of line, and the per-rank analyzers
(``SPEC.per_rank``) run on those (at most :data:`MAX_OUTLIER_RANKS`, the
farthest first) and on :data:`MEDIAN_RANKS` median ranks for reference. The
analyzers that match collectives across ranks (``nccl_wait``, ``overlap``)
still read every rank. ``stallscope analyze --all-ranks`` analyzes every rank.

A rank is out of line when one of its screening metrics lies beyond the
median of all ranks by more than 3 scaled MADs and more than 10 % of the
median, in either direction (the rule of :mod:`stallscope.finding_groups`,
two-sided: the straggler computes longer and waits less than the others).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stallscope.finding_groups import MAD_TO_SIGMA, OUTLIER_MADS, OUTLIER_MIN_EXCESS
from stallscope.jobdata import JobData
from stallscope.rank_card import card_rows

DETAIL_ALL_UP_TO = 64  # ranks: a job this size or smaller is analyzed in detail on every rank
MAX_OUTLIER_RANKS = 16  # out-of-line ranks analyzed in detail, the farthest out first
MEDIAN_RANKS = 2  # ranks nearest the median step time (or busy time), analyzed for reference

# screening metric -> (label, unit) as the report's reasons write it
SCREEN_METRICS = {
    "step_ms": ("step time", " ms"),
    "busy_pct": ("GPU compute", "% of span"),
    "comm_pct": ("communication (incl. waits)", "% of span"),
}


@dataclass
class RankSelection:
    """The ranks analyzed in detail, each with why; ``ranks`` is the job's rank count."""

    ranks: int
    analyzed: dict[int, str] = field(default_factory=dict)  # rank -> why, ascending
    threshold: int = DETAIL_ALL_UP_TO  # jobs of more ranks than this are triaged
    all_ranks: bool = False  # every rank, forced (--all-ranks)

    def to_dict(self, job_id: str) -> dict[str, Any]:
        """The report's ``rank_selection`` entry (docs/report-schema.md)."""
        return {
            "job": job_id,
            "ranks": self.ranks,
            "threshold": self.threshold,
            "all_ranks": self.all_ranks,
            "analyzed": [{"rank": r, "why": why} for r, why in sorted(self.analyzed.items())],
        }


def screen(job: JobData) -> dict[int, dict[str, float]]:
    """Per rank with GPU kernels: ``step_ms`` (median step duration, ms; absent without
    steps), ``busy_pct`` (non-communication kernel time as % of the span from the first to
    the last kernel; can pass 100 with concurrent streams) and ``comm_pct`` (communication
    kernel time, waits included, as % of that span). Read from the rank cards
    (:mod:`stallscope.rank_card`): one query over all ranks' cards."""
    rank_of = {r.trace_id: int(r.meta.get("rank") or 0) for r in job.traces}
    devices = card_rows(job, "device")
    totals: dict[int, list[int]] = {}  # rank -> [compute, comm, first start, last end]
    for i in np.flatnonzero(~devices.get("first_ns_null", np.zeros(0, bool))).tolist():
        first, last = int(devices["first_ns"][i]), int(devices["last_ns"][i])
        t = totals.setdefault(rank_of[devices["trace_id"][i]], [0, 0, first, last])
        t[0] += max(0, int(devices["compute_ns"][i]))
        t[1] += max(0, int(devices["comm_ns"][i]))
        t[2], t[3] = min(t[2], first), max(t[3], last)
    out = {
        rank: {"busy_pct": 100 * c / (b - a), "comm_pct": 100 * m / (b - a)}
        for rank, (c, m, a, b) in totals.items()
        if b > a
    }
    steps = card_rows(job, "step")
    durations: dict[str, list[int]] = {}
    for trace, a, b in zip(steps["trace_id"].tolist(), steps["start_ns"].tolist(),
                           steps["end_ns"].tolist(), strict=True):  # fmt: skip
        durations.setdefault(trace, []).append(b - a)
    for trace, values in durations.items():
        if rank_of[trace] in out:
            out[rank_of[trace]]["step_ms"] = float(statistics.median(values)) / 1e6
    return out


def out_of_line(values: dict[int, float]) -> dict[int, float]:
    """Rank -> distance from the median in units of the outlier cut (> 1: out of line),
    for the ranks beyond it in either direction; {} with fewer than 3 values."""
    if len(values) < 3:
        return {}
    median = statistics.median(values.values())
    mad = statistics.median(abs(v - median) for v in values.values())
    cut = max(OUTLIER_MADS * MAD_TO_SIGMA * mad, OUTLIER_MIN_EXCESS * abs(median))
    if cut <= 0:
        return {}
    return {r: abs(v - median) / cut for r, v in values.items() if abs(v - median) > cut}


def select_ranks(
    job: JobData, *, all_ranks: bool = False, threshold: int | None = None
) -> RankSelection | None:
    """The ranks of ``job`` to analyze in detail; None for a job of at most ``threshold``
    ranks (default :data:`DETAIL_ALL_UP_TO`): every rank, nothing to report."""
    threshold = DETAIL_ALL_UP_TO if threshold is None else threshold
    ranks = sorted({int(r.meta.get("rank") or 0) for r in job.traces})
    if len(ranks) <= threshold:
        return None
    if all_ranks:
        return RankSelection(len(ranks), {r: "--all-ranks" for r in ranks}, threshold, True)
    metrics = screen(job)
    if not metrics:  # no kernels anywhere: nothing to screen on, and little to analyze
        return RankSelection(
            len(ranks), {r: "no GPU kernels to screen on" for r in ranks}, threshold
        )
    reasons: dict[int, list[str]] = {r: ["no GPU kernels"] for r in ranks if r not in metrics}
    score: dict[int, float] = dict.fromkeys(reasons, float("inf"))
    for name, (label, unit) in SCREEN_METRICS.items():
        values = {r: m[name] for r, m in metrics.items() if name in m}
        if not values:
            continue
        median = statistics.median(values.values())
        for rank, distance in out_of_line(values).items():
            reasons.setdefault(rank, []).append(
                f"{label} {values[rank]:.1f}{unit} (median {median:.1f})"
            )
            score[rank] = max(score.get(rank, 0.0), distance)
    chosen = sorted(score, key=lambda r: (-score[r], r))[:MAX_OUTLIER_RANKS]
    analyzed = {r: "out of line: " + ", ".join(reasons[r]) for r in chosen}
    key = "step_ms" if any("step_ms" in m for m in metrics.values()) else "busy_pct"
    typical = {r: m[key] for r, m in metrics.items() if key in m and r not in score}
    middle = statistics.median(typical.values()) if typical else 0.0
    label, unit = SCREEN_METRICS[key]
    for rank in sorted(typical, key=lambda r: (abs(typical[r] - middle), r))[:MEDIAN_RANKS]:
        analyzed[rank] = f"median rank, for reference ({label} {typical[rank]:.1f}{unit})"
    return RankSelection(len(ranks), dict(sorted(analyzed.items())), threshold)
