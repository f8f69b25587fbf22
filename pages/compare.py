"""Compare page: two jobs, the same comparison as ``stallscope compare`` (verdict and why, step
time, where one GPU's step goes, time by cause, communication, copies, kernels, findings' savings);
all the work is ``stallscope.compare.compare_jobs``, the tables are ``compare_tables``."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from stallscope.compare import compare_tables, finding_notes, headline, step_delta_text
from stallscope.pages.spec import PageSpec, Shot
from stallscope.pages.state import get_store, jobs, report_for

ROW_PX = 35  # st.dataframe's row height


@st.cache_data(max_entries=64, show_spinner="Comparing…")
def _compare(base: str, new: str, store_path: str, _reports: tuple) -> dict[str, Any]:
    """The comparison; ``_reports`` (not hashed: the jobs' stored reports, immutable per job)."""
    from stallscope.compare import compare_jobs

    store = get_store()
    return compare_jobs(store, store.traces(base), store.traces(new), top=25, reports=_reports)


PAGE = PageSpec(
    "Compare",
    "compare",
    order=90,
    needs=("base", "new"),
    shots=(Shot("compare", (("base", "healthy"), ("new", "dataloader"))),),
)


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
        "Base", ids, index=_index(ids, st.query_params.get("base"), 1), format_func=names.get
    )
    new = cols[1].selectbox(
        "New", ids, index=_index(ids, st.query_params.get("new"), 0), format_func=names.get
    )
    st.query_params.update({"base": base, "new": new})
    store = get_store()
    reports = tuple(report_for(job_id, store.traces(job_id)) for job_id in (base, new))
    result = _compare(base, new, str(store.root), reports)
    _verdict(result)
    for i, (title, header, rows) in enumerate(compare_tables(result, width=120)):
        st.subheader(title)
        if rows:
            st.dataframe(
                pd.DataFrame(rows, columns=header),
                width="stretch",
                hide_index=True,
                height=ROW_PX * (len(rows) + 1) + 3,  # every row in view: the last rows are totals
            )
        else:
            st.caption("(none)")
        if i == 0:
            st.caption(step_delta_text(result))
    st.caption(
        "The same comparison as `stallscope compare BASE NEW` (docs/compare.md): per-step figures, "
        "so jobs with different step counts compare."
    )


def _index(ids: list[str], wanted: str | None, default: int) -> int:
    return ids.index(wanted) if wanted in ids else min(default, len(ids) - 1)


def _verdict(result: dict[str, Any]) -> None:
    reason, *rest = headline(result)
    text = f"**{result['verdict'].upper()}** — {reason}"
    show = {"regression": st.error, "improvement": st.success}.get(result["verdict"], st.info)
    show(text)
    for para in rest:
        if para.startswith("Warning: "):
            st.warning(para.removeprefix("Warning: "))
        else:  # "Why: ...": the categories that explain the change
            st.markdown(f"**Why:** {para.removeprefix('Why: ')}")
    for note in finding_notes(result):
        st.caption(note)
