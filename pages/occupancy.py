"""Occupancy page: per-kernel theoretical (and, with Nsight Compute, achieved) occupancy.

The tables are the report's typed ``occupancy`` table (per rank and GPU), titled by the
``occupancy`` analyzer's ``table`` findings.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from stallscope.pages.spec import PageSpec, Shot
from stallscope.pages.state import report_for, selected_job
from stallscope.pages.text import finding_text
from stallscope.views import findings_of, table_of

COLUMNS = [
    "kernel", "share_pct", "launches", "theoretical_occupancy_pct", "ncu achieved %", "ncu bound",
    "ncu top stall", "limiter", "block", "grid", "registers_per_thread", "shared_mem_bytes", "waves_per_sm",
    "tail_idle_pct",
]  # fmt: skip


NCU_COLUMNS = {
    "ncu_achieved_occupancy_pct": "ncu achieved %",
    "ncu_bound": "ncu bound",
    "ncu_top_stall": "ncu top stall",
}


def _ncu_columns(frame: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """The table with the Nsight Compute columns named for the page, or without them when no
    kernel was profiled (``ncu_bound`` is set for every profiled kernel); and whether any was."""
    if "ncu_bound" not in frame or not frame["ncu_bound"].notna().any():
        return frame.drop(columns=list(NCU_COLUMNS), errors="ignore"), False
    return frame.rename(columns=NCU_COLUMNS), True


PAGE = PageSpec(
    "Occupancy", "occupancy", order=70, shots=(Shot("occupancy", (("job", "occupancy"),)),)
)


def render() -> None:
    st.title("Occupancy")
    picked = selected_job()
    if picked is None:
        return
    job, traces = picked
    report = report_for(job["job_id"], traces)
    for f in findings_of(report, "occupancy"):
        if f["severity"] != "info":
            st.warning(
                f"{f['severity'].upper()} · {finding_text(f['title'])}\n\n{finding_text(f['recommendation'])}"
            )
    tables = findings_of(report, "occupancy", key="table")
    if not tables:
        st.info("No kernels with a launch configuration in this job.")
        return
    for f in tables:
        st.subheader(finding_text(f["title"]))
        frame = pd.DataFrame(table_of(report, "occupancy", f["trace"], f["device"]))
        frame, measured = _ncu_columns(frame)
        shown = [c for c in COLUMNS if c in frame.columns]
        for column, sep in (("limiter", ", "), ("block", " × "), ("grid", " × ")):
            if column in frame:
                frame[column] = frame[column].map(
                    lambda v, sep=sep: sep.join(map(str, v)) if isinstance(v, list) else v
                )
        st.dataframe(
            frame[shown].round(2),
            width="stretch",
            hide_index=True,
            column_config={"kernel": st.column_config.TextColumn("kernel", width="medium")},
        )
        st.caption(
            "Theoretical occupancy comes from the launch configuration and the device limits; Kineto's "
            "'est. achieved occupancy' is a grid-capped estimate, not a measurement. "
            + (
                "The ncu columns are Nsight Compute's measurements of the profiled launches, matched to "
                "these kernels."
                if measured
                else "Achieved occupancy, stall reasons and the bound need an Nsight Compute profile of "
                "the same program (ingest its CSV pages with the trace)."
            )
        )
