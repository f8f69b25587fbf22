"""Memory page: allocated and reserved GPU memory over time, the peak, what is live at it,
and the memory analyzer's findings (from Kineto ``profile_memory=True`` traces)."""

from __future__ import annotations

import streamlit as st

from stallscope.memory_charts import live_ops_frame, memory_figure, memory_frame
from stallscope.pages.state import get_store, report_for, selected_job
from stallscope.pages.text import finding_text, literal
from stallscope.views import findings_of

CAPTURE_HINT = (
    "No allocator events in this job. Capture them with "
    "`torch.profiler.profile(..., profile_memory=True)`."
)


def render() -> None:
    st.title("Memory")
    picked = selected_job()
    if picked is None:
        return
    job, traces = picked
    report = report_for(job["job_id"], traces)
    summaries = findings_of(report, "memory", key="summary")
    if not summaries:
        st.info(CAPTURE_HINT)
        return
    for f in findings_of(report, "memory"):
        if f["severity"] != "info":
            st.warning(
                f"{f['severity'].upper()} · {finding_text(f['title'])}\n\n"
                f"{finding_text(f['detail'])}\n\n{finding_text(f['recommendation'])}"
            )
    con = get_store().connect(traces)
    try:
        for trace_id in dict.fromkeys(f["trace"] for f in summaries):
            frame = memory_frame(con, trace_id)
            for summary in (f for f in summaries if f["trace"] == trace_id):
                _device_section(frame, summary, several=len(traces) > 1)
    finally:
        con.close()


def _device_section(frame, summary, *, several: bool) -> None:
    label = f"rank {summary['rank']} · " if several else ""
    st.subheader(label + literal(summary["title"]))
    st.caption(finding_text(summary["detail"]))
    st.plotly_chart(
        memory_figure(frame, summary["device"], summary),
        width="stretch",
        key=f"memory-{summary['trace']}-{summary['device']}",
    )
    ops = live_ops_frame(summary)
    if not ops.empty:
        st.markdown("**Live at the allocated peak, by the operator that allocated it**")
        st.dataframe(ops[["op", "MiB", "count"]], width="stretch", hide_index=True)
