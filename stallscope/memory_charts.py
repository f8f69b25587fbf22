"""The Memory page's figure: allocated and reserved bytes over time, per device, peak marked.

Input: the ``memory`` table of some traces (read here through a store
connection) and the ``memory`` analyzer's typed tables (``memory_devices``,
``memory_live_at_peak``: docs/report-schema.md); output: frames and Plotly figures. No analysis beyond what the analyzer defines (its
:func:`~stallscope.analyzers.memory.device_memory` rebuilds the series).
"""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import pandas as pd
import plotly.graph_objects as go

from stallscope.analyzers.memory import device_memory

MIB = float(1 << 20)
MAX_POINTS = 20_000  # per series: the figure keeps every peak (see _thin)
COLORS = {"allocated": "#1565c0", "reserved": "#ef6c00"}
CAPACITY_LINE_FROM = 0.25  # device memory drawn when the peak uses at least this share of it


def memory_frame(con: duckdb.DuckDBPyConnection, trace_id: str) -> pd.DataFrame:
    """One row per allocator event of the trace: device, ts_ns, allocated and reserved bytes
    (reserved NaN when the trace has no totals, allocated NaN when it records segments only:
    nsys), in event order."""
    cols = con.execute(
        "SELECT device, ts_ns, bytes, total_allocated, total_reserved, addr, tid, action, stack "
        "FROM memory WHERE trace_id = ? AND action IS DISTINCT FROM 'free_block' "
        "ORDER BY device, ts_ns, seq",
        [trace_id],
    ).fetchnumpy()
    parts = []
    for device in np.unique(cols["device"]):
        mask = cols["device"] == device
        mem = device_memory({k: v[mask] for k, v in cols.items()})
        parts.append(
            pd.DataFrame(
                {
                    "device": int(device),
                    "ts_ns": mem.ts_ns,
                    "allocated": mem.allocated if mem.allocated_known else np.nan,
                    "reserved": mem.reserved if mem.reserved is not None else np.nan,
                }
            )
        )
    if not parts:
        return pd.DataFrame(columns=["device", "ts_ns", "allocated", "reserved"])
    return pd.concat(parts, ignore_index=True)


def _thin(frame: pd.DataFrame, limit: int = MAX_POINTS) -> pd.DataFrame:
    """At most about ``limit`` rows: per bucket of events its first row and the rows holding the
    bucket's highest allocated and reserved values, so no peak is lost."""
    if len(frame) <= limit:
        return frame
    buckets = np.arange(len(frame)) * (limit // 3) // len(frame)
    keep = set(frame.groupby(buckets).head(1).index)
    if frame["allocated"].notna().any():  # nsys records no allocated series
        keep |= set(frame.groupby(buckets)["allocated"].idxmax())
    if frame["reserved"].notna().any():
        keep |= set(frame.groupby(buckets)["reserved"].idxmax().dropna().astype(int))
    return frame.loc[sorted(keep)]


def memory_figure(frame: pd.DataFrame, device: int, peaks: dict[str, Any] | None) -> go.Figure:
    """Allocated and reserved MiB of one device against ms since its first event, as steps;
    the allocated peak (``peaks``: the device's ``memory_devices`` row) marked, and the
    device memory drawn when the peak uses a good share of it."""
    part = _thin(frame[frame["device"] == device].reset_index(drop=True))
    fig = go.Figure()
    if part.empty:
        return fig
    t0 = int(part["ts_ns"].iloc[0])
    x = (part["ts_ns"] - t0) / 1e6
    for name in ("reserved", "allocated"):
        if part[name].notna().any():
            fig.add_trace(
                go.Scattergl(
                    x=x, y=part[name] / MIB, name=name, mode="lines",
                    line={"shape": "hv", "color": COLORS[name]},
                    hovertemplate=f"{name} %{{y:,.1f}} MiB at %{{x:.3f}} ms<extra></extra>",
                )
            )  # fmt: skip
    peaks = peaks or {}
    peak_ns = peaks.get("allocated_peak_ns")
    peak = peaks.get("allocated_peak_bytes")
    if peak_ns is not None and peak is not None:
        fig.add_trace(
            go.Scatter(
                x=[(peak_ns - t0) / 1e6], y=[peak / MIB], name="allocated peak",
                mode="markers+text", text=[f"peak {peak / MIB:,.1f} MiB"], textposition="top center",
                marker={"size": 11, "color": "#c62828", "symbol": "diamond"},
            )
        )  # fmt: skip
    _snapshot_markers(fig, peaks, t0)
    capacity = peaks.get("capacity_bytes")
    held = peaks.get("reserved_peak_bytes") or peak or 0
    if capacity and held >= CAPACITY_LINE_FROM * capacity:  # else the line would flatten the series
        fig.add_hline(
            y=capacity / MIB, line_dash="dot", line_color="#757575",
            annotation_text=f"device memory {capacity / MIB:,.0f} MiB",
        )  # fmt: skip
    fig.update_layout(
        xaxis_title="ms since the first allocator event",
        yaxis_title="MiB",
        height=380,
        margin={"l": 10, "r": 10, "t": 30, "b": 10},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02},  # clear of the x title
    )
    return fig


def _snapshot_markers(fig: go.Figure, row: dict[str, Any], t0: int) -> None:
    """A paired memory snapshot's reserved and allocated totals where it was taken (the
    row's ``snapshot_*`` fields), when its time is on the trace's clock."""
    at = row.get("snapshot_ns")
    if at is None:
        return
    for name in ("reserved", "allocated"):
        value = row.get(f"snapshot_{name}_bytes")
        if value is not None:
            fig.add_trace(
                go.Scatter(
                    x=[(at - t0) / 1e6], y=[value / MIB], name=f"{name} at the snapshot",
                    mode="markers", marker={"size": 10, "color": COLORS[name], "symbol": "x"},
                    hovertemplate=f"snapshot: {name} %{{y:,.1f}} MiB at %{{x:.3f}} ms"
                    "<extra></extra>",
                )
            )  # fmt: skip


def live_ops_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """A device's ``memory_live_at_peak`` rows (op, bytes, count) with MiB, for a table."""
    frame = pd.DataFrame(rows, columns=["op", "bytes", "count"])
    if not frame.empty:
        frame["MiB"] = (frame["bytes"] / MIB).round(2)
    return frame
