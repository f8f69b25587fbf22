"""Kernels page: hotspots by GPU time, kernel categories and precision.

Reads the report's typed tables ``kernel_categories``, ``kernels`` and ``operators``
(the ``hotspots`` analyzer's, per rank and GPU) and the hotspots finding's title.
"""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import streamlit as st

from stallscope.humanize import records_table, short_kernel_names
from stallscope.pages.spec import PageSpec
from stallscope.pages.state import report_for, selected_job
from stallscope.pages.text import literal
from stallscope.views import findings_of, table_of, table_places

PAGE = PageSpec("Kernels", "kernels", order=40)


def render() -> None:
    st.title("Kernels")
    picked = selected_job()
    if picked is None:
        return
    job, traces = picked
    report = report_for(job["job_id"], traces)
    places = table_places(report, "kernel_categories") or table_places(report, "kernels")
    if not places:
        st.info("No kernels in this job.")
        return
    labels = {f"rank {rank} · GPU {device}": (trace, device) for trace, rank, device in places}
    trace, device = (
        labels[st.selectbox("GPU", list(labels))]
        if len(labels) > 1
        else next(iter(labels.values()))
    )
    title = next(
        (
            f["title"]
            for f in findings_of(report, "hotspots")
            if (f["trace"], f["device"]) == (trace, device)
        ),
        "",
    )
    st.caption(literal(title))
    categories = pd.DataFrame(table_of(report, "kernel_categories", trace, device))
    if not categories.empty:
        categories["ms"] = categories["gpu_ns"] / 1e6
        fig = px.bar(categories, x="ms", y="category", orientation="h", height=260, text="pct")
        fig.update_traces(texttemplate="%{text:.1f}%")
        st.plotly_chart(fig, width="stretch")
    kernels = pd.DataFrame(table_of(report, "kernels", trace, device))
    if not kernels.empty:
        full = kernels.pop("name")
        kernels.insert(0, "kernel", short_kernel_names(list(full)))
        kernels["total ms"] = kernels.pop("total_ns") / 1e6
        kernels["mean µs"] = kernels.pop("mean_ns") / 1e3
        kernels["median µs"] = kernels.pop("median_ns") / 1e3
        kernels["full name"] = full
        st.subheader("Top kernels by GPU time")
        st.dataframe(
            kernels.round(3),
            width="stretch",
            hide_index=True,
            column_config={
                "kernel": st.column_config.TextColumn(
                    "kernel", width="large", help="Short form; the full name is in the last column"
                ),
                "share_pct": st.column_config.NumberColumn("share", format="%.1f%%"),
                "full name": st.column_config.TextColumn("full name", width="large"),
            },
        )
    ops = pd.DataFrame(table_of(report, "operators", trace, device))
    if not ops.empty:
        st.subheader("CPU operators by the GPU time they launched")
        table = records_table(ops.to_dict("records"))
        st.dataframe(
            table.drop(columns=["full name"], errors="ignore"), width="stretch", hide_index=True
        )
