"""Plotly figures built from reports and timeline frames (no analysis here).

Every function takes plain data (report dicts, DataFrames) and returns a
``plotly.graph_objects.Figure``; the dashboard and the HTML report draw them.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

from stallscope.report_types import IDLE_CAUSES

CAUSE_COLORS = {
    "compute": "#2e7d32",
    "comm": "#1565c0",
    "comm_under": "#4db6ac",
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


# The exclusive parts of a GPU's span, left to right: (column, legend name, color). The busy
# ones come from utilization's *_only_ns / comm_under_compute_ns metrics, the waiting part of
# communication alone from overlap's exposed_comm_wait_ns, idle by cause from gpu_idle.
BUSY_PARTS = (
    ("compute_only_ms", "compute only", "compute"),
    ("comm_under_ms", "communication under compute", "comm_under"),
    ("comm_transfer_ms", "communication alone (exposed)", "comm"),
    ("comm_wait_ms", "communication alone: waiting for other ranks", "comm_wait"),
    ("copy_ms", "copies alone (no kernel beside them)", "memcpy_busy"),
)


def device_time_table(report: dict[str, Any]) -> pd.DataFrame:
    """One row per (trace, rank, device) with GPU activity: the span and its parts, in ms, that
    never overlap and sum to ``span_ms`` (a device known only from other metrics, e.g. a memory
    snapshot's, has no row).

    Busy parts (:data:`BUSY_PARTS`): compute only, communication under compute, communication
    alone split into waiting for other ranks (overlap's ``exposed_comm_wait_ns``, clipped to it)
    and the rest (``comm_transfer_ms``), copies alone. Idle: ``idle_<cause>_ms`` (gpu_idle) and
    ``idle_other_ms``, idle time no cause metric covers (0 when gpu_idle ran). ``busy_ms`` is the
    busy parts' sum. A report without the
    utilization parts (one made before they existed) has NaN busy parts and NaN idle."""
    rows: dict[tuple, dict[str, Any]] = {}
    for m in report["metrics"]:
        if m["device"] is None:
            continue
        row = rows.setdefault(
            (m["trace"], m["rank"], m["device"]),
            {"trace": m["trace"], "rank": m["rank"], "device": m["device"]},
        )
        row[m["name"]] = m["value"]
    frame = pd.DataFrame([row for row in rows.values() if row.get("gpu_span_ns") is not None])
    if frame.empty:
        return frame

    def ms(name: str, default: float = float("nan")) -> pd.Series:
        return frame.get(name, pd.Series(default, index=frame.index)).astype(float) / 1e6

    frame["span_ms"] = ms("gpu_span_ns")
    frame["compute_only_ms"] = ms("compute_only_ns")
    frame["comm_under_ms"] = ms("comm_under_compute_ns")
    comm_only = ms("comm_only_ns")
    frame["comm_wait_ms"] = ms("exposed_comm_wait_ns", 0.0).fillna(0).clip(upper=comm_only)
    frame["comm_transfer_ms"] = comm_only - frame["comm_wait_ms"]
    frame["copy_ms"] = ms("copy_only_ns")
    frame["busy_ms"] = sum(frame[column] for column, _, _ in BUSY_PARTS)
    idle = frame["span_ms"] - frame["busy_ms"]
    for cause in IDLE_CAUSES:
        frame[f"idle_{cause}_ms"] = ms(f"idle_{cause}_ns", 0.0).fillna(0)
    causes = sum(frame[f"idle_{cause}_ms"] for cause in IDLE_CAUSES)
    frame["idle_other_ms"] = (idle - causes).clip(lower=0)
    return frame.sort_values(["rank", "device"]).reset_index(drop=True)


def busy_shares(table: pd.DataFrame) -> dict[str, float]:
    """Job-wide shares (%) over :func:`device_time_table`'s GPUs, weighted by their spans:
    ``busy_pct`` (``gpu_busy_pct``, as the Library's), ``copies_pct`` (copies alone), and,
    only when the job's collectives were matched across ranks (``exposed_comm_wait_ns``
    measured), ``busy_no_wait_pct``: busy less the waiting part of communication alone
    (docs/metrics.md, "GPU busy without NCCL waiting")."""
    span = table["span_ms"].sum()
    out = {
        "busy_pct": float((table["gpu_busy_pct"] * table["span_ms"]).sum() / span),
        "copies_pct": float(100 * table["copy_ms"].fillna(0).sum() / span),
    }
    if "exposed_comm_wait_ns" in table and table["exposed_comm_wait_ns"].notna().any():
        out["busy_no_wait_pct"] = out["busy_pct"] - float(100 * table["comm_wait_ms"].sum() / span)
    return out


LEGEND_ROW_PX = 20  # one legend entry's row height in the time-by-cause chart


def time_by_cause_figure(report: dict[str, Any]) -> go.Figure:
    """Stacked bars per rank/GPU of parts that never overlap and sum to its span, in ms: compute
    only, communication under compute, communication alone (waiting for other ranks apart),
    copies alone, idle by cause (:func:`device_time_table`)."""
    frame = device_time_table(report)
    fig = go.Figure()
    if frame.empty:
        return fig
    # ASCII labels: plotly encodes JSON with orjson when it is installed, which escapes non-ASCII differently
    labels = [f"rank {r}, GPU {d}" for r, d in zip(frame["rank"], frame["device"], strict=True)]
    parts = list(BUSY_PARTS)
    parts += [(f"idle_{c}_ms", f"idle: {c}", c) for c in IDLE_CAUSES]
    parts.append(("idle_other_ms", "idle: cause not measured", "unknown"))
    # compute only always (the busy anchor); the other parts where some GPU has them
    drawn = [p for p in parts if p is parts[0] or frame[p[0]].sum() > 1e-9]
    for column, name, color in drawn:
        fig.add_bar(
            y=labels, x=frame[column], name=name, orientation="h", marker_color=CAUSE_COLORS[color]
        )
    fig.update_layout(
        barmode="stack",
        # room for the legend above the bars even when a narrow page puts one entry per row
        # (plotly otherwise caps it at half the figure and scrolls it)
        height=150 + 40 * len(labels) + LEGEND_ROW_PX * len(drawn),
        margin={"l": 10, "r": 10, "t": 80, "b": 10},
        xaxis_title="ms of each GPU's span (the parts do not overlap)",
        # the legend in the bars' left-to-right order (plotly reverses it for stacked bars)
        legend={
            "orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0, "traceorder": "normal",
            "maxheight": LEGEND_ROW_PX * len(drawn) + 10,
        },
    )  # fmt: skip
    return fig


TIMELINE_COLORS = {
    "compute": "#2e7d32",
    "communication": "#1565c0",
    "memcpy HtoD": "#8e24aa",
    "memcpy DtoH": "#c2185b",
    "memcpy DtoD": "#ba68c8",
    "memcpy PtoP": "#5e35b1",
    "memcpy HtoH": "#f06292",
    "memcpy other": "#9575cd",
    "memset": "#ef6c00",
    "cpu_op": "#8d6e63",
    "runtime": "#f9a825",
    "driver": "#00897b",
    "annotation": "#4fc3f7",
    "step": "#0d47a1",
}
TIMELINE_LEGEND = {
    "compute": "compute kernel", "communication": "communication kernel (NCCL…)",
    "memcpy HtoD": "memcpy HtoD", "memcpy DtoH": "memcpy DtoH", "memcpy DtoD": "memcpy DtoD",
    "memcpy PtoP": "memcpy PtoP", "memcpy HtoH": "memcpy HtoH", "memcpy other": "memcpy",
    "memset": "memset", "cpu_op": "CPU operator", "runtime": "runtime call (launch…)",
    "driver": "driver call", "annotation": "annotation", "step": "step",
}  # fmt: skip
LANE_PX = 24  # pixels per lane; bars are drawn LANE_PX * 0.7 thick
BUSY_BANDS = (0.25, 0.5, 0.75, 1.0)  # bins are drawn at one of 4 opacities (WebGL: one per trace)


def _ms(ns: float) -> str:
    """A duration in µs below 1 ms, else ms."""
    return f"{ns / 1e3:.2f} µs" if ns < 1e6 else f"{ns / 1e6:.3f} ms"


def timeline_hover(frame: pd.DataFrame, t0: int) -> list[str]:
    """Hover text per row: name, start (ms from the window start), duration (µs or ms),
    lane, and grid/block or bytes where present; bins give their event count and busy share."""
    out = []
    columns = ["kind", "name", "start_ns", "end_ns", "lane", "category", "count", "busy", "grid",
               "block", "bytes"]  # fmt: skip
    for kind, name, start_ns, end_ns, lane, category, count, busy, grid, block, nbytes in zip(
        *(frame[c].tolist() for c in columns), strict=True
    ):
        start = f"start {(start_ns - t0) / 1e6:.3f} ms"
        if kind == "bin":
            out.append(
                f"{count} events · mostly {category}<br>{start}, bin of "
                f"{_ms(end_ns - start_ns)}, busy {busy:.0%}<br>{lane}"
            )
            continue
        text = f"<b>{_escape(name[:100])}</b><br>{start} · {_ms(end_ns - start_ns)}<br>{lane} · {category}"
        if isinstance(grid, str):
            text += f"<br>grid {grid} · block {block}"
        if pd.notna(nbytes):
            text += f"<br>{int(nbytes):,} bytes"
        out.append(text)
    return out


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _segments(start: pd.Series, end: pd.Series, y: pd.Series, t0: int):
    """x and y of line segments ``start -> end`` at ``y`` with NaN separators (one WebGL
    trace; float arrays, which plotly sends as compact typed arrays)."""
    import numpy as np

    n = len(start)
    x = np.full(3 * n, np.nan)
    x[0::3] = ((start - t0) / 1e6).to_numpy(dtype=float)
    x[1::3] = ((end - t0) / 1e6).to_numpy(dtype=float)
    ys = np.full(3 * n, np.nan)
    ys[0::3] = ys[1::3] = y.to_numpy(dtype=float)
    return x, ys


class _Traces:
    """Collects trace dicts; :meth:`figure` builds the figure without plotly's per-property
    validation (2.4 s -> 0.14 s for 1M points in a test; the traces are built here, in code)."""

    def __init__(self) -> None:
        self.data: list[dict[str, Any]] = []

    def add_scattergl(self, **kw: Any) -> None:
        self.data.append({"type": "scattergl", **kw})

    def add_scatter(self, **kw: Any) -> None:
        self.data.append({"type": "scatter", **kw})

    def figure(self, layout: dict[str, Any]) -> go.Figure:
        return go.Figure(data=self.data, layout=layout, _validate=False)


def timeline_figure(
    frame: pd.DataFrame,
    window: tuple[int, int],
    findings: list[dict[str, Any]] | None = None,
    *,
    lanes: list[str] | None = None,
    labels: pd.Series | None = None,
    chosen: str | None = None,
    flows: pd.DataFrame | None = None,
    selected: str | None = None,
) -> go.Figure:
    """The timeline of a window: one lane per GPU stream / host thread (``lanes``, top to
    bottom; default: the frame's order), slices colored by category and drawn in WebGL as
    line segments (one trace per category, None-separated), busy-share bins at 4 opacities,
    slice ``labels`` (text per row, '' for none), findings as red windows plus a top lane with
    their titles on hover (``chosen`` highlighted), launch -> GPU ``flows`` as arrows and the
    ``selected`` event (a key) outlined. x in ms from the window start, clipped to the window.

    Every event also gets a marker at its middle (``customdata`` = its key), so a click
    selects it (plotly selects points, never line segments)."""
    t0, t1 = window
    fig = _Traces()
    lanes = (
        lanes
        if lanes is not None
        else list(dict.fromkeys(frame["lane"]))
        if not frame.empty
        else []
    )
    # lane i at y = -i, top to bottom: Streamlit's plotly.js draws WebGL lines at the
    # axis edge when the y axis is reversed, so the axis stays ascending
    pos = {lane: -i for i, lane in enumerate(lanes)}
    width = max(4, int(LANE_PX * 0.7))
    shown = frame[frame["lane"].isin(pos)] if not frame.empty else frame
    if not shown.empty:
        shown = shown.assign(
            start_ns=shown["start_ns"].clip(lower=t0), end_ns=shown["end_ns"].clip(upper=t1)
        )
        y = shown["lane"].map(pos)
        hover = pd.Series(timeline_hover(shown, t0), index=shown.index)
        legend_done: set[str] = set()
        events = shown[shown["kind"] != "bin"]
        for category, part in events.groupby("category", sort=False):
            _add_bars(fig, part, y, hover, t0, str(category), width, 1.0, legend_done)
        bins = shown[shown["kind"] == "bin"]
        if not bins.empty:
            band = bins["busy"].apply(lambda b: next(x for x in BUSY_BANDS if b <= x + 1e-9))
            for (category, level), part in bins.groupby([bins["category"], band], sort=False):
                _add_bars(
                    fig, part, y, hover, t0, str(category), width, max(level, 0.2), legend_done
                )
        for category, part in events.groupby("category", sort=False):
            _add_event_points(fig, part, y, hover, window, str(category))
        if labels is not None:
            text = labels.reindex(events.index).fillna("")
            text = text[text != ""]
            if not text.empty:
                rows = events.loc[text.index]
                fig.add_scattergl(  # WebGL: an SVG trace would sit under the WebGL bars
                    x=((rows["start_ns"] + rows["end_ns"]) / 2 - t0) / 1e6, y=y[text.index],
                    text=text.map(_escape).to_numpy(dtype=str), mode="text", showlegend=False,
                    hoverinfo="skip",
                    textfont={"color": "white", "size": 10}, name="labels",
                )  # fmt: skip
    _finding_windows(fig, findings or [], window, chosen, (-len(lanes) + 0.5, 1.5))
    shapes, annotations = [], []
    if flows is not None and not flows.empty and not shown.empty:
        annotations, more = _flow_arrows(flows, shown, pos, window)
        shapes += more
    if selected is not None and not shown.empty:
        hit = shown[shown["key"] == selected]
        for row in hit.head(1).itertuples():
            shapes.append(_outline(row.start_ns, row.end_ns, pos[row.lane], t0, "#000000"))
    ticks = [-i for i in range(len(lanes))]
    layout = {
        "shapes": shapes,
        "annotations": annotations,
        "yaxis": {
            "tickvals": [1, *ticks] if findings else ticks,
            "ticktext": ["findings", *lanes] if findings else lanes,
            "range": [-len(lanes) + 0.5, 1.5 if findings else 0.5],
            "showgrid": False, "zeroline": False,
        },
        "xaxis": {"title": {"text": "ms from window start"}, "range": [0, (t1 - t0) / 1e6]},
        "height": 140 + LANE_PX * (len(lanes) + (1 if findings else 0)),
        "margin": {"l": 10, "r": 10, "t": 30, "b": 10},
        "showlegend": True,
        "hovermode": "closest",
        "hoverdistance": 20,  # event points lie every 1/60 of the window along long slices
        "clickmode": "event+select",
        "dragmode": "zoom",
        "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0},
    }  # fmt: skip
    fig = fig.figure(layout)
    return fig


def _add_bars(fig, part, y, hover, t0, category, width, opacity, legend_done) -> None:
    """One WebGL trace of None-separated segments; hover comes from the event points."""
    x, ys = _segments(part["start_ns"], part["end_ns"], y[part.index], t0)
    is_bin = bool((part["kind"] == "bin").any())
    extra: dict[str, Any] = {"hoverinfo": "skip"}
    if is_bin:  # bins have no points of their own: their vertices carry the hover
        import numpy as np

        values = hover[part.index].to_numpy(dtype=str)
        text = np.empty(len(x), dtype=values.dtype)
        text[0::3] = text[1::3] = values
        extra = {"text": text, "hovertemplate": "%{text}<extra></extra>"}
    fig.add_scattergl(
        x=x, y=ys, mode="lines", name=TIMELINE_LEGEND.get(category, category),
        legendgroup=category, showlegend=category not in legend_done, opacity=opacity,
        line={"color": TIMELINE_COLORS.get(category, "#90a4ae"), "width": width},
        connectgaps=False, **extra,
    )  # fmt: skip
    legend_done.add(category)


HOVER_STEPS = 60  # a long slice gets a hover point every 1/60 of the window


def _add_event_points(fig, part, y, hover, window, category) -> None:
    """The points that hover and clicks find (``customdata`` = the event's key): a visible
    marker at each event's middle, and invisible ones every 1/60 of the window along longer
    slices, so hovering anywhere on a long bar names it (plotly hovers points, not lines)."""
    import numpy as np

    t0, t1 = window
    step = max((t1 - t0) / HOVER_STEPS, 1.0)
    starts, ends = part["start_ns"].to_numpy(dtype=float), part["end_ns"].to_numpy(dtype=float)
    keys, text = part["key"].to_numpy(dtype=str), hover[part.index].to_numpy(dtype=str)
    ys = y[part.index].to_numpy(dtype=float)
    color = TIMELINE_COLORS.get(category, "#90a4ae")
    common = {
        "mode": "markers", "showlegend": False, "legendgroup": category,
        "hovertemplate": "%{text}<extra></extra>",
        "unselected": {"marker": {"opacity": 1}}, "selected": {"marker": {"opacity": 1}},
    }  # fmt: skip
    fig.add_scattergl(
        x=((starts + ends) / 2 - t0) / 1e6, y=ys, name=f"{category} events",
        marker={"size": 6, "color": color}, customdata=keys, text=text, **common,
    )  # fmt: skip
    counts = np.clip(((ends - starts) // step).astype(int), 0, HOVER_STEPS)
    if counts.sum():
        rows = np.repeat(np.arange(len(part)), counts)
        k = np.concatenate([np.arange(1, c + 1) for c in counts if c])
        offsets = np.minimum(starts[rows] + (k - 0.5) * step, ends[rows])
        unselected = {"marker": {"opacity": 0}}
        fig.add_scattergl(
            x=(offsets - t0) / 1e6, y=ys[rows], name=f"{category} hover",
            marker={"size": 8, "color": color, "opacity": 0}, customdata=keys[rows],
            text=text[rows], **{**common, "unselected": unselected, "selected": unselected},
        )  # fmt: skip


def _outline(start: int, end: int, lane: int, t0: int, color: str) -> dict[str, Any]:
    return {
        "type": "rect", "xref": "x", "yref": "y", "x0": (start - t0) / 1e6, "x1": (end - t0) / 1e6,
        "y0": lane - 0.45, "y1": lane + 0.45, "line": {"color": color, "width": 2},
        "fillcolor": "rgba(0,0,0,0)", "layer": "above",
    }  # fmt: skip


def _finding_windows(fig, findings, window, chosen, y_range: tuple[float, float]) -> None:
    """Findings' windows as red rectangles (two filled traces, None-separated: layout shapes
    cost ~5 ms each to validate), the chosen finding darker and outlined; and, on the top
    lane, one hoverable bar per window with the finding's title."""
    import numpy as np

    t0, t1 = window
    low, high = y_range
    rects: dict[bool, tuple[list, list]] = {False: ([], []), True: ([], [])}
    xs, ys, texts = [], [], []
    for f in findings:
        strong = f.get("id") == chosen
        for start, end in f.get("windows", [])[:200]:
            if end <= t0 or start >= t1:
                continue
            a, b = (max(start, t0) - t0) / 1e6, (min(end, t1) - t0) / 1e6
            rects[strong][0].extend([a, b, b, a, a, None])
            rects[strong][1].extend([low, low, high, high, low, None])
            title = _escape(f.get("title", ""))
            where = f"rank {f['rank']}" if f.get("rank") is not None else ""
            text = f"<b>{title}</b><br>{where} · {(end - start) / 1e6:.3f} ms" + (
                " · chosen" if strong else ""
            )
            xs += [a, b, None]
            ys += [1, 1, None]
            texts += [text, text, None]
    for strong, (rx, ry) in rects.items():
        if rx:
            fig.add_scatter(
                x=np.array(rx, dtype=float), y=np.array(ry, dtype=float), mode="lines", fill="toself", hoverinfo="skip", showlegend=False,
                fillcolor="rgba(239,83,80,0.35)" if strong else "rgba(239,83,80,0.13)",
                line={"width": 2 if strong else 0, "color": "#b71c1c"},
                name="chosen finding" if strong else "finding windows",
            )  # fmt: skip
    if xs:
        fig.add_scatter(
            x=np.array(xs, dtype=float), y=np.array(ys, dtype=float), mode="lines",
            name="finding window", text=np.array([t or "" for t in texts], dtype=str),
            hovertemplate="%{text}<extra></extra>",
            line={"color": "#c62828", "width": max(4, int(LANE_PX * 0.7))},
        )  # fmt: skip


def _flow_arrows(flows: pd.DataFrame, shown: pd.DataFrame, pos: dict[str, int], window):
    """Arrows from each launch call to the GPU activity it launched, and outlines of the
    launches. When one end is outside the window (or in a binned lane), the arrow runs to
    the window's edge on the other end's lane, labelled with the hidden end's name and time."""
    t0, t1 = window
    where = shown[shown["key"] != ""].drop_duplicates("key").set_index("key")
    arrows, outlines = [], []
    for f in flows.head(100).itertuples():
        src = where.loc[f.launch_key] if f.launch_key in where.index else None
        dst = where.loc[f.gpu_key] if f.gpu_key in where.index else None
        if src is None and dst is None:
            continue
        arrow = {
            "xref": "x", "yref": "y", "axref": "x", "ayref": "y", "showarrow": True,
            "arrowhead": 2, "arrowsize": 1.2, "arrowwidth": 1.6, "arrowcolor": "#212121",
            "text": "", "standoff": 2, "font": {"size": 10},
        }  # fmt: skip
        if src is not None and dst is not None:
            arrow |= {"x": (dst.start_ns - t0) / 1e6, "y": pos[dst.lane],
                      "ax": (src.start_ns - t0) / 1e6, "ay": pos[src.lane]}  # fmt: skip
        elif dst is not None:  # the launch is outside: from the left edge
            arrow |= {"x": (dst.start_ns - t0) / 1e6, "y": pos[dst.lane], "ax": 0,
                      "ay": pos[dst.lane] + 0.5, "xanchor": "left",
                      "text": f"{f.launch_name} at {(f.launch_start_ns - t0) / 1e6:.3f} ms"}  # fmt: skip
        else:  # what it launched is outside: to the right edge
            arrow |= {"x": (t1 - t0) / 1e6, "y": pos[src.lane] - 0.5,
                      "ax": (src.start_ns - t0) / 1e6, "ay": pos[src.lane], "xanchor": "right",
                      "text": f"{str(f.gpu_name)[:40]} at {(f.gpu_start_ns - t0) / 1e6:.3f} ms"}  # fmt: skip
        arrows.append(arrow)
        if src is not None:
            outlines.append(_outline(src.start_ns, src.end_ns, pos[src.lane], t0, "#424242"))
    return arrows, outlines


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
    """One row per (trace, rank, device, step) of the report's ``steps`` table, in ms:
    ``compute_ms``; ``exposed_ms`` = busy − compute (communication and copies with no compute
    beside them); ``idle_<cause>_ms``; ``step_ms`` (the host step) and ``window_ms`` (the GPU
    work launched in the step and the idle time charged to it), which the parts sum to."""
    rows = []
    for s in (report.get("tables") or {}).get("steps", []):
        row = {"trace": s["trace"], "rank": s["rank"], "device": s["device"], "step": s["step"]}
        row["step_ms"] = s["step_ms"]
        row["window_ms"] = s["window_ns"] / 1e6
        row["compute_ms"] = s["compute_ns"] / 1e6
        exposed = max(0, s["busy_ns"] - s["compute_ns"]) / 1e6
        row["exposed_ms"] = exposed
        row["comm_ms"] = s["comm_ns"] / 1e6
        row["memcpy_ms"] = s["memcpy_ns"] / 1e6
        # named apart when only one of them ran in the step; else one combined part
        only_copies, only_comm = row["comm_ms"] == 0, row["memcpy_ms"] == 0
        row["exposed_copies_ms"] = exposed if only_copies else 0.0
        row["exposed_comm_ms"] = exposed if only_comm and not only_copies else 0.0
        row["exposed_both_ms"] = exposed - row["exposed_copies_ms"] - row["exposed_comm_ms"]
        for cause in IDLE_CAUSES:
            row[f"idle_{cause}_ms"] = s[f"idle_{cause}_ns"] / 1e6
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
