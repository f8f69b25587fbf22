"""Distributed page: per-rank overlap, a rank × collective wait heatmap, the straggler."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from stallscope import job_settings
from stallscope.charts import critical_path_figure, wait_heatmap
from stallscope.humanize import records_table
from stallscope.pages.state import current_overrides, get_store, report_for, selected_job
from stallscope.pages.text import literal
from stallscope.views import findings_of


@st.cache_data(max_entries=64, show_spinner=False)
def _waits(job_id: str, skew_tolerance_us: float | None) -> pd.DataFrame:
    from stallscope.jobdata import JobData
    from stallscope.views import wait_matrix

    store = get_store()
    job = JobData(store, store.traces(job_id))
    try:
        # the report's clock correction: the same nccl_wait threshold
        overrides = (
            {}
            if skew_tolerance_us is None
            else {"nccl_wait": {"skew_tolerance_us": skew_tolerance_us}}
        )
        job_settings.apply(job, overrides)
        return wait_matrix(job)
    finally:
        job.close()


def render() -> None:
    st.title("Distributed")
    picked = selected_job()
    if picked is None:
        return
    job, traces = picked
    overrides = current_overrides()
    report = report_for(job["job_id"], traces, overrides)
    overlap = findings_of(report, "overlap")
    if not overlap and not findings_of(report, "nccl_wait"):
        st.info("No communication kernels in this job.")
        return
    rows = [
        {
            "rank": f["rank"],
            "GPU": f["device"],
            "comm ms": f["evidence"].get("comm_ns", 0) / 1e6,
            "hidden %": f["evidence"].get("comm_overlap_pct"),
            "exposed ms": f["evidence"].get("exposed_comm_ns", 0) / 1e6,
            "waiting ms": f["evidence"].get("exposed_wait_ns", 0) / 1e6,
        }
        for f in overlap
        if "comm_ns" in f["evidence"]
    ]
    if rows:
        st.subheader("Communication overlap per rank")
        st.caption(
            "Hidden = share of communication under compute; exposed = the rest. Waiting = exposed time spent waiting for a late rank "
            "is the straggler's cost (below); the rest is transfer that better overlap would hide."
        )
        st.dataframe(
            pd.DataFrame(rows).sort_values(["rank", "GPU"]).round(2),
            width="stretch",
            hide_index=True,
        )
    for f in findings_of(report, "nccl_wait"):
        if f["severity"] != "info":
            st.error(f"{literal(f['title'])} — {literal(f['detail'])}")
    waits = _waits(job["job_id"], overrides.get("nccl_wait", {}).get("skew_tolerance_us"))
    if not waits.empty:
        st.subheader("Time each rank waited in each collective")
        st.caption(
            "Darker: longer wait for the last rank to arrive. The straggler's row stays pale."
        )
        st.plotly_chart(wait_heatmap(waits), width="stretch")
    for f in findings_of(report, "nccl_wait", key="collectives"):
        _critical_path(f["evidence"].get("critical_path") or [])
        ops = pd.DataFrame(f["evidence"].get("ops", []))
        if not ops.empty:
            st.subheader("Collectives by type")
            st.dataframe(records_table(ops.to_dict("records")), width="stretch", hide_index=True)


def _critical_path(steps: list[dict]) -> None:
    """The chosen step's cross-rank critical path: a chart and its table."""
    if not steps:
        return
    st.subheader("Critical path")
    st.caption(
        "The chain of work, waits and idle time that set the step's end, across ranks: shortening "
        "anything off this path does not shorten the step."
    )
    labels = {f"step {s['step']} ({s['time_ns'] / 1e6:.1f} ms)": s for s in steps}
    picked = labels[st.selectbox("Step", list(labels))]
    segments = pd.DataFrame(picked["segments"])
    if segments.empty:
        return
    st.plotly_chart(critical_path_figure(segments), width="stretch")
    table = segments.assign(
        start_ms=(segments["start_ns"] - segments["start_ns"].min()) / 1e6,
        ms=segments["duration_ns"] / 1e6,
    )[["rank", "what", "start_ms", "ms"]]
    st.dataframe(table.round(3), width="stretch", hide_index=True)
