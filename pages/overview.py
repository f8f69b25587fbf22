"""Overview page: headline metrics and findings of one job."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from stallscope.errors import StallscopeError
from stallscope.pages.state import get_store, report_for


def render() -> None:
    st.title("Overview")
    store = get_store()
    jobs = store.jobs()
    if not jobs:
        st.info("No traces yet: upload one in the Library.")
        return
    ids = [j["job_id"] for j in jobs]
    wanted = st.query_params.get("job", ids[0])
    index = ids.index(wanted) if wanted in ids else 0
    labels = {j["job_id"]: f"{j.get('name')} ({j['job_id']})" for j in jobs}
    job_id = st.selectbox("Job", ids, index=index, format_func=labels.get)
    st.query_params["job"] = job_id
    try:
        trace_ids = tuple(r.trace_id for r in store.traces(job_id))
        report = report_for(job_id, trace_ids)
    except StallscopeError as exc:
        st.error(str(exc))
        return
    metrics = pd.DataFrame(report["metrics"])
    if not metrics.empty:
        table = metrics.pivot_table(
            index=["rank", "device"], columns="name", values="value", aggfunc="first"
        )
        st.subheader("GPU time")
        st.dataframe(table, use_container_width=True)
    st.subheader(f"Findings ({len(report['findings'])})")
    if not report["findings"]:
        st.success("No findings.")
    for f in report["findings"]:
        with st.expander(
            f"{f['severity'].upper()} · {f['title']} · {f['impact_ns'] / 1e6:.1f} ms lost"
        ):
            st.write(f["detail"])
            st.markdown(f"**Fix:** {f['recommendation']}")
            st.json(f["evidence"], expanded=False)
