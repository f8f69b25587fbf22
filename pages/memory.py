"""Memory page: allocated and reserved GPU memory over time, the peak, what is live at it,
and the memory analyzer's findings (from Kineto ``profile_memory=True`` traces)."""

from __future__ import annotations

import streamlit as st

from stallscope.humanize import dashed
from stallscope.memory_charts import live_ops_frame, memory_figure, memory_frame
from stallscope.pages.spec import PageSpec, Shot
from stallscope.pages.state import get_store, report_for, selected_job
from stallscope.pages.text import finding_text, literal
from stallscope.views import findings_of, table_of

LIVE_FORMATS = {"count": "{:,.0f}"}  # count: none before the capture; MiB stays a number (sorts)

CAPTURE_HINT = (
    "No allocator events in this job. Capture them with "
    "`torch.profiler.profile(..., profile_memory=True)`."
)

OLD_REPORT = (
    "This report was written before the memory tables (2026-12-01) the timeline is drawn "
    "from: analyzing the job again with this version of stallscope draws it."
)


PAGE = PageSpec(
    "Memory",
    "memory",
    order=80,
    shots=(
        Shot("memory", (("job", "memory_gpt"),)),  # Kineto
        Shot("memory-snapshot", (("job", "snapshot"),)),
        Shot("memory-nsys", (("job", "nsys_mem_train"),)),
        # the memory_fragment trace with the CUDA memory snapshot of the same process: one
        # job, the snapshot paired with the trace's rank
        Shot(
            "memory-paired",
            files=(
                "kineto/memory_fragment/memory_fragment.pt.trace.json.gz",
                "memory_snapshot/memory_fragment.snapshot.pickle.gz",
            ),
            job="memory_fragment + snapshot",
        ),
    ),
)


def render() -> None:
    st.title("Memory")
    picked = selected_job()
    if picked is None:
        return
    job, traces = picked
    report = report_for(job["job_id"], traces)
    devices = table_of(report, "memory_devices")
    if not devices:
        _without_table(findings_of(report, "memory", "summary"))
        return
    for f in findings_of(report, "memory"):
        if f["severity"] != "info":
            st.warning(
                f"{f['severity'].upper()} · {finding_text(f['title'])}\n\n"
                f"{finding_text(f['detail'])}\n\n{finding_text(f['recommendation'])}"
            )
    summaries = {(f["trace"], f["device"]): f for f in findings_of(report, "memory", "summary")}
    con = get_store().connect(traces)
    try:
        for trace_id in dict.fromkeys(row["trace"] for row in devices):
            frame = memory_frame(con, trace_id)
            for row in (r for r in devices if r["trace"] == trace_id):
                summary = summaries.get((trace_id, row["device"]))
                several = len({t["rank"] for t in report["traces"]}) > 1
                _device_section(report, frame, row, summary, several=several)
    finally:
        con.close()


def _device_section(report, frame, row, summary, *, several: bool) -> None:
    """One device: the summary finding's title and detail, the timeline, what is live at the
    peak (the ``memory_devices`` and ``memory_live_at_peak`` rows)."""
    label = f"rank {row['rank']} · " if several else ""
    title = summary["title"] if summary else f"GPU {row['device']} memory"
    st.subheader(label + literal(title))
    if summary:
        st.caption(finding_text(summary["detail"]))
    st.plotly_chart(
        memory_figure(frame, row["device"], row),
        width="stretch",
        key=f"memory-{row['trace']}-{row['device']}",
    )
    ops = live_ops_frame(table_of(report, "memory_live_at_peak", row["trace"], row["device"]))
    if not ops.empty:
        st.markdown("**Live at the allocated peak, by the operator that allocated it**")
        st.dataframe(
            dashed(ops[["op", "MiB", "count"]], LIVE_FORMATS), width="stretch", hide_index=True
        )
    at_snapshot = table_of(report, "memory_live_at_snapshot", row["trace"], row["device"])
    if at_snapshot:
        st.markdown("**Live when the memory snapshot was taken, by Python stack** (the snapshot's)")
        snap = live_ops_frame(at_snapshot)
        st.dataframe(
            dashed(snap[["op", "MiB", "count"]], LIVE_FORMATS), width="stretch", hide_index=True
        )


def _without_table(summaries) -> None:
    """No ``memory_devices`` rows: how to capture allocator events, or (a report written before
    the memory tables) the summaries' text and how to get the timeline."""
    if not summaries:
        st.info(CAPTURE_HINT)
        return
    st.info(OLD_REPORT)
    for summary in summaries:
        st.subheader(literal(summary["title"]))
        st.caption(finding_text(summary["detail"]))
