"""Compare page: two jobs, the same comparison as ``stallscope compare`` (verdict, step time,
time by cause per step, kernel deltas); all the work is ``stallscope.compare.compare_jobs``."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from stallscope.compare import pct_text
from stallscope.pages.state import get_store, jobs


@st.cache_data(max_entries=64, show_spinner="Comparing…")
def _compare(base: str, new: str, store_path: str) -> dict[str, Any]:
    from stallscope.compare import compare_jobs

    store = get_store()
    return compare_jobs(store, store.traces(base), store.traces(new), top=25)


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
    result = _compare(base, new, str(get_store().root))
    _verdict(result)
    _step_time(result)
    _causes(result)
    _kernels(result)
    st.caption(
        "The same comparison as `stallscope compare BASE NEW` (docs/compare.md): per-step figures, "
        "so jobs with different step counts compare."
    )


def _index(ids: list[str], wanted: str | None, default: int) -> int:
    return ids.index(wanted) if wanted in ids else min(default, len(ids) - 1)


def _verdict(result: dict[str, Any]) -> None:
    text = f"**{result['verdict'].upper()}** — {result['reason']}."
    show = {"regression": st.error, "improvement": st.success}.get(result["verdict"], st.info)
    show(text)
    for warning in result["warnings"]:
        st.warning(warning)
    new_only = result["findings"]["new_only"]
    if new_only:
        st.caption("Findings only in new: " + ", ".join(f"{a} ({sev})" for a, sev in new_only))


def _step_time(result: dict[str, Any]) -> None:
    s = result["step_time"]
    frame = pd.DataFrame(
        [
            {"": "base", "job": result["base"]["job"], "step ms (median)": s["base_median_ms"],
             "std ms": s["base_std_ms"], "steps": s["base_steps"], "from": result["base"]["step_source"]},
            {"": "new", "job": result["new"]["job"], "step ms (median)": s["new_median_ms"],
             "std ms": s["new_std_ms"], "steps": s["new_steps"], "from": result["new"]["step_source"]},
        ]
    ).set_index("")  # fmt: skip
    st.subheader("Step time")
    st.dataframe(frame.round(3), width="stretch")


def _causes(result: dict[str, Any]) -> None:
    rows = [
        {"GPU time per step": f"{r['kind']}: {r['cause']}", "base ms": r["base_ms"],
         "new ms": r["new_ms"], "delta ms": r["delta_ms"], "delta %": pct_text(r["delta_pct"])}
        for r in result["causes"] if r["base_ms"] or r["new_ms"]
    ]  # fmt: skip
    st.subheader("Time by cause (summed over GPUs, per step)")
    st.dataframe(pd.DataFrame(rows).round(3), width="stretch", hide_index=True)


def _kernels(result: dict[str, Any]) -> None:
    rows = [
        {"kernel": r["kernel"], "base ms": r["base_ms"], "new ms": r["new_ms"],
         "delta ms": r["delta_ms"], "delta %": pct_text(r["delta_pct"]),
         "launches (total)": f"{r['base_launches']} -> {r['new_launches']}"}
        for r in result["kernels"]
    ]  # fmt: skip
    st.subheader("Kernels with the largest change (GPU ms per step)")
    st.dataframe(pd.DataFrame(rows).round(3), width="stretch", hide_index=True)
