"""Timeline page: GPU streams and host threads of one trace, aggregated server-side."""

from __future__ import annotations

import streamlit as st

from stallscope.charts import timeline_figure
from stallscope.pages.state import get_store, report_for, selected_job


@st.cache_data(max_entries=256, show_spinner=False)
def _frame(trace_id: str, job_id: str, start: int, end: int):
    from stallscope.jobdata import JobData
    from stallscope.timeline import Window, timeline_window

    store = get_store()
    job = JobData(store, [r for r in store.traces(job_id) if r.trace_id == trace_id])
    try:
        return timeline_window(job, trace_id, Window(start, end))
    finally:
        job.close()


@st.cache_data(max_entries=256, show_spinner=False)
def _bounds(trace_id: str, job_id: str) -> tuple[int, int, int, int]:
    """(trace start, trace end, default window start, default window end), ns."""
    from stallscope.jobdata import JobData
    from stallscope.timeline import default_window, trace_bounds

    store = get_store()
    job = JobData(store, [r for r in store.traces(job_id) if r.trace_id == trace_id])
    try:
        b, d = trace_bounds(job, trace_id), default_window(job, trace_id)
        return b.start_ns, b.end_ns, d.start_ns, d.end_ns
    finally:
        job.close()


def render() -> None:
    st.title("Timeline")
    picked = selected_job()
    if picked is None:
        return
    job, traces = picked
    ranks = {f"rank {r.meta['rank']}": r for r in traces}
    wanted = st.query_params.get("trace")
    default = next((k for k, r in ranks.items() if r.trace_id == wanted), next(iter(ranks)))
    rank_label = st.sidebar.selectbox("Rank", list(ranks), index=list(ranks).index(default))
    trace = ranks[rank_label]
    st.query_params["trace"] = trace.trace_id
    lo, hi, d_lo, d_hi = _bounds(trace.trace_id, job["job_id"])
    start, end = _window_from_url(lo, hi, (d_lo, d_hi))
    ms = st.slider(
        "Window (ms from the first event)",
        min_value=0.0,
        max_value=max((hi - lo) / 1e6, 0.001),
        value=((start - lo) / 1e6, (end - lo) / 1e6),
        step=max((hi - lo) / 1e6 / 1000, 0.001),
    )
    start, end = lo + int(ms[0] * 1e6), lo + int(ms[1] * 1e6)
    st.query_params["window"] = f"{start}-{end}"
    report = report_for(job["job_id"], traces)
    findings = [
        f for f in report["findings"] if f["trace"] == trace.trace_id and f["severity"] != "info"
    ]
    chosen = st.query_params.get("finding")
    highlight = [w for f in findings if not chosen or f["id"] == chosen for w in f["windows"]]
    frame = _frame(trace.trace_id, job["job_id"], start, end)
    st.caption(
        f"{len(frame)} shapes for {(end - start) / 1e6:.3f} ms; lanes with many events are shown as busy-share bins "
        "(zoom in to see single events); nested host ranges get a sub-lane per depth. Red: windows of the findings."
    )
    st.plotly_chart(timeline_figure(frame, (start, end), highlight), width="stretch")


def _window_from_url(lo: int, hi: int, default: tuple[int, int]) -> tuple[int, int]:
    """The ``window`` query parameter clamped to the trace, else ``default`` (the steps)."""
    text = st.query_params.get("window", "")
    try:
        a, b = (int(x) for x in text.split("-", 1)) if text else default
    except ValueError:
        a, b = default
    a, b = max(lo, min(a, hi)), max(lo, min(b, hi))
    return (a, b) if b > a else (lo, hi)
