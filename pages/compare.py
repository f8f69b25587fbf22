"""Compare page: two jobs side by side — step time, time by cause, kernel deltas."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from stallscope.charts import device_time_table
from stallscope.pages.state import get_store, jobs, report_for


@st.cache_data(max_entries=64, show_spinner=False)
def _kernel_times(job_id: str) -> pd.DataFrame:
    from stallscope.jobdata import JobData

    store = get_store()
    job = JobData(store, store.traces(job_id))
    try:
        return job.con.execute(
            """SELECT n.name AS kernel, count(*) AS count, sum(g.end_ns - g.start_ns) / 1e6 AS gpu_ms
               FROM gpu g JOIN names n USING (trace_id, name_id) WHERE g.kind = 'kernel' GROUP BY 1"""
        ).fetchdf()
    finally:
        job.close()


def render() -> None:
    st.title("Compare")
    all_jobs = jobs()
    if len(all_jobs) < 2:
        st.info("Compare needs two jobs in the store.")
        return
    names = {j["job_id"]: f"{j.get('name')} · {j['job_id']}" for j in all_jobs}
    ids = list(names)
    cols = st.columns(2)
    base = cols[0].selectbox(
        "Base",
        ids,
        index=ids.index(st.query_params.get("base", ids[1]))
        if st.query_params.get("base") in ids
        else 1,
        format_func=names.get,
    )
    new = cols[1].selectbox(
        "New",
        ids,
        index=ids.index(st.query_params.get("new", ids[0]))
        if st.query_params.get("new") in ids
        else 0,
        format_func=names.get,
    )
    st.query_params.update({"base": base, "new": new})
    store = get_store()
    reports = {
        side: report_for(job_id, store.traces(job_id))
        for side, job_id in (("base", base), ("new", new))
    }
    _summary(reports)
    _kernel_deltas(base, new)


def _summary(reports: dict) -> None:
    rows = []
    for side, report in reports.items():
        table = device_time_table(report)
        metrics = {m["name"]: m["value"] for m in report["metrics"] if m["device"] is None}
        row = {
            "": side,
            "step ms (median)": metrics.get("step_time_ms_median"),
            "step ms (p90)": metrics.get("step_time_ms_p90"),
        }
        if not table.empty:
            row["GPU busy %"] = round(
                float((table["gpu_busy_pct"] * table["span_ms"]).sum() / table["span_ms"].sum()), 2
            )
            for column in [c for c in table.columns if c.startswith("idle_") and c.endswith("_ms")]:
                row[column.removeprefix("idle_").removesuffix("_ms") + " idle ms"] = round(
                    float(table[column].sum()), 3
                )
        rows.append(row)
    frame = pd.DataFrame(rows).set_index("")
    st.subheader("Step time and GPU time by cause")
    st.dataframe(frame.T, width="stretch")


def _kernel_deltas(base: str, new: str) -> None:
    merged = (
        _kernel_times(base)
        .merge(_kernel_times(new), on="kernel", how="outer", suffixes=(" base", " new"))
        .fillna(0)
    )
    merged["Δ gpu ms"] = merged["gpu_ms new"] - merged["gpu_ms base"]
    merged = merged.reindex(merged["Δ gpu ms"].abs().sort_values(ascending=False).index).head(50)
    st.subheader("Kernels that changed most")
    st.dataframe(merged, width="stretch", hide_index=True)
