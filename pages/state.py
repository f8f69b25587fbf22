"""Shared page helpers: the store and cached reports (no analysis here)."""

from __future__ import annotations

from typing import Any

import streamlit as st

from stallscope.store import Store


@st.cache_resource
def get_store() -> Store:
    return Store().ensure()


@st.cache_data(show_spinner="Analyzing…", max_entries=64)
def report_for(job_id: str, trace_ids: tuple[str, ...]) -> dict[str, Any]:
    """Report for some traces of a job; cached per trace ids (traces are immutable)."""
    from stallscope.report import build_report

    store = get_store()
    refs = [r for r in store.traces(job_id) if r.trace_id in trace_ids]
    return build_report(store, [refs])
