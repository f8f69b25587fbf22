"""Plotly figures built from reports and timeline frames (no analysis here).

Every function takes plain data (report dicts, DataFrames) and returns a
``plotly.graph_objects.Figure``; the dashboard and the HTML report draw them.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

CAUSE_COLORS = {
    "compute": "#2e7d32",
    "comm": "#1565c0",
    "comm_wait": "#90caf9",
    "memcpy": "#6a1b9a",
    "memcpy_busy": "#ab47bc",
    "dataloader": "#ef6c00",
    "host_sync": "#c62828",
    "launch": "#f9a825",
    "cpu": "#8d6e63",
    "queued": "#78909c",
    "unknown": "#bdbdbd",
}
IDLE_CAUSES = ("dataloader", "host_sync", "memcpy", "launch", "cpu", "queued", "unknown")


def device_time_table(report: dict[str, Any]) -> pd.DataFrame:
    """One row per (trace, rank, device): span and ms of busy categories and idle causes."""
    rows: dict[tuple, dict[str, Any]] = {}
    for m in report["metrics"]:
        if m["device"] is None:
            continue
        row = rows.setdefault(
            (m["trace"], m["rank"], m["device"]),
            {"trace": m["trace"], "rank": m["rank"], "device": m["device"]},
        )
        row[m["name"]] = m["value"]
    frame = pd.DataFrame(list(rows.values()))
    if frame.empty:
        return frame
    span_ms = frame.get("gpu_span_ns", 0) / 1e6
    frame["span_ms"] = span_ms
    for name in ("compute", "comm"):
        frame[f"{name}_ms"] = frame.get(f"{name}_pct", 0) / 100 * span_ms
    # Time inside collectives spent waiting for a late rank (nccl_wait), drawn apart from transfer.
    wait_ms = frame.get("nccl_wait_ns", pd.Series(0.0, index=frame.index)).fillna(0) / 1e6
    frame["comm_wait_ms"] = wait_ms.clip(upper=frame["comm_ms"])
    frame["comm_transfer_ms"] = frame["comm_ms"] - frame["comm_wait_ms"]
    # Copies with no kernel beside them (overlap's exposed_memcpy_ns; else all copy time):
    # a copy-bound GPU is busy copying, and the bar must show it.
    copies_ms = frame.get("memcpy_pct", pd.Series(0.0, index=frame.index)).fillna(0) / 100 * span_ms
    exposed = frame.get("exposed_memcpy_ns", pd.Series(float("nan"), index=frame.index)) / 1e6
    frame["copy_ms"] = exposed.fillna(copies_ms).clip(lower=0)
    for cause in IDLE_CAUSES:
        frame[f"idle_{cause}_ms"] = frame.get(f"idle_{cause}_ns", 0) / 1e6
    return frame.sort_values(["rank", "device"]).reset_index(drop=True)


def time_by_cause_figure(report: dict[str, Any]) -> go.Figure:
    """Stacked bars per rank/GPU: busy (compute, communication, copies with no kernel beside
    them) and idle by cause, in ms."""
    frame = device_time_table(report)
    fig = go.Figure()
    if frame.empty:
        return fig
    # ASCII labels: plotly encodes JSON with orjson when it is installed, which escapes non-ASCII differently
    labels = [f"rank {r}, GPU {d}" for r, d in zip(frame["rank"], frame["device"], strict=True)]
    bars = [("compute", "compute_ms", "compute"), ("communication", "comm_transfer_ms", "comm")]
    if frame["comm_wait_ms"].sum() > 0:
        bars.append(("communication: waiting for other ranks", "comm_wait_ms", "comm_wait"))
    if frame["copy_ms"].sum() > 0:
        bars.append(("copies (no kernel beside them)", "copy_ms", "memcpy_busy"))
    for name, column, color in bars:
        fig.add_bar(
            y=labels, x=frame[column], name=name, orientation="h", marker_color=CAUSE_COLORS[color]
        )
    for cause in IDLE_CAUSES:
        column = f"idle_{cause}_ms"
        if frame[column].sum() > 0:
            fig.add_bar(
                y=labels,
                x=frame[column],
                name=f"idle: {cause}",
                orientation="h",
                marker_color=CAUSE_COLORS[cause],
            )
    fig.update_layout(
        barmode="stack",
        height=170 + 40 * len(labels),
        margin={"l": 10, "r": 10, "t": 80, "b": 10},
        xaxis_title="ms (compute and communication may overlap)",
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},
    )
    return fig


def timeline_figure(
    frame: pd.DataFrame, window: tuple[int, int], highlights: list[list[int]] | None = None
) -> go.Figure:
    """Horizontal bars per lane; bins are shaded by busy share. x in ms from the window start."""
    t0 = window[0]
    fig = go.Figure()
    if not frame.empty:
        lanes = sorted(frame["lane"].unique(), key=lambda lane: (not lane.startswith("GPU"), lane))
        for kind, part in frame.groupby("kind"):
            opacity = part["busy"].clip(0.15, 1.0) if kind == "bin" else None
            # bars clipped to the window: an event that began before it starts at 0, not at -x ms
            starts = part["start_ns"].clip(lower=t0)
            ends = part["end_ns"].clip(upper=window[1])
            fig.add_bar(
                y=part["lane"],
                base=(starts - t0) / 1e6,
                x=(ends - starts).clip(lower=1) / 1e6,
                orientation="h",
                name="many events (busy share)" if kind == "bin" else str(kind),
                marker={"color": _kind_color(str(kind)), "opacity": opacity},
                customdata=part[["name", "count", "busy"]].to_numpy(),
                hovertemplate="%{customdata[0]}<br>start %{base:.3f} ms, %{x:.3f} ms<br>busy %{customdata[2]:.0%}<extra></extra>",
            )
        fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(lanes)))
    # one layout update for all windows: add_vrect per window costs ~30 ms each in plotly
    shapes = [
        {
            "type": "rect", "xref": "x", "yref": "paper", "y0": 0, "y1": 1, "line": {"width": 0},
            "x0": (max(start, t0) - t0) / 1e6, "x1": (min(end, window[1]) - t0) / 1e6,
            "fillcolor": "#ef5350", "opacity": 0.18, "layer": "below",
        }
        for start, end in (highlights or [])[:200]
        if end > window[0] and start < window[1]
    ]  # fmt: skip
    fig.update_layout(shapes=shapes)
    fig.update_layout(
        barmode="overlay",
        height=160 + 28 * max(1, frame["lane"].nunique() if not frame.empty else 1),
        margin={"l": 10, "r": 10, "t": 20, "b": 10},
        xaxis_title="ms from window start",
        xaxis_range=[0, (window[1] - t0) / 1e6],
        showlegend=True,
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},
    )
    return fig


def _kind_color(kind: str) -> str:
    return {
        "kernel": "#2e7d32",
        "memcpy": "#6a1b9a",
        "memcpy_busy": "#ab47bc",
        "memset": "#d81b60",
        "bin": "#455a64",
        "cpu_op": "#8d6e63",
        "runtime": "#f9a825",
        "driver": "#00897b",
        "annotation": "#1e88e5",
    }.get(kind, "#90a4ae")


def wait_heatmap(frame: pd.DataFrame) -> go.Figure:
    """Rank × collective heatmap of the time each rank waited (ms) for the last arrival."""
    fig = go.Figure()
    if frame.empty:
        return fig
    grid = frame.pivot_table(
        index="rank", columns="collective", values="wait_ms", aggfunc="max"
    ).fillna(0)
    fig.add_heatmap(
        z=grid.to_numpy(),
        x=[str(c) for c in grid.columns],
        y=[f"rank {r}" for r in grid.index],
        colorscale="Reds",
        colorbar={"title": "wait ms"},
        hovertemplate="collective %{x}<br>%{y}<br>waited %{z:.3f} ms<extra></extra>",
    )
    fig.update_layout(
        height=140 + 30 * len(grid.index),
        margin={"l": 10, "r": 10, "t": 20, "b": 10},
        xaxis_title="collective (in time order)",
    )
    return fig


def _path_kind(what: str) -> str:
    """Colour class of a critical-path segment: kernels, collective, an idle cause, before capture."""
    if what.startswith("collective"):
        return "comm"
    if what.startswith("idle: "):
        return what[len("idle: ") :]
    if what in ("idle", "gap"):
        return "unknown"
    if what == "before capture":
        return "before capture"
    return "compute"


def critical_path_figure(segments: pd.DataFrame) -> go.Figure:
    """One step's cross-rank critical path as bars per rank (x in ms from the step's start).

    ``segments``: ``rank, what, start_ns, end_ns, duration_ns`` (the ``critical_path``
    evidence of the ``collectives`` finding), earliest first.
    """
    fig = go.Figure()
    if segments.empty:
        return fig
    t0 = int(segments["start_ns"].min())
    frame = segments.assign(
        lane=[f"rank {r}" for r in segments["rank"]],
        kind=[_path_kind(w) for w in segments["what"]],
    )
    for kind, part in frame.groupby("kind", sort=False):
        fig.add_bar(
            y=part["lane"],
            base=(part["start_ns"] - t0) / 1e6,
            x=(part["duration_ns"]).clip(lower=1) / 1e6,
            orientation="h",
            name=str(kind),
            marker={"color": CAUSE_COLORS.get(str(kind), "#e0e0e0")},
            customdata=part[["what"]].to_numpy(),
            hovertemplate="%{customdata[0]}<br>start %{base:.3f} ms, %{x:.3f} ms<extra></extra>",
        )
    lanes = sorted(frame["lane"].unique(), key=lambda lane: int(lane.split()[1]))
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(lanes)))
    fig.update_layout(
        barmode="overlay",
        height=140 + 30 * len(lanes),
        margin={"l": 10, "r": 10, "t": 20, "b": 10},
        xaxis_title="ms from the step's start",
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},
    )
    return fig


def step_rows(report: dict[str, Any]) -> pd.DataFrame:
    """One row per (trace, rank, device, step) from the step_breakdown findings' evidence, in ms:
    ``compute_ms``; ``exposed_ms`` = busy − compute (communication and copies with no compute
    beside them); ``idle_<cause>_ms``; ``step_ms`` (the host step) and ``window_ms`` (the GPU
    work launched in the step and the idle time charged to it), which the parts sum to."""
    rows = []
    for f in report["findings"]:
        if f["analyzer"] != "step_breakdown":
            continue
        for s in f["evidence"].get("steps", []):
            row = {
                "trace": f["trace"],
                "rank": f["rank"],
                "device": s.get("device"),
                "step": s["step"],
            }
            row["step_ms"] = s.get("step_ms", 0.0)
            row["window_ms"] = s.get("window_ns", 0) / 1e6
            row["compute_ms"] = s.get("compute_ns", 0) / 1e6
            exposed = max(0, s.get("busy_ns", 0) - s.get("compute_ns", 0)) / 1e6
            row["exposed_ms"] = exposed
            row["comm_ms"] = s.get("comm_ns", 0) / 1e6
            row["memcpy_ms"] = s.get("memcpy_ns", 0) / 1e6
            # named apart when only one of them ran in the step; else one combined part
            only_copies, only_comm = row["comm_ms"] == 0, row["memcpy_ms"] == 0
            row["exposed_copies_ms"] = exposed if only_copies else 0.0
            row["exposed_comm_ms"] = exposed if only_comm and not only_copies else 0.0
            row["exposed_both_ms"] = exposed - row["exposed_copies_ms"] - row["exposed_comm_ms"]
            for cause in IDLE_CAUSES:
                row[f"idle_{cause}_ms"] = s.get(f"idle_{cause}_ns", 0) / 1e6
            rows.append(row)
    return pd.DataFrame(rows)


def step_stack_figure(rows: pd.DataFrame) -> go.Figure:
    """TensorBoard-plugin-style stacked bar per step of one GPU: compute, communication and
    copies with no compute beside them, idle by cause (ms); the bar's height is the GPU time the
    step launched plus the idle time charged to it (``window_ms``, close to the step's length)."""
    fig = go.Figure()
    if rows.empty:
        return fig
    steps = [f"step {s}" for s in rows["step"]]
    parts = [("compute", "compute_ms", CAUSE_COLORS["compute"]),
             ("communication, no compute beside", "exposed_comm_ms", CAUSE_COLORS["comm"]),
             ("copies, no kernel beside", "exposed_copies_ms", CAUSE_COLORS["memcpy_busy"]),
             ("communication and copies, no compute beside", "exposed_both_ms", CAUSE_COLORS["comm_wait"])]  # fmt: skip
    parts += [(f"idle: {c}", f"idle_{c}_ms", CAUSE_COLORS[c]) for c in IDLE_CAUSES]
    for name, column, color in parts:
        if rows[column].sum() > 0:
            fig.add_bar(
                x=steps,
                y=rows[column],
                name=name,
                marker_color=color,
                customdata=rows[["comm_ms", "memcpy_ms", "step_ms"]].to_numpy(),
                hovertemplate=f"{name}: %{{y:.2f}} ms<br>step %{{customdata[2]:.2f}} ms "
                "(communication %{customdata[0]:.2f} ms, copies %{customdata[1]:.2f} ms in all)"
                "<extra></extra>",
            )
    fig.update_layout(
        barmode="stack",
        height=360,
        margin={"l": 10, "r": 10, "t": 60, "b": 10},
        yaxis_title="ms",
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},
    )
    return fig
