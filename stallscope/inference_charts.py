"""Plotly figures of the Inference page, from the ``inference`` analyzer's iteration table.

Input: the ``evidence["iterations"]`` rows of the analyzer's ``iterations``
finding (ns on the trace's clock); output: figures (no analysis here).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

PHASE_COLORS = {"decode": "#2e7d32", "prefill": "#c62828", "mixed": "#ef6c00", "unknown": "#78909c"}
PART_COLORS = {
    "GPU work": "#2e7d32",
    "prefill GPU": "#c62828",
    "idle: sync": "#6a1b9a",
    "idle: graph_launch": "#90caf9",
    "idle: launch": "#f9a825",
    "idle: issue": "#ffe082",
    "idle: cpu": "#8d6e63",
    "idle: queued": "#b0bec5",
    "idle: unknown": "#e0e0e0",
}
LINE_LABELS = (("p50", "top left"), ("p90", "top right"), ("p99", "top right"))
IDLE_PARTS = ("sync", "graph_launch", "launch", "issue", "cpu", "queued", "unknown")


def iteration_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows as a frame, times in ms from the first iteration's GPU start."""
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    origin = frame["gpu_start_ns"].min()
    frame["gpu_start_ms"] = (frame["gpu_start_ns"] - origin) / 1e6
    frame["gpu_ms"] = (frame["gpu_end_ns"] - frame["gpu_start_ns"]) / 1e6
    if "period_ns" in frame:
        frame["period_ms"] = frame["period_ns"] / 1e6
    return frame


def percentiles(frame: pd.DataFrame) -> dict[str, float]:
    """p50/p90/p99 and max of the decode periods (ms); empty without periods."""
    if "period_ms" not in frame:
        return {}
    periods = frame["period_ms"].dropna().to_numpy()
    if periods.size == 0:
        return {}
    return {
        "p50": float(np.percentile(periods, 50)),
        "p90": float(np.percentile(periods, 90)),
        "p99": float(np.percentile(periods, 99)),
        "max": float(periods.max()),
    }


def iteration_timeline(frame: pd.DataFrame) -> go.Figure:
    """Each iteration's GPU window as a bar on its phase's row."""
    fig = go.Figure()
    for phase, color in PHASE_COLORS.items():
        part = frame[frame["phase"] == phase]
        if part.empty:
            continue
        fig.add_trace(
            go.Bar(
                y=[phase] * len(part),
                x=part["gpu_ms"],
                base=part["gpu_start_ms"],
                orientation="h",
                name=phase,
                marker_color=color,
                customdata=np.stack([part["index"], part["name"]], axis=-1),
                hovertemplate="iteration %{customdata[0]} · %{customdata[1]}<br>"
                "GPU %{base:.2f} ms + %{x:.3f} ms<extra></extra>",
            )
        )
    fig.update_layout(
        height=230,
        barmode="overlay",
        xaxis_title="ms from the first iteration (GPU window of each iteration)",
        margin=dict(l=10, r=10, t=30, b=10),
        title="Iterations by phase",
    )
    return fig


def tpot_histogram(frame: pd.DataFrame) -> go.Figure:
    """Histogram of the decode periods (time per output token) with p50/p90/p99 lines."""
    periods = frame["period_ms"].dropna() if "period_ms" in frame else pd.Series(dtype=float)
    fig = go.Figure(go.Histogram(x=periods, nbinsx=60, marker_color=PHASE_COLORS["decode"]))
    spread = percentiles(frame)
    for (name, where), shift in zip(LINE_LABELS, (0, -18, -36), strict=True):
        if name in spread:
            fig.add_vline(
                x=spread[name],
                line_dash="dash",
                annotation_text=f"{name} {spread[name]:.2f} ms",
                annotation_position=where,
                annotation_yshift=shift,
            )
    fig.update_layout(
        height=300,
        xaxis_title="time per output token (ms): GPU completion to GPU completion",
        yaxis_title="tokens",
        margin=dict(l=10, r=10, t=30, b=10),
        title="Time per output token",
    )
    return fig


def stall_causes(frame: pd.DataFrame) -> go.Figure:
    """Per decode period, stacked: decode GPU work, prefill GPU work and idle time by cause."""
    decode = frame.dropna(subset=["period_ms"]) if "period_ms" in frame else frame.iloc[0:0]
    fig = go.Figure()
    idle = sum((decode.get(f"idle_{c}_ns", 0) for c in IDLE_PARTS), 0)
    parts = {
        "GPU work": (decode["period_ns"] - idle - decode["prefill_ns"]).clip(lower=0)
        if len(decode)
        else [],
        "prefill GPU": decode.get("prefill_ns", []),
        **{f"idle: {c}": decode.get(f"idle_{c}_ns", []) for c in IDLE_PARTS},
    }
    for name, values in parts.items():
        fig.add_trace(
            go.Bar(
                x=decode["index"],
                y=np.asarray(values) / 1e6,
                name=name,
                marker_color=PART_COLORS[name],
            )
        )
    fig.update_layout(
        barmode="stack",
        height=340,
        xaxis_title="decode iteration",
        yaxis_title="ms of its period",
        margin=dict(l=10, r=10, t=30, b=10),
        title="What each token waited for",
    )
    return fig
