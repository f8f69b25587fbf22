"""Charts of many ranks: rank bins, the binned wait heatmap, the wait histogram."""

from __future__ import annotations

import pandas as pd

from stallscope.rank_charts import (
    MAX_ROWS,
    binned_waits,
    rank_bins,
    wait_distribution_figure,
    wait_heatmap,
)


def waits_frame(ranks: int, collectives: int, late: int = 37) -> pd.DataFrame:
    """Every rank waits 5 ms in every collective, except the late rank (0 ms) and rank 80
    in collective 1 (9 ms)."""
    rows = []
    for c in range(collectives):
        for r in range(ranks):
            wait = 0.0 if r == late else 9.0 if (r, c) == (80, 1) else 5.0
            rows.append(
                {"collective": c, "op": "allreduce", "rank": r, "wait_ms": wait, "last": r == late}
            )
    return pd.DataFrame(rows)


def test_rank_bins_are_equal_and_at_most_max_rows():
    assert rank_bins(list(range(64))) == [[r] for r in range(64)]
    bins = rank_bins(list(range(1024)))
    assert len(bins) == MAX_ROWS and {len(b) for b in bins} == {16}
    assert [len(b) for b in rank_bins(list(range(100)))] == [2] * 50
    assert [len(b) for b in rank_bins(list(range(130)))][-1] == 130 - 43 * 3  # 44 bins of 3, then 1


def test_binned_heatmap_keeps_the_straggler_pale_and_names_ranks():
    rows, columns, least, least_rank, most, most_rank = binned_waits(waits_frame(100, 3))
    assert len(rows) == 50 and rows[0] == "ranks 0-1" and rows[18] == "ranks 36-37"
    assert columns == ["0", "1", "2"]
    assert least[18].tolist() == [0.0, 0.0, 0.0] and least_rank[18].tolist() == [37, 37, 37]
    assert most[18].tolist() == [5.0, 5.0, 5.0] and most_rank[18].tolist() == [36, 36, 36]
    assert most[40, 1] == 9.0 and most_rank[40, 1] == 80 and least[40, 1] == 5.0
    fig = wait_heatmap(waits_frame(100, 3))
    assert len(fig.data[0].y) == 50 and "latest rank" in fig.data[0].hovertemplate


def test_many_collectives_are_binned_and_summed():
    rows, columns, least, *_ = binned_waits(waits_frame(4, 250), max_rows=64, max_columns=100)
    assert len(columns) == 84 and columns[0] == "0-2" and columns[-1] == "249"  # bins of 3
    assert rows == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert least[0, 0] == 15.0 and least[0, -1] == 5.0  # three collectives summed, then one


def test_wait_histogram_marks_the_straggler():
    per_rank = pd.DataFrame(
        {"rank": range(256), "waiting_ms": [0.0 if r == 7 else 190.0 for r in range(256)]}
    )
    fig = wait_distribution_figure(per_rank, straggler=7)
    assert len(fig.data) == 1 and len(fig.data[0].x) == 256  # one histogram, not 256 marks
    assert fig.layout.annotations[0].text == "straggler rank 7"


def test_wait_histogram_counts_whole_ranks():
    """A few ranks: one tick per rank, never 0.2 … 0.8 ranks; many alike: Plotly's own ticks."""
    few = pd.DataFrame({"rank": range(4), "waiting_ms": [1.0, 2.0, 3.0, 4.0]})
    axis = wait_distribution_figure(few).layout.yaxis
    assert axis.dtick == 1 and axis.tickformat == "d"
    many = pd.DataFrame({"rank": range(1024), "waiting_ms": [5.0] * 1023 + [0.0]})
    axis = wait_distribution_figure(many, straggler=1023).layout.yaxis
    assert axis.dtick is None and axis.tickformat == "d"
