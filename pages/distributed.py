"""Distributed page: the straggler, how the ranks' waits spread, per-rank overlap, the
rank × collective wait heatmap (ranks binned above 64), a rank search, the critical path.

Readable at 1,024 ranks: one entry per kind of waiting finding (the worst rank speaks for
the group, with the distribution over ranks), one histogram of the ranks' waits, a heatmap
of at most 64 rows, and a search box that jumps to one rank's numbers and timeline.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from stallscope import job_settings
from stallscope.charts import critical_path_figure
from stallscope.finding_groups import spread_text
from stallscope.humanize import records_table
from stallscope.pages.links import padded, timeline_link
from stallscope.pages.spec import PageSpec, Shot
from stallscope.pages.state import current_overrides, get_store, report_for, selected_job
from stallscope.pages.text import finding_text, literal
from stallscope.rank_charts import MAX_ROWS, rank_bins, wait_distribution_figure, wait_heatmap
from stallscope.views import (
    findings_of,
    grouped_findings,
    overlap_rows,
    table_of,
    table_places,
    timeline_traces,
)


@st.cache_data(max_entries=64, show_spinner=False)
def _waits(job_id: str, skew_tolerance_us: float | None) -> pd.DataFrame:
    from stallscope.jobdata import JobData
    from stallscope.views import wait_matrix

    store = get_store()
    job = JobData(store, store.traces(job_id), tables=("collectives",))  # all wait_matrix reads
    try:
        # the report's clock correction: the same nccl_wait threshold
        overrides = (
            {}
            if skew_tolerance_us is None
            else {"nccl_wait": {"skew_tolerance_us": skew_tolerance_us}}
        )
        job_settings.apply(job, overrides)
        return wait_matrix(job)
    finally:
        job.close()


PAGE = PageSpec(
    "Distributed", "distributed", order=50, shots=(Shot("distributed", (("job", "straggler"),)),)
)


def render() -> None:
    st.title("Distributed")
    picked = selected_job()
    if picked is None:
        return
    job, traces = picked
    job_id = job["job_id"]
    overrides = current_overrides()
    report = report_for(job_id, traces, overrides)
    if not table_of(report, "comm_overlap") and not findings_of(report, "nccl_wait"):
        st.info("No communication kernels in this job.")
        return
    trace_of = {int(t["rank"] or 0): t["id"] for t in timeline_traces(report)}
    waiting = [f for f in findings_of(report, "nccl_wait") if f["severity"] != "info"]
    straggler_of = _stragglers(report)
    overlap = overlap_rows(report)
    for group in grouped_findings(waiting):
        _waiting_group(group, job_id, trace_of, straggler_of)
    _distribution(overlap, report)
    waits = _waits(job_id, overrides.get("nccl_wait", {}).get("skew_tolerance_us"))
    _rank_search(job_id, trace_of, overlap, waiting, waits, straggler_of)
    if not overlap.empty:
        st.subheader(f"Communication overlap per rank ({overlap['rank'].nunique()} ranks)")
        st.caption(
            "Hidden = share of communication under compute; exposed = the rest. Waiting = exposed time spent waiting for a late rank "
            "is the straggler's cost (above); the rest is transfer that better overlap would hide."
        )
        st.dataframe(
            overlap, width="stretch", hide_index=True, height=min(400, 38 + 35 * len(overlap))
        )
    if not waits.empty:
        ranks = sorted(waits["rank"].unique().tolist())
        binned = len(ranks) > MAX_ROWS
        st.subheader("Time each rank waited in each collective")
        st.caption(
            "Darker: longer wait for the last rank to arrive. The straggler's row stays pale."
            if not binned
            else f"{len(ranks)} ranks in bins of {len(rank_bins(ranks)[0])}: a cell is coloured "
            "by the least wait in its bin (the bin's latest rank), so the bin holding a straggler "
            "stays pale; hover for that rank and the one that waited most. Find one rank above."
        )
        st.plotly_chart(wait_heatmap(waits), width="stretch", key="wait_heatmap")
    for trace, _, device in table_places(report, "critical_path"):
        _critical_path(table_of(report, "critical_path", trace, device))
    for trace, _, device in table_places(report, "collective_ops"):
        ops = table_of(report, "collective_ops", trace, device)
        st.subheader("Collectives by type")
        st.dataframe(records_table(ops), width="stretch", hide_index=True)


def _stragglers(report: dict) -> dict[tuple[str, int | None], int]:
    """(trace, device) of each waiting rank -> the rank it waited for (``rank_waits`` table)."""
    return {(r["trace"], r["device"]): r["straggler_rank"] for r in table_of(report, "rank_waits")}


def _waiting_group(
    group: list[dict],
    job_id: str,
    trace_of: dict[int, str],
    straggler_of: dict[tuple[str, int | None], int],
) -> None:
    """One box for the same waiting finding on many ranks: the worst rank's, the spread over
    the ranks, and a link to the straggler's own timeline at the worst wait."""
    f = group[0]
    st.error(f"{finding_text(f['title'])} — {finding_text(f['detail'])}")
    if len(group) > 1:
        st.caption(literal(spread_text(group)))
    straggler = straggler_of.get((f["trace"], f["device"]))
    if straggler is None or int(straggler) not in trace_of or not f["windows"]:
        return
    start, end = padded(f["windows"][0])
    query = {
        "job": job_id,
        "trace": trace_of[int(straggler)],
        "ranks": ",".join(str(r) for r in sorted({int(straggler), int(f["rank"])})),
        "window": f"{start}-{end}",
        "finding": f["id"],
    }
    timeline_link(
        query, f"Open straggler rank {straggler}'s timeline at rank {f['rank']}'s longest wait"
    )


def _distribution(overlap: pd.DataFrame, report: dict) -> None:
    """Histogram of the ranks' exposed wait: one chart however many ranks (the overlap table's
    waiting ms of every rank, else the ``rank_waits`` table's of the waiting ranks)."""
    rank_waits = table_of(report, "rank_waits")
    if not overlap.empty:
        per_rank = overlap.groupby("rank", as_index=False)["waiting ms"].sum()
        per_rank = per_rank.rename(columns={"waiting ms": "waiting_ms"})
    else:
        per_rank = pd.DataFrame(
            {
                "rank": [r["rank"] for r in rank_waits],
                "waiting_ms": [r["exposed_wait_ns"] / 1e6 for r in rank_waits],
            }
        )
    if len(per_rank) < 2 or not per_rank["waiting_ms"].any():
        return
    stragglers = [r["straggler_rank"] for r in rank_waits]
    straggler = max(set(stragglers), key=stragglers.count, default=None)
    st.subheader(f"How long the {len(per_rank)} ranks waited")
    st.caption(
        "Exposed time each rank spent waiting in collectives for a late rank (nothing of its "
        "own to run). One spike: the ranks wait alike for one straggler (dashed line); a tail: a few "
        "ranks wait longer, look them up below."
    )
    st.plotly_chart(wait_distribution_figure(per_rank, straggler), width="stretch", key="wait_hist")


def _rank_search(
    job_id: str,
    trace_of: dict[int, str],
    overlap: pd.DataFrame,
    waiting: list[dict],
    waits: pd.DataFrame,
    straggler_of: dict[tuple[str, int | None], int],
) -> None:
    """Jump to one rank: its overlap row, its waiting finding, its heatmap row, its timeline."""
    text = st.text_input(
        "Find a rank", placeholder=f"rank number, 0-{max(trace_of)}", key="dist_rank"
    )
    if not text.strip():
        return
    try:
        rank = int(text.strip().removeprefix("rank").strip())
    except ValueError:
        st.warning(f"Not a rank number: {literal(text)}")
        return
    if rank not in trace_of:
        st.warning(f"No rank {rank} in this job (ranks {min(trace_of)}-{max(trace_of)}).")
        return
    row = overlap[overlap["rank"] == rank]
    if not row.empty:
        st.dataframe(row, width="stretch", hide_index=True)
    mine = [f for f in waiting if f["rank"] == rank]
    late = [f for f in waiting if straggler_of.get((f["trace"], f["device"])) == rank]
    for f in mine:
        st.warning(f"{finding_text(f['title'])} — {finding_text(f['detail'])}")
    if late and not mine:
        st.info(f"Rank {rank} is the rank {len(late)} other rank(s) waited for.")
    if not waits.empty:
        ranks = sorted(waits["rank"].unique().tolist())
        bin_of = next((b for b in rank_bins(ranks) if rank in b), None)
        if bin_of is not None and len(bin_of) > 1:
            st.caption(f"In the heatmap: the row of ranks {bin_of[0]}-{bin_of[-1]}.")
    query = {"job": job_id, "trace": trace_of[rank], "ranks": str(rank)}
    window = (mine or late)[0]["windows"][:1] if (mine or late) else []
    if window:
        start, end = padded(window[0])
        query["window"] = f"{start}-{end}"
    timeline_link(query, f"Open rank {rank}'s timeline")


def _critical_path(steps: list[dict]) -> None:
    """The chosen step's cross-rank critical path: a chart and its table."""
    if not steps:
        return
    st.subheader("Critical path")
    st.caption(
        "The chain of work, waits and idle time that set the step's end, across ranks: shortening "
        "anything off this path does not shorten the step."
    )
    labels = {f"step {s['step']} ({s['time_ns'] / 1e6:.1f} ms)": s for s in steps}
    picked = labels[st.selectbox("Step", list(labels))]
    segments = pd.DataFrame(picked["segments"])
    if segments.empty:
        return
    st.plotly_chart(critical_path_figure(segments), width="stretch")
    table = segments.assign(
        start_ms=(segments["start_ns"] - segments["start_ns"].min()) / 1e6,
        ms=segments["duration_ns"] / 1e6,
    )[["rank", "what", "start_ms", "ms"]]
    st.dataframe(table.round(3), width="stretch", hide_index=True)
