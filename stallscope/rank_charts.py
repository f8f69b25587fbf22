"""Charts of many ranks for the Distributed page: a binned wait heatmap and a wait distribution.

Readable at 1,024 ranks: the heatmap draws at most :data:`MAX_ROWS` rows
(ranks in equal bins above that) and :data:`MAX_COLUMNS` columns (collectives
in equal bins), and the distribution is one histogram, not one mark per rank.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

MAX_ROWS = 64  # heatmap rows: above this many ranks, ranks are binned
MAX_COLUMNS = 200  # heatmap columns: above this many collectives, collectives are binned


def rank_bins(ranks: list[int], max_rows: int = MAX_ROWS) -> list[list[int]]:
    """``ranks`` (ascending) cut into at most ``max_rows`` consecutive bins of equal size
    (the last may be smaller); one bin per rank when they fit."""
    size = max(1, math.ceil(len(ranks) / max_rows))
    return [ranks[i : i + size] for i in range(0, len(ranks), size)]


def bin_label(members: list[int]) -> str:
    return f"rank {members[0]}" if len(members) == 1 else f"ranks {members[0]}-{members[-1]}"


def binned_waits(frame: pd.DataFrame, max_rows: int = MAX_ROWS, max_columns: int = MAX_COLUMNS):
    """The :func:`~stallscope.views.wait_matrix` frame as binned grids.

    Returns (rows, columns, least, least_rank, most, most_rank): ``rows`` the bin labels
    (``"rank 3"`` or ``"ranks 0-15"``), ``columns`` the collective-bin labels; per cell the
    least wait (ms) of the bin's ranks and the rank that waited least (the bin's latest
    arrival: the one its collectives waited for), and the most wait and its rank. A cell
    sums a rank's waits over the collectives of its column bin.
    """
    grid = frame.pivot_table(index="rank", columns="collective", values="wait_ms", aggfunc="max")
    grid = grid.fillna(0.0)
    ranks = [int(r) for r in grid.index]
    col_size = max(1, math.ceil(grid.shape[1] / max_columns))
    col_of = np.arange(grid.shape[1]) // col_size
    summed = np.stack(
        [grid.to_numpy()[:, col_of == c].sum(axis=1) for c in range(int(col_of.max()) + 1)], 1
    )  # rank x column bin
    cols = [int(c) for c in grid.columns]
    firsts = [cols[c * col_size] for c in range(summed.shape[1])]
    lasts = [cols[min(len(cols), (c + 1) * col_size) - 1] for c in range(summed.shape[1])]
    columns = [str(a) if a == b else f"{a}-{b}" for a, b in zip(firsts, lasts, strict=True)]
    bins = rank_bins(ranks, max_rows)
    least = np.zeros((len(bins), summed.shape[1]))
    most = np.zeros_like(least)
    least_rank = np.zeros(least.shape, dtype=np.int64)
    most_rank = np.zeros(least.shape, dtype=np.int64)
    start = 0
    for b, members in enumerate(bins):
        block = summed[start : start + len(members)]
        lo, hi = block.argmin(axis=0), block.argmax(axis=0)
        least[b], most[b] = block.min(axis=0), block.max(axis=0)
        least_rank[b] = np.asarray(members)[lo]
        most_rank[b] = np.asarray(members)[hi]
        start += len(members)
    return [bin_label(m) for m in bins], columns, least, least_rank, most, most_rank


def wait_heatmap(frame: pd.DataFrame, max_rows: int = MAX_ROWS) -> go.Figure:
    """Rank × collective heatmap of the time each rank waited (ms) for the last arrival.

    Up to ``max_rows`` ranks, one row per rank (the straggler's row stays pale). Above,
    one row per bin of consecutive ranks, coloured by the bin's *least* wait, so that the
    bin holding a straggler stays pale too; the hover names the bin's latest rank (least
    wait) and the rank that waited most. At most :data:`MAX_COLUMNS` columns.
    """
    fig = go.Figure()
    if frame.empty:
        return fig
    rows, columns, least, least_rank, most, most_rank = binned_waits(frame, max_rows)
    binned = any(label.startswith("ranks ") for label in rows)
    custom = np.stack([least_rank, most, most_rank], axis=-1)
    hover = (
        "collective %{x}<br>%{y}<br>latest rank %{customdata[0]}: waited %{z:.3f} ms"
        "<br>waited most: rank %{customdata[2]}, %{customdata[1]:.3f} ms<extra></extra>"
        if binned
        else "collective %{x}<br>%{y}<br>waited %{z:.3f} ms<extra></extra>"
    )
    fig.add_heatmap(
        z=least,
        x=columns,
        y=rows,
        customdata=custom,
        colorscale="Reds",
        colorbar={"title": "least wait ms" if binned else "wait ms"},
        hovertemplate=hover,
    )
    row_px = 30 if len(rows) <= 16 else max(9, 480 // len(rows))
    fig.update_layout(
        height=140 + row_px * len(rows),
        margin={"l": 10, "r": 10, "t": 20, "b": 10},
        xaxis_title="collective (in time order)",
        yaxis={"autorange": "reversed", "type": "category"},
    )
    return fig


def wait_distribution_figure(per_rank: pd.DataFrame, straggler: int | None = None) -> go.Figure:
    """Histogram of the ranks' exposed wait (ms), the straggler marked.

    ``per_rank``: ``rank``, ``waiting_ms`` (exposed time waiting for a late rank). One
    bar per wait range, however many ranks: the shape shows whether all ranks wait alike
    (one spike) or a few stand out.
    """
    fig = go.Figure()
    if per_rank.empty:
        return fig
    bins = min(60, max(10, len(per_rank) // 4))
    fig.add_histogram(
        x=per_rank["waiting_ms"],
        nbinsx=bins,
        marker={"color": "#c62828"},
        hovertemplate="%{x} ms: %{y} ranks<extra></extra>",
        name="ranks",
    )
    if straggler is not None and straggler in set(per_rank["rank"]):
        value = float(per_rank.loc[per_rank["rank"] == straggler, "waiting_ms"].iloc[0])
        fig.add_vline(
            x=value,
            line={"color": "#1565c0", "dash": "dash"},
            annotation_text=f"straggler rank {straggler}",
            annotation_position="top",
        )
    fig.update_layout(
        height=300,
        margin={"l": 10, "r": 10, "t": 30, "b": 10},
        xaxis_title="exposed wait for a late rank, ms",
        yaxis_title="ranks",
        yaxis=_whole_count_ticks(per_rank["waiting_ms"], bins),
        showlegend=False,
        bargap=0.05,
    )
    return fig


def _whole_count_ticks(values: pd.Series, bins: int) -> dict:
    """Y axis settings for a histogram of rank counts: whole-number ticks. Plotly's own ticks
    step by 0.2 or 0.5 when the tallest bar is a few ranks; then a tick per rank. ``bins``
    approximates Plotly's binning (its bins are at least as wide, its bars at least as tall)."""
    tallest = int(np.histogram(values.to_numpy(dtype=float), bins=bins)[0].max())
    return {"tickformat": "d", "rangemode": "tozero"} | ({"dtick": 1} if tallest <= 10 else {})
