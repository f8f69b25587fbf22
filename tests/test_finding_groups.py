"""The rank distribution of a group of findings: percentiles, outliers, rank ranges."""

from __future__ import annotations

import pytest

from stallscope.finding_groups import (
    OUTLIERS_LISTED,
    outlier_cut,
    percentile,
    rank_ranges,
    spread,
    spread_text,
)

MS = 1_000_000


def waits(impacts_ms: dict[int, float], severity: str = "critical") -> list[dict]:
    """One nccl_wait-like finding per rank, worst first (as grouped_findings orders them)."""
    fs = [
        {"trace": f"t{r}", "rank": r, "device": 0, "severity": severity,
         "impact_ns": int(ms * MS), "analyzer": "nccl_wait", "evidence": {}}
        for r, ms in impacts_ms.items()
    ]  # fmt: skip
    return sorted(fs, key=lambda f: -f["impact_ns"])


def test_nearest_rank_percentile():
    values = list(range(1, 101))  # 1..100
    assert percentile(values, 99) == 99 and percentile(values, 50) == 50
    assert percentile(values, 100) == 100 and percentile([7], 99) == 7
    assert percentile([1, 2, 3], 99) == 3  # ceil(2.97) = 3rd value


def test_rank_ranges_collapse_runs_and_cap_the_list():
    assert rank_ranges([0, *range(2, 128)]) == "0, 2-127"
    assert rank_ranges([5]) == "5"
    assert rank_ranges([1, 3, 5, 7], limit=2) == "1, 3, and 2 more ranks"
    assert rank_ranges([1, 3, 5], limit=2) == "1, 3, and 1 more rank"


def test_outliers_are_beyond_three_scaled_mads_and_ten_percent_above_the_median():
    # 100 ranks at 10 ms, 20 at 11 ms (spread), rank 500 at 30 ms: median 10, MAD 0 -> cut 11 ms
    impacts = {r: 10.0 for r in range(100)} | {100 + r: 11.0 for r in range(20)} | {500: 30.0}
    group = waits(impacts)
    assert outlier_cut([f["impact_ns"] for f in group]) == pytest.approx(11 * MS)
    s = spread(group)
    assert (s.min_ns, s.median_ns, s.max_ns) == (10 * MS, 10 * MS, 30 * MS)
    assert s.p99_ns == 11 * MS  # 121 values: the 120th is 11 ms, only the 121st is 30
    assert s.outliers == [(500, 0, 30 * MS)]  # 11 ms is not beyond the cut: not an outlier
    assert s.per == "rank" and s.ranks[0] == 0 and len(s.ranks) == 121


def test_identical_ranks_have_no_outliers():
    s = spread(waits({r: 190.7 for r in range(127)}))
    assert s.outliers == [] and s.min_ns == s.max_ns


def test_spread_text_names_the_worst_outliers_up_to_the_cap():
    impacts = {r: 1.0 for r in range(200)} | {1000 + r: 50.0 + r for r in range(12)}
    text = spread_text(waits(impacts))
    assert text.startswith(
        "Same finding on 212 ranks (0-199, 1000-1011): ms lost per rank min 1.00"
    )
    assert "outliers: rank 1011 (61.00 ms), rank 1010 (60.00 ms)" in text
    assert f"and {12 - OUTLIERS_LISTED} more." in text
    assert text.count("rank 10") == OUTLIERS_LISTED  # only the listed ones are named


def test_spread_text_counts_gpus_and_mixed_severities():
    group = waits({0: 5.0}) + waits({1: 3.0}, "medium")
    group.append(dict(group[0], device=1, impact_ns=4 * MS))
    group.sort(key=lambda f: -f["impact_ns"])
    text = spread_text(group)
    assert text.startswith("Same finding on 3 GPUs of 2 ranks (0-1): ms lost per GPU min 3.00")
    assert text.endswith("no outliers; critical on 2, medium on 1.")
    assert spread_text(group[:1]) == ""  # a group of one says nothing more
