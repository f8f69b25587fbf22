"""Inference page: serving iterations by phase, time per output token, what each token waited for.

Everything comes from the report: its typed ``iterations`` table (per rank and GPU),
the ``inference`` analyzer's ``iterations`` finding (which GPUs, and the caption) and its
other findings; the figures are ``stallscope.inference_charts``.
"""

from __future__ import annotations

import streamlit as st

from stallscope.errors import UsageError
from stallscope.inference_charts import (
    iteration_frame,
    iteration_timeline,
    percentiles,
    stall_causes,
    tpot_histogram,
)
from stallscope.job_settings import ITERATION_RANGE, check_iteration_range
from stallscope.pages.spec import PageSpec, Shot
from stallscope.pages.state import report_for, selected_job, threshold_overrides
from stallscope.pages.text import finding_text, literal
from stallscope.views import findings_of, table_of

PAGE = PageSpec(
    "Inference", "inference", order=60, shots=(Shot("inference", (("job", "decode_eager"),)),)
)


def render() -> None:
    st.title("Inference")
    picked = selected_job()
    if picked is None:
        return
    job, traces = picked
    overrides = threshold_overrides()
    regex = _iteration_range_input()
    if regex:
        overrides.setdefault(ITERATION_RANGE[0], {})[ITERATION_RANGE[1]] = regex
    report = report_for(job["job_id"], traces, overrides)
    found = findings_of(report, "inference")
    tables = findings_of(report, "inference", key="iterations")
    if not tables:
        st.info(
            "No inference iterations in this job: no engine or user ranges named for prefill/decode, "
            "no CUDA-graph replays beside an inference marker, and no repeated model forwards in the "
            "input shapes (profile with record_shapes=True); name the iteration ranges above "
            "(docs/analyzers/inference.md)."
        )
        return
    labels = {f"rank {f['rank']} · GPU {f['device']}": f for f in tables}
    chosen = labels[st.selectbox("GPU", list(labels))] if len(labels) > 1 else tables[0]
    st.caption(finding_text(chosen["title"]) + " · " + finding_text(chosen["detail"]))
    frame = iteration_frame(table_of(report, "iterations", chosen["trace"], chosen["device"]))
    _headline(report, chosen, frame)
    st.plotly_chart(iteration_timeline(frame), width="stretch")
    if "period_ms" in frame:
        left, right = st.columns(2)
        left.plotly_chart(tpot_histogram(frame), width="stretch")
        right.plotly_chart(stall_causes(frame), width="stretch")
    _findings([f for f in found if f is not chosen and f["device"] == chosen["device"]])


def _iteration_range_input() -> str | None:
    """The iteration-range input (a regex, as ``analyze --iteration-range``); None when empty or invalid."""
    value = st.text_input(
        "Iteration range (regular expression)",
        key="inference_iteration_range",
        placeholder="found automatically; e.g. ^decode_step$",
        help="The host ranges (record_function/NVTX names) that are the serving loop's iterations, "
        "when the automatic guess (engine names, CUDA-graph replays, input shapes) is wrong.",
    ).strip()
    if not value:
        return None
    try:
        check_iteration_range(value)
    except UsageError as error:
        st.error(literal(str(error)))
        return None
    return value


def _headline(report: dict, chosen: dict, frame) -> None:
    values = {
        m["name"]: m["value"]
        for m in report["metrics"]
        if m["trace"] == chosen["trace"] and m["device"] == chosen["device"]
    }
    spread = percentiles(frame)
    tokens = values.get("tokens_per_s")
    cols = st.columns(6)
    cols[0].metric("Tokens/s", "—" if tokens is None else f"{tokens:,.0f}",
                   help="Batch per decode iteration (from engine names or input shapes) / time per "
                   "token; — when the batch is unknown (profile with record_shapes=True, or set "
                   "the inference analyzer's decode_batch threshold)")  # fmt: skip
    for col, key in zip(cols[1:4], ("p50", "p90", "p99"), strict=True):
        value = spread.get(key)
        col.metric(f"TPOT {key}", "—" if value is None else f"{value:.2f} ms",
                   help="Time per output token: GPU completion of one decode iteration to the next")  # fmt: skip
    cols[4].metric("Decode iterations", f"{values.get('decode_iterations', 0)}")
    cols[5].metric("Prefill iterations", f"{values.get('prefill_iterations', 0)}")


def _findings(found: list[dict]) -> None:
    st.subheader("What holds the decode loop back")
    if not found:
        st.success("No inference finding: nothing above the thresholds holds the decode loop back.")
    for f in found:
        saving = f" · saves ~{f['saving_ns'] / 1e6:.1f} ms if fixed" if f.get("saving_ns") else ""
        with st.expander(
            f"{f['severity'].upper()} · {finding_text(f['title'])}{saving}", expanded=True
        ):
            st.markdown(finding_text(f["detail"]))
            st.markdown(f"**Fix.** {finding_text(f['recommendation'])}")
