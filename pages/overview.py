"""Overview page: the goodput headline and the findings, sorted by GPU time lost."""

from __future__ import annotations

import streamlit as st

from stallscope.charts import (
    busy_shares,
    device_time_table,
    step_rows,
    step_stack_figure,
    time_by_cause_figure,
)
from stallscope.compare_inference import inference_summary
from stallscope.finding_groups import spread_text
from stallscope.humanize import evidence_tables
from stallscope.pages.links import padded, timeline_link
from stallscope.pages.spec import PageSpec, Shot
from stallscope.pages.state import report_for, selected_job, threshold_overrides
from stallscope.pages.text import finding_text, literal
from stallscope.report_store import step_time_ms
from stallscope.views import grouped_findings

BADGE = {
    "critical": ":red-background[CRITICAL]",
    "high": ":orange-background[HIGH]",
    "medium": ":orange[MEDIUM]",
    "low": ":blue[LOW]",
    "info": ":gray[INFO]",
}


PAGE = PageSpec(
    "Overview",
    "overview",
    order=20,
    shots=(Shot("overview"), Shot("overview-ddp", (("job", "straggler"),))),
)


def render() -> None:
    st.title("Overview")
    picked = selected_job()
    if picked is None:
        return
    job, traces = picked
    report = report_for(job["job_id"], traces, threshold_overrides())
    _headline(job, report)
    _steps(report)
    _findings(report, job["job_id"])


def _headline(job: dict, report: dict) -> None:
    table = device_time_table(report)
    st.caption(
        literal(
            f"{job.get('name')} · {len(report['traces'])} rank(s) · uploaded by {job.get('uploaded_by')} · {', '.join(job.get('tags', []))}"
        )
    )
    if job.get("notes"):
        st.caption("Notes: " + literal(job["notes"]))
    if table.empty:
        st.warning("No GPU activity in this job.")
        return
    span = table["span_ms"].max()
    shares = busy_shares(table)
    busy, copies = shares["busy_pct"], shares["copies_pct"]
    idle = (table["gpu_idle_pct"] * table["span_ms"]).sum() / 100
    steps = _step_times(report)
    # two rows of three: six tiles in one row cut "62.3 ms" to "62.…" at laptop widths
    cols = [*st.columns(3), *st.columns(3)]
    decode = inference_summary(report)
    if decode:  # an inference job: the serving figures lead
        _decode_headline(cols, decode)
    elif steps:
        median, p90, jitter = steps
        cols[0].metric(
            "Step time",
            _ms(median),
            help="Median ProfilerStep/NVTX step duration of the slowest rank's captured steps",
        )
        cols[1].metric("Step p90", _ms(p90), help="90th percentile of those steps")
        cols[2].metric("Jitter", f"{jitter:.2f}x", help="The longest step over the median step")
    else:
        cols[0].metric("Step time", "—", help="No step markers in this trace")
        cols[1].metric("GPU span", _ms(span), help="Longest first-to-last GPU activity of any GPU")
    cols[3].metric(
        "GPU busy",
        f"{busy:.0f}%",
        delta=f"copies alone {copies:.0f}%" if copies >= 1 else None,
        delta_color="off",
        delta_arrow="off",
        help="Time-weighted over all ranks and GPUs: kernels, copies and memsets. "
        "'copies alone' is the share with a copy and no kernel running. A communication "
        "kernel counts as busy while it runs, also while it only waits for another rank.",
    )
    if "busy_no_wait_pct" in shares:  # only jobs whose collectives were matched across ranks
        cols[3].caption(
            f"GPU busy without NCCL waiting: **{shares['busy_no_wait_pct']:.0f}%**",
            help="GPU busy less the time communication kernels only waited for a later rank "
            "with no compute kernel beside them (docs/metrics.md)",
        )
    cols[4].metric(
        "GPU idle",
        _ms(idle),
        help="Idle time summed over every rank and GPU (its causes are in the chart)",
    )
    cols[5].metric("GPUs", f"{len(table)}", help="Rank × GPU pairs with activity")
    st.plotly_chart(time_by_cause_figure(report), width="stretch")


def _decode_headline(cols, decode: dict[str, float]) -> None:
    """Time per output token and tokens/s of the slowest GPU (the inference analyzer's metrics)."""
    tokens = decode.get("tokens_per_s")
    cols[0].metric(
        "Time per token",
        _ms(decode["decode_iter_ms_median"]),
        help="Median decode period: GPU completion of one decode iteration to the next "
        "(slowest GPU); the Inference page has the distribution",
    )
    cols[1].metric("TPOT p90", _ms(decode.get("decode_iter_ms_p90", 0.0)), help="90th percentile")
    cols[2].metric(
        "Tokens/s",
        "—" if tokens is None else f"{tokens:,.0f}",
        help="Batch per decode iteration / time per token; — when the trace does not give the batch "
        "(the inference analyzer's decode_batch threshold sets it)",
    )


def _findings(report: dict, job_id: str) -> None:
    groups = grouped_findings(report["findings"])
    real = [g for g in groups if g[0]["severity"] != "info"]
    info = sum(len(g) for g in groups) - sum(len(g) for g in real)
    count = sum(len(g) for g in real)
    st.subheader(findings_heading(count, info))
    if not real:
        st.success("Nothing above info: no GPU time lost to the problems stallscope checks.")
    for group in groups:
        f = group[0]  # the worst of the group speaks for it
        label = f"{BADGE[f['severity']]} {finding_text(f['title'])} · {f['impact_ns'] / 1e6:.1f} ms · {_where(f)}"
        if f.get("saving_ns"):
            label += f" · saves ~{f['saving_ns'] / 1e6:.1f} ms if fixed"
        if len(group) > 1:
            label += f" · and {len(group) - 1} more"
        with st.expander(label, expanded=group is (real[0] if real else None)):
            if len(group) > 1:
                st.caption(literal(spread_text(group)) + " Shown below: the worst.")
            st.markdown(finding_text(f["detail"]))
            st.markdown(f"**Fix.** {finding_text(f['recommendation'])}")
            if f["windows"]:
                start, end = padded(f["windows"][0])
                query = {"job": job_id, "trace": f["trace"], "window": f"{start}-{end}"}
                timeline_link(query | {"finding": f["id"]}, "Show the worst window on the timeline")
            # drawn on demand: a 32-rank job has ~200 findings, and their evidence tables
            # drawn up front took ~90% of the page's time
            if st.toggle("Evidence", key=f"evidence_{f['id']}"):
                _evidence(f["evidence"])


def _steps(report: dict) -> None:
    """Per-step stacked bar of one GPU (the slowest rank's first by default)."""
    rows = step_rows(report)
    if rows.empty:
        return
    st.subheader("Where each step's time goes")
    keys = rows.groupby(["rank", "device"])["step_ms"].median().sort_values(ascending=False)
    labels = {f"rank {r} · GPU {d}": (r, d) for r, d in keys.index}
    chosen = next(iter(labels))
    if len(labels) > 1:
        chosen = st.selectbox(
            "GPU", list(labels), help="Ordered by median step time: the slowest first"
        )
    rank, device = labels[chosen]
    one = rows[(rows["rank"] == rank) & (rows["device"] == device)].sort_values("step")
    st.plotly_chart(step_stack_figure(one), width="stretch")


def _evidence(evidence: dict) -> None:
    """The finding's evidence in human units (ms, MiB, GB/s, %), lists as tables."""
    facts, tables = evidence_tables(evidence)
    if not facts.empty:
        st.dataframe(facts, hide_index=True, width="stretch")
    for title, table in tables:
        st.caption(literal(title))
        st.dataframe(table, hide_index=True, width="stretch")
    st.caption("As stored (exact units: ns, bytes)")
    st.json(evidence, expanded=False)


def _step_times(report: dict) -> tuple[float, float, float] | None:
    """(median ms, p90 ms, max/median) of the worst rank's steps (the Library shows the same)."""
    return step_time_ms(report)


def findings_heading(to_act_on: int, info: int) -> str:
    """``Findings: 2 to act on · 13 info``: both counts named, so 2 never reads as all of 15."""
    return f"Findings: {to_act_on} to act on" + (f" · {info} info" if info else "")


def _where(f: dict) -> str:
    return f"rank {f['rank']}" + ("" if f["device"] is None else f" · GPU {f['device']}")


def _ms(value: float) -> str:
    """A tile's duration, at most 4 significant characters: ``12.3 s``, ``623 ms``, ``4.2 ms``,
    ``80 µs`` (``value`` in ms)."""
    return (
        f"{value / 1000:.1f} s"
        if value >= 10_000
        else f"{value:.0f} ms"
        if value >= 100
        else f"{value:.1f} ms"
        if value >= 1
        else f"{value * 1000:.0f} µs"
    )
