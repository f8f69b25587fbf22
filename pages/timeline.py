"""Timeline page: GPU streams and host threads of a job's ranks on one time axis.

State is in the URL: ``ranks`` (``0,1``), ``trace`` (the rank a link came for),
``window`` (``START-END``, ns on the traces' clock), ``finding`` (highlighted)
and ``event`` (the selected slice's key). The data, search and flows come from
:mod:`stallscope.timeline`, the figure from :func:`stallscope.charts.timeline_figure`.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from stallscope.charts import timeline_figure
from stallscope.pages.spec import PageSpec, Shot
from stallscope.pages.state import get_store, report_for, selected_job
from stallscope.pages.text import literal

PLOT_PX = 850  # the chart's drawing width in a 1440 px wide page (lane names take the rest): labels are sized for it
SELECTED = "tl_last_selection"  # the chart selection already acted on (session key)


def _job(job_id: str, trace_ids: tuple[str, ...]):
    from stallscope.jobdata import JobData

    store = get_store()
    return JobData(store, [r for r in store.traces(job_id) if r.trace_id in trace_ids])


@st.cache_data(max_entries=256, show_spinner=False)
def _frame(trace_ids: tuple[str, ...], job_id: str, start: int, end: int) -> pd.DataFrame:
    from stallscope.timeline import Window, timeline_window

    job = _job(job_id, trace_ids)
    try:
        return timeline_window(job, list(trace_ids), Window(start, end))
    finally:
        job.close()


@st.cache_data(max_entries=256, show_spinner=False)
def _bounds(trace_ids: tuple[str, ...], job_id: str) -> tuple[int, int, int, int, int]:
    """(start, end, default window start, default window end, first steps' spread), ns."""
    from stallscope.timeline import default_window, first_step_starts, trace_bounds

    job = _job(job_id, trace_ids)
    try:
        b, d = trace_bounds(job, list(trace_ids)), default_window(job, list(trace_ids))
        firsts = list(first_step_starts(job, list(trace_ids)).values())
        spread = max(firsts) - min(firsts) if len(firsts) > 1 else 0
        return b.start_ns, b.end_ns, d.start_ns, d.end_ns, spread
    finally:
        job.close()


@st.cache_data(max_entries=128, show_spinner=False)
def _search(trace_ids: tuple[str, ...], job_id: str, text: str, window: tuple[int, int] | None):
    from stallscope.timeline import Window, search_events

    job = _job(job_id, trace_ids)
    try:
        return search_events(job, list(trace_ids), text, Window(*window) if window else None)
    finally:
        job.close()


@st.cache_data(max_entries=128, show_spinner=False)
def _event(trace_ids: tuple[str, ...], job_id: str, key: str):
    from stallscope.timeline import find_event, launch_flows

    job = _job(job_id, trace_ids)
    try:
        return find_event(job, key), launch_flows(job, key)
    finally:
        job.close()


PAGE = PageSpec(
    "Timeline",
    "timeline",
    order=30,
    shots=(Shot("timeline"), Shot("timeline-ddp", (("job", "straggler"),))),
)


def render() -> None:
    st.title("Timeline")
    picked = selected_job()
    if picked is None:
        return
    job, traces = picked
    job_id = job["job_id"]
    report = report_for(job_id, traces)
    findings = [f for f in report["findings"] if f["severity"] != "info" and f["windows"]]
    by_rank = {int(r.meta.get("rank") or 0): r for r in traces}
    ranks = _ranks(by_rank, findings)
    if not ranks:
        st.info("Pick at least one rank in the sidebar.")
        return
    ids = tuple(by_rank[r].trace_id for r in ranks)
    if st.query_params.get("trace") not in ids:
        st.query_params["trace"] = ids[0]
    lo, hi, d_lo, d_hi, spread = _bounds(ids, job_id)
    start, end = _window_slider(lo, hi, (d_lo, d_hi))
    chosen = st.query_params.get("finding")
    shown_findings = [
        {"id": f["id"], "title": f["title"], "windows": f["windows"], "rank": f["rank"]}
        for f in findings
        if f["trace"] in ids
    ]
    _search_box(ids, job_id, (start, end), (lo, hi))
    start, end = _window_from_url(lo, hi, (d_lo, d_hi))  # a search pick moved it
    frame = _frame(ids, job_id, start, end)
    event_key = st.query_params.get("event")
    event, flows = _event(ids, job_id, event_key) if event_key else (None, None)
    fig = _figure(frame, (start, end), shown_findings, chosen, flows, event_key)
    _caption(frame, start, end, len(ranks), spread)
    state = st.plotly_chart(
        fig, width="stretch", key="tl_chart", on_select="rerun", selection_mode="points",
        config={"scrollZoom": True, "displaylogo": False},
    )  # fmt: skip
    _picked_in_chart(state)
    if event is not None:
        _details(event, flows, start)


def _ranks(by_rank: dict, findings: list[dict]) -> list[int]:
    """The ranks shown: the sidebar multiselect, defaulting to the URL's ``ranks``, else all
    (up to 8) or rank 0 and the ranks with findings; the linked trace's rank is always in."""
    from stallscope.timeline import default_ranks

    linked = next(
        (r for r, ref in by_rank.items() if ref.trace_id == st.query_params.get("trace")), None
    )
    text = st.query_params.get("ranks", "")
    try:
        wanted = [int(x) for x in text.split(",") if x != ""]
    except ValueError:
        wanted = []
    worst_first = sorted(findings, key=lambda f: -(f.get("impact_ns") or 0))
    default = [r for r in wanted if r in by_rank] or default_ranks(
        list(by_rank), [int(f["rank"]) for f in worst_first]
    )
    if linked is not None and linked not in default:
        default = sorted([*default, linked])
    ranks = st.sidebar.multiselect(
        "Ranks", sorted(by_rank), default=default, format_func=lambda r: f"rank {r}"
    )
    st.query_params["ranks"] = ",".join(str(r) for r in sorted(ranks))
    return sorted(ranks)


def _window_slider(lo: int, hi: int, default: tuple[int, int]) -> tuple[int, int]:
    start, end = _window_from_url(lo, hi, default)
    cols = st.columns([6, 1, 1])
    ms = cols[0].slider(
        "Window (ms from the first event)",
        min_value=0.0,
        max_value=max((hi - lo) / 1e6, 0.001),
        value=((start - lo) / 1e6, (end - lo) / 1e6),
        step=max((hi - lo) / 1e6 / 1000, 0.001),
    )
    start, end = lo + int(ms[0] * 1e6), lo + int(ms[1] * 1e6)
    if cols[1].button("Zoom out ×4", help="Four times as wide, around the same middle"):
        mid, half = (start + end) // 2, (end - start) * 2
        start, end = max(lo, mid - half), min(hi, mid + half)
    if cols[2].button("Steps", help="Back to the captured steps (the whole trace without steps)"):
        start, end = default
    if end <= start:
        start, end = default
    st.query_params["window"] = f"{start}-{end}"
    return start, end


def _window_from_url(lo: int, hi: int, default: tuple[int, int]) -> tuple[int, int]:
    """The ``window`` query parameter clamped to the traces, else ``default`` (the steps)."""
    text = st.query_params.get("window", "")
    try:
        a, b = (int(x) for x in text.split("-", 1)) if text else default
    except ValueError:
        a, b = default
    a, b = max(lo, min(a, hi)), max(lo, min(b, hi))
    return (a, b) if b > a else (lo, hi)


def _search_box(ids: tuple[str, ...], job_id: str, window: tuple[int, int], bounds) -> None:
    """Search slice names (substring, any case); picking a match zooms the window to it."""
    cols = st.columns([3, 2, 5])
    text = cols[0].text_input("Search slices by name", key="tl_search", placeholder="e.g. nccl")
    where = cols[1].radio("In", ["this window", "the whole trace"], horizontal=True, key="tl_in")
    if not text.strip():
        return
    found, total = _search(ids, job_id, text, window if where == "this window" else None)
    if found.empty:
        cols[2].caption(
            literal(f"No slice named like {text!r} {where.replace('the ', 'in the ')}.")
        )
        return
    t0 = window[0]
    picks = {  # label -> (key, start, end); numbered, so labels never collide
        f"{i + 1}. rank {row.rank} · {(row.start_ns - t0) / 1e6:.3f} ms · "
        f"{(row.end_ns - row.start_ns) / 1e3:.1f} µs · {row.name[:90]}": (
            row.key, int(row.start_ns), int(row.end_ns),
        )
        for i, row in enumerate(found.itertuples())
    }  # fmt: skip
    cols[2].selectbox(
        f"Matches ({total:,}" + (f", first {len(found)} shown" if total > len(found) else "") + ")",
        list(picks),
        index=None,
        placeholder="pick one to zoom to it",
        key="tl_match",
        on_change=_zoom_to_match,
        args=(picks, bounds, ids, job_id),
    )


def _zoom_to_match(picks: dict, bounds: tuple[int, int], ids: tuple[str, ...], job_id: str) -> None:
    """Zoom to the picked match, wide enough to show its launch (or what it launched) too
    when that lies within 50 ms, so the flow arrow has both ends."""
    from stallscope.timeline import Window, window_around

    label = st.session_state.get("tl_match")
    if label not in picks:
        return
    key, start, end = picks[label]
    _, flows = _event(ids, job_id, key)
    if flows is not None and not flows.empty:
        lo = min(start, int(flows["launch_start_ns"].min()), int(flows["gpu_start_ns"].min()))
        hi = max(end, int(flows["launch_end_ns"].max()), int(flows["gpu_end_ns"].max()))
        if hi - lo <= 50_000_000:
            start, end = lo, hi
    w = window_around(
        start, end, Window(*bounds), share=0.5 if (start, end) != picks[label][1:] else 0.2
    )
    st.query_params["window"] = f"{w.start_ns}-{w.end_ns}"
    st.query_params["event"] = key


def _figure(frame, window, findings, chosen, flows, event_key):
    from stallscope.timeline import Window, lane_order, slice_labels

    labels = slice_labels(frame, Window(*window), plot_px=PLOT_PX)
    return timeline_figure(
        frame, window, findings, lanes=lane_order(frame), labels=labels, chosen=chosen,
        flows=flows, selected=event_key,
    )  # fmt: skip


def _caption(frame: pd.DataFrame, start: int, end: int, n_ranks: int, spread: int) -> None:
    binned = int((frame["kind"] == "bin").sum()) if not frame.empty else 0
    text = (
        f"{len(frame):,} shapes ({binned:,} busy-share bins) for {(end - start) / 1e6:.3f} ms "
        f"of {n_ranks} rank(s), each on its trace's own clock. Lanes with more than 2,000 events "
        "in the window are drawn as bins colored by the category that fills most of each (zoom "
        "in, search or pick a finding to see single slices). Drag to zoom, double-click to reset; "
        "click a slice for its details and launch arrow. Red: findings' windows."
    )
    if spread > 1_000_000:
        text += (
            f" The ranks' first steps start {spread / 1e6:.3f} ms apart: their clocks may differ, "
            "or a rank started late."
        )
    st.caption(text)


def _picked_in_chart(state) -> None:
    """A click on a slice selects it (its key goes into the URL), once per new selection."""
    points = (state or {}).get("selection", {}).get("points", []) if state else []
    keys = [p.get("customdata") for p in points if isinstance(p.get("customdata"), str)]
    key = keys[0] if keys else None
    if key and key != st.session_state.get(SELECTED):
        st.session_state[SELECTED] = key
        st.query_params["event"] = key
        st.rerun()


def _details(event: dict, flows: pd.DataFrame, t0: int) -> None:
    """The selected slice: what it is, when, where, its launch configuration, and its flows."""
    from stallscope.humanize import short_kernel_name

    dur = int(event["end_ns"] - event["start_ns"])
    name = str(event["name"])
    title = short_kernel_name(name) if event["side"] == "gpu" else name[:120]
    st.subheader("Selected: " + literal(title))
    facts = {
        "name": name,
        "where": event["lane"],
        "category": event["category"],
        "start (ms from window start)": f"{(event['start_ns'] - t0) / 1e6:.4f}",
        "duration": f"{dur / 1e3:.2f} µs" if dur < 1_000_000 else f"{dur / 1e6:.3f} ms",
        "grid": event.get("grid"),
        "block": event.get("block"),
        "registers per thread": event.get("registers_per_thread"),
        "shared memory bytes": event.get("shared_mem_bytes"),
        "bytes": event.get("bytes"),
        "copy kind": event.get("copy_kind"),
        "correlation": event.get("correlation"),
        "external id": event.get("external_id"),
    }
    rows = [
        {"field": k, "value": str(v)} for k, v in facts.items() if v is not None and not pd.isna(v)
    ]
    cols = st.columns([2, 3])
    cols[0].dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    if flows is None or flows.empty:
        cols[1].caption("No launch -> GPU link recorded for this slice (no correlation id).")
        return
    table = pd.DataFrame({
        "launch": flows["launch_name"],
        "launch at ms": ((flows["launch_start_ns"] - t0) / 1e6).round(4),
        "GPU activity": flows["gpu_name"].str.slice(0, 80),
        "GPU start ms": ((flows["gpu_start_ns"] - t0) / 1e6).round(4),
        "launch -> start µs": ((flows["gpu_start_ns"] - flows["launch_start_ns"]) / 1e3).round(2),
    })  # fmt: skip
    cols[1].caption("Launch -> GPU flows (arrows in the chart where both ends are drawn):")
    cols[1].dataframe(table, hide_index=True, width="stretch")
